"""The scheduler leader: takeover, then the transactional fire loop.

Takeover, in this order (docs/decisions/0002-scheduler-election-and-fencing.md):
1. `init_transactions()` on the fixed transactional.id: fences any previous leader, and
   completes or aborts its open transaction, so what follows reads a settled log.
2. Read `scheduler-state` to its end: every job's stored next fire.
3. Replay `job-definitions` from offset 0 through the election consumer (which then
   stays on it). Records below the group's committed offset were processed by an
   earlier leader; the rest are validated now, the bad ones dead-lettered.
4. Reconcile: where a job's state was computed from its current definition, trust its
   next fire (no cron evaluation); recompute the others.
5. Read `retries` to its end: the pending retry timers.
6. Commit the reconciled state, dead letters and the definitions offset in one
   transaction; then fire.

Each round of the fire loop commits, in one transaction: the JobDue records of every
timer due now (and of the ALLOW jobs' fires due within `scheduler_fire_ahead_ms`, which
the workers start at their time: docs/decisions/0027), the new state of each fired
job, tombstones of fired retries, the effects of newly read definitions and the consumer
offset of those definitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from functools import partial
from typing import Any
from uuid import UUID

from confluent_kafka import KafkaException, Message, TopicPartition
from opentelemetry.trace import Span, Status, StatusCode

from cronstream.services.scheduler.clock import Clock, FirePlan
from cronstream.services.scheduler.outbound import LeaderRecords
from cronstream.shared import metrics, telemetry
from cronstream.shared.clients import REAL, KafkaClients
from cronstream.shared.codec import DecodeError, decode_key
from cronstream.shared.inbound import Batch, Inbound
from cronstream.shared.kafka.config import OFFSET_BEGINNING, producer_config, reader_config
from cronstream.shared.kafka.consumer import ConsumerThread, OnLane
from cronstream.shared.kafka.errors import settled
from cronstream.shared.kafka.reading import position, read_to_end, record_time_ms
from cronstream.shared.logs import log
from cronstream.shared.producers import OutRecord, ProducerFenced, TransactionalProducer
from cronstream.shared.records import JobDefinition, RetryRequest
from cronstream.shared.settings import Settings

logger = logging.getLogger(__name__)

SERVICE = "scheduler"
FIRE_LIMIT = 5000  # fires per transaction; a larger backlog takes several rounds
DEFINITIONS_PER_ROUND = 10_000
# Rounds (transactions) start at least this far apart: under load one round fires every
# job due in the gap instead of a transaction per few jobs (a transaction costs the broker
# milliseconds, a record in it microseconds: decision 0012); a lone fire is never held
# back more than this. 50 ms: a round writes every job-due partition, and moving rounds
# from 20 to 50 ms apart took a quarter off the broker's CPU at 1,000 fires/s.
ROUND_GAP_SECONDS = 0.05
# ...and this far apart while every fire is committed ahead of its time (ALLOW jobs inside
# `scheduler_fire_ahead_ms`, decision 0027): nothing waits on the round then. A round
# that fired something due already (a retry, a FORBID or REPLACE job, a late fire), or
# with such a timer due before this gap is out, keeps the short gap, so the timer path's
# fire lag stays what ROUND_GAP_SECONDS makes it.
AHEAD_ROUND_GAP_SECONDS = 0.1
# ...except when catching up (fires found this late after an outage or a takeover): each
# round then fires one missed occurrence per job, and waiting between rounds would only
# hold back the newest fires, which come last.
CATCH_UP_LAG_MS = 1000


def time_ms() -> int:
    return time.time_ns() // 1_000_000


def next_round_gap(plan: FirePlan, now_ms: int) -> float:
    """How long after a round that planned `plan` at `now_ms` the next may start: the long
    gap while everything fired ahead of its time, else the short one — or until the
    earliest timer that waits for its time is due, if that comes first."""
    if any(fire.scheduled_ms <= now_ms for fire in plan.dues):
        return ROUND_GAP_SECONDS
    if plan.held_ms is None:
        return AHEAD_ROUND_GAP_SECONDS
    return min(AHEAD_ROUND_GAP_SECONDS, max(ROUND_GAP_SECONDS, (plan.held_ms - now_ms) / 1000))


class Leader:
    """One term of leadership. Created on assignment of partition 0, stopped on revoke."""

    def __init__(self, settings: Settings, election: ConsumerThread, instance: str,
                 kafka: KafkaClients = REAL) -> None:
        self.settings = settings
        self.kafka = kafka
        self.topics = settings.topics
        self.election = election
        self.instance = instance
        self.clock = Clock()
        self.failed: BaseException | None = None
        self.fenced = False
        self.ready = asyncio.Event()
        self._active = True
        self._loading = True
        self._committed_offset = 0
        self._unprocessed: list[Message] = []
        self._pending_defs: list[Message] = []
        self._pending_fixes: list[OutRecord] = []
        self._caught_up = asyncio.Event()
        self._state_loaded = asyncio.Event()
        self._wake = asyncio.Event()
        self._round_gap = ROUND_GAP_SECONDS  # until the next round: next_round_gap
        self._txn_lock = asyncio.Lock()
        self._producer: TransactionalProducer | None = None
        self.out = LeaderRecords(self.topics, self.clock)
        # Every record the leader reads, from job-definitions and retries, goes through the
        # one inbound path: errors logged, bad records dead-lettered with its transactions.
        self.inbound = Inbound(SERVICE, self.topics)
        self._fire_spans: list[Span] = []
        self._retries_reader: ConsumerThread | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._run(), name="scheduler-leader"))

    async def stop(self) -> None:
        """Stop acting: after this returns no transaction of this term is in flight."""
        self._active = False
        metrics.SCHEDULER_LEADER.set(0)
        self._wake.set()
        self._caught_up.set()
        self._state_loaded.set()
        async with self._txn_lock:
            for task in self._tasks:
                task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._retries_reader is not None:
            await self._retries_reader.close()
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.close()

    @property
    def active(self) -> bool:
        return self._active and self.failed is None

    # -- definitions, fed by the service's election loop ------------------------------

    def feed(self, batch: Batch) -> None:
        """The election consumer's batch, through the service's inbound path."""
        if batch.ended and self._loading:
            self._caught_up.set()
        for msg in batch.records:
            if self._loading:
                self._load_definition(batch, msg)
            else:
                self._pending_defs.append(msg)
        self._pending_fixes += batch.dead
        if self._pending_defs:
            self._wake.set()

    def _load_definition(self, batch: Batch, msg: Message) -> None:
        offset = position(msg)[2]
        # Below the committed offset: dead-lettered (if need be) by an earlier leader.
        job_id = batch.read(lambda _value, key: decode_key(key), msg,
                            reject=offset >= self._committed_offset)
        if job_id is None:
            return
        self.clock.load_definition(job_id, msg.value(), offset, record_time_ms(msg))
        if offset >= self._committed_offset:
            self._unprocessed.append(msg)

    # -- takeover -------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._take_over()
            await self._fire_loop()
        except ProducerFenced as exc:
            self.fenced = True
            self.failed = exc
            log(logger, "leader_fenced", logging.WARNING, instance=self.instance, error=str(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failed = exc
            logger.exception("leader failed", extra={"action": "leader_failed"})

    async def _take_over(self) -> None:
        started = time.monotonic()
        tid = f"{self.topics.prefix}scheduler-leader"
        self._producer = self.kafka.transactional(
            producer_config(self.settings, f"scheduler-{self.instance}", transactional_id=tid)
        )
        await self._producer.init()
        log(logger, "leader_fenced_predecessor", instance=self.instance, transactional_id=tid)

        def load_state(messages: list[Message]) -> None:
            for msg in messages:
                key = msg.key()
                if key:
                    self.clock.load_state(key.decode("utf-8", "replace"), msg.value())

        state_reader = self.kafka.consumer(reader_config(self.settings, "scheduler-state"), "state")
        try:
            await read_to_end(state_reader, [TopicPartition(self.topics.scheduler_state, 0)],
                              load_state)
        finally:
            await state_reader.close()

        tp = TopicPartition(self.topics.job_definitions, 0)
        committed = await settled(lambda: self.election.committed([tp]),
                                  "committed offset of job-definitions")
        self._committed_offset = max(committed[0].offset, 0)
        # The election consumer paused partition 0 on assignment; replay starts now,
        # from the beginning (a later term of the same assignment must rewind).
        await self.election.on_lane(partial(self._rewind, tp=tp))
        await self._caught_up.wait()
        if not self._active:
            return

        retries: dict[bytes, Message] = {}
        self._retries_reader = self.kafka.consumer(reader_config(self.settings, "scheduler-retries"),
                                                   "retries")
        await read_to_end(
            self._retries_reader, [TopicPartition(self.topics.retries, 0)],
            lambda msgs: retries.update({m.key() or b"": m for m in msgs}),
        )
        self._apply_retries(self.inbound.batch([m for m in retries.values() if m.value() is not None]))

        checked = self.inbound.batch(self._unprocessed)
        last_offset = max((position(m)[2] for m in self._unprocessed), default=-1)
        for msg in checked.records:
            if msg.value() is not None:
                checked.decode(JobDefinition, msg, key_field="job_id")
        self._unprocessed.clear()
        records: list[OutRecord] = checked.dead
        records += [self.out.state(c) for c in self.clock.reconcile()]
        records += self.out.suspension_alerts()
        records += self._pending_fixes
        self._pending_fixes = []
        offsets = [TopicPartition(tp.topic, 0, last_offset + 1)] if last_offset >= 0 else None
        await self._commit(records, offsets)
        self._loading = False
        self.ready.set()
        metrics.SCHEDULER_LEADER.set(1)
        metrics.SCHEDULER_JOBS.set(len(self.clock.jobs))
        metrics.SCHEDULER_PENDING_RETRIES.set(len(self.clock.retries))
        self._tasks.append(asyncio.create_task(self._consume_retries(), name="scheduler-retries"))
        log(logger, "leader_ready", instance=self.instance, jobs=len(self.clock.jobs),
            retries=len(self.clock.retries), takeover_seconds=round(time.monotonic() - started, 3))

    @staticmethod
    def _rewind(consumer: OnLane, tp: TopicPartition) -> None:
        consumer.pause([tp])
        try:
            consumer.seek(TopicPartition(tp.topic, 0, OFFSET_BEGINNING))
        except KafkaException as exc:
            # Not fetching yet (first term): the assignment already starts at 0.
            log(logger, "definitions_rewind_skipped", logging.DEBUG, error=str(exc))
        consumer.resume([tp])

    # -- retries --------------------------------------------------------------------

    def _apply_retries(self, batch: Batch) -> None:
        for msg in batch.records:
            self._apply_retry(batch, msg)
        self._pending_fixes += batch.dead

    def _apply_retry(self, batch: Batch, msg: Message) -> None:
        # A bad timer is dead-lettered and its key tombstoned, so no later leader sees it
        # again (a tombstone under a bad key is nothing to fix).
        key = batch.read(_execution_key, msg, reject=msg.value() is not None)
        if key is None:
            if msg.value() is not None:
                self._pending_fixes.append(OutRecord(self.topics.retries, msg.key(), None))
            return
        if msg.value() is None:
            self.clock.cancel_retry(key)
            self.out.retry_headers.pop(str(key), None)
            return
        request = batch.decode(RetryRequest, msg, key_field="execution_id")
        if request is None:
            self._pending_fixes.append(OutRecord(self.topics.retries, msg.key(), None))
            return
        self.clock.add_retry(request)
        self.out.retry_headers[str(request.execution_id)] = telemetry.carried(msg.headers())

    async def _consume_retries(self) -> None:
        """Follow `retries` for the term. Should it fail, the term fails with it (the service
        takes over again): retry timers must never stop arriving silently."""
        try:
            await self._follow_retries()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failed = exc
            logger.exception("retries stopped", extra={"action": "leader_failed"})
            self._wake.set()

    async def _follow_retries(self) -> None:
        assert self._retries_reader is not None
        while self._active:
            messages = await self._retries_reader.consume(1000, 0.1)
            self._apply_retries(self.inbound.batch(messages))
            if messages:
                self._wake.set()

    # -- firing ---------------------------------------------------------------------

    async def _fire_loop(self) -> None:
        last_round = 0.0
        ahead = self.settings.scheduler_fire_ahead_ms
        while self._active:
            now = time_ms()
            due = self.clock.next_due_ms()
            if (not self._pending_defs and not self._pending_fixes
                    and (due is None or due > now + ahead)):
                timeout = 1.0 if due is None else min(1.0, (due - ahead - now) / 1000)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            wait = ROUND_GAP_SECONDS if self._pending_defs or self._pending_fixes else self._round_gap
            gap = wait - (time.monotonic() - last_round)
            catching_up = due is not None and now - due > CATCH_UP_LAG_MS
            if gap > 0 and not catching_up:
                await asyncio.sleep(gap)
                continue
            last_round = time.monotonic()
            await self._round(now)

    async def _round(self, now_ms: int) -> None:
        async with self._txn_lock:
            if not self._active:
                return
            self.out.new_round()
            # Bounded: a bulk upload of definitions takes several short transactions.
            defs = self._pending_defs[:DEFINITIONS_PER_ROUND]
            del self._pending_defs[:DEFINITIONS_PER_ROUND]
            records = self.out.definitions(self.inbound.batch(defs))
            records += self._pending_fixes
            self._pending_fixes = []
            offsets = None
            if defs:
                offsets = [TopicPartition(self.topics.job_definitions, 0, position(defs[-1])[2] + 1)]
            plan = self.clock.plan(now_ms, FIRE_LIMIT, self.settings.scheduler_fire_ahead_ms)
            records += self.out.fires(plan, self._fire_spans)
            records += self.out.suspension_alerts()
            planned_ms = time_ms()
            spans, self._fire_spans = self._fire_spans, []
            try:
                await self._commit(records, offsets)
            except BaseException as exc:
                self.clock.restore(plan)
                for span in spans:
                    span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
                    span.end()
                raise
            for span in spans:
                span.end()
            for key in plan.fired_retries:
                self.out.retry_headers.pop(str(key), None)
            self.clock.commit(plan)
            metrics.SCHEDULER_JOBS.set(len(self.clock.jobs))
            metrics.SCHEDULER_PENDING_RETRIES.set(len(self.clock.retries))
            if plan.skipped:
                metrics.MISFIRES.labels(outcome="skipped").inc(plan.skipped)
            self._round_gap = next_round_gap(plan, now_ms)
            if plan.dues:
                committed_ms = time_ms()
                retried = len(plan.fired_retries)
                metrics.FIRES.labels(reason="RETRY").inc(retried)
                metrics.FIRES.labels(reason="SCHEDULE").inc(len(plan.dues) - retried)
                for fire in plan.dues:
                    metrics.FIRE_LAG.observe(max(0, committed_ms - fire.scheduled_ms) / 1000)
                log(logger, "jobs_fired", fired=len(plan.dues),
                    max_lag_ms=committed_ms - min(d.scheduled_ms for d in plan.dues),
                    plan_ms=planned_ms - now_ms, commit_ms=committed_ms - planned_ms,
                    first_job_id=plan.dues[0].job_id,
                    first_scheduled_ms=plan.dues[0].scheduled_ms)

    async def _commit(self, records: list[OutRecord], offsets: list[TopicPartition] | None) -> None:
        if not records and not offsets:
            return
        assert self._producer is not None
        await self._producer.commit(records, offsets, self._group_metadata)

    def _group_metadata(self) -> Any:
        return self.election.group_metadata()


def _execution_key(_value: bytes | None, key: bytes | None) -> UUID:
    """A `retries` record's key: the execution id of the attempt it times."""
    try:
        return UUID(decode_key(key))
    except ValueError:
        raise DecodeError("key is not an execution id") from None

