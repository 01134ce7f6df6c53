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

A transaction that hangs (a broker restart: shared/producers.py) is given up after its
deadline and its producer replaced, which settles it. Whether it committed is then read
back: if the group's committed offsets moved past the batch and no rebalance happened in
between, it did, and the starts go ahead; otherwise nothing starts and the records are
read again. (Should the rare ambiguous case — a rebalance in the middle — leave an
execution RUNNING that nobody runs, the monitor re-queues it: it is missing from this
worker's heartbeats.)

The rooms: intake.py holds what was consumed and not started (tiers, held records,
pause thresholds), slots.py what runs (taken at a start, given back when a handler
returns), executions.py the records each execution produces; this module is the I/O that
joins them: the consumer, the turn's transaction, the drain and the rebalance callbacks.
The handlers run in pool.py's processes (child.py) or inline (inline.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from functools import partial
from typing import Any, Protocol
from uuid import UUID

from confluent_kafka import KafkaException, Message, TopicPartition

from cronstream.services.worker.commands import Cancellations
from cronstream.services.worker.executions import (
    Finished,
    Reporter,
    Running,
    count_finished,
    count_started,
)
from cronstream.services.worker.heartbeats import Heartbeats
from cronstream.services.worker.intake import Intake
from cronstream.services.worker.logs import LogShipper
from cronstream.services.worker.runner import CancelSignal, LinesFn, Outcome
from cronstream.services.worker.slots import Slots
from cronstream.shared import metrics
from cronstream.shared.clients import REAL, KafkaClients, resolved_topics
from cronstream.shared.fast_records import DueRecord, decode_due
from cronstream.shared.health import Health
from cronstream.shared.inbound import Batch, Inbound
from cronstream.shared.kafka.config import (
    IDLE_FETCH_WAIT_MS,
    consumer_config,
    producer_config,
    reader_config,
)
from cronstream.shared.kafka.consumer import ConsumerThread, OnLane
from cronstream.shared.kafka.reading import position, read_to_end
from cronstream.shared.lifecycle import arm_shutdown_watchdog, supervise
from cronstream.shared.logs import log
from cronstream.shared.producers import (
    OutRecord,
    ProducerFenced,
    TransactionAborted,
    TransactionalProducer,
    TransactionOutcomeUnknown,
)
from cronstream.shared.records import PRIORITIES, WorkerStatus, now_utc
from cronstream.shared.settings import Settings
from cronstream.shared.telemetry import Headers, Hop, attached, messaging, recording

logger = logging.getLogger(__name__)

SERVICE = "worker"
PROGRESS_INTERVAL = 1.0  # seconds between PROGRESS events of one execution
PRIORITY_FILL_SECONDS = 0.5  # after an assignment, buffer this long before the first start
# Turns (transactions) start at most this far apart under load: a turn then carries the
# claims and ends of many executions instead of one transaction each (a transaction costs
# the broker far more than a record: bench.transactions). At 3,000 executions/s, 100 ms
# took a worker from ~33 to ~10 transactions/s (decision 0012). The cadence bounds no
# rate: a worker claims ahead what its slots will run until the turn after next, and
# starts it as slots free (slots.py).
TURN_GAP_SECONDS = 0.1
# The gap follows the load (decision 0029): in proportion to the records a worker's turns
# carry a second, the whole gap from FULL_RECORDS_PER_SECOND on (~500 executions/s: an
# execution is a claim and an end), never less than MIN_TURN_GAP_SECONDS. The first
# record after a quiet gap starts at once: idle and under a light load, starts go out as
# they come; at 100 executions/s a worker turns every ~20 ms, at 500/s every 100 ms.
FULL_RECORDS_PER_SECOND = 1000.0
MIN_TURN_GAP_SECONDS = 0.01


def turn_gap(records_per_second: float) -> float:
    """The gap before the next turn, at a load of `records_per_second` (FULL_RECORDS_PER_SECOND)."""
    return max(MIN_TURN_GAP_SECONDS,
               TURN_GAP_SECONDS * min(1.0, records_per_second / FULL_RECORDS_PER_SECOND))


class Runner(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def run_now(self, due: DueRecord, progress: Any, trace: Headers | None = None,
                lines: LinesFn | None = None) -> Outcome | None: ...

    async def run(self, due: DueRecord, progress: Any, cancel: CancelSignal,
                  trace: Headers | None = None, lines: LinesFn | None = None) -> Outcome: ...


class WorkerService:
    name = SERVICE

    def __init__(self, settings: Settings, runner: Runner, kafka: KafkaClients = REAL) -> None:
        self.settings = settings
        self.topics = settings.topics
        self.worker_id = settings.worker_id
        self.queues = list(settings.worker_queues)
        self.runner = runner
        self.kafka = kafka
        self.health = Health(self.name)
        self.health.require("kafka", "assignment")
        # SIGTERM drains: the shutdown watchdog allows for the drain grace.
        self.shutdown_seconds = settings.worker_drain_grace_seconds + 20
        self.inbound = Inbound(SERVICE, self.topics)
        self.reporter = Reporter(self.topics, self.worker_id)
        self.cancellations = Cancellations(self._cancel_running)
        self.status: WorkerStatus = "ACTIVE"
        self.intake = Intake({self.topics.work(priority, queue): priority
                              for priority in PRIORITIES for queue in self.queues},
                             settings.worker_concurrency)
        self.slots = Slots(settings.worker_concurrency)
        self._events: list[OutRecord] = []  # PROGRESS events waiting for a transaction
        # Whether the partitions are paused: read by the rebalance callbacks (on the
        # consumer's lane), written there too (_set_paused).
        self._paused = False
        self._fill_until = 0.0
        self._last_turn = 0.0
        self._turn_gap = MIN_TURN_GAP_SECONDS  # until the next turn (_turn: by the load)
        self._commit_seconds = 0.01  # how long a turn's commit takes, recently
        self._load = 0.0  # records a second in the turns, recently
        self._assignments = 0  # bumped by every rebalance callback
        # Since when the worker has waited for an assignment (subscribed or revoked, no
        # assignment since); None while it holds one (even an empty one).
        self._waiting_since: float | None = None
        self._consumer_conf: dict[str, Any] = {}
        self._wake = asyncio.Event()
        self._consumer: ConsumerThread | None = None
        self._producer: TransactionalProducer | None = None
        self._heartbeats: Heartbeats | None = None
        self.logs = LogShipper(self.topics, self.worker_id, settings.worker_log_rate_bytes,
                               lambda: self.kafka.idempotent(producer_config(
                                   self.settings, f"worker-{self.worker_id}-logs")))
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def capacity(self) -> int:
        return self.slots.capacity

    @property
    def paused(self) -> bool:
        """Whether its partitions are paused (stalled handlers: intake.py)."""
        return self._paused

    # -- lifecycle ------------------------------------------------------------------

    def open(self) -> None:
        """Make the Kafka clients (none is contacted yet)."""
        self._loop = asyncio.get_running_loop()
        # Stable per worker id: a restart fences and settles its predecessor's transaction,
        # and the monitor fences a worker it declares dead (docs/decisions/0008).
        tid = f"{self.topics.prefix}worker-{self.worker_id}"
        self._producer = self.kafka.transactional(
            producer_config(self.settings, f"worker-{self.worker_id}", transactional_id=tid))
        beats = self.kafka.idempotent(producer_config(self.settings, f"worker-{self.worker_id}-hb"))
        self._heartbeats = Heartbeats(beats, self.topics, self.worker_id, capacity=self.capacity,
                                      queues=self.queues, running=self.listed)
        self._consumer_conf = consumer_config(
            self.settings, f"worker-{self.worker_id}", f"{self.topics.prefix}workers",
            # range: every work topic (one per tier) is spread over all workers on its own.
            # (cooperative-sticky balances the total count and can leave a worker with only
            # the empty tiers.) Static membership: a worker restarted under its id (a pod of
            # a StatefulSet, a supervisor's restart) takes its partitions back at once,
            # without waiting for the session of its dead predecessor to expire.
            **{"partition.assignment.strategy": "range", "group.instance.id": self.worker_id},
        )
        self._consumer = self.kafka.consumer(self._consumer_conf, "worker")

    async def run(self, stopping: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        # Retry timers go to their job's shard of `retries`: as many as the clock has.
        self.topics = self.reporter.topics = await resolved_topics(self.settings, self.kafka)
        await loop.run_in_executor(None, self.kafka.ensure_topics, self.settings,
                                   self.topics.work_specs(self.queues))
        await self.runner.start()
        metrics.WORKER_SLOTS.set(self.capacity)
        self.open()
        assert self._producer is not None and self._heartbeats is not None
        # It tails `commands` once loaded: its idle fetches may wait as long as a consumer's
        # (the load's end is told up to that much later, once, at start).
        commands = self.kafka.consumer(
            {**reader_config(self.settings, f"worker-{self.worker_id}-cmd"),
             "fetch.wait.max.ms": IDLE_FETCH_WAIT_MS}, "commands")
        beating = asyncio.Event()  # set when the heartbeats may stop (after the drain)
        tasks: list[asyncio.Task[None]] = []
        try:
            await self._producer.init()
            # Known cancellations first, so that nothing cancelled before this start runs.
            await read_to_end(commands, [TopicPartition(self.topics.commands, 0)],
                              self.cancellations.feed)
            self.health.set("kafka", True)
            tasks = [
                asyncio.create_task(supervise("commands", partial(self._command_loop, commands, stopping),
                                              self.health, stopping)),
                asyncio.create_task(supervise(
                    "heartbeats", partial(self._heartbeats.loop, lambda: self.status,
                                          self.settings.heartbeat_interval_seconds, beating),
                    self.health, stopping)),
                asyncio.create_task(supervise("logs", partial(self.logs.loop, beating),
                                              self.health, stopping)),
            ]
            await self._subscribe()
            log(logger, "worker_started", worker_id=self.worker_id, queues=",".join(self.queues),
                capacity=self.capacity)
            await self._poll_loop(stopping)
            await self._drain()
        except ProducerFenced:
            # Another process took our worker id, or the monitor declared us dead and gave our
            # executions to others: whatever still runs here is not ours to report any more.
            log(logger, "worker_fenced", logging.ERROR, worker_id=self.worker_id,
                running=len(self.slots), hint="restart with a fresh state")
            arm_shutdown_watchdog(self.shutdown_seconds, "worker_fenced")
            raise
        finally:
            beating.set()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await commands.close()
            await self.logs.close()
            await self._heartbeats.last("OFFLINE")
            assert self._consumer is not None
            await self._consumer.close()
            await self.runner.close()
            await self._producer.close()

    async def _subscribe(self) -> None:
        assert self._consumer is not None
        self._waiting_since = time.monotonic()
        await self._consumer.subscribe(self.topics.work_topics(self.queues), on_assign=self._on_assign,
                                       on_revoke=self._on_revoke, on_lost=self._on_revoke)

    async def _rejoin(self, reason: str) -> None:
        """Start over in the group with a fresh consumer (same static member id).

        A rebalance takes seconds (members rejoin within a poll; a dead one is dropped after
        the session timeout). After a broker restart, a consumer can be left waiting for an
        assignment that never comes, with nothing logged (static members: confluent-kafka-go
        #494); and a consumer fenced by another joining with its group.instance.id (which the
        client can do to itself after a coordinator moved) is dead for good, a fatal error.
        A fresh consumer joining under the same group.instance.id takes the member's place.
        Nothing is lost: with no assignment nothing is buffered or uncommitted, and
        running executions are reported by the transactions of the turns that follow.
        """
        assert self._consumer is not None
        waited = 0.0 if self._waiting_since is None else time.monotonic() - self._waiting_since
        log(logger, "worker_rejoining", logging.WARNING, worker_id=self.worker_id,
            waited_seconds=round(waited, 1), reason=reason)
        old, self._consumer = self._consumer, None
        await old.close()  # a static member does not leave the group on close
        self.intake.clear()
        self._assignments += 1
        self._consumer = self.kafka.consumer(self._consumer_conf, "worker")
        await self._subscribe()

    def listed(self) -> list[UUID]:
        """The executions this worker's heartbeats list as its own (slots.py)."""
        return self.slots.listed()

    # -- the poll loop --------------------------------------------------------------

    async def _poll_loop(self, stopping: asyncio.Event) -> None:
        assert self._consumer is not None
        while not stopping.is_set():
            await self._set_paused(self.intake.wants_pause(self._paused))
            finished = self.slots.has_finished()
            busy = len(self.slots) or finished or len(self.intake)
            # Finished executions are reported, and held records started, within one turn
            # gap of the last turn; never sooner than that after it.
            gap = max(0.0, self._turn_gap - (time.monotonic() - self._last_turn))
            timeout = gap if finished else (max(gap, 0.02) if busy else 0.1)
            hold_until = self.intake.hold_until
            if hold_until is not None:  # wake when the first held record is due
                timeout = min(timeout, max(gap, hold_until - time.time()))
            messages = await self._consumer.consume(self.intake.room(), timeout)
            waiting = self._waiting_since
            if waiting is not None and time.monotonic() - waiting > self.settings.worker_rejoin_after_seconds:
                await self._rejoin("no assignment since the last rebalance began")
                continue
            try:
                records = self.inbound.batch(messages).records
            except KafkaException:
                # The consumer is dead (fenced as a static member, above all): a fresh one
                # takes its place at once, instead of after waiting for an assignment.
                await self._rejoin("the consumer failed for good")
                continue
            self.intake.add(records)
            if time.monotonic() - self._last_turn >= self._turn_gap:
                await self._turn(starting=True)
            if not messages and not self.slots.has_finished() and not self._events:
                # Nothing arrived: wait briefly for a handler to finish instead of spinning.
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 0.0 if busy else 0.05)

    async def _set_paused(self, paused: bool) -> None:
        if paused == self._paused or self._consumer is None:
            return

        def apply(consumer: OnLane) -> None:
            # On the consumer's lane, where the rebalance callbacks read the flag.
            self._paused = paused
            assignment = consumer.assignment()
            if assignment:
                (consumer.pause if paused else consumer.resume)(assignment)

        await self._consumer.on_lane(apply)
        log(logger, "intake_paused" if paused else "intake_resumed", buffered=len(self.intake),
            running=len(self.slots))

    async def _turn(self, starting: bool) -> None:
        """One transaction: new claims (with their offsets), finished executions, progress."""
        batch = self.inbound.batch([])
        records: list[OutRecord] = []
        # As many claims as the slots will run until the turn after next (slots.py). A slot
        # frees when its handler returns, not when its report commits.
        claims = 0
        if starting and self.status == "ACTIVE" and time.monotonic() >= self._fill_until:
            claims = self.slots.claimable(TURN_GAP_SECONDS + self._commit_seconds)
        starts = self._take_starts(claims, batch, records)
        records.extend(batch.dead)
        finished = self.slots.take_finished()
        for done in finished:
            records.extend(self.reporter.finished(done))
        progress, self._events = self._events, []
        records.extend(progress)
        if not records and not batch.next_offsets:
            return
        began = time.monotonic()
        since = max(began - self._last_turn, MIN_TURN_GAP_SECONDS)
        self._load += 0.3 * (min(len(records) / since, 10 * FULL_RECORDS_PER_SECOND) - self._load)
        self._turn_gap = turn_gap(self._load)
        self._last_turn = began
        self.slots.committing(starts)
        try:
            committed = await self._commit(records, batch.offsets())
        finally:
            self.slots.committed()
        self._commit_seconds += 0.1 * (time.monotonic() - began - self._commit_seconds)
        if not committed:
            self.slots.give_back(finished)
            for run in starts:
                run.hop.end("not started: the transaction did not commit")
            await self._rewind()
            return
        self.slots.reported(finished)
        for done in finished:
            count_finished(done)
            done.running.hop.end(done.outcome.error if done.status != "COMPLETED" else None)
        for run in starts:
            self.slots.claim(run)
        self._fill()
        metrics.WORKER_SLOTS_BUSY.set(self.slots.busy())
        metrics.WORKER_BUFFERED.set(len(self.intake))

    def _take_starts(self, claims: int, batch: Batch, records: list[OutRecord]) -> list[Running]:
        """Up to `claims` buffered records to claim in this turn (their RUNNING events added
        to `records`, their offsets to `batch`)."""
        starts: list[Running] = []
        now = now_utc()
        self.intake.begin()
        read = partial(batch.read, decode_due)
        while True:
            if claims <= len(starts):
                return starts
            head = self.intake.next(read, now)
            if head is None:
                return starts
            msg, due = head
            batch.take(msg)
            if due is None or due.execution_id in self.slots:
                continue  # dead-lettered, or a redelivery of what already runs here
            run = Running(due, self._hop(due, msg), now_utc())
            cancelled = self.cancellations.get(due.execution_id)
            if cancelled is not None:
                records.append(self.reporter.cancelled_before_start(run, *cancelled))
                continue
            starts.append(run)
            records.append(self.reporter.running(run))

    def _fill(self) -> None:
        """Start claimed executions while slots are free: on the spot when the runner can
        (inline synchronous handlers), else as a task. Between turns, no transaction: the
        claim committed their RUNNING."""
        while (run := self.slots.next_start()) is not None:
            run.started_at = now_utc()
            count_started(run)
            if run.cancel.is_set():  # cancelled (or drained) after its claim, before it began
                self._finish(run, Outcome("CANCELLED", error="cancelled before it started"),
                             ran=False)
                continue
            outcome = self._run_now(run)
            if outcome is None:
                run.task = asyncio.create_task(self._execute(run))
            else:  # reported with the next turn, like any other that finished
                self._finish(run, outcome)

    def _hop(self, due: DueRecord, msg: Message) -> Hop:
        topic, partition, offset = position(msg)
        attributes = messaging(topic, partition, offset, job_id=due.job_id,
                               execution_id=due.execution_id, attempt=due.attempt_number,
                               delivery=due.delivery, worker_id=self.worker_id) if recording() else None
        return Hop("cronstream.run", msg.headers(), attributes=attributes)

    async def _commit(self, records: list[OutRecord], offsets: list[TopicPartition]) -> bool:
        """Commit one turn; whether it committed (read back when the outcome is unknown)."""
        assert self._producer is not None and self._consumer is not None
        # (No fresh producer after a rebalance here, unlike the dispatcher: a worker's
        # producer keeps its epoch so that the monitor's fence of a worker it declared dead
        # stays in force — docs/decisions/0008.)
        assignments = self._assignments
        try:
            await self._producer.commit(records, offsets or None, self._consumer.group_metadata)
            return True
        except TransactionOutcomeUnknown as exc:
            # The producer was replaced (a new epoch). Had the monitor declared this worker
            # dead meanwhile (no heartbeat for dead_after: paused, stuck), that fence is gone
            # now: stop rather than report what runs elsewhere by now.
            assert self._heartbeats is not None
            if self._heartbeats.silent_for() > self.settings.worker_dead_after_seconds:
                log(logger, "worker_presumed_dead", logging.ERROR, worker_id=self.worker_id,
                    silent_seconds=round(self._heartbeats.silent_for(), 1))
                raise ProducerFenced("no heartbeat delivered for longer than dead_after") from exc
            committed = await self._committed_through(offsets) and assignments == self._assignments
            log(logger, "worker_transaction_settled", logging.WARNING, error=str(exc),
                committed=committed)
            return committed
        except TransactionAborted as exc:
            log(logger, "worker_transaction_aborted", logging.WARNING, error=str(exc))
            return False

    async def _committed_through(self, offsets: list[TopicPartition]) -> bool:
        """Whether the group's committed offsets reach `offsets` (read from the broker)."""
        if not offsets:
            return False  # nothing to tell by: report them again (same records: executions.Finished)
        assert self._consumer is not None
        try:
            committed = await self._consumer.committed(
                [TopicPartition(t.topic, t.partition) for t in offsets])
        except KafkaException:
            return False
        wanted = {(t.topic, t.partition): t.offset for t in offsets}
        return all(c.offset >= wanted[(c.topic, c.partition)] for c in committed)

    async def _rewind(self) -> None:
        """Drop the buffer and seek every assigned partition back to its committed offset."""
        assert self._consumer is not None
        self.intake.clear()
        await self._consumer.on_lane(lambda consumer: consumer.seek_to_committed())

    # -- executions -----------------------------------------------------------------

    def _run_now(self, run: Running) -> Outcome | None:
        """The outcome of a run the runner settles on the spot (an inline synchronous
        handler, an unknown one); None when it must be awaited (`_execute`)."""
        try:
            return self.runner.run_now(run.due, partial(self._progress, run), run.headers,
                                       partial(self.logs.add, run))
        except Exception as exc:
            with attached(run.headers):  # the log line carries its trace_id
                logger.exception("runner failed", extra={"action": "runner_failed",
                                                         "execution_id": str(run.due.execution_id)})
            return Outcome("FAILED", error=f"worker error: {exc}")

    async def _execute(self, run: Running) -> None:
        def progress(percent: float, message: str | None) -> None:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._progress, run, percent, message)

        try:
            outcome = await self.runner.run(run.due, progress, run.cancel, run.headers,
                                            partial(self.logs.add, run))
        except Exception as exc:
            with attached(run.headers):  # the log line carries its trace_id
                logger.exception("runner failed", extra={"action": "runner_failed",
                                                         "execution_id": str(run.due.execution_id)})
            outcome = Outcome("FAILED", error=f"worker error: {exc}")
        self._finish(run, outcome)
        self._fill()
        self._wake.set()

    def _finish(self, run: Running, outcome: Outcome, ran: bool = True) -> None:
        """Its handler returned (or was stopped): the slot is free, and its end, with the
        last batch of its log, goes out with the next turn."""
        done = Finished(run, outcome, now_utc())
        note = None
        if outcome.status != "COMPLETED" and outcome.traceback is None:
            note = f"[{outcome.status}] {outcome.error}"  # killed, timed out, cancelled
        done.log = self.logs.final(run, note, outcome.traceback)
        self.slots.finish(done, (done.completed_at - run.started_at).total_seconds() if ran else None)

    def _progress(self, run: Running, percent: float, message: str | None) -> None:
        if run.due.execution_id not in self.slots:
            return
        now = time.monotonic()
        if percent < 100 and now - run.last_progress < PROGRESS_INTERVAL:
            return
        run.last_progress = now
        self._events.append(self.reporter.event(run, "PROGRESS", progress=percent,
                                                progress_message=message))
        self._wake.set()

    # -- drain ----------------------------------------------------------------------

    async def _drain(self) -> None:
        """SIGTERM: take nothing new, let running executions finish within the grace
        period, re-queue what is still running, then report OFFLINE."""
        assert self._heartbeats is not None
        self.status = "DRAINING"
        await self._heartbeats.last("DRAINING")
        await self._set_paused(True)
        self.intake.clear()  # not committed: the partitions' next owner reads them again
        # Claimed and not started: they never will be here, and run elsewhere at once.
        unstarted = self.slots.unstarted()
        if unstarted and await self._commit(
                [r for run in unstarted for r in self.reporter.requeued(run, "worker drained")], []):
            self.slots.forget(unstarted)
        log(logger, "worker_draining", worker_id=self.worker_id, running=len(self.slots),
            grace_seconds=self.settings.worker_drain_grace_seconds)
        deadline = time.monotonic() + self.settings.worker_drain_grace_seconds
        while self.slots and time.monotonic() < deadline:
            await self._turn(starting=False)
            if not self.slots:
                break
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), min(0.1, deadline - time.monotonic()))
        await self._turn(starting=False)
        if self.slots:
            await self._requeue_remaining()

    async def _requeue_remaining(self) -> None:
        records: list[OutRecord] = []
        for run in self.slots:
            run.cancel.set("worker drained")
            records.extend(self.reporter.requeued(run, "worker drained"))
            records.extend(self.logs.final(run, "[REQUEUED] the worker drained before it ended: "
                                                "it runs again elsewhere"))
        if not await self._commit(records, []):
            # Not written: they stay RUNNING under this worker, which is about to go OFFLINE
            # (or silent); the monitor re-queues them.
            log(logger, "drain_requeue_not_committed", logging.WARNING, executions=len(self.slots))
        tasks = [run.task for run in self.slots if run.task is not None]
        for task in tasks:
            task.cancel()  # the pool kills their processes
        await asyncio.gather(*tasks, return_exceptions=True)
        self.slots.clear()

    # -- commands -------------------------------------------------------------------

    async def _command_loop(self, commands: ConsumerThread, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            self.cancellations.feed(await commands.consume(100, 0.2))

    def _cancel_running(self, execution_id: UUID, reason: str, by: str | None) -> bool:
        run = self.slots.get(execution_id)
        if run is None:
            return False
        run.cancel.set(reason, by)
        return True

    # -- rebalance callbacks (consumer lane) ------------------------------------------

    def _on_assign(self, consumer: OnLane, partitions: list[TopicPartition]) -> None:
        consumer.assign(partitions)
        self._assignments += 1
        self._waiting_since = None
        self.health.set("assignment", True)
        if partitions:
            # Explicitly, both ways: librdkafka keeps a partition's pause through its
            # revocation and re-assignment (librdkafka #1849, confluent-kafka-go #193). A
            # worker paused in its previous assignment and resumed while it had none (its
            # buffer emptied by the revocation) would otherwise never fetch again from the
            # partitions it got back, with nothing in any log.
            (consumer.pause if self._paused else consumer.resume)(partitions)
        # Let every tier's backlog reach the buffer before choosing what starts first.
        self._fill_until = time.monotonic() + PRIORITY_FILL_SECONDS
        log(logger, "partitions_assigned", count=len(partitions))

    def _on_revoke(self, consumer: OnLane, partitions: list[TopicPartition]) -> None:
        log(logger, "partitions_revoked", count=len(partitions))
        self._assignments += 1
        self._waiting_since = time.monotonic()
        self.health.set("assignment", False, "rebalancing")
        revoked = {(tp.topic, tp.partition) for tp in partitions}
        if self._loop is not None:
            # Buffered records of revoked partitions belong to their next owner now.
            self._loop.call_soon_threadsafe(self.intake.drop, revoked)
        consumer.unassign()
