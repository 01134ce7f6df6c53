"""The worker's turn through an in-memory bus (tests/unit/bus.py): what its heartbeats
list while a start is being committed, and when a backlog pauses its partitions. The monitor re-queues a RUNNING execution that a
heartbeat sent after its start does not list; a start commit can take seconds (a cluster
losing its leader), so an execution must be listed from the moment its RUNNING event may
commit — or it runs twice."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import Message, TopicPartition

from cronstream.services.worker.heartbeats import Heartbeats
from cronstream.services.worker.runner import CancelSignal, Outcome
from cronstream.services.worker.service import WorkerService
from cronstream.shared.fast_records import DueRecord
from cronstream.shared.kafka.config import OFFSET_BEGINNING
from cronstream.shared.producers import OutRecord
from cronstream.shared.records import JobDue, JobSnapshot
from cronstream.shared.settings import Settings
from tests.unit.bus import MemoryBus, MemoryIdempotentProducer, MemoryProducer, clients

SETTINGS = Settings(topic_prefix="u.", topic_partitions=3, worker_id="w1")
T = SETTINGS.topics
WORK = T.work("normal", "default")


class HeldRunner:
    """Handlers that run until the test lets them finish."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started: list[uuid.UUID] = []

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def run_now(self, due: DueRecord, progress: Any, trace: Any = None, lines: Any = None
                ) -> Outcome | None:
        return None  # every run is held: awaited

    async def run(self, due: DueRecord, progress: Any, cancel: CancelSignal,
                  trace: Any = None, lines: Any = None) -> Outcome:
        self.started.append(due.execution_id)
        await self.release.wait()
        return Outcome("COMPLETED")


class SlowProducer(MemoryProducer):
    """A producer whose next commit waits at the gate (a slow broker), then commits or
    aborts as `fail_next` says."""

    def __init__(self, bus: MemoryBus) -> None:
        super().__init__(bus)
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()

    async def commit(self, records: Iterable[OutRecord], offsets: list[TopicPartition] | None = None,
                     group_metadata: Callable[[], Any] | None = None, attempts: int = 3) -> None:
        self.waiting.set()
        await self.gate.wait()
        await super().commit(records, offsets, group_metadata, attempts)


def worker(bus: MemoryBus, concurrency: int = SETTINGS.worker_concurrency
           ) -> tuple[WorkerService, SlowProducer, HeldRunner]:
    """A worker on `bus` (its clients opened, none started) holding partition 0 of WORK."""
    runner = HeldRunner()
    producers: list[SlowProducer] = []

    def transactional(on: MemoryBus) -> SlowProducer:
        producers.append(SlowProducer(on))
        return producers[-1]

    settings = SETTINGS.model_copy(update={"worker_concurrency": concurrency})
    service = WorkerService(settings, runner, clients(bus, transactional))
    service.open()
    consumer(service).assigned = [TopicPartition(WORK, 0)]
    return service, producers[0], runner


def consumer(service: WorkerService) -> Any:
    """The bus consumer the worker made (tests/unit/bus.py)."""
    return service._consumer.lane  # type: ignore[union-attr]


def due_on(bus: MemoryBus, partition: int, at: datetime = datetime(2026, 11, 30, tzinfo=UTC),
           topic: str = WORK) -> tuple[JobDue, Message]:
    """A JobDue scheduled `at`, appended to `topic`'s `partition`, and its record."""
    due = JobDue(execution_id=uuid.uuid4(), job_id="job", run_id=uuid.uuid4(),
                 scheduled_at=at, reason="SCHEDULE",
                 idempotency_key="k", job=JobSnapshot(handler="noop"))
    return due, bus.append(topic, b"job", due.to_json(), partition=partition)


def buffer_one(bus: MemoryBus, service: WorkerService) -> JobDue:
    due, msg = due_on(bus, 0)
    service.intake.add([msg])
    return due


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(20):
        while not condition():
            await asyncio.sleep(0.001)


async def stop(service: WorkerService, loop: asyncio.Task[None], stopping: asyncio.Event,
               runner: HeldRunner) -> None:
    """End the poll loop and let every held handler return."""
    stopping.set()
    runner.release.set()
    await asyncio.wait_for(loop, 5)
    for task in [r.task for r in service.slots if r.task]:
        await asyncio.wait_for(task, 5)


def test_an_execution_is_listed_while_its_start_commits_and_after() -> None:
    async def scenario() -> None:
        bus = MemoryBus()
        service, producer, runner = worker(bus)
        due = buffer_one(bus, service)
        turn = asyncio.create_task(service._turn(starting=True))
        await asyncio.wait_for(producer.waiting.wait(), 5)
        # The commit is in flight: a heartbeat now must already claim the execution.
        assert service.listed() == [due.execution_id]
        producer.gate.set()
        await asyncio.wait_for(turn, 5)
        assert service.listed() == [due.execution_id]  # running now
        await asyncio.sleep(0)  # let the handler task begin
        assert runner.started == [due.execution_id]
        assert [e["status"] for e in bus.values(T.execution_events)] == ["RUNNING"]
        runner.release.set()
        for task in [r.task for r in service.slots if r.task]:
            await asyncio.wait_for(task, 5)

    asyncio.run(scenario())


def test_a_start_whose_commit_aborts_is_no_longer_listed_and_never_runs() -> None:
    async def scenario() -> None:
        bus = MemoryBus()
        service, producer, runner = worker(bus)
        due = buffer_one(bus, service)
        producer.fail_next = "abort"
        turn = asyncio.create_task(service._turn(starting=True))
        await asyncio.wait_for(producer.waiting.wait(), 5)
        assert service.listed() == [due.execution_id]
        producer.gate.set()
        await asyncio.wait_for(turn, 5)
        assert service.listed() == []
        assert runner.started == []
        assert bus.values(T.execution_events) == []
        # Nothing committed: the partition rewinds to its committed position (the
        # beginning) and the record is read again.
        assert consumer(service).seeks == [(WORK, 0, OFFSET_BEGINNING)]
        assert len(service.intake) == 0

    asyncio.run(scenario())


def test_a_backlog_does_not_pause_the_partitions_only_stalled_handlers_do() -> None:
    """Pausing makes librdkafka drop what it prefetched, and resuming fetches it again: a
    worker that paused whenever its buffer filled refetched its backlog over and over and
    collapsed under it. A full buffer takes one record per turn instead; only handlers that
    stall (the buffer at twice its limit) pause the partitions, until it is half empty."""
    async def scenario() -> None:
        bus = MemoryBus()
        service, producer, runner = worker(bus)
        producer.gate.set()
        # A smaller buffer than a worker's own (the same rules): slots refill a turn at a
        # time, SLOT_BOUND_TURN_GAP_SECONDS apart, so draining 1,000 would take seconds.
        limit = service.intake.limit = 100
        service.intake.pause_limit = 2 * limit
        for _ in range(2 * limit + 600):
            due_on(bus, 0)
        changes: list[tuple[bool, int]] = []
        consumer(service).on_pause = lambda paused: changes.append((paused, len(service.intake)))
        stopping = asyncio.Event()
        loop = asyncio.create_task(service._poll_loop(stopping))

        # Every slot busy with a handler that does not return: the buffer fills, and only
        # at twice its limit do the partitions pause.
        await until(lambda: bool(changes))
        assert changes[0] == (True, 2 * limit)
        assert len(runner.started) == service.capacity
        # The handlers return: the buffer drains, and the partitions resume once it is
        # half empty.
        runner.release.set()
        await until(lambda: len(changes) > 1)
        assert changes[1][0] is False and changes[1][1] <= limit // 2
        await stop(service, loop, stopping, runner)

    asyncio.run(scenario())


def test_partitions_given_back_by_a_rebalance_are_fetched_again_after_a_pause() -> None:
    """librdkafka keeps a partition paused through its revocation and re-assignment (the
    bus does too). Stalled handlers pause the worker; a rebalance revokes its partitions
    (emptying its buffer, so it resumes while it holds none) and gives one back: the
    worker must fetch from it. Before the fix it never did — in a benchmark, one worker
    of two sat idle for the whole run with its partitions' backlog untouched."""
    async def scenario() -> None:
        bus = MemoryBus()
        service, producer, runner = worker(bus)
        producer.gate.set()
        bus_consumer = consumer(service)
        both = [TopicPartition(WORK, 0), TopicPartition(WORK, 1)]
        bus_consumer.assign(both)
        limit = service.intake.limit
        for i in range(2 * limit + 600):
            due_on(bus, i % 2)
        stopping = asyncio.Event()
        loop = asyncio.create_task(service._poll_loop(stopping))

        await until(lambda: service.paused)  # every slot held, the buffer at 2 x limit
        service._on_revoke(bus_consumer, both)
        await until(lambda: not service.paused)  # the buffer emptied: resumed, holding none
        service._on_assign(bus_consumer, [TopicPartition(WORK, 0)])
        await until(lambda: len(service.intake) > 0)
        assert service.intake.partitions() == {(WORK, 0)}
        await stop(service, loop, stopping, runner)

    asyncio.run(scenario())


def test_a_fire_committed_ahead_starts_at_its_scheduled_time_not_before() -> None:
    """The scheduler commits fires up to `scheduler_fire_ahead_ms` early (decision 0027).
    A worker holds such a record until its scheduled_at, and what follows it in its
    partition waits behind it (so the partition's offsets commit in order); due records of
    other partitions and tiers start at once."""
    async def scenario() -> None:
        bus = MemoryBus()
        service, producer, runner = worker(bus)
        producer.gate.set()
        high = T.work("high", "default")
        consumer(service).assign([TopicPartition(WORK, 0), TopicPartition(WORK, 1),
                                  TopicPartition(high, 0)])
        at = datetime.now(UTC) + timedelta(milliseconds=400)
        ahead, _ = due_on(bus, 0, at)
        behind, _ = due_on(bus, 0)  # due long ago, after the held one in its partition
        other, _ = due_on(bus, 1)  # due, in another partition of the same tier
        urgent, _ = due_on(bus, 0, topic=high)
        stopping = asyncio.Event()
        loop = asyncio.create_task(service._poll_loop(stopping))

        await until(lambda: len(runner.started) == 2)
        assert runner.started == [urgent.execution_id, other.execution_id]
        assert datetime.now(UTC) < at  # the held record has not started: its time is to come
        assert (WORK, 0) not in bus.committed  # nor is its partition's offset committed
        assert bus.committed[(WORK, 1)] == 1
        await until(lambda: len(runner.started) == 4)
        assert runner.started[2:] == [ahead.execution_id, behind.execution_id]
        started = {e["execution_id"]: e["started_at"] for e in bus.values(T.execution_events)
                   if e["status"] == "RUNNING"}
        assert datetime.fromisoformat(started[str(ahead.execution_id)]) >= at
        assert bus.committed[(WORK, 0)] == 2
        await stop(service, loop, stopping, runner)

    asyncio.run(scenario())


def test_held_records_coming_due_one_by_one_start_in_turns_not_one_each() -> None:
    """Fires committed ahead arrive before their time and come due one after another (jobs
    spread over the second). Each must start at or after its scheduled_at — and a turn
    starts every record due by then: a transaction costs the broker milliseconds whatever
    it holds, so one per record as it comes due would cost a transaction per execution."""
    async def scenario() -> None:
        bus = MemoryBus()
        service, producer, runner = worker(bus, concurrency=64)
        producer.gate.set()
        runner.release.set()  # handlers return at once
        first = datetime.now(UTC) + timedelta(milliseconds=100)
        spread = timedelta(milliseconds=300)
        count = 60  # one due every 5 ms
        dues = [due_on(bus, 0, first + spread * i / count)[0] for i in range(count)]
        stopping = asyncio.Event()
        loop = asyncio.create_task(service._poll_loop(stopping))

        await until(lambda: len(runner.started) == count)
        assert runner.started == [d.execution_id for d in dues]  # in offset order
        started = {e["execution_id"]: datetime.fromisoformat(e["started_at"])
                   for e in bus.values(T.execution_events) if e["status"] == "RUNNING"}
        assert all(started[str(d.execution_id)] >= d.scheduled_at for d in dues)
        # 60 fires, a claim and an end each: far fewer transactions than records.
        assert producer.transactions <= count // 4
        await stop(service, loop, stopping, runner)

    asyncio.run(scenario())


class QuickRunner(HeldRunner):
    """Handlers that return at their first await (short handlers of a pool), each
    noting how many ran at once."""

    def __init__(self) -> None:
        super().__init__()
        self.running = 0
        self.most = 0

    async def run(self, due: DueRecord, progress: Any, cancel: CancelSignal,
                  trace: Any = None, lines: Any = None) -> Outcome:
        self.started.append(due.execution_id)
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0.001)
        self.running -= 1
        return Outcome("COMPLETED")


def test_short_handlers_keep_every_slot_busy_between_turns() -> None:
    """`--concurrency` is how many handlers run at once, not how many start per turn: a
    worker of 2 slots used to start at most 2 executions a turn (80 a second at the
    default 8 slots and 100 ms turns). It claims ahead what its slots will run before the
    turn after next and starts each as a slot frees, without a transaction."""
    async def scenario() -> None:
        bus = MemoryBus()
        service, producer, _ = worker(bus, concurrency=2)
        runner = service.runner = QuickRunner()
        producer.gate.set()
        count = 300
        for _ in range(count):
            due_on(bus, 0)
        stopping = asyncio.Event()
        loop = asyncio.create_task(service._poll_loop(stopping))
        await until(lambda: len(runner.started) == count)
        await until(lambda: len([e for e in bus.values(T.execution_events)
                                 if e["status"] == "COMPLETED"]) == count)
        assert runner.most == 2  # never more at once than its slots
        # One claim per slot and turn would have taken 150 turns.
        assert producer.transactions < count // 10
        # Every execution RUNNING once, on this worker, committed before it began.
        assert len([e for e in bus.values(T.execution_events) if e["status"] == "RUNNING"]) == count
        await stop(service, loop, stopping, runner)

    asyncio.run(scenario())


def test_claims_not_started_are_requeued_at_once_when_the_worker_drains() -> None:
    async def scenario() -> None:
        bus = MemoryBus()
        service, producer, runner = worker(bus, concurrency=1)
        producer.gate.set()
        service.slots.duration = 0.01  # short handlers so far: it claims ahead
        for _ in range(5):
            due_on(bus, 0)
        stopping = asyncio.Event()
        loop = asyncio.create_task(service._poll_loop(stopping))
        await until(lambda: len(service.slots) == 5)  # all claimed, one running (held)
        assert len(runner.started) == 1
        stopping.set()
        await asyncio.wait_for(loop, 5)
        heartbeats = service._heartbeats = Heartbeats(
            MemoryIdempotentProducer(bus), T, "w1", capacity=1, queues=["default"],  # type: ignore[arg-type]
            running=service.listed)
        drained = asyncio.create_task(service._drain())
        await until(lambda: len([e for e in bus.values(T.execution_events)
                                 if e["status"] == "REQUEUED"]) == 4)
        assert len(service.slots) == 1 and heartbeats is not None  # the running one finishes
        runner.release.set()
        await asyncio.wait_for(drained, 10)
        statuses = [e["status"] for e in bus.values(T.execution_events)]
        assert statuses.count("COMPLETED") == 1 and statuses.count("REQUEUED") == 4
        assert len(bus.records(T.job_due)) == 4  # their next delivery, to run elsewhere

    asyncio.run(scenario())


def test_the_cadence_follows_the_load() -> None:
    from cronstream.services.worker.service import (
        FULL_RECORDS_PER_SECOND,
        MIN_TURN_GAP_SECONDS,
        TURN_GAP_SECONDS,
        turn_gap,
    )

    assert turn_gap(0) == MIN_TURN_GAP_SECONDS  # idle and light: starts go out at once
    assert turn_gap(FULL_RECORDS_PER_SECOND / 5) == pytest.approx(TURN_GAP_SECONDS / 5)
    assert turn_gap(FULL_RECORDS_PER_SECOND) == turn_gap(10 * FULL_RECORDS_PER_SECOND) == TURN_GAP_SECONDS
