"""A 3-node KRaft cluster (replication 3, min.insync.replicas 2) loses the leader of the
busiest partitions: a routine event on every production cluster."""

from __future__ import annotations

from collections import Counter

from tests.chaos.conftest import RunFactory
from tests.chaos.harness import (
    NODE_LOSS_TARGET_SECONDS,
    RESTART_TARGET_SECONDS,
    hold_for,
    hold_until,
    short_or_full,
)
from tests.chaos.servers import ChaosCluster


def test_cluster_loses_the_leader_of_the_busiest_partitions(
    chaos_run: RunFactory, chaos_cluster: ChaosCluster,
) -> None:
    """The node leading most partitions of job-due, execution-events and the work topic
    is SIGKILLed; the other two carry on (leaders move, writes still reach 2 in sync),
    and the node rejoins later. Nothing is lost or doubled, and execution goes on."""
    cluster = chaos_cluster.cluster
    run = chaos_run("cluster_leader_loss", bootstrap_servers=chaos_cluster.bootstrap_servers,
                    replication=3)
    run.start_system()
    t = run.settings.topics
    busiest = [t.job_due, t.execution_events, t.work("normal", "default")]
    replicas = cluster.replicas(busiest)
    assert set(replicas.values()) == {3}, f"topics not replicated 3 times: {replicas}"
    run.start_load(short_or_full(40, 70))
    hold_until(run.at(short_or_full(10, 20)))
    leaders = Counter(cluster.leaders(busiest).values())
    victim = leaders.most_common(1)[0][0]
    run.figures["leaders_before"] = {str(node): n for node, n in leaders.items()}
    run.figures["victim"] = victim
    cluster.kill_node(victim)
    run.fault_ended(f"leader node {victim} SIGKILL (stays down)", NODE_LOSS_TARGET_SECONDS)
    hold_for(short_or_full(10, 20))
    run.figures["leaders_during"] = {str(n): c for n, c in
                                     Counter(cluster.leaders(busiest).values()).items()}
    cluster.start_node(victim)
    run.fault_ended(f"node {victim} back", RESTART_TARGET_SECONDS)
    run.settle()
    run.verdict()

