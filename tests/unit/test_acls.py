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
