"""The monitor's projection loop through an in-memory bus (tests/unit/bus.py) and an
in-memory ProjectionStore: a partition taken over resumes from the offsets PostgreSQL
holds; garbage is dead-lettered and the rest of its batch projected; a database lost
mid-batch makes it resume from the stored offsets, each event projected once; two
monitors holding one partition around a rebalance are fenced; the end of a partition,
past a transaction marker, is where later records are read from.

The monitor runs its own loop (`serve`): the group coordinator moves partitions inside a
poll (`rebalance_in_poll`), as librdkafka does, because the monitor's assignment waits
for its writer on the event loop."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import asyncpg
from confluent_kafka import Message, TopicPartition

from cronstream.services.monitor.decoding import MonitorBatch
from cronstream.services.monitor.projection import ExecutionPatch, fold
from cronstream.services.monitor.service import MonitorService
from cronstream.services.monitor.store import Fresh, ProjectionStore, unprojected
from cronstream.shared.db import query
from cronstream.shared.fast_records import EventRecord
from cronstream.shared.inbound import DLQ_ERROR, DLQ_OFFSET, DLQ_SERVICE, DLQ_TOPIC
from cronstream.shared.kafka.config import OFFSET_BEGINNING
from cronstream.shared.records import ExecutionEvent, ExecutionStatus, Heartbeat, JobDue, JobSnapshot
from cronstream.shared.settings import Settings
from cronstream.shared.topics import Topics
from tests.support import headers
from tests.unit.bus import MemoryBus, MemoryConsumerThread, clients

SETTINGS = Settings(topic_prefix="u.", topic_partitions=3)
T = SETTINGS.topics
EVENTS = T.execution_events


# -- an in-memory ProjectionStore ------------------------------------------------------------


@dataclass
class MemoryTransaction:
    """One open transaction of the memory store: the rows written in it so far, which
    exist only once it commits."""

    events: list[EventRecord] = field(default_factory=list)
    beats: list[Heartbeat] = field(default_factory=list)

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        # DAG advancement (advance.py) asks on the store's connection which of the batch's
        # jobs have DAG steps after them: none here, this store projects no definitions.
        if sql == query("dag_upstreams_among"):
            return []
        raise NotImplementedError(f"the memory store answers no other SQL: {sql[:80]}")


class MemoryStore:
    """What the monitor's loop asks of ProjectionStore (services/monitor/store.py) —
    `stored_offsets`, `transaction`, `write` — with what PostgreSQL guarantees it: a
    batch's rows and its offsets are committed together or not at all, batches are fenced
    one after the other (the offset rows' locks), and the fence is the store's own
    (`unprojected`: what lies below the stored offsets is left out). Projects execution
    events and heartbeats; anything else it refuses, rather than pretend."""

    def __init__(self, topics: Topics) -> None:
        self.topics = topics
        self.offsets: dict[tuple[str, int], int] = {}
        self.events: list[EventRecord] = []
        self.beats: list[Heartbeat] = []
        self.left_out = 0  # records of committed batches that the fence left out
        self.failures: list[Exception] = []  # the next writes raise these, halfway through
        self._lock = asyncio.Lock()

    async def stored_offsets(self) -> dict[tuple[str, int], int]:
        return dict(self.offsets)

    @asynccontextmanager
    async def transaction(self, batch: MonitorBatch) -> AsyncIterator[Fresh]:
        async with self._lock:
            open_transaction = MemoryTransaction()
            fresh = unprojected(open_transaction, batch, self.offsets, self.topics)
            yield fresh
            # COMMIT (never reached when the batch raised: nothing of it is kept)
            self.events += open_transaction.events
            self.beats += open_transaction.beats
            self.offsets.update(fresh.offsets)
            self.left_out += len(batch.events) + len(batch.beats) - len(fresh.events) - len(fresh.beats)

    async def write(self, fresh: Fresh, sanitize: bool = False) -> list[ExecutionPatch]:
        if fresh.definitions or fresh.commands or fresh.alerts or fresh.logs:
            raise NotImplementedError("the memory store projects execution events and heartbeats only")
        rows = cast(MemoryTransaction, fresh.conn)
        rows.events += [e for e, _, _ in fresh.events]
        if self.failures:
            raise self.failures.pop(0)
        rows.beats += fresh.beats
        return sorted(fold([e for e, _, _ in fresh.events], fresh.traces).values(),
                      key=lambda p: p.execution_id)

    def event_ids(self) -> Counter[uuid.UUID]:
        return Counter(e.event_id for e in self.events)


def session_lost() -> Exception:
    """What asyncpg raises when the server goes away mid-statement (the monitor's UNAVAILABLE)."""
    return asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation")


# -- the monitor on the bus ------------------------------------------------------------------


@asynccontextmanager
async def monitor(bus: MemoryBus, store: MemoryStore, instance: str = "m1"
                  ) -> AsyncIterator[tuple[MonitorService, MemoryConsumerThread]]:
    """A monitor running its loop on `bus` and `store`, with no partition yet."""
    service = MonitorService(SETTINGS, instance, clients(bus))
    consumer, _ = service.open(cast(ProjectionStore, store))
    stopping = asyncio.Event()
    loop = asyncio.create_task(service.serve(consumer, stopping))
    try:
        yield service, bus.consumer("monitor")
    finally:
        stopping.set()
        await loop
        await consumer.close()


async def until(condition: Callable[[], object], what: str) -> None:
    try:
        async with asyncio.timeout(10):
            while not condition():
                await asyncio.sleep(0.001)
    except TimeoutError:
        raise AssertionError(f"not within 10 s: {what}") from None


def event(status: ExecutionStatus = "QUEUED", job_id: str = "job") -> ExecutionEvent:
    due = JobDue(execution_id=uuid.uuid4(), job_id=job_id, run_id=uuid.uuid4(),
                 scheduled_at=datetime(2026, 11, 30, tzinfo=UTC), reason="SCHEDULE",
                 idempotency_key="k", job=JobSnapshot(handler="noop"))
    return ExecutionEvent.for_due(due, status)


def publish(bus: MemoryBus, e: ExecutionEvent, partition: int = 0) -> Message:
    return bus.append(EVENTS, e.job_id.encode(), e.to_json(), partition=partition)


def heartbeat(bus: MemoryBus) -> Message:
    beat = Heartbeat(worker_id="w1", hostname="h", status="ACTIVE", sent_at=datetime.now(UTC),
                     capacity=4)
    return bus.append(T.heartbeats, b"w1", beat.to_json(), partition=0)


def ready(service: MonitorService, component: str) -> bool:
    return service.health.ready()[1][component] == "ready"


# -- the tests -------------------------------------------------------------------------------


def test_a_partition_taken_over_resumes_from_the_offsets_postgresql_holds_not_kafkas() -> None:
    async def scenario() -> None:
        bus, store = MemoryBus.of(T), MemoryStore(T)
        older = [event() for _ in range(6)]
        for e in older:
            publish(bus, e, partition=0)
        newer = [event(), event("COMPLETED")]
        for e in newer:
            publish(bus, e, partition=1)
        # The monitor before this one projected offsets 0-3 of partition 0 and stored 4 with
        # them; its informational commit to Kafka lagged at 2. It never reached partition 1,
        # of which Kafka holds a stray offset.
        store.events, store.offsets = list(older[:4]), {(EVENTS, 0): 4}
        bus.committed.update({(EVENTS, 0): 2, (EVENTS, 1): 1})
        async with monitor(bus, store) as (service, consumer):
            consumer.rebalance_in_poll(assign=[TopicPartition(EVENTS, 0), TopicPartition(EVENTS, 1)])
            await until(lambda: len(store.events) == 8, "every event projected")
            assert consumer.lane.assigns[-1] == [(EVENTS, 0, 4), (EVENTS, 1, OFFSET_BEGINNING)], \
                "each partition from its stored offset, or its beginning where none is stored"
            assert store.event_ids() == Counter(e.event_id for e in [*older, *newer])
            assert store.offsets == {(EVENTS, 0): 6, (EVENTS, 1): 2}
            assert store.left_out == 0, "nothing projected already was read again"
            assert ready(service, "assignment")
            await until(lambda: bus.committed == {(EVENTS, 0): 6, (EVENTS, 1): 2},
                        "Kafka's offsets follow, for the lag figures")

    asyncio.run(scenario())


def test_garbage_on_execution_events_is_dead_lettered_with_its_reason_and_its_batch_projected() -> None:
    async def scenario() -> None:
        bus, store = MemoryBus.of(T), MemoryStore(T)
        first, second = event(), event("RUNNING")
        publish(bus, first)
        garbage = bus.append(EVENTS, b"job", b"\xff{not an event", partition=0)
        publish(bus, second)
        async with monitor(bus, store) as (_, consumer):
            consumer.rebalance_in_poll(assign=[TopicPartition(EVENTS, 0)])
            await until(lambda: store.offsets.get((EVENTS, 0)) == 3, "the batch committed")
        assert store.event_ids() == Counter([first.event_id, second.event_id])
        dead = bus.records(T.dead_letters)
        assert [m.value() for m in dead] == [garbage.value()], "dead-lettered once, byte for byte"
        why = headers(dead[0])
        assert (why[DLQ_TOPIC], why[DLQ_OFFSET], why[DLQ_SERVICE]) == (EVENTS, "1", "monitor")
        assert why[DLQ_ERROR], "with the reason it could not be read"

    asyncio.run(scenario())


def test_a_database_lost_mid_batch_resumes_from_the_stored_offsets_and_projects_each_event_once() -> None:
    async def scenario() -> None:
        bus, store = MemoryBus.of(T), MemoryStore(T)
        events = [event() for _ in range(4)]
        publish(bus, events[0])
        async with monitor(bus, store) as (service, consumer):
            consumer.rebalance_in_poll(assign=[TopicPartition(EVENTS, 0)])
            await until(lambda: store.offsets == {(EVENTS, 0): 1}, "the first batch committed")
            store.failures.append(session_lost())
            publish(bus, events[1])
            publish(bus, events[2])
            await until(lambda: not ready(service, "database"), "the loss noticed")
            assert store.offsets == {(EVENTS, 0): 1} and len(store.events) == 1, \
                "the lost batch left neither rows nor offsets"
            publish(bus, events[3])  # the next batch: the writer asks for the resync
            await until(lambda: store.offsets == {(EVENTS, 0): 4}, "everything committed")
            assert ready(service, "database")
            assert consumer.lane.assigns[-1] == [(EVENTS, 0, 1)], "rewound to the stored offset"
        assert store.event_ids() == Counter(e.event_id for e in events), "each event once"
        assert store.left_out == 0

    asyncio.run(scenario())


def test_two_monitors_holding_one_partition_around_a_rebalance_project_each_event_once() -> None:
    async def scenario() -> None:
        bus, store = MemoryBus.of(T), MemoryStore(T)
        events = [event() for _ in range(5)]
        for e in events[:3]:
            publish(bus, e)
        p0 = TopicPartition(EVENTS, 0)
        async with monitor(bus, store, "m1") as (first, old), monitor(bus, store, "m2") as (second, new):
            old.rebalance_in_poll(assign=[p0])
            await until(lambda: store.offsets == {(EVENTS, 0): 3}, "the first monitor's batch")
            # The group gives the partition to the second monitor; the first has not heard
            # of its revocation yet (a zombie for a moment): both read what comes next.
            new.rebalance_in_poll(assign=[p0])
            await until(lambda: ready(second, "assignment"), "the second monitor assigned")
            publish(bus, events[3])
            publish(bus, events[4])
            await until(lambda: store.left_out == 2, "the second copy of the batch fenced out")
            old.rebalance_in_poll(revoke=[p0])
            await until(lambda: not ready(first, "assignment"), "the first monitor revoked")
        assert store.event_ids() == Counter(e.event_id for e in events), "each event once"
        assert store.offsets == {(EVENTS, 0): 5}
        assert first.projected + second.projected == 5

    asyncio.run(scenario())


def test_the_end_of_a_partition_past_a_transaction_marker_is_where_later_records_are_read() -> None:
    async def scenario() -> None:
        bus, store = MemoryBus.of(T), MemoryStore(T)
        early, late = event(), event("RUNNING")
        publish(bus, early)
        bus.marker(EVENTS, 0)  # the worker's transaction's commit marker: offset 1
        heartbeat(bus)
        hb = TopicPartition(T.heartbeats, 0)
        async with monitor(bus, store) as (service, consumer):
            assert not await service._caught_up_on_heartbeats(), "not before it owns heartbeats"
            consumer.rebalance_in_poll(assign=[TopicPartition(EVENTS, 0), TopicPartition(EVENTS, 1), hb])
            await until(lambda: store.offsets.get((T.heartbeats, 0)) == 1 and store.events,
                        "both partitions read to their end")
            assert store.offsets == {(EVENTS, 0): 1, (T.heartbeats, 0): 1}, \
                "the next offset after each last record; nothing for the empty partition"
            assert await service._caught_up_on_heartbeats()
            publish(bus, late)  # offset 2, after the marker
            await until(lambda: store.offsets[(EVENTS, 0)] == 3, "the later record committed")
        assert store.event_ids() == Counter([early.event_id, late.event_id])
        assert [b.worker_id for b in store.beats] == ["w1"]

    asyncio.run(scenario())
