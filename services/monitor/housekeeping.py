"""Housekeeping: dead workers, orphaned executions, next runs, fleet figures.

Run once a second. Only a monitor that has *watched* `heartbeats` — owned it, read it to
its end and reached the broker in every round — for `dead_after` on end may call a worker
dead or an execution orphaned: one that is catching up, or that was cut off from the
broker (a broker restart cuts off everyone, workers included), would see every worker as
silent, fence the whole fleet and re-queue what it is running (see `Sight`).

Dead workers (docs/reference/semantics.md#dead-workers). A worker silent for
`CRONSTREAM_WORKER_DEAD_AFTER_SECONDS`:
1. is *fenced*: the monitor takes the worker's transactional.id (`init_transactions()`),
   which aborts the transaction it may have left open — read_committed consumers of its
   partitions move on at once instead of after `transaction.timeout.ms` — and makes any
   later commit of that worker fail. A paused worker that wakes up cannot report a stale
   FAILED (and its RetryRequest) for an execution that runs elsewhere by then;
2. the end of every `execution-events` partition is read right after the fence (the high
   watermark: everything the fenced incarnation committed lies below it, its transaction
   markers included; anything written later comes from a process that took the
   transactional.id after the fence — the worker restarted under its id);
3. then the monitor waits until the projection holds everything on `execution-events`
   (so what the worker did commit before dying is seen: nothing is re-queued that ended);
4. re-queues the RUNNING executions whose start was committed below that end — never one
   started by a new incarnation in the meantime, which runs it and will report it (the
   chaos suite caught a monitor re-queueing, 5 s after its fence, what the restarted worker
   had just started: it ran twice).

Orphans. An execution RUNNING on a live worker whose heartbeats, sent well after it
started, do not list it, is run by nobody (its worker could not tell whether the
transaction that started it committed, and did not start it). It is re-queued once the
projection is known to hold every event committed before the heartbeat was read — so an
execution that merely finished a moment ago (a worker drops it from its heartbeats only
after its end is committed) is never mistaken for one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import asyncpg
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from cronstream.services.monitor.outbound import Outbound
from cronstream.services.monitor.store import ProjectionStore, calendars_of
from cronstream.services.monitor.upstream import step_upstream
from cronstream.shared import metrics
from cronstream.shared.clients import REAL, KafkaClients
from cronstream.shared.db import query
from cronstream.shared.kafka.config import OFFSET_BEGINNING, producer_config, reader_config
from cronstream.shared.kafka.consumer import ConsumerThread
from cronstream.shared.kafka.lag import WorkLag
from cronstream.shared.logs import log
from cronstream.shared.producers import IdempotentProducer
from cronstream.shared.records import now_utc
from cronstream.shared.schedule import StoredTiming, next_fire
from cronstream.shared.settings import Settings

logger = logging.getLogger(__name__)

ORPHAN_GRACE_SECONDS = 2.0  # heartbeat sent_at vs started_at: one worker's own clock
ORPHAN_EVERY = 2  # rounds between orphan checks (a restarted worker leaves orphans at once)
FIGURES_EVERY = 5  # rounds between next-run and queue-depth refreshes
CATCH_UP_SECONDS = 20.0
FENCE_PATIENCE = 20.0


class Sight:
    """How long this monitor has watched the heartbeats without a break.

    Silence is evidence only for a gap the monitor itself watched: after a break (no
    ownership, behind the end, the broker unreachable) every worker gets `dead_after`
    again, counted from when the monitor could see once more."""

    def __init__(self, dead_after: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.dead_after = dead_after
        self.clock = clock
        self._since: float | None = None

    def observe(self, watching: bool) -> bool:
        """Record one round's view; whether silence may now be taken as death."""
        if not watching:
            self._since = None
            return False
        now = self.clock()
        if self._since is None:
            self._since = now
        return now - self._since >= self.dead_after


class Housekeeping:
    def __init__(self, settings: Settings, pool: asyncpg.Pool, store: ProjectionStore, *,
                 producer: IdempotentProducer, outbound: Outbound, instance: str,
                 kafka: KafkaClients = REAL) -> None:
        self.settings = settings
        self.kafka = kafka
        self.topics = settings.topics
        self.pool = pool
        self.store = store
        self.producer = producer
        self.outbound = outbound
        self.instance = instance
        self._reader: ConsumerThread | None = None
        self.rounds = 0
        self.sight = Sight(settings.worker_dead_after_seconds)

    async def close(self) -> None:
        if self._reader is not None:
            await self._reader.close()

    async def round(self, watching: bool) -> None:
        """One round; `watching`: this monitor owns `heartbeats`, has read it to the end and
        reached the broker to tell."""
        self.rounds += 1
        if self.sight.observe(watching):  # silence has been watched long enough to judge
            await self.requeue_dead_workers()
            if self.rounds % ORPHAN_EVERY == 0:
                await self.requeue_orphans()
        if self.rounds % FIGURES_EVERY == 0:
            await self.refresh_next_executions()
            await self.resolve_definition_versions()
            if watching:  # one monitor measures the fleet-wide gauges, so that sums stay true
                await self.measure_fleet()

    # -- dead workers ---------------------------------------------------------------------

    async def requeue_dead_workers(self) -> None:
        dead = await self.pool.fetch(query("dead_workers"), self.settings.worker_dead_after_seconds)
        if not dead:
            return
        ids = [r["worker_id"] for r in dead]
        fenced_below: dict[str, list[int]] = {}
        for worker_id in ids:
            await self.fence(worker_id)
            fenced_below[worker_id] = await self.event_ends()
        ends = [max(column) for column in zip(*fenced_below.values(), strict=True)]
        if not await self.projection_caught_up(ends):
            log(logger, "requeue_postponed", logging.WARNING, workers=",".join(ids),
                reason="the projection has not caught up with execution-events yet")
            return
        running = [row for worker_id, ends in fenced_below.items()
                   for row in await self.pool.fetch(query("running_on_worker_before"), worker_id, ends)]
        records = [r for row in running for r in self.outbound.requeue(
            row, f"worker {row['worker_id']} stopped sending heartbeats",
            await step_upstream(self.pool, row["run_id"], row["job_id"]))]
        await self._publish(records)
        await self.pool.execute(query("mark_workers_offline"), ids)
        metrics.REQUEUES.labels(reason="dead_worker").inc(len(running))
        for row in dead:
            log(logger, "worker_declared_dead", logging.WARNING, worker_id=row["worker_id"],
                last_heartbeat=row["last_heartbeat"].isoformat(), requeued=len(running))

    async def fence(self, worker_id: str) -> None:
        """Take the worker's transactional.id: its open transaction is aborted now, and it
        can never commit again under this epoch."""
        tid = f"{self.topics.prefix}worker-{worker_id}"
        producer = self.kafka.transactional(producer_config(
            self.settings, f"monitor-{self.instance}-fence", transactional_id=tid))
        try:
            await producer.init(patience=FENCE_PATIENCE)
            log(logger, "worker_fenced_by_monitor", worker_id=worker_id, transactional_id=tid)
        finally:
            await producer.close()

    async def event_ends(self) -> list[int]:
        """The high watermark of each `execution-events` partition (index = partition),
        asked of the partition leaders now. Not the last stable offset: another producer's
        open transaction holds that back below records the fenced worker committed."""
        return await asyncio.get_running_loop().run_in_executor(
            None, self.kafka.latest_offsets, self.settings, self.topics.execution_events)

    # -- orphans ----------------------------------------------------------------------------

    async def requeue_orphans(self) -> None:
        candidates = await self.pool.fetch(query("orphan_candidates"), ORPHAN_GRACE_SECONDS)
        if not candidates or not await self.projection_caught_up(await self.event_ends()):
            return
        still = {(r["execution_id"], r["delivery"]) for r in await self.pool.fetch(
            query("still_running"), [r["execution_id"] for r in candidates])}
        orphans = [r for r in candidates if (r["execution_id"], r["delivery"]) in still]
        records = [r for row in orphans for r in self.outbound.requeue(
            row, f"worker {row['worker_id']} does not run it (its start was never confirmed)",
            await step_upstream(self.pool, row["run_id"], row["job_id"]))]
        await self._publish(records)
        metrics.REQUEUES.labels(reason="orphan").inc(len(orphans))

    async def _publish(self, records: list[Any]) -> None:
        for record in records:
            self.producer.produce(record)
        await self.producer.flush_async(30.0)

    # -- is every committed execution event projected? ------------------------------------

    async def projection_caught_up(self, ends: list[int], patience: float = CATCH_UP_SECONDS) -> bool:
        """Whether the projection holds every execution event committed below `ends` (each
        partition's high watermark, index = partition, read before this call): its stored
        offsets have reached them — what a projection that keeps up does within a batch
        under any load — or, from each stored offset, there is nothing left to read but the
        end (idle: control records — transaction markers — occupy the last offsets, so a
        projection that holds everything may store an offset below the high watermark)."""
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            if await self._projected_through(ends) or await self._nothing_unprojected():
                return True
            await asyncio.sleep(0.2)
        return False

    async def _projected_through(self, ends: list[int]) -> bool:
        topic = self.topics.execution_events
        stored = await self.store.stored_offsets()
        return all(stored.get((topic, p), 0) >= end for p, end in enumerate(ends))

    async def _nothing_unprojected(self) -> bool:
        if self._reader is None:
            self._reader = self.kafka.consumer(
                reader_config(self.settings, f"monitor-{self.instance}-probe"), "projection-probe")
        reader, topic = self._reader, self.topics.execution_events
        stored = await self.store.stored_offsets()
        partitions = await reader.partitions(topic) or []
        assignment = [TopicPartition(topic, p, stored.get((topic, p), OFFSET_BEGINNING))
                      for p in partitions]
        await reader.assign(assignment)
        pending = set(partitions)
        try:
            deadline = time.monotonic() + 5.0
            while pending and time.monotonic() < deadline:
                for msg in await reader.consume(len(partitions) + 10, 0.2):
                    err = msg.error()
                    if err is None:
                        return False  # a committed record the projection has not written
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
            return not pending
        finally:
            await reader.unassign()

    # -- figures ----------------------------------------------------------------------------

    async def refresh_next_executions(self) -> None:
        """Keep `job_definitions.next_execution_at` current for the dashboards and `jobs`."""
        rows = await self.pool.fetch(query("due_for_next_execution"))
        if not rows:
            return
        now = now_utc()
        ids, times = [], []
        named = sorted({r["calendar"] for r in rows if r["calendar"] is not None})
        calendars = await calendars_of(self.pool, named) if named else {}
        for row in rows:
            # The row's timing columns, written from the same definition: this runs up to
            # once per fire of every job, and parsing the whole definition cost the most.
            job_id, *timing = row
            stored = StoredTiming(*timing)
            try:
                upcoming = next_fire(stored, now, calendar=calendars.get(stored.calendar or ""))
            except Exception:  # a definition the scheduler suspends (or its calendar is gone)
                upcoming = None
            ids.append(job_id)
            times.append(upcoming)
        await self.pool.execute(query("set_next_execution"), ids, times)

    async def resolve_definition_versions(self) -> None:
        """Name the definition version of executions projected in a transaction that
        overlapped their definition's (two monitors: neither saw the other's row)."""
        rows = await self.pool.fetch(query("unresolved_definition_versions"))
        if rows:
            await self.pool.execute(query("set_definition_versions"),
                                    [r["execution_id"] for r in rows], [r["version"] for r in rows])

    async def measure_fleet(self) -> None:
        """Queue depth per tier and queue (the workers group's lag on each work topic) and
        workers by status."""
        depth = await asyncio.get_running_loop().run_in_executor(None, self._work_lag)
        if depth:
            await self.pool.execute(query("upsert_queue_depth"), [p for p, _, _ in depth],
                                    [q for _, q, _ in depth], [d for _, _, d in depth])
        for priority, queue, value in depth:
            metrics.QUEUE_DEPTH.labels(queue=queue, priority=priority).set(value)
        counts = {r["status"]: r["n"] for r in await self.pool.fetch(query("workers_by_status"))}
        for status in ("ACTIVE", "DRAINING", "OFFLINE"):
            metrics.WORKERS.labels(status=status).set(counts.get(status, 0))

    def _work_lag(self) -> list[tuple[str, str, int]]:
        lag = WorkLag(self.settings, f"monitor-{self.instance}-lag")
        try:
            return lag.measure()
        except KafkaException as exc:
            log(logger, "queue_depth_unavailable", logging.WARNING, error=str(exc))
            return []
        finally:
            lag.close()
