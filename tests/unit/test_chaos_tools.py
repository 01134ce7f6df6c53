"""The chaos suite's own tools, without servers: the cluster's node configs and the
load's expected fires."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cronstream.infra.cluster import KafkaCluster
from cronstream.shared.ids import execution_id
from tests.chaos.harness import DEAD_AFTER_SECONDS, Requeue, worker_kill_problems
from tests.chaos.load import LoadShape, expected_fires
from tests.support import most_at_once, pool_slots_in_use


def _props(path: Path) -> dict[str, str]:
    lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
    return dict(ln.split("=", 1) for ln in lines)


def test_cluster_nodes_share_one_static_quorum_with_production_durability(tmp_path: Path) -> None:
    cluster = KafkaCluster(tmp_path, tmp_path / "libs", size=3, replication=3, min_insync_replicas=2)
    ports = {n.port for n in cluster.nodes.values()} | {n.controller_port for n in cluster.nodes.values()}
    assert len(ports) == 6, "every node has its own client and controller port"
    configs = {i: _props(cluster.write_config(node)) for i, node in cluster.nodes.items()}
    voters = {c["controller.quorum.voters"] for c in configs.values()}
    assert len(voters) == 1 and len(voters.pop().split(",")) == 3
    for i, config in configs.items():
        assert config["node.id"] == str(i)
        assert config["transaction.state.log.replication.factor"] == "3"
        assert config["transaction.state.log.min.isr"] == "2"
        assert config["offsets.topic.replication.factor"] == "3"
        assert config["min.insync.replicas"] == "2"
        assert "${" not in "".join(config.values()), "every placeholder is filled in"
    assert cluster.bootstrap_servers.count(",") == 2


def test_cluster_refuses_a_min_isr_above_the_replication(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="min_insync_replicas"):
        KafkaCluster(tmp_path, tmp_path, size=3, replication=2, min_insync_replicas=3)


def test_the_windows_fires_are_its_grid_points_inclusive() -> None:
    start = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    shape = LoadShape(noop_jobs=2, sleep_jobs=1, long_jobs=1, print_jobs=1, pooled_jobs=2, keyed_jobs=1)
    definitions = shape.definitions(start, start + timedelta(seconds=10))
    fires = expected_fires(definitions)
    # Every job fires at start, each second (the pooled ones every 2 s), and at the end.
    assert len(fires) == 6 * 11 + 2 * 6
    first = execution_id("noop-00", start, 1)
    assert fires[first].scheduled_at == start
    assert {f.job_id for f in fires.values()} == {"noop-00", "noop-01", "sleep-00", "long-00", "print-00",
                                                   "pooled-00", "pooled-01", "keyed-00"}
    assert all(d["misfire_policy"] == "FIRE_ALL" for d in definitions)
    pooled = [d for d in definitions if d.get("pool")]
    assert [d["job_id"] for d in pooled] == ["pooled-00", "pooled-01"]
    assert shape.recovery_job_ids([d["job_id"] for d in definitions]) == \
        ["noop-00", "noop-01", "sleep-00", "long-00", "print-00"]


def test_the_flow_ledger_counts_what_ran_at_once() -> None:
    t = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    s = timedelta(seconds=1)
    assert most_at_once([]) == 0
    # A slot released and taken again at the same instant is one run at a time.
    assert most_at_once([(t, t + s), (t + s, t + 2 * s)]) == 1
    assert most_at_once([(t, t + 3 * s), (t + s, t + 2 * s), (t + 2 * s, t + 4 * s)]) == 2
    text = 'cronstream_pool_slots_in_use{pool="chaos-pool"} 0.0\ncronstream_pool_slots_in_use{pool="x"} 2.0\n'
    assert pool_slots_in_use(text, "chaos-pool") == 0 and pool_slots_in_use(text, "x") == 2
    assert pool_slots_in_use(text, "absent") is None


def test_a_worker_kill_run_fails_without_a_kill_inside_a_transaction_or_a_slow_requeue() -> None:
    prompt = Requeue("worker-1", running=3, requeued=3, seconds=DEAD_AFTER_SECONDS + 1.9)
    assert worker_kill_problems(2, 1, [prompt]) == []
    assert worker_kill_problems(2, 0, [prompt]) == [
        "none of the 2 kills was caught inside an open transaction"]
    slow = Requeue("worker-2", running=3, requeued=3, seconds=DEAD_AFTER_SECONDS + 2.5)
    assert ["re-queued 7.5s after its death" in p for p in worker_kill_problems(2, 1, [slow])] == [True]
    lost = Requeue("worker-2", running=3, requeued=2, seconds=DEAD_AFTER_SECONDS)
    assert ["1 were never re-queued" in p for p in worker_kill_problems(2, 1, [lost])] == [True]
