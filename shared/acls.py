"""The Kafka ACLs each principal needs, and nothing more (docs/reference/operations.md#least-privilege).

Every service, the dashboard, the CLI/SDK writers, KEDA and `cronstream init`
authenticate as a principal of their own (a SASL user: `User:cronstream-worker`, ...),
and the cluster's authorizer allows each only what its code does. The footprints below
are what the code reads and writes (docs/architecture.md: who writes what); a test runs
the whole system on a broker with these ACLs and nothing else
(tests/security/test_kafka_principals.py), so a footprint that is too small fails there.

What the grants mean (docs/deploy.md, the trust boundary): a write to `job-definitions`,
`calendars` (which decides on which days jobs fire), `job-due`, `retries` or a work topic
names a handler and its params, so whoever holds such a principal can run any registered
handler with any params on every worker. The worker and the monitor hold `job-due` and
`retries` (drain and dead-worker requeues, retry timers), the dashboard and the CLI
`job-definitions`, `calendars` and `job-due`; the dashboard
cannot write `execution-events`, a worker cannot write `job-definitions`.

Resources are named with the topic prefix: topics literally (`cronstream.job-due`), the
work topics by prefix (`cronstream.work.`), groups literally, transactional ids of
instances and shards by prefix (`cronstream.worker-`, `cronstream.scheduler-shard-`).
Kafka implies DESCRIBE from READ and WRITE.
Readers of compacted state assign partitions under the group `<prefix>reader-unused`,
which they never join: librdkafka still looks its coordinator up (DESCRIBE).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from cronstream.shared.records import JobDefinition
from cronstream.shared.topics import Topics

Operation = Literal["READ", "WRITE", "CREATE", "DESCRIBE"]
ResourceType = Literal["TOPIC", "GROUP", "TRANSACTIONAL_ID", "CLUSTER"]
Pattern = Literal["LITERAL", "PREFIXED"]

# Logical names (without the prefix), as in the topic table of shared/topics.py.
WORK = "work."
READER_GROUP = "reader-unused"


@dataclass(frozen=True)
class Footprint:
    """What one principal does on Kafka: topics read and written, operations on the
    work topics, consumer groups it reads (joins, commits) or only describes, and
    transactional ids (name, pattern)."""

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    work: tuple[Operation, ...] = ()
    groups: tuple[str, ...] = ()
    describes_groups: tuple[str, ...] = ()
    transactional_ids: tuple[tuple[str, Pattern], ...] = ()
    creates_topics: bool = False


_EVERY_CONSUMER = (READER_GROUP,)

FOOTPRINTS: dict[str, Footprint] = {
    # Every process joins the group `scheduler` on `scheduler-members` (who is alive) and
    # lists its members (describe_consumer_groups: DESCRIBE, implied by READ); each shard
    # it leads commits through the shard's own transactional id, `scheduler-shard-<n>`.
    "scheduler": Footprint(
        reads=("job-definitions", "scheduler-state", "trigger-state", "retries", "scheduler-members",
               "calendars"),
        writes=("job-due", "scheduler-state", "trigger-state", "retries", "alerts", "dead-letters"),
        groups=("scheduler",), describes_groups=_EVERY_CONSUMER,
        transactional_ids=(("scheduler-shard-", "PREFIXED"),)),
    "dispatcher": Footprint(
        reads=("job-due", "execution-events", "dispatcher-state", "pools", "admissions"),
        writes=("execution-events", "commands", "dispatcher-state", "admissions", "dead-letters"),
        work=("WRITE", "CREATE"), groups=("dispatcher",), describes_groups=_EVERY_CONSUMER,
        transactional_ids=(("dispatcher-", "PREFIXED"),)),
    "worker": Footprint(
        reads=("commands",),
        writes=("execution-events", "execution-logs", "retries", "heartbeats", "job-due",
                "dead-letters"),
        work=("READ", "CREATE"), groups=("workers",), describes_groups=_EVERY_CONSUMER,
        transactional_ids=(("worker-", "PREFIXED"),)),
    "monitor": Footprint(
        reads=("execution-events", "execution-logs", "heartbeats", "job-definitions", "commands",
               "alerts", "calendars", "pools"),
        writes=("job-due", "execution-events", "retries", "alerts", "dead-letters"),
        # Queue depth is the workers group's lag; fencing a dead worker takes its id.
        work=("DESCRIBE",), groups=("monitor",), describes_groups=(*_EVERY_CONSUMER, "workers"),
        transactional_ids=(("worker-", "PREFIXED"),)),
    "analytics": Footprint(
        reads=("execution-events", "job-definitions", "scheduler-state", "alerts"),
        writes=("alerts",),
        work=("DESCRIBE",), describes_groups=(*_EVERY_CONSUMER, "workers")),
    # The Schedulers page and `cronstream schedulers` list the scheduler group's members
    # and count the partitions of job-definitions (its shards): DESCRIBE only, never a join.
    # Calendars are written like job definitions (a calendar decides when jobs fire).
    "ui": Footprint(
        reads=("job-definitions", "calendars", "pools"),
        writes=("job-definitions", "calendars", "job-due", "commands"),
        describes_groups=(*_EVERY_CONSUMER, "scheduler")),
    "cli": Footprint(
        reads=("job-definitions", "calendars", "pools", "execution-events"),
        writes=("job-definitions", "calendars", "pools", "job-due", "commands", "retries"),
        describes_groups=(*_EVERY_CONSUMER, "scheduler")),
    # KEDA's lag trigger: the workers group's offsets and the work topics' ends.
    "keda": Footprint(work=("DESCRIBE",), describes_groups=("workers",)),
    "init": Footprint(creates_topics=True),
}
PRINCIPALS = tuple(FOOTPRINTS)
DEFAULT_PRINCIPAL_PREFIX = "User:cronstream-"


@dataclass(frozen=True, order=True)
class Acl:
    principal: str
    resource: ResourceType
    pattern: Pattern
    name: str
    operation: Operation
    host: str = field(default="*", compare=False)

    def as_row(self) -> dict[str, str]:
        return {"principal": self.principal, "resource": self.resource, "pattern": self.pattern,
                "name": self.name, "operation": self.operation}


def principals(overrides: Mapping[str, str] | None = None,
               prefix: str = DEFAULT_PRINCIPAL_PREFIX) -> dict[str, str]:
    """Each part's principal: `<prefix><part>`, or the override given for it."""
    unknown = set(overrides or {}) - set(PRINCIPALS)
    if unknown:
        raise ValueError(f"no such part: {', '.join(sorted(unknown))} "
                         f"(parts: {', '.join(PRINCIPALS)})")
    return {part: (overrides or {}).get(part, f"{prefix}{part}") for part in PRINCIPALS}


def trigger_topics(definitions: Iterable[JobDefinition]) -> list[str]:
    """The source topics of the EVENT jobs among `definitions`: the scheduler reads them
    (docs/decisions/0057), each by its full name."""
    return sorted({d.event.topic for d in definitions if d.type == "EVENT" and d.event is not None})


def acls(topics: Topics, names: Mapping[str, str], triggers: Iterable[str] = ()) -> list[Acl]:
    """Every ACL binding of every principal in `names` (part -> principal), sorted; the
    scheduler's include READ on `triggers`, the source topics of event triggers
    (`trigger_topics`: full names, no prefix added)."""
    found: set[Acl] = set()
    if "scheduler" in names:
        found.update(Acl(names["scheduler"], "TOPIC", "LITERAL", topic, "READ") for topic in triggers)
    for part, principal in names.items():
        footprint = FOOTPRINTS[part]

        def add(resource: ResourceType, pattern: Pattern, name: str, *operations: Operation,
                principal: str = principal) -> None:
            found.update(Acl(principal, resource, pattern, name, op) for op in operations)

        for topic in footprint.reads:
            add("TOPIC", "LITERAL", topics.prefix + topic, "READ")
        for topic in footprint.writes:
            add("TOPIC", "LITERAL", topics.prefix + topic, "WRITE")
        if footprint.work:
            add("TOPIC", "PREFIXED", topics.prefix + WORK, *footprint.work)
        for group in footprint.groups:
            add("GROUP", "LITERAL", topics.prefix + group, "READ")
        for group in footprint.describes_groups:
            add("GROUP", "LITERAL", topics.prefix + group, "DESCRIBE")
        for name, pattern in footprint.transactional_ids:
            add("TRANSACTIONAL_ID", pattern, topics.prefix + name, "WRITE")
        if footprint.creates_topics:
            if topics.prefix:
                add("TOPIC", "PREFIXED", topics.prefix, "CREATE", "DESCRIBE")
            else:  # no prefix to scope it by: the cluster's, and every topic's name
                add("CLUSTER", "LITERAL", "kafka-cluster", "CREATE")
                add("TOPIC", "LITERAL", "*", "DESCRIBE")
    # READ implies DESCRIBE: a describe beside a read of the same resource says nothing.
    reads = {(a.principal, a.resource, a.pattern, a.name) for a in found if a.operation == "READ"}
    return sorted(a for a in found if not (
        a.operation == "DESCRIBE" and (a.principal, a.resource, a.pattern, a.name) in reads))
