"""The worker: takes executions from the work topics of its queues and runs them.

The poll loop never blocks on a handler. Each turn it:
1. consumes into a bounded local buffer per priority tier (pausing every partition
   while the buffer is full, resuming when it drains);
2. picks what to start, highest tier first, up to the free slots;
3. commits one transaction holding the RUNNING events of those starts together with
   their consumed offsets, plus the events of executions that finished meanwhile
   (and, for failures with attempts left, their RetryRequests);
4. only then starts the handlers. An aborted transaction starts nothing: the consumer
   rewinds and the records are read again (by this worker or the partition's next
   owner), so an execution is RUNNING on at most one worker per delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, Protocol
from uuid import UUID, uuid4

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from cronstream.services.worker.runner import CancelSignal, Outcome
from cronstream.shared import metrics
from cronstream.shared.codec import DecodeError, decode
from cronstream.shared.health import Health
from cronstream.shared.kafka import (
    ConsumerThread,
    IdempotentProducer,
    OutRecord,
    ProducerFenced,
    TransactionAborted,
    TransactionalProducer,
    consumer_config,
    dead_letter,
    ensure_topics,
    log_consumer_error,
    position,
    producer_config,
    read_to_end,
    reader_config,
)
from cronstream.shared.lifecycle import wait_or_stop
from cronstream.shared.logs import log
from cronstream.shared.records import (
    PRIORITIES,
    Command,
    ExecutionEvent,
    ExecutionStatus,
    Heartbeat,
    JobDue,
    now_utc,
)
from cronstream.shared.retry import attempts_left, next_attempt
from cronstream.shared.settings import Settings
from cronstream.shared.telemetry import child_traceparent, trace_headers, trace_id, traceparent_of

logger = logging.getLogger(__name__)

SERVICE = "worker"
PROGRESS_INTERVAL = 1.0  # seconds between PROGRESS events of one execution
PRIORITY_FILL_SECONDS = 0.5  # after an assignment, buffer this long before the first start


CANCELLED_MEMORY = 100_000  # cancelled execution ids remembered


class Runner(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def run(self, due: JobDue, progress: Any, cancel: CancelSignal) -> Outcome: ...


@dataclass
class Running:
    due: JobDue
    traceparent: str
    started_at: datetime
    cancel: CancelSignal = field(default_factory=CancelSignal)
    task: asyncio.Task[None] | None = None
    last_progress: float = 0.0


@dataclass
class Finished:
    running: Running
    outcome: Outcome
    completed_at: datetime
    status: str = ""  # the status reported (set when its records are built)


def _exemplar(run: Running) -> dict[str, str] | None:
    """The execution's trace id, attached to its histogram sample (docs/metrics.md)."""
    trace = trace_id(run.traceparent)
    return {"trace_id": trace} if trace else None


class WorkerService:
    name = SERVICE

    def __init__(self, settings: Settings, runner: Runner) -> None:
        self.settings = settings
        self.topics = settings.topics
        self.worker_id = settings.worker_id
        self.queues = list(settings.worker_queues)
        self.capacity = settings.worker_concurrency
        self.runner = runner
        self.health = Health(self.name)
        self.health.require("assignment")
        self.status = "ACTIVE"
        self.running: dict[UUID, Running] = {}
        self._finished: list[Finished] = []
        self._events: list[OutRecord] = []  # PROGRESS events waiting for a transaction
        self._buffer: dict[str, deque[Message]] = {p: deque() for p in PRIORITIES}
        self._tier_of: dict[str, str] = {}
        # Pausing discards librdkafka's prefetched records, so it must be rare: a roomy
        # buffer, paused only when full and resumed once half empty.
        self._buffer_limit = max(1000, 4 * self.capacity)
        self._paused = False
        self._fill_until = 0.0
        self._rng = random.Random()
        # Cancelled execution ids (from `commands`), for those not started yet.
        self._cancelled: OrderedDict[UUID, tuple[str, str | None]] = OrderedDict()
        self._wake = asyncio.Event()
        self._consumer: ConsumerThread | None = None
        self._producer: TransactionalProducer | None = None
        self._hb: IdempotentProducer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._io: Any = None

    # -- lifecycle ------------------------------------------------------------------

    async def run(self, stopping: asyncio.Event) -> None:
        loop = self._loop = asyncio.get_running_loop()
        from concurrent.futures import ThreadPoolExecutor

        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worker-txn")
        work_topics = self.topics.work_topics(self.queues)
        for priority in PRIORITIES:
            for queue in self.queues:
                self._tier_of[self.topics.work(priority, queue)] = priority
        await loop.run_in_executor(None, ensure_topics, self.settings,
                                   self.topics.work_specs(self.queues))
        await self.runner.start()
        metrics.WORKER_SLOTS.set(self.capacity)
        tid = f"{self.topics.prefix}worker-{self.worker_id}"
        self._producer = TransactionalProducer(
            producer_config(self.settings, f"worker-{self.worker_id}", transactional_id=tid))
        await loop.run_in_executor(self._io, self._producer.init)
        self._hb = IdempotentProducer(producer_config(self.settings, f"worker-{self.worker_id}-hb"))
        conf = consumer_config(
            self.settings, f"worker-{self.worker_id}", f"{self.topics.prefix}workers",
            # range: every work topic (one per tier) is spread over all workers on its own.
            # (cooperative-sticky balances the total count and can leave a worker with only
            # the empty tiers.)
            **{"partition.assignment.strategy": "range"},
        )
        commands = ConsumerThread(reader_config(self.settings, f"worker-{self.worker_id}-cmd"),
                                  "commands")
        # Known cancellations first, so that nothing cancelled before this start runs.
        await read_to_end(commands, [TopicPartition(self.topics.commands, 0)], self._on_commands)
        command_task = asyncio.create_task(self._command_loop(commands, stopping))
        consumer = self._consumer = ConsumerThread(conf, "worker")
        await consumer.call(lambda: consumer.consumer.subscribe(
            work_topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
            on_lost=self._on_revoke))
        beating = asyncio.Event()  # set when the heartbeats may stop (after the drain)
        heartbeats = asyncio.create_task(self._heartbeat_loop(beating))
        log(logger, "worker_started", worker_id=self.worker_id, queues=",".join(self.queues),
            capacity=self.capacity)
        try:
            await self._poll_loop(stopping)
            await self._drain()
        finally:
            beating.set()
            heartbeats.cancel()
            command_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await command_task
            await commands.close()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeats
            await self._send_heartbeat("OFFLINE")
            await consumer.close()
            await self.runner.close()
            await loop.run_in_executor(self._io, self._producer.close)
            self._io.shutdown(wait=True)
            if self._hb is not None:
                await loop.run_in_executor(None, self._hb.flush, 5.0)

    # -- the poll loop --------------------------------------------------------------

    def _buffered(self) -> int:
        return sum(len(q) for q in self._buffer.values())

    async def _poll_loop(self, stopping: asyncio.Event) -> None:
        assert self._consumer is not None
        while not stopping.is_set():
            room = self._buffer_limit - self._buffered()
            if room <= 0 or (self._paused and room < self._buffer_limit // 2):
                await self._set_paused(True)
            else:
                await self._set_paused(False)
            busy = self.running or self._finished or self._buffered()
            timeout = 0.0 if self._finished else (0.02 if busy else 0.1)
            messages = await self._consumer.consume(max(1, room), timeout)
            for msg in messages:
                err = msg.error()
                if err is not None:
                    log_consumer_error("worker", err)
                    continue
                self._buffer[self._tier_of.get(msg.topic(), "low")].append(msg)
            await self._turn(starting=True)
            if not messages and not self._finished and not self._events:
                # Nothing arrived: wait briefly for a handler to finish instead of spinning.
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 0.0 if busy else 0.05)

    async def _set_paused(self, paused: bool) -> None:
        if paused == self._paused or self._consumer is None:
            return
        consumer = self._consumer.consumer

        def apply() -> None:
            assignment = consumer.assignment()
            if assignment:
                (consumer.pause if paused else consumer.resume)(assignment)

        await self._consumer.call(apply)
        self._paused = paused

    async def _turn(self, starting: bool) -> None:
        """One transaction: new starts (with offsets), finished executions, progress."""
        starts: list[Running] = []
        records: list[OutRecord] = []
        offsets: dict[tuple[str, int], int] = {}
        # A slot frees when its handler returns, not when its report commits: the report
        # and the next start share this transaction.
        busy = len(self.running) - len(self._finished)
        free = self.capacity - busy if starting and self.status == "ACTIVE" else 0
        if time.monotonic() < self._fill_until:
            free = 0
        while free > len(starts):
            msg = self._next_buffered()
            if msg is None:
                break
            topic, partition, offset = position(msg)
            offsets[(topic, partition)] = offset + 1
            try:
                due = decode(JobDue, msg.value(), key=msg.key(), key_field="job_id")
            except DecodeError as exc:
                records.append(dead_letter(self.topics, msg, str(exc), SERVICE))
                continue
            if due.execution_id in self.running:
                continue  # a redelivery of what already runs here
            parent = traceparent_of(msg.headers())
            run = Running(due, child_traceparent(parent), now_utc())
            cancelled = self._cancelled.get(due.execution_id)
            if cancelled is not None:
                reason, by = cancelled
                records.append(self._event(run, "CANCELLED", completed_at=run.started_at,
                                           error_message=f"cancelled before it started: {reason}",
                                           cancelled_by=by, priority=due.job.priority,
                                           queue=due.job.queue))
                continue
            starts.append(run)
            records.append(self._event(run, "RUNNING"))
        finished, self._finished = self._finished, []
        for done in finished:
            records.extend(self._finish_records(done))
        progress, self._events = self._events, []
        records.extend(progress)
        if not records and not offsets:
            return
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        try:
            await self._commit(records, tps)
        except (TransactionAborted, KafkaException) as exc:
            log(logger, "worker_transaction_aborted", logging.WARNING, error=str(exc))
            self._finished = finished + self._finished  # report them in the next turn
            await self._rewind()
            return
        for done in finished:
            self.running.pop(done.running.due.execution_id, None)
        for run in starts:
            self.running[run.due.execution_id] = run
            run.task = asyncio.create_task(self._execute(run))
            job = run.due.job
            metrics.START_LAG.labels(queue=job.queue, priority=job.priority).observe(
                max(0.0, (run.started_at - run.due.scheduled_at).total_seconds()),
                _exemplar(run))
        for done in finished:
            self._count_finished(done)
        metrics.WORKER_SLOTS_BUSY.set(len(self.running))
        metrics.WORKER_BUFFERED.set(self._buffered())

    def _count_finished(self, done: Finished) -> None:
        job, status = done.running.due.job, done.status
        metrics.WORKER_EXECUTIONS.labels(status=status, queue=job.queue, priority=job.priority).inc()
        metrics.EXECUTION_DURATION.labels(queue=job.queue, priority=job.priority, status=status).observe(
            max(0.0, (done.completed_at - done.running.started_at).total_seconds()),
            _exemplar(done.running))

    def _next_buffered(self) -> Message | None:
        for priority in PRIORITIES:
            if self._buffer[priority]:
                return self._buffer[priority].popleft()
        return None

    async def _commit(self, records: list[OutRecord], offsets: list[TopicPartition]) -> None:
        assert self._producer is not None and self._consumer is not None
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(
                self._io,
                partial(self._producer.commit_records, records, offsets or None,
                        self._consumer.consumer.consumer_group_metadata),
            )
        except ProducerFenced:
            # Another process runs with our worker id: it owns our executions now.
            log(logger, "worker_fenced", logging.ERROR, worker_id=self.worker_id)
            raise

    async def _rewind(self) -> None:
        """Drop the buffer and seek every assigned partition back to its committed offset."""
        assert self._consumer is not None
        for q in self._buffer.values():
            q.clear()
        consumer = self._consumer.consumer

        def seek_back() -> None:
            assignment = consumer.assignment()
            if not assignment:
                return
            for tp in consumer.committed(assignment, 10.0):
                tp.offset = tp.offset if tp.offset >= 0 else -2
                with contextlib.suppress(KafkaException):
                    consumer.seek(tp)

        await self._consumer.call(seek_back)

    # -- executions -----------------------------------------------------------------

    async def _execute(self, run: Running) -> None:
        def progress(percent: float, message: str | None) -> None:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._progress, run, percent, message)

        try:
            outcome = await self.runner.run(run.due, progress, run.cancel)
        except Exception as exc:
            logger.exception("runner failed", extra={"action": "runner_failed",
                                                     "execution_id": str(run.due.execution_id)})
            outcome = Outcome("FAILED", error=f"worker error: {exc}")
        self._finished.append(Finished(run, outcome, now_utc()))
        self._wake.set()

    def _progress(self, run: Running, percent: float, message: str | None) -> None:
        if run.due.execution_id not in self.running:
            return
        now = time.monotonic()
        if percent < 100 and now - run.last_progress < PROGRESS_INTERVAL:
            return
        run.last_progress = now
        self._events.append(self._event(run, "PROGRESS", progress=percent,
                                        progress_message=message))
        self._wake.set()

    def _finish_records(self, done: Finished) -> list[OutRecord]:
        run, outcome = done.running, done.outcome
        status: ExecutionStatus = outcome.status
        records: list[OutRecord] = []
        if outcome.retryable and not attempts_left(run.due):
            status = "PERMANENTLY_FAILED"
        elif outcome.retryable:
            retry = next_attempt(run.due, done.completed_at, self._rng)
            records.append(OutRecord(self.topics.retries, str(retry.execution_id).encode(),
                                     retry.to_json(), trace_headers(run.traceparent)))
        error = outcome.error
        if status == "CANCELLED" and run.cancel.reason:
            error = run.cancel.reason if error in (None, "cancelled") else f"{run.cancel.reason}: {error}"
        done.status = status
        records.insert(0, self._event(
            run, status, completed_at=done.completed_at, error_message=error,
            result=outcome.result, progress=100.0 if status == "COMPLETED" else None,
            priority=run.due.job.priority, queue=run.due.job.queue,
            cancelled_by=run.cancel.by if status == "CANCELLED" else None,
        ))
        log(logger, "execution_finished", logging.DEBUG if status == "COMPLETED" else logging.WARNING,
            job_id=run.due.job_id, execution_id=str(run.due.execution_id), status=status,
            attempt=run.due.attempt_number, error=error)
        return records

    def _event(self, run: Running, status: ExecutionStatus, **fields: Any) -> OutRecord:
        due = run.due
        event = ExecutionEvent(
            event_id=uuid4(),
            execution_id=due.execution_id,
            job_id=due.job_id,
            run_id=due.run_id,
            status=status,
            attempt_number=due.attempt_number,
            scheduled_at=due.scheduled_at,
            occurred_at=now_utc(),
            delivery=due.delivery,
            worker_id=self.worker_id,
            started_at=run.started_at,
            **fields,
        )
        return OutRecord(self.topics.execution_events, due.job_id.encode(), event.to_json(),
                         trace_headers(run.traceparent))

    # -- drain ----------------------------------------------------------------------

    async def _drain(self) -> None:
        """SIGTERM: take nothing new, let running executions finish within the grace
        period, re-queue what is still running, then report OFFLINE."""
        self.status = "DRAINING"
        await self._send_heartbeat("DRAINING")
        await self._set_paused(True)
        for q in self._buffer.values():
            q.clear()  # not committed: the partitions' next owner reads them again
        log(logger, "worker_draining", worker_id=self.worker_id, running=len(self.running),
            grace_seconds=self.settings.worker_drain_grace_seconds)
        deadline = time.monotonic() + self.settings.worker_drain_grace_seconds
        while self.running and time.monotonic() < deadline:
            await self._turn(starting=False)
            if not self.running:
                break
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), min(0.1, deadline - time.monotonic()))
        await self._turn(starting=False)
        if self.running:
            await self._requeue_remaining()

    async def _requeue_remaining(self) -> None:
        records: list[OutRecord] = []
        for run in list(self.running.values()):
            run.cancel.set("worker drained")
            due = run.due.model_copy(update={"reason": "REQUEUE", "delivery": run.due.delivery + 1})
            records.append(self._event(run, "REQUEUED", error_message="worker drained"))
            records.append(OutRecord(self.topics.job_due, due.job_id.encode(), due.to_json(),
                                     trace_headers(run.traceparent)))
            log(logger, "execution_requeued", job_id=due.job_id,
                execution_id=str(due.execution_id), delivery=due.delivery, reason="drain")
        await self._commit(records, [])
        tasks = [run.task for run in self.running.values() if run.task is not None]
        for task in tasks:
            task.cancel()  # the pool kills their processes
        await asyncio.gather(*tasks, return_exceptions=True)
        self.running.clear()

    # -- commands -------------------------------------------------------------------

    async def _command_loop(self, commands: ConsumerThread, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            messages = await commands.consume(100, 0.2)
            self._on_commands([m for m in messages if m.error() is None])

    def _on_commands(self, messages: list[Message]) -> None:
        for msg in messages:
            try:
                command = Command.model_validate_json(msg.value() or b"")
            except ValueError:
                continue  # the commands topic is dead-lettered by the monitor
            if command.command != "CANCEL":
                continue
            reason = command.reason or "cancelled"
            self._cancelled[command.execution_id] = (reason, command.issued_by)
            if len(self._cancelled) > CANCELLED_MEMORY:
                self._cancelled.popitem(last=False)
            run = self.running.get(command.execution_id)
            if run is not None:
                log(logger, "execution_cancel_requested", job_id=run.due.job_id,
                    execution_id=str(command.execution_id), reason=reason)
                run.cancel.set(reason, command.issued_by)

    # -- heartbeats -----------------------------------------------------------------

    async def _heartbeat_loop(self, done: asyncio.Event) -> None:
        while not await wait_or_stop(done, 0):
            await self._send_heartbeat(self.status)
            await wait_or_stop(done, self.settings.heartbeat_interval_seconds)

    async def _send_heartbeat(self, status: str) -> None:
        if self._hb is None:
            return
        beat = Heartbeat(
            worker_id=self.worker_id,
            hostname=socket.gethostname(),
            status=status,  # type: ignore[arg-type]
            sent_at=now_utc(),
            running=list(self.running),
            capacity=self.capacity,
            queues=self.queues,
        )
        self._hb.produce(OutRecord(self.topics.heartbeats, self.worker_id.encode(), beat.to_json()))
        if status == "OFFLINE":
            await asyncio.get_running_loop().run_in_executor(None, self._hb.flush, 5.0)

    # -- rebalance callbacks (consumer thread) ----------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.assign(partitions)
        self.health.set("assignment", True)
        if self._paused and partitions:
            consumer.pause(partitions)
        # Let every tier's backlog reach the buffer before choosing what starts first.
        self._fill_until = time.monotonic() + PRIORITY_FILL_SECONDS
        log(logger, "partitions_assigned", count=len(partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log(logger, "partitions_revoked", count=len(partitions))
        self.health.set("assignment", False, "rebalancing")
        revoked = {(tp.topic, tp.partition) for tp in partitions}
        if self._loop is not None:
            # Buffered records of revoked partitions belong to their next owner now.
            def drop() -> None:
                for priority, q in self._buffer.items():
                    self._buffer[priority] = deque(
                        m for m in q if (m.topic(), m.partition()) not in revoked)

            self._loop.call_soon_threadsafe(drop)
        consumer.unassign()
