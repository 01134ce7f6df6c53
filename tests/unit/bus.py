"""A small in-memory bus behind the seams our services use (in the spirit of
procrastinate's InMemoryConnector and dramatiq's StubBroker): topics of partitions of
records, a consumer group's committed offsets, and transactions that append records and
commit offsets together — or, when a test says so, abort, or hang with an outcome the
service must read back. Fakes of *our* interfaces (ConsumerThread and its OnLane view,
TransactionalProducer), never of Kafka itself: the services reach Kafka only through
those (tests/unit/test_seams.py), and the real broker stays in the integration tests.

What of Kafka's behaviour the services rely on, the bus keeps: a record's offset is its
place in its partition, and control records (transaction markers, `marker`) take offsets
too without ever being delivered, so the end of a partition (its high watermark) can lie
past its last record; a consumer's position moves past them once it read what is left;
a reader with `enable.partition.eof` gets an end-of-partition event each time it reaches
an end; records carry a timestamp, which `offsets_for_times` looks up.
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError, Message, TopicPartition

from cronstream.shared.clients import KafkaClients
from cronstream.shared.kafka.reading import position
from cronstream.shared.producers import OutRecord, TransactionAborted, TransactionOutcomeUnknown
from cronstream.shared.topics import Topics


@dataclass
class MemoryBus:
    partitions: int = 3
    logs: dict[tuple[str, int], list[Message]] = field(default_factory=dict)
    committed: dict[tuple[str, int], int] = field(default_factory=dict)
    # group -> the client ids of its members (what the coordinator would list).
    members: dict[str, set[str]] = field(default_factory=dict)
    # Topics with a partition count of their own (`of`: the counts `cronstream init` gives).
    sized: dict[str, int] = field(default_factory=dict)
    # The next offset of each partition: past its last record, and past its markers.
    ends: dict[tuple[str, int], int] = field(default_factory=dict)
    # The most records one consume returns (a fetch's size); None: whatever is there.
    fetch_max: int | None = None
    # Every consumer made on the bus by `clients`, in order.
    consumers: list[MemoryConsumerThread] = field(default_factory=list)

    @classmethod
    def of(cls, topics: Topics, fetch_max: int | None = None) -> MemoryBus:
        """A bus whose topics have the partitions `cronstream init` gives them (one for
        `alerts`, `job-definitions`, `heartbeats`...; shared/topics.py)."""
        return cls(partitions=topics.partitions, sized={s.name: s.partitions for s in topics.specs()},
                   fetch_max=fetch_max)

    def partition_count(self, topic: str) -> int:
        return self.sized.get(topic, self.partitions)

    def partition_of(self, key: bytes | None, topic: str = "") -> int:
        return zlib.crc32(key or b"") % self.partition_count(topic)

    def append(self, topic: str, key: bytes | None, value: bytes | None,
               headers: list[tuple[str, bytes]] | None = None, partition: int | None = None,
               timestamp_ms: int | None = None) -> Message:
        """A record at the end of its partition, stamped `timestamp_ms` (default: now, as
        a producer stamps CreateTime)."""
        partition = self.partition_of(key, topic) if partition is None else partition
        at = time.time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms
        msg = Message(topic=topic, partition=partition, offset=self.end(topic, partition), key=key,
                      value=value, headers=list(headers or []), timestamp=(TIMESTAMP_CREATE_TIME, at))
        self.logs.setdefault((topic, partition), []).append(msg)
        self.ends[(topic, partition)] = self.end(topic, partition) + 1
        return msg

    def marker(self, topic: str, partition: int) -> None:
        """A control record (a transaction's commit or abort marker): it takes the next
        offset, and no consumer ever gets it."""
        self.ends[(topic, partition)] = self.end(topic, partition) + 1

    def end(self, topic: str, partition: int) -> int:
        """The partition's high watermark."""
        return self.ends.get((topic, partition), 0)

    def records(self, topic: str) -> list[Message]:
        return [m for (t, _), log in sorted(self.logs.items()) if t == topic for m in log]

    def values(self, topic: str) -> list[dict[str, Any]]:
        return [json.loads(v) for m in self.records(topic) if (v := m.value()) is not None]

    def read(self, topic: str, partition: int, start: int) -> list[Message]:
        """The partition's records from offset `start` on."""
        return [m for m in self.logs.get((topic, partition), []) if position(m)[2] >= start]

    def consumer(self, name: str) -> MemoryConsumerThread:
        """The last consumer a service made under `name` (ConsumerThread's name)."""
        return [c for c in self.consumers if c.name == name][-1]


class MemoryLane:
    """The consumer's lane view (shared/kafka/consumer.py: OnLane) on the bus: what a
    rebalance callback and an `on_lane` call get."""

    def __init__(self, bus: MemoryBus, eof: bool = False) -> None:
        self.bus = bus
        self.eof = eof  # `enable.partition.eof`: an event at each end reached
        self.seeks: list[tuple[str, int, int]] = []
        self.assigns: list[list[tuple[str, int, int]]] = []  # each assignment, at its offsets
        self.assigned: list[TopicPartition] = []
        self.positions: dict[tuple[str, int], int] = {}
        self.paused: set[tuple[str, int]] = set()
        self.at_end: set[tuple[str, int]] = set()  # its end-of-partition event given already
        self.on_pause: Callable[[bool], None] = lambda paused: None

    def take(self, n: int) -> list[Message]:
        """Up to `n` records of the assigned partitions that are not paused, from each
        one's position (where it was assigned at, else its committed offset). A partition
        read to its last record is at its end, past any markers there; a reader with
        `eof` then gets an end-of-partition event, once until it reads more."""
        taken: list[Message] = []
        for tp in self.assigned:
            key = (tp.topic, tp.partition)
            if key in self.paused or len(taken) >= n:
                continue
            start = self.positions.get(key, max(0, self.bus.committed.get(key, 0)))
            left = self.bus.read(tp.topic, tp.partition, start)
            records = left[:n - len(taken)]
            end = self.bus.end(tp.topic, tp.partition)
            self.positions[key] = max(start, end) if len(records) == len(left) else position(records[-1])[2] + 1
            taken.extend(records)
            if records:
                self.at_end.discard(key)
            if self.eof and self.positions[key] >= end and key not in self.at_end:
                self.at_end.add(key)
                taken.append(Message(topic=tp.topic, partition=tp.partition, offset=self.positions[key],
                                     error=KafkaError(KafkaError._PARTITION_EOF)))
        return taken

    def assignment(self) -> list[TopicPartition]:
        return list(self.assigned)

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        """Like librdkafka: a partition fetches from the offset it is assigned at, else
        from its committed offset again; one paused before it was revoked is still paused
        (librdkafka #1849)."""
        self.assigns.append([(tp.topic, tp.partition, tp.offset) for tp in partitions])
        self.assigned = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        for tp in partitions:
            key = (tp.topic, tp.partition)
            self.positions.pop(key, None)
            self.at_end.discard(key)
            if tp.offset >= 0:
                self.positions[key] = tp.offset
            elif tp.offset == -2:  # the beginning
                self.positions[key] = 0

    def unassign(self) -> None:
        self.assigned = []

    def incremental_assign(self, partitions: Sequence[TopicPartition]) -> None:
        kept = [tp for tp in self.assigned
                if (tp.topic, tp.partition) not in {(p.topic, p.partition) for p in partitions}]
        current = {(tp.topic, tp.partition): self.positions.get((tp.topic, tp.partition)) for tp in kept}
        self.assign([*kept, *partitions])
        for key, at in current.items():
            if at is not None:
                self.positions[key] = at

    def incremental_unassign(self, partitions: Sequence[TopicPartition]) -> None:
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self.assigned = [tp for tp in self.assigned if (tp.topic, tp.partition) not in gone]

    def pause(self, partitions: Sequence[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in partitions}
        self.on_pause(True)

    def resume(self, partitions: Sequence[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in partitions}
        self.on_pause(False)

    def seek(self, tp: TopicPartition) -> None:
        self.seeks.append((tp.topic, tp.partition, tp.offset))
        self.positions[(tp.topic, tp.partition)] = max(0, tp.offset)
        self.at_end.discard((tp.topic, tp.partition))

    def committed(self, partitions: Sequence[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.bus.committed.get((tp.topic, tp.partition), -1001))
                for tp in partitions]

    def position(self, partitions: Sequence[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.positions.get((tp.topic, tp.partition), -1001))
                for tp in partitions]

    def watermarks(self, partition: TopicPartition, timeout: float = -1,
                   cached: bool = False) -> tuple[int, int]:
        return 0, self.bus.end(partition.topic, partition.partition)

    def commit(self, offsets: Sequence[TopicPartition], asynchronous: bool = False) -> None:
        for tp in offsets:
            self.bus.committed[(tp.topic, tp.partition)] = tp.offset

    def seek_to_committed(self, partitions: Sequence[TopicPartition] | None = None,
                          from_start: int = -2) -> list[TopicPartition]:
        committed = self.committed(self.assignment() if partitions is None else partitions)
        for tp in committed:
            tp.offset = tp.offset if tp.offset >= 0 else from_start
            self.seek(tp)
        return committed


Callback = Callable[[Any, list[TopicPartition]], None]


@dataclass(frozen=True)
class GroupMove:
    """Partitions the group moves in one rebalance."""

    assign: Sequence[TopicPartition] = ()
    revoke: Sequence[TopicPartition] = ()
    lost: bool = False


class MemoryConsumerThread:
    """A ConsumerThread whose calls run at once, on the bus. `rebalance` plays the group
    coordinator: it calls the callbacks the service subscribed with; `rebalance_in_poll`
    does it inside the next `consume`, on a thread of its own, as librdkafka does on the
    consumer's lane — for callbacks that wait on the service's event loop."""

    def __init__(self, bus: MemoryBus, name: str = "memory", eof: bool = False) -> None:
        self.bus = bus
        self.name = name
        self.lane = MemoryLane(bus, eof)
        self.subscribed: list[str] = []
        self.callbacks: dict[str, Callback] = {}
        self.pending: list[GroupMove] = []
        self.consumes = 0
        self.closed = False

    async def on_lane(self, fn: Callable[[Any], Any]) -> Any:
        return fn(self.lane)

    def run_sync(self, fn: Callable[[Any], Any]) -> Any:
        return fn(self.lane)

    async def subscribe(self, topics: Sequence[str], on_assign: Callback | None = None,
                        on_revoke: Callback | None = None, on_lost: Callback | None = None) -> None:
        self.subscribed = list(topics)
        self.callbacks = {name: cb for name, cb in
                          (("assign", on_assign), ("revoke", on_revoke), ("lost", on_lost)) if cb}

    def rebalance(self, assign: Sequence[TopicPartition] = (), revoke: Sequence[TopicPartition] = (),
                  lost: bool = False) -> None:
        """The group moved partitions: revoke (or lose) some, then assign others."""
        if revoke:
            self.callbacks["lost" if lost else "revoke"](self.lane, list(revoke))
        if assign:
            self.callbacks["assign"](self.lane, [TopicPartition(tp.topic, tp.partition, tp.offset)
                                                 for tp in assign])

    def rebalance_in_poll(self, assign: Sequence[TopicPartition] = (),
                          revoke: Sequence[TopicPartition] = (), lost: bool = False) -> None:
        """The group moves partitions during the next `consume`."""
        self.pending.append(GroupMove(assign, revoke, lost))

    def group_metadata(self) -> str:
        return "memory-group"

    async def consume(self, max_messages: int, timeout: float) -> list[Message]:
        self.consumes += 1
        while self.pending:
            moved = self.pending.pop(0)
            await asyncio.to_thread(self.rebalance, moved.assign, moved.revoke, moved.lost)
        taken = self.lane.take(min(max_messages, self.bus.fetch_max or max_messages))
        if not taken:
            await asyncio.sleep(0)  # a poll that waited (without the wait)
        return taken

    async def assign(self, partitions: Sequence[TopicPartition]) -> None:
        self.lane.assign(partitions)

    async def unassign(self) -> None:
        self.lane.unassign()

    async def assignment(self) -> list[TopicPartition]:
        return self.lane.assignment()

    async def committed(self, partitions: Sequence[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        return self.lane.committed(partitions)

    async def position(self, partitions: Sequence[TopicPartition]) -> list[TopicPartition]:
        return self.lane.position(partitions)

    async def watermarks(self, partition: TopicPartition, timeout: float = -1,
                         cached: bool = False) -> tuple[int, int]:
        return self.lane.watermarks(partition)

    async def partitions(self, topic: str, timeout: float = -1) -> list[int] | None:
        return list(range(self.bus.partition_count(topic)))

    async def offsets_for_times(self, partitions: Sequence[TopicPartition],
                                timeout: float = -1) -> list[TopicPartition]:
        """For each partition (its `offset` a time in epoch ms): the first record stamped
        at or after it, or -1 (the end) where none is; for -1 (Kafka's "latest"), the end."""
        def first_since(tp: TopicPartition) -> int:
            if tp.offset == -1:
                return self.bus.end(tp.topic, tp.partition)
            return next((position(m)[2] for m in self.bus.logs.get((tp.topic, tp.partition), [])
                         if m.timestamp()[1] >= tp.offset), -1)

        return [TopicPartition(tp.topic, tp.partition, first_since(tp)) for tp in partitions]

    async def close(self) -> None:
        self.closed = True


@dataclass
class MemoryProducer:
    """A TransactionalProducer on the bus. `fail_next`: "abort" (nothing visible),
    "unknown-committed" or "unknown-lost" (it hung; it did, or did not, commit)."""

    bus: MemoryBus
    fail_next: str | None = None
    transactions: int = 0

    async def init(self) -> None:
        return None

    async def commit(self, records: Iterable[OutRecord], offsets: list[TopicPartition] | None = None,
                     group_metadata: Callable[[], Any] | None = None, attempts: int = 3) -> None:
        failure, self.fail_next = self.fail_next, None
        if failure == "abort":
            raise TransactionAborted("aborted (memory bus)")
        if failure == "unknown-lost":
            raise TransactionOutcomeUnknown("hung and lost (memory bus)")
        for record in records:
            self.bus.append(record.topic, record.key, record.value, record.headers, record.partition)
        for tp in offsets or []:
            self.bus.committed[(tp.topic, tp.partition)] = tp.offset
        self.transactions += 1
        if failure == "unknown-committed":
            raise TransactionOutcomeUnknown("hung after committing (memory bus)")

    async def reset(self) -> None:
        return None

    async def close(self) -> None:
        return None


@dataclass
class MemoryIdempotentProducer:
    """An IdempotentProducer on the bus: every record is there at once."""

    bus: MemoryBus

    def produce(self, record: OutRecord, on_delivery: Any = None) -> None:
        self.bus.append(record.topic, record.key, record.value, record.headers, record.partition)

    def poll(self, timeout: float = 0) -> None:
        return None

    def flush(self, timeout: float = 30.0) -> None:
        return None

    async def flush_async(self, timeout: float = 10.0) -> None:
        return None


def clients(bus: MemoryBus, transactional: Callable[[MemoryBus], MemoryProducer] = MemoryProducer
            ) -> KafkaClients:
    """The Kafka clients a service makes (shared/clients.py), on `bus`."""
    def consumer(conf: dict[str, Any], name: str) -> Any:
        bus.consumers.append(MemoryConsumerThread(bus, name, bool(conf.get("enable.partition.eof"))))
        return bus.consumers[-1]

    return KafkaClients(
        consumer=consumer,
        transactional=lambda conf: cast(Any, transactional(bus)),
        idempotent=lambda conf: cast(Any, MemoryIdempotentProducer(bus)),
        ensure_topics=lambda settings, specs: [],
        topic_names=lambda settings: sorted({t for t, _p in bus.logs}),
        latest_offsets=lambda settings, topic: [bus.end(topic, p) for p in range(bus.partition_count(topic))],
        group_members=lambda settings, group: sorted(bus.members.get(group, ())),
        partition_counts=lambda settings, topics: {t: bus.partition_count(t) for t in topics},
    )
