"""The ACL bindings `cronstream kafka-acls` derives from each part's footprint
(shared/acls.py; the broker-backed proof is tests/security/test_kafka_principals.py)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cronstream.cli import cli
from cronstream.shared.acls import Acl, acls, principals
from cronstream.shared.topics import Topics


def test_bindings_are_named_with_the_prefix_and_a_read_implies_its_describe() -> None:
    names = principals({"worker": "User:CN=workers"})
    bindings = acls(Topics("acme."), names)
    worker = {(a.resource, a.pattern, a.name, a.operation) for a in bindings if a.principal == "User:CN=workers"}
    assert ("TOPIC", "LITERAL", "acme.job-definitions", "WRITE") not in worker
    assert ("TOPIC", "PREFIXED", "acme.work.", "READ") in worker
    assert ("TRANSACTIONAL_ID", "PREFIXED", "acme.worker-", "WRITE") in worker
    assert ("GROUP", "LITERAL", "acme.workers", "READ") in worker
    monitor = {(a.name, a.operation) for a in bindings if a.principal == "User:cronstream-monitor"}
    assert ("acme.workers", "DESCRIBE") in monitor and ("acme.monitor", "READ") in monitor
    assert len(bindings) == len(set(bindings)) and bindings == sorted(bindings)
    assert not any(a.operation == "DESCRIBE" and Acl(a.principal, a.resource, a.pattern, a.name, "READ")
                   in bindings for a in bindings)


def test_init_creates_topics_by_prefix_or_on_the_cluster_without_one() -> None:
    scoped = {(a.resource, a.pattern, a.name, a.operation)
              for a in acls(Topics("acme."), {"init": "User:i"})}
    assert scoped == {("TOPIC", "PREFIXED", "acme.", "CREATE"), ("TOPIC", "PREFIXED", "acme.", "DESCRIBE")}
    bare = {(a.resource, a.name, a.operation) for a in acls(Topics(""), {"init": "User:i"})}
    assert ("CLUSTER", "kafka-cluster", "CREATE") in bare


def test_an_unknown_part_is_refused_and_the_commands_are_printed() -> None:
    with pytest.raises(ValueError, match="no such part: wroker"):
        principals({"wroker": "User:x"})
    out = CliRunner().invoke(cli, ["--topic-prefix", "acme.", "kafka-acls", "--only", "ui", "-o", "commands"])
    assert out.exit_code == 0, out.output
    assert "--allow-principal User:cronstream-ui --operation Write --topic acme.job-due " \
           "--resource-pattern-type literal" in out.output
    refused = CliRunner().invoke(cli, ["kafka-acls", "--principal", "nobody"])
    assert refused.exit_code == 2 and "PART=PRINCIPAL" in refused.output


def test_the_sharded_scheduler_joins_its_group_and_commits_through_each_shards_transactional_id() -> None:
    bindings = acls(Topics("acme."), principals())

    def of(part: str) -> set[tuple[str, str, str, str]]:
        return {(a.resource, a.pattern, a.name, a.operation) for a in bindings
                if a.principal == f"User:cronstream-{part}"}

    scheduler = of("scheduler")
    assert {("TOPIC", "LITERAL", "acme.scheduler-members", "READ"),
            ("GROUP", "LITERAL", "acme.scheduler", "READ"),
            ("TRANSACTIONAL_ID", "PREFIXED", "acme.scheduler-shard-", "WRITE"),
            ("TOPIC", "LITERAL", "acme.scheduler-state", "WRITE"),
            ("TOPIC", "LITERAL", "acme.retries", "WRITE")} <= scheduler
    assert not any(name == "acme.scheduler-leader" for _r, _p, name, _o in scheduler), "one leader no more"
    assert not any(a.name == "acme.scheduler-members" and a.operation == "WRITE" for a in bindings), \
        "the members topic holds no record: nobody writes it"
    # Who lists the schedulers (the dashboard's page, `cronstream schedulers`) describes
    # the group and counts the shards, and cannot join the group.
    for part in ("ui", "cli"):
        assert {("GROUP", "LITERAL", "acme.scheduler", "DESCRIBE"),
                ("TOPIC", "LITERAL", "acme.job-definitions", "READ")} <= of(part), part
        assert ("GROUP", "LITERAL", "acme.scheduler", "READ") not in of(part), part



def test_the_scheduler_reads_its_trigger_state_and_the_source_topics_of_event_triggers() -> None:
    from cronstream.shared.acls import trigger_topics
    from cronstream.shared.records import JobDefinition

    definitions = [JobDefinition.from_dict({"job_id": j, "type": "EVENT", "handler": "h",
                                            "event": {"topic": t}})
                   for j, t in (("a", "shop.orders"), ("b", "shop.orders"), ("c", "acme.execution-events"))]
    definitions.append(JobDefinition.from_dict({"job_id": "d", "type": "INTERVAL", "interval_seconds": 5,
                                                "handler": "h"}))
    sources = trigger_topics(definitions)
    assert sources == ["acme.execution-events", "shop.orders"]
    bindings = acls(Topics("acme."), principals(), sources)
    reads = {a.name for a in bindings if a.principal == "User:cronstream-scheduler" and a.operation == "READ"}
    assert {"shop.orders", "acme.execution-events", "acme.trigger-state"} <= reads
    writes = {a.name for a in bindings if a.principal == "User:cronstream-scheduler" and a.operation == "WRITE"}
    assert "acme.trigger-state" in writes and "shop.orders" not in writes
    assert not any(a.name == "shop.orders" for a in bindings if a.principal != "User:cronstream-scheduler")
    out = CliRunner().invoke(cli, ["--topic-prefix", "acme.", "kafka-acls", "--only", "scheduler",
                                   "--trigger-topic", "shop.orders", "-o", "commands"])
    assert out.exit_code == 0, out.output
    assert "--allow-principal User:cronstream-scheduler --operation Read --topic shop.orders" in out.output
