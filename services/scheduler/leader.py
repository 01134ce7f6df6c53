"""A shard's leader: takeover, then the transactional fire loop (one term, one shard).

Takeover, in this order (docs/decisions/0002 and 0039):
1. `init_transactions()` on the shard's own transactional.id: fences the shard's previous
   leader alone, and completes or aborts its open transaction, so what follows reads a
   settled log.
2. The follower reads the shard's `scheduler-state`, `retries` and `job-definitions` to
   the end they have now into the shard's store (follower.py). A warm standby's store is
   current already: this reads only the tail.
3. The election consumer reads the shard's definitions from where the store and the
   group's committed offset say (the lower of the two). Records below the committed
   offset were processed by an earlier leader (the store takes their bytes); the rest are
   validated now, the bad ones dead-lettered, the good ones applied.
4. Reconcile what the store cannot trust: jobs whose stored timing was not computed from
   their definition, or from their calendar's current version (the process's calendar
   table, read to its end before any definition is applied: calendars.py), are computed
   again; timings of deleted jobs are dropped.
5. Commit the reconciled state, dead letters and the definitions offset (in transactions
   of a bounded size); then hold the near window in memory (the clock) and fire.

Each round of the fire loop commits, in one transaction of the shard: the JobDue records
of every timer due now (and of the ALLOW jobs' fires due within `scheduler_fire_ahead_ms`,
which the workers start at their time: docs/decisions/0027), the new state of each fired
job, tombstones of fired retries, the effects of newly read definitions and the consumer
offset of those definitions. The store learns each committed timing after the commit.
A calendar that changed is applied first in the next round: every job of the shard that
names it is planned again (held or not), and its new state committed with the round.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

from confluent_kafka import Message, TopicPartition
from opentelemetry.trace import Span, Status, StatusCode

from cronstream.services.scheduler.calendars import CalendarTable
from cronstream.services.scheduler.clock import Clock, FirePlan, JobClock, StateChange
from cronstream.services.scheduler.follower import Follower
from cronstream.services.scheduler.outbound import Applied, LeaderRecords
from cronstream.services.scheduler.sources import TriggerEngine
from cronstream.services.scheduler.store import ShardStore, StoredJob
from cronstream.shared import telemetry
from cronstream.shared.clients import REAL, KafkaClients
from cronstream.shared.codec import DecodeError, decode_key
from cronstream.shared.inbound import Batch, Inbound
from cronstream.shared.kafka.config import producer_config
from cronstream.shared.kafka.consumer import ConsumerThread
from cronstream.shared.kafka.errors import settled
from cronstream.shared.kafka.reading import position, record_time_ms
from cronstream.shared.logs import log
from cronstream.shared.producers import OutRecord, ProducerFenced, TransactionalProducer
from cronstream.shared.records import RetryRequest
from cronstream.shared.settings import Settings

logger = logging.getLogger(__name__)

SERVICE = "scheduler"
FIRE_LIMIT = 5000  # fires per transaction; a larger backlog takes several rounds
DEFINITIONS_PER_ROUND = 10_000
# At takeover, state records per transaction (a first leader computes every job's).
RECONCILE_PER_TRANSACTION = 20_000
# Rounds (transactions) start at least this far apart: under load one round fires every
# job due in the gap instead of a transaction per few jobs (a transaction costs the broker
# milliseconds, a record in it microseconds: decision 0012); a lone fire is never held
# back more than this.
ROUND_GAP_SECONDS = 0.05
# ...and further apart while every fire is committed ahead of its time (ALLOW jobs inside
# `scheduler_fire_ahead_ms`, decision 0027): nothing waits on the round then, so long as
# each fire is still committed AHEAD_MARGIN_SECONDS before its time (the dispatcher's and
# a worker's hops). The gap is the window less that margin, between these bounds: with
# the default 300 ms window, 200 ms. A process leading many shards commits a transaction
# per shard and round, and the broker's CPU follows transactions (16 shards in one process
# took 52 transactions per 1,000 executions at 3,000/s with a 100 ms gap). A round that
# fired something due already (a retry, a FORBID or REPLACE job, a late fire), or with
# such a timer due before this gap is out, keeps the short gap.
AHEAD_ROUND_GAP_SECONDS = 0.1
AHEAD_ROUND_GAP_MAX_SECONDS = 0.25
AHEAD_MARGIN_SECONDS = 0.1
# ...except when catching up (fires found this late after an outage or a takeover): a
# round fires every missed occurrence of each job it takes (FIRE_LIMIT at most), and
# waiting between rounds would only hold back the rest of a larger backlog.
CATCH_UP_LAG_MS = 1000
# The near window: timers due within this are held in memory (the clock); the store has
# the rest. It moves on when less than half of it is left.
WINDOW_MS = 120_000
# How many held jobs are made ready to fire (parsed, rendered) per pass between rounds:
# a burst due in one second is prepared long before its second.
PREPARE_PER_PASS = 2_000
# A round with this many fires is a burst: the process's standby reading waits this long
# after it (follower.py: hold), leaving the CPU to the rounds that follow.
BURST_FIRES = 1_000
BURST_HOLD_SECONDS = 0.3
# Handing a shard over (a SIGTERM, a move), its leader's last round commits the ALLOW jobs' fires
# due within this much: the standby takes over meanwhile. A takeover at a million jobs
# took a little over a second (issue 55: the latest fire 1,155 ms late with 1,000); the
# workers hold a record at most HOLD_AT_MOST_SECONDS (2 s) before its time, which leaves
# half a second for clock skew.
HAND_OVER_AHEAD_MS = 1_500


def time_ms() -> int:
    return time.time_ns() // 1_000_000


def ahead_round_gap(fire_ahead_ms: int) -> float:
    """The gap between rounds that only commit fires ahead of their time (above)."""
    return min(AHEAD_ROUND_GAP_MAX_SECONDS,
               max(AHEAD_ROUND_GAP_SECONDS, fire_ahead_ms / 1000 - AHEAD_MARGIN_SECONDS))


def next_round_gap(plan: FirePlan, now_ms: int, ahead_gap: float = AHEAD_ROUND_GAP_SECONDS) -> float:
    """How long after a round that planned `plan` at `now_ms` the next may start: the long
    gap (`ahead_gap`) while everything fired ahead of its time, else the short one — or
    until the earliest timer that waits for its time is due, if that comes first."""
    if any(fire.scheduled_ms <= now_ms for fire in plan.dues):
        return ROUND_GAP_SECONDS
    if plan.held_ms is None:
        return ahead_gap
    return min(ahead_gap, max(ROUND_GAP_SECONDS, (plan.held_ms - now_ms) / 1000))


def transactional_id(prefix: str, shard: int) -> str:
    """The shard's own transactional.id: a new leader of the shard fences its old leader,
    and only it."""
    return f"{prefix}scheduler-shard-{shard}"


def _job(row: StoredJob) -> JobClock:
    job = JobClock(row.job_id, row.def_offset, row.raw, row.observed_ms)
    job.next_fire_ms, job.last_fire_ms = row.next_fire_ms, row.last_fire_ms
    job.calendar_offset, job.runs = row.cal_offset, row.runs or 0
    return job


class ShardLeader:
    """One term of leadership of one shard. Created when the election consumer is assigned
    the shard's partition, stopped (before the callback returns) when it loses it."""

    def __init__(self, settings: Settings, shard: int, *, election: ConsumerThread, store: ShardStore,
                 follower: Follower, instance: str, group_metadata: Callable[[], Any],
                 kafka: KafkaClients = REAL, calendars: CalendarTable | None = None) -> None:
        self.settings = settings
        self.topics = settings.topics
        self.shard = shard
        self.election = election
        self.store = store
        self.follower = follower
        self.instance = instance
        self.kafka = kafka
        self._group_metadata = group_metadata
        self._reading = False  # whether the definitions consumer has the shard's partition
        # Every calendar, shared by the process's leaders; none given: no calendar known.
        self.calendars = calendars if calendars is not None else CalendarTable(ready=True)
        self.clock = Clock(shape_of=store.shape, dependents=store.dependents, calendars=self.calendars)
        self.clock.horizon_ms = time_ms() + WINDOW_MS
        self._pending_calendars: set[str] = set()
        self.calendars.listen(self.calendar_changed)
        self.failed: BaseException | None = None
        self.fenced = False
        self.ready = asyncio.Event()
        self._active = True
        self._loading = True
        self._committed_offset = 0
        self._unprocessed: list[Message] = []
        self._processed: list[tuple[str, int, int, bytes | None]] = []
        self._pending_defs: list[Message] = []
        self._pending_retries: list[Message] = []
        self._pending_fixes: list[OutRecord] = []
        self._caught_up = asyncio.Event()
        self._fed = asyncio.Event()
        self._draining = False  # the service stopped reading: process what has come
        self._wake = asyncio.Event()
        self._round_gap = ROUND_GAP_SECONDS
        self._ahead_gap = ahead_round_gap(settings.scheduler_fire_ahead_ms)
        self._txn_lock = asyncio.Lock()
        self._producer: TransactionalProducer | None = None
        self.out = LeaderRecords(self.topics, self.clock, shard, store.fired)
        self.inbound = Inbound(SERVICE, self.topics)
        self._fire_spans: list[Span] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.took_over_seconds: float | None = None
        # The shard's event triggers (sources.py): their runs commit in this term's transactions.
        self.triggers = TriggerEngine(settings, shard, store, commit=self._commit_triggered,
                                      on_failed=self._trigger_failed, lock=self._txn_lock,
                                      instance=instance, kafka=kafka)

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._run(), name=f"scheduler-shard-{self.shard}"))

    async def stop(self, hand_over: bool = False) -> None:
        """Stop acting: after this returns no transaction of this term is in flight. Handing
        over (a SIGTERM, or the roles move the shard), a last round first commits what is
        due, and the ALLOW jobs' fires of the next HAND_OVER_AHEAD_MS, which the workers
        start at their time."""
        if hand_over and self.active and self.ready.is_set():
            with contextlib.suppress(Exception):
                await self._round(time_ms(), ahead_ms=HAND_OVER_AHEAD_MS)
        self._active = False
        self.calendars.unlisten(self.calendar_changed)
        self._wake.set()
        self._caught_up.set()
        async with self._txn_lock:
            for task in self._tasks:
                task.cancel()
            await self.triggers.stop()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.triggers.join()
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.close()
        if self._reading:
            self._reading = False
            with contextlib.suppress(Exception):
                await self.election.on_lane(lambda c: c.incremental_unassign(
                    [TopicPartition(self.topics.job_definitions, self.shard)]))

    @property
    def active(self) -> bool:
        return self._active and self.failed is None

    @property
    def jobs(self) -> int:
        return len(self.clock.jobs)

    @property
    def backlog(self) -> int:
        """Definitions read and not processed yet (a first leader of a shard)."""
        return len(self._unprocessed)

    def drain(self) -> None:
        """The service reads no more definitions until the backlogs shrink: process what
        has come without waiting for a full round."""
        self._draining = True
        self._fed.set()

    # -- definitions, fed by the service's election loop ------------------------------

    def feed(self, batch: Batch, records: list[Message], ended: bool) -> None:
        """This shard's records of an election batch (read through the inbound path)."""
        if ended and self._loading:
            self._caught_up.set()
        for msg in records:
            if self._loading:
                self._load_definition(batch, msg)
            else:
                self._pending_defs.append(msg)
        self._fed.set()
        if self._processed:  # the bytes of what an earlier leader handled, in one write
            processed, self._processed = self._processed, []
            self.store.write(definitions=processed,
                             positions=[(self.topics.job_definitions, processed[-1][1] + 1)])
        if self._pending_defs:
            self._wake.set()

    def _load_definition(self, batch: Batch, msg: Message) -> None:
        offset = position(msg)[2]
        # Below the committed offset: dead-lettered (if need be) by an earlier leader.
        job_id = batch.read(lambda _value, key: decode_key(key), msg,
                            reject=offset >= self._committed_offset)
        if job_id is None:
            return
        if offset >= self._committed_offset:
            self._unprocessed.append(msg)
        else:
            self._processed.append((job_id, offset, record_time_ms(msg), msg.value()))

    def calendar_changed(self, calendar_id: str) -> None:
        """A calendar changed (the process's calendar table): its jobs of this shard are
        planned again in the next round, before anything fires."""
        self._pending_calendars.add(calendar_id)
        self._wake.set()

    def waiting(self) -> int:
        """Jobs of the shard that name a calendar not known: they wait for it."""
        known = self.calendars.ids()
        return sum(n for calendar_id, n in self.store.naming_counts().items() if calendar_id not in known)

    def on_retries(self, messages: list[Message]) -> None:
        """Records of the shard's `retries`, read by the follower (its lane: the loop's)."""
        self._pending_retries.extend(messages)
        self._wake.set()

    # -- takeover -------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._take_over()
            await self._fire_loop()
        except ProducerFenced as exc:
            self.fenced = True
            self.failed = exc
            log(logger, "leader_fenced", logging.WARNING, instance=self.instance, shard=self.shard,
                error=str(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failed = exc
            logger.exception("shard leader failed", extra={"action": "leader_failed",
                                                           "shard": self.shard})

    async def _take_over(self) -> None:
        started = time.monotonic()
        tid = transactional_id(self.topics.prefix, self.shard)
        self._producer = self.kafka.transactional(
            producer_config(self.settings, f"scheduler-{self.instance}-{self.shard}", transactional_id=tid))
        await self._producer.init()
        steps = {"fence": time.monotonic()}
        log(logger, "leader_fenced_predecessor", instance=self.instance, shard=self.shard,
            transactional_id=tid)
        # Everything the predecessor committed is in the log now: read it into the store.
        await self.follower.caught_up(self.shard)
        steps["tail"] = time.monotonic()
        self.follower.follow(self.shard, self.store, "leading", on_retries=self.on_retries)
        await self.triggers.load()

        # Every calendar, before any definition is applied or any timing trusted.
        while not self.calendars.ready.is_set() and self._active:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.calendars.ready.wait(), 0.5)
        # What changed before is in the table the rest of the takeover computes with.
        self._pending_calendars.clear()
        steps["calendars"] = time.monotonic()
        tp = TopicPartition(self.topics.job_definitions, self.shard)
        committed = await settled(lambda: self.election.committed([tp]),
                                  "committed offset of job-definitions")
        self._committed_offset = max(committed[0].offset, 0)
        start = min(self.store.positions().get(tp.topic, 0), self._committed_offset)
        await self.election.on_lane(lambda c: c.incremental_assign(
            [TopicPartition(tp.topic, self.shard, start)]))
        self._reading = True
        await self._process_unprocessed()
        if not self._active:
            return
        steps["definitions"] = time.monotonic()
        await self._reconcile()
        steps["reconcile"] = time.monotonic()
        self._pending_fixes += self._admit_window(None)
        if self._pending_fixes or self.out.has_suspensions():
            records, self._pending_fixes = self._pending_fixes + self.out.suspension_alerts(), []
            await self._commit(records, None)
        self._loading = False
        self.ready.set()
        self.triggers.start()
        self.took_over_seconds = round(time.monotonic() - started, 3)
        self._tasks.append(asyncio.create_task(self._prepare_loop(), name=f"scheduler-prepare-{self.shard}"))
        marks = [started, *steps.values()]
        log(logger, "leader_ready", instance=self.instance, shard=self.shard, jobs=self.store.count(),
            held=len(self.clock.jobs), retries=self.store.retry_count(),
            takeover_seconds=self.took_over_seconds,
            **{f"{name}_ms": round(1000 * (marks[i + 1] - marks[i])) for i, name in enumerate(steps)})

    async def _process_unprocessed(self) -> None:
        """Validate and apply the definitions no earlier leader processed, in transactions of
        DEFINITIONS_PER_ROUND as they arrive (a first leader of a shard of a million jobs
        never holds them all), until the end of the partition."""
        tp = TopicPartition(self.topics.job_definitions, self.shard)
        while self._active:
            ended = self._caught_up.is_set()
            draining, self._draining = self._draining, False
            if len(self._unprocessed) >= DEFINITIONS_PER_ROUND or ((ended or draining) and self._unprocessed):
                defs = self._unprocessed[:DEFINITIONS_PER_ROUND]
                del self._unprocessed[:DEFINITIONS_PER_ROUND]
                applied: list[Applied] = []
                records = self.out.definitions(self.inbound.batch(defs), applied)
                records += self.triggers.definitions(applied)
                await self._commit(records, [TopicPartition(tp.topic, self.shard, position(defs[-1])[2] + 1)])
                self._store_applied(applied, [])
                self.triggers.applied()
                self.clock.evict()
                continue
            if ended:
                return
            self._fed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._fed.wait(), 0.1)

    def _store_applied(self, applied: list[Applied], timings: list[StateChange]) -> None:
        """What a committed transaction changed: the definitions it applied and the
        timings it wrote, into the shard's store."""
        if not applied and not timings:
            return
        changes = [a.change for a in applied] + timings
        self.store.write(
            definitions=[(a.job_id, a.offset, a.observed_ms, a.raw) for a in applied],
            states=[(c.job_id, c.offset, c.next_fire_ms, c.last_fire_ms, c.value is None,
                     c.calendar_offset, c.runs) for c in changes],
            positions=[(self.topics.job_definitions, applied[-1].offset + 1)] if applied else ())

    async def _reconcile(self) -> None:
        """Jobs whose stored timing was not computed from their definition: computed again
        (every job, for the very first leader of a shard); timings of deleted jobs dropped."""
        after = ""
        while self._active:
            rows = self.store.unreconciled(after, RECONCILE_PER_TRANSACTION)
            if not rows:
                break
            after = rows[-1].job_id
            changes = [StateChange(row.job_id, None) if row.raw is None else self.clock.recompute(_job(row))
                       for row in rows]
            await self._commit_states(changes)
            self.clock.evict()
        # Jobs whose timing was computed with another version of their calendar (or
        # without it): computed again with the current one.
        after = ""
        while self._active:
            rows = self.store.calendar_jobs(after, RECONCILE_PER_TRANSACTION)
            if not rows:
                break
            after = rows[-1].job_id
            stale = []
            for row in rows:
                job = _job(row)
                if not self.clock.trusted(job, row.next_fire_ms):
                    stale.append(self.clock.recompute(job))
            await self._commit_states(stale)
            self.clock.evict()

    async def _commit_states(self, changes: list[StateChange]) -> None:
        if not changes:
            return
        records = [self.out.state(c) for c in changes] + self.out.suspension_alerts()
        await self._commit(records, None)
        self._store_applied([], changes)

    # -- the near window ------------------------------------------------------------

    def _admit_window(self, since_ms: int | None) -> list[OutRecord]:
        """Hold the jobs and retries due before the horizon (from `since_ms` on); returns
        the fixes of retry records that do not read (dead letters and tombstones)."""
        horizon = self.clock.horizon_ms
        assert horizon is not None
        for row in self.store.due_between(since_ms, horizon):
            self.clock.admit(_job(row))
        fixes: list[OutRecord] = []
        for execution_id, _due, value, headers in self.store.retries_between(since_ms, horizon):
            fixes += self._hold_retry(execution_id.encode(), value, headers)
        return fixes

    def _hold_retry(self, key: bytes, value: bytes, headers: str | None) -> list[OutRecord]:
        try:
            request = RetryRequest.model_validate_json(value)
            if str(request.execution_id) != key.decode():
                raise ValueError("the key is not the record's execution_id")
        except Exception as exc:
            # A bad timer is dead-lettered and its key tombstoned, so no later leader sees
            # it again; the store drops it with the tombstone.
            log(logger, "retry_unreadable", logging.WARNING, shard=self.shard, key=key[:100],
                error=str(exc)[:300])
            self.store.write(retries=[(key.decode("utf-8", "replace"), None, None, None)])
            return [self.out.dead_letter_retry(key, value, str(exc)), self._tombstone(key)]
        if self.clock.add_retry(request) and headers:
            self.out.retry_headers[str(request.execution_id)] = [
                (k, v.encode()) for k, v in json.loads(headers)]
        return []

    async def _move_window(self, now_ms: int) -> None:
        horizon = self.clock.horizon_ms
        assert horizon is not None
        if horizon - now_ms > WINDOW_MS // 2:
            return
        self.clock.horizon_ms = now_ms + WINDOW_MS
        self._pending_fixes += self._admit_window(horizon)

    async def _prepare_loop(self) -> None:
        """Make held jobs ready to fire ahead of their time (parsed definition, the next
        JobDue rendered, the fire after it computed): a burst of jobs due in the same
        second then costs only its records."""
        while self._active:
            prepared = 0
            for job in list(self.clock.jobs.values()):
                try:
                    done = self.clock.prepare(job)
                except Exception:  # a bad one is suspended when due
                    done = True
                if done:
                    prepared += 1
                    if prepared % PREPARE_PER_PASS == 0:
                        await asyncio.sleep(0)
            await asyncio.sleep(1.0)

    # -- retries --------------------------------------------------------------------

    def _apply_retries(self) -> None:
        messages, self._pending_retries = self._pending_retries, []
        batch = self.inbound.batch(messages)
        for msg in batch.records:
            key = msg.key()
            value = msg.value()
            if key is None:
                if value is not None:
                    batch.reject(msg, "missing key")
                continue
            try:
                execution_id = UUID(decode_key(key))
            except (ValueError, DecodeError):
                if value is not None:
                    batch.reject(msg, "key is not an execution id")
                    self._pending_fixes.append(self._tombstone(key))
                continue
            if value is None:
                self.clock.cancel_retry(execution_id)
                self.out.retry_headers.pop(str(execution_id), None)
                self.store.write(retries=[(str(execution_id), None, None, None)],
                                 positions=[(self.topics.retries, position(msg)[2] + 1)])
                continue
            request = batch.decode(RetryRequest, msg, key_field="execution_id")
            if request is None:
                self._pending_fixes.append(self._tombstone(key))
                continue
            headers = telemetry.carried(msg.headers())
            self.store.write(retries=[(str(execution_id), int(request.due_at.timestamp() * 1000), value,
                                       json.dumps([[k, v.decode("utf-8", "replace")] for k, v in headers])
                                       if headers else None)],
                             positions=[(self.topics.retries, position(msg)[2] + 1)])
            if self.clock.add_retry(request):
                self.out.retry_headers[str(request.execution_id)] = headers
        self._pending_fixes += batch.dead

    def _tombstone(self, key: bytes) -> OutRecord:
        return OutRecord(self.topics.retries, key, None, partition=self.shard)

    # -- firing ---------------------------------------------------------------------

    async def _fire_loop(self) -> None:
        last_round = 0.0
        ahead = self.settings.scheduler_fire_ahead_ms
        while self._active:
            now = time_ms()
            await self._move_window(now)
            if self._pending_retries:
                self._apply_retries()
            due = self.clock.next_due_ms()
            if (not self._pending_defs and not self._pending_fixes and not self._pending_calendars
                    and (due is None or due > now + ahead)):
                timeout = 1.0 if due is None else min(1.0, (due - ahead - now) / 1000)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            wait = (ROUND_GAP_SECONDS if self._pending_defs or self._pending_fixes or self._pending_calendars
                    else self._round_gap)
            gap = wait - (time.monotonic() - last_round)
            catching_up = due is not None and now - due > CATCH_UP_LAG_MS
            if gap > 0 and not catching_up:
                await asyncio.sleep(gap)
                continue
            last_round = time.monotonic()
            await self._round(now)

    async def _round(self, now_ms: int, ahead_ms: int | None = None) -> None:
        async with self._txn_lock:
            if not self._active:
                return
            self.out.new_round()
            replanned = self._replan_calendars()
            defs = self._pending_defs[:DEFINITIONS_PER_ROUND]
            del self._pending_defs[:DEFINITIONS_PER_ROUND]
            applied: list[Applied] = []
            records = [self.out.state(c) for c in replanned]
            records += self.out.definitions(self.inbound.batch(defs), applied)
            records += self.triggers.definitions(applied)
            records += self._pending_fixes
            self._pending_fixes = []
            offsets = None
            if defs:
                offsets = [TopicPartition(self.topics.job_definitions, self.shard,
                                          position(defs[-1])[2] + 1)]
            plan = self.clock.plan(now_ms, FIRE_LIMIT, self.settings.scheduler_fire_ahead_ms
                                   if ahead_ms is None else ahead_ms)
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
            self._store_applied(applied, replanned + plan.states)
            self.triggers.applied()
            if plan.fired_retries:
                self.store.write(retries=[(str(k), None, None, None) for k in plan.fired_retries])
            self.clock.evict()
            self.out.count_round(plan, now_ms, planned_ms)
            if len(plan.dues) >= BURST_FIRES:
                self.follower.hold(BURST_HOLD_SECONDS)
            self._round_gap = next_round_gap(plan, now_ms, self._ahead_gap)

    def _replan_calendars(self) -> list[StateChange]:
        """The jobs of the shard naming a calendar that changed, planned again (in memory
        now; their states commit with the round)."""
        if not self._pending_calendars:
            return []
        changed, self._pending_calendars = sorted(self._pending_calendars), set()
        changes: list[StateChange] = []
        for calendar_id in changed:
            jobs = [_job(row) for row in self.store.naming(calendar_id)]
            found = self.clock.replan_calendar(calendar_id, jobs)
            changes += found
            if found:
                offset = self.calendars.offset(calendar_id)
                log(logger, "calendar_replanned", shard=self.shard, calendar_id=calendar_id,
                    jobs=len(found), offset="deleted" if offset is None else offset)
        return changes

    async def _commit_triggered(self, records: list[OutRecord]) -> bool:
        """An event trigger's run (or positions), in a transaction of this term; False
        when the term is over."""
        async with self._txn_lock:
            if not self.active:
                return False
            await self._commit(records, None)
            return True

    def _trigger_failed(self, exc: BaseException) -> None:
        if self.failed is None:
            self.fenced = isinstance(exc, ProducerFenced)
            self.failed = exc

    async def _commit(self, records: list[OutRecord], offsets: list[TopicPartition] | None) -> None:
        if not records and not offsets:
            return
        assert self._producer is not None
        await self._producer.commit(records, offsets, self._group_metadata)
