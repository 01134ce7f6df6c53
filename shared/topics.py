"""Topic names and their configuration (docs/reference/topics.md).

Every name is prefixed by `CRONSTREAM_TOPIC_PREFIX`. `cronstream init` creates the
topics below; work topics are created on demand by the dispatcher and the workers for
the queues they use, with the same settings.

| topic              | partitions | cleanup        | key                          |
|--------------------|-----------:|----------------|------------------------------|
| job-definitions    | S          | compact        | job_id                       |
| job-due            | P          | delete 7 d     | job_id                       |
| execution-events   | P          | delete 7 d     | job_id                       |
| execution-logs     | P          | delete 7 d     | execution_id                 |
| heartbeats         | 1          | delete 1 h     | worker_id                    |
| retries            | S          | compact        | execution_id of next attempt |
| dead-letters       | 1          | delete 14 d    | original key                 |
| scheduler-state    | S          | compact        | job_id                       |
| trigger-state      | S          | compact        | job_id (an EVENT job's)      |
| scheduler-members  | 1          | delete 1 h     | (nothing: a group's topic)   |
| dispatcher-state   | P          | compact        | job_id (partition of the job)|
| admissions         | P          | delete 7 d     | job_id (flow control requests)|
| commands           | 1          | delete 1 d     | execution_id                 |
| alerts             | 1          | delete 14 d    | job_id                       |
| calendars          | 1          | compact        | calendar_id                  |
| pools              | 1          | compact        | pool name                    |
| work.<tier>.<queue>| P          | delete 7 d     | job_id                       |

P is `CRONSTREAM_TOPIC_PARTITIONS` (default 6); S the shards of the clock,
`CRONSTREAM_SCHEDULER_SHARDS` (default 16), fixed once `job-definitions` exists: a job's
shard is the partition its job_id hashes to (shared/shards.py), and its state and pending
retries are written to the same partition of `scheduler-state` and `retries`, whoever
writes them. `scheduler-members` holds no record: the scheduler group's members join on
it (services/scheduler/service.py). `job-due`, `execution-events` and
`dispatcher-state` must have the same count: the dispatcher relies on partition i of
each holding the same jobs. Every cronstream producer uses the Java client's partitioner
(murmur2); other producers of `job-due` must too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cronstream.shared.records import PRIORITIES
from cronstream.shared.shards import shard_of

_DAY_MS = 86_400_000
_COMPACT = {
    "cleanup.policy": "compact",
    # The active segment is never compacted: roll hourly so that it can be.
    "segment.ms": str(3_600_000),
    "min.cleanable.dirty.ratio": "0.1",
    "delete.retention.ms": str(_DAY_MS),
}


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Topics:
    prefix: str = "cronstream."
    partitions: int = 6
    shards: int = 16

    @property
    def job_definitions(self) -> str:
        return f"{self.prefix}job-definitions"

    @property
    def job_due(self) -> str:
        return f"{self.prefix}job-due"

    @property
    def execution_events(self) -> str:
        return f"{self.prefix}execution-events"

    @property
    def execution_logs(self) -> str:
        return f"{self.prefix}execution-logs"

    @property
    def heartbeats(self) -> str:
        return f"{self.prefix}heartbeats"

    @property
    def retries(self) -> str:
        return f"{self.prefix}retries"

    @property
    def dead_letters(self) -> str:
        return f"{self.prefix}dead-letters"

    @property
    def scheduler_state(self) -> str:
        return f"{self.prefix}scheduler-state"

    @property
    def trigger_state(self) -> str:
        """The event triggers' positions (key: job_id, the partition of the job's shard),
        committed with their runs (docs/decisions/0057)."""
        return f"{self.prefix}trigger-state"

    @property
    def scheduler_members(self) -> str:
        return f"{self.prefix}scheduler-members"

    def members_spec(self) -> TopicSpec:
        return TopicSpec(self.scheduler_members, 1, {"retention.ms": str(3_600_000)})

    @property
    def dispatcher_state(self) -> str:
        return f"{self.prefix}dispatcher-state"

    @property
    def admissions(self) -> str:
        """Flow control's requests to the partition that admits a pool (decision 0056):
        same partition count as `job-due`, partitions chosen by the dispatcher."""
        return f"{self.prefix}admissions"

    @property
    def commands(self) -> str:
        return f"{self.prefix}commands"

    @property
    def alerts(self) -> str:
        return f"{self.prefix}alerts"

    @property
    def calendars(self) -> str:
        """Named calendars (key: calendar_id; null deletes): one partition, since every
        scheduler shard and the monitor read all of them."""
        return f"{self.prefix}calendars"

    @property
    def pools(self) -> str:
        """Pools of slots (key: the pool's name; null deletes): one partition, since the
        dispatchers that admit pooled executions and the monitor read all of them."""
        return f"{self.prefix}pools"

    def public(self) -> list[str]:
        """The topics other systems produce to or consume from: a compatibility contract
        (schemas/asyncapi.yaml, docs/consuming-events.md)."""
        return [self.job_definitions, self.calendars, self.pools, self.execution_events,
                self.alerts, self.dead_letters]

    def shard(self, job_id: str) -> int:
        """The partition of `scheduler-state` and `retries` that holds what the clock keeps
        for `job_id`: its shard (shared/shards.py)."""
        return shard_of(job_id, self.shards)

    def logical(self, topic: str) -> str:
        """A topic's name without the prefix (a bounded metric label)."""
        return topic[len(self.prefix):] if topic.startswith(self.prefix) else "other"

    def work(self, priority: str, queue: str) -> str:
        return f"{self.prefix}work.{priority}.{queue}"

    def work_topics(self, queues: list[str]) -> list[str]:
        """The work topics of `queues`, highest priority first."""
        return [self.work(p, q) for p in PRIORITIES for q in queues]

    def specs(self, queues: tuple[str, ...] = ("default",)) -> list[TopicSpec]:
        p = self.partitions
        week = {"retention.ms": str(7 * _DAY_MS)}
        return [
            TopicSpec(self.job_definitions, self.shards, dict(_COMPACT)),
            TopicSpec(self.job_due, p, week),
            TopicSpec(self.execution_events, p, week),
            TopicSpec(self.execution_logs, p, week),
            TopicSpec(self.heartbeats, 1, {"retention.ms": str(3_600_000)}),
            TopicSpec(self.retries, self.shards, dict(_COMPACT)),
            TopicSpec(self.dead_letters, 1, {"retention.ms": str(14 * _DAY_MS)}),
            TopicSpec(self.scheduler_state, self.shards, dict(_COMPACT)),
            TopicSpec(self.trigger_state, self.shards, dict(_COMPACT)),
            self.members_spec(),
            TopicSpec(self.dispatcher_state, p, dict(_COMPACT)),
            TopicSpec(self.admissions, p, week),
            TopicSpec(self.commands, 1, {"retention.ms": str(_DAY_MS)}),
            TopicSpec(self.alerts, 1, {"retention.ms": str(14 * _DAY_MS)}),
            TopicSpec(self.calendars, 1, dict(_COMPACT)),
            TopicSpec(self.pools, 1, dict(_COMPACT)),
            *self.work_specs(queues),
        ]

    def work_specs(self, queues: tuple[str, ...] | list[str]) -> list[TopicSpec]:
        return [
            TopicSpec(t, self.partitions, {"retention.ms": str(7 * _DAY_MS)})
            for t in self.work_topics(list(queues))
        ]
