"""A small in-memory bus behind the seams our services use (in the spirit of
procrastinate's InMemoryConnector and dramatiq's StubBroker): topics of partitions of
records, a consumer group's committed offsets, and transactions that append records and
commit offsets together — or, when a test says so, abort, or hang with an outcome the
service must read back. Fakes of *our* interfaces (ConsumerThread and its OnLane view,
TransactionalProducer), never of Kafka itself: the services reach Kafka only through
those (tests/unit/test_seams.py), and the real broker stays in the integration tests.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka import Message, TopicPartition

from cronstream.shared.clients import KafkaClients
from cronstream.shared.producers import OutRecord, TransactionAborted, TransactionOutcomeUnknown


@dataclass
class MemoryBus:
    partitions: int = 3
    logs: dict[tuple[str, int], list[Message]] = field(default_factory=dict)
    committed: dict[tuple[str, int], int] = field(default_factory=dict)
    # group -> the client ids of its members (what the coordinator would list).
    members: dict[str, set[str]] = field(default_factory=dict)

    def partition_of(self, key: bytes | None) -> int:
        return zlib.crc32(key or b"") % self.partitions

    def append(self, topic: str, key: bytes | None, value: bytes | None,
               headers: list[tuple[str, bytes]] | None = None, partition: int | None = None) -> Message:
        partition = self.partition_of(key) if partition is None else partition
        log = self.logs.setdefault((topic, partition), [])
        msg = Message(topic=topic, partition=partition, offset=len(log), key=key, value=value,
                      headers=list(headers or []))
        log.append(msg)
        return msg

    def records(self, topic: str) -> list[Message]:
        return [m for (t, _), log in sorted(self.logs.items()) if t == topic for m in log]

    def values(self, topic: str) -> list[dict[str, Any]]:
        return [json.loads(v) for m in self.records(topic) if (v := m.value()) is not None]

    def read(self, topic: str, partition: int, start: int) -> list[Message]:
        return self.logs.get((topic, partition), [])[start:]


class MemoryLane:
    """The consumer's lane view (shared/kafka/consumer.py: OnLane) on the bus: what a
    rebalance callback and an `on_lane` call get."""

    def __init__(self, bus: MemoryBus) -> None:
        self.bus = bus
        self.seeks: list[tuple[str, int, int]] = []
        self.assigned: list[TopicPartition] = []
        self.positions: dict[tuple[str, int], int] = {}
        self.paused: set[tuple[str, int]] = set()
        self.on_pause: Callable[[bool], None] = lambda paused: None

    def take(self, n: int) -> list[Message]:
        """Up to `n` records of the assigned partitions that are not paused, from each
        one's position (where it was assigned at, else its committed offset)."""
        taken: list[Message] = []
        for tp in self.assigned:
            key = (tp.topic, tp.partition)
            if key in self.paused or len(taken) >= n:
                continue
            start = self.positions.get(key, max(0, self.bus.committed.get(key, 0)))
            records = self.bus.read(tp.topic, tp.partition, start)[:n - len(taken)]
            self.positions[key] = start + len(records)
            taken.extend(records)
        return taken

    def assignment(self) -> list[TopicPartition]:
        return list(self.assigned)

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        """Like librdkafka: a partition fetches from the offset it is assigned at, else
        from its committed offset again; one paused before it was revoked is still paused
        (librdkafka #1849)."""
        self.assigned = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        for tp in partitions:
            key = (tp.topic, tp.partition)
            self.positions.pop(key, None)
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

    def committed(self, partitions: Sequence[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.bus.committed.get((tp.topic, tp.partition), -1001))
                for tp in partitions]

    def position(self, partitions: Sequence[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.positions.get((tp.topic, tp.partition), -1001))
                for tp in partitions]

    def watermarks(self, partition: TopicPartition, timeout: float = -1,
                   cached: bool = False) -> tuple[int, int]:
        return 0, len(self.bus.logs.get((partition.topic, partition.partition), []))

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


class MemoryConsumerThread:
    """A ConsumerThread whose calls run at once, on the bus. `rebalance` plays the group
    coordinator: it calls the callbacks the service subscribed with."""

    def __init__(self, bus: MemoryBus) -> None:
        self.bus = bus
        self.lane = MemoryLane(bus)
        self.subscribed: list[str] = []
        self.callbacks: dict[str, Callback] = {}
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

    def group_metadata(self) -> str:
        return "memory-group"

    async def consume(self, max_messages: int, timeout: float) -> list[Message]:
        taken = self.lane.take(max_messages)
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
        found = sorted(p for (t, p) in self.bus.logs if t == topic)
        return found or list(range(self.bus.partitions))

    async def offsets_for_times(self, partitions: Sequence[TopicPartition],
                                timeout: float = -1) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, -1) for tp in partitions]

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

    async def flush_async(self, timeout: float = 10.0) -> None:
        return None


def clients(bus: MemoryBus, transactional: Callable[[MemoryBus], MemoryProducer] = MemoryProducer
            ) -> KafkaClients:
    """The Kafka clients a service makes (shared/clients.py), on `bus`."""
    return KafkaClients(
        consumer=lambda conf, name: cast(Any, MemoryConsumerThread(bus)),
        transactional=lambda conf: cast(Any, transactional(bus)),
        idempotent=lambda conf: cast(Any, MemoryIdempotentProducer(bus)),
        ensure_topics=lambda settings, specs: [],
        topic_names=lambda settings: sorted({t for t, _p in bus.logs}),
        latest_offsets=lambda settings, topic: [len(bus.logs.get((topic, p), []))
                                                for p in range(bus.partitions)],
        group_members=lambda settings, group: sorted(bus.members.get(group, ())),
        partition_counts=lambda settings, topics: dict.fromkeys(topics, bus.partitions),
    )
