"""The monitor: the exactly-once PostgreSQL projection, and what follows from it.

Consumes `execution-events`, `heartbeats`, `job-definitions`, `calendars`, `commands` and
`alerts` (read_committed). The rooms:
- decoding.py: a batch through the one inbound path (dead letters on any failure);
- store.py: the fenced projection, one PostgreSQL transaction per batch with its offsets;
- log_bounds.py: each delivery's log kept to its limit, nothing kept after its end;
- advance.py: DAG advancement and approvals, decided once inside that transaction;
- outbound.py: every record the monitor publishes;
- housekeeping.py: dead workers (fenced, then re-queued), orphans, next runs, figures;
- retention.py: old executions, events and alerts deleted in bounded batches.

What a batch publishes (DAG steps, decisions, alerts, dead letters) is produced and
flushed *before* its PostgreSQL commit: after a crash the batch is projected again and the
same records are re-issued — with the same deterministic ids, so consumers drop the
repeats (at least once, deduplicated).

Outages: PostgreSQL or Kafka going away is waited out with backoff — the monitor stays
alive and reports itself not ready; the batch in hand is written once the database is
back. Decoding batch n+1 overlaps with writing batch n; writes stay in order.

Why one module of this size: the poll loop, the writer it feeds and the
resync after an outage share the batch queue and the epoch that orders them; every
decision lives in the rooms above.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from typing import Any

import asyncpg
from confluent_kafka import KafkaException, TopicPartition

from cronstream.services.monitor.advance import DagAdvancer, Decisions
from cronstream.services.monitor.decoding import Decoder, MonitorBatch
from cronstream.services.monitor.housekeeping import Housekeeping
from cronstream.services.monitor.outbound import Outbound
from cronstream.services.monitor.retention import retention_loop
from cronstream.services.monitor.store import Fresh, ProjectionStore, create_staging
from cronstream.shared import metrics
from cronstream.shared.clients import REAL, KafkaClients, resolved_topics
from cronstream.shared.db import SESSION_LOST, fast_timestamps, query
from cronstream.shared.fast_records import EventRecord
from cronstream.shared.health import Health
from cronstream.shared.inbound import Inbound
from cronstream.shared.kafka.config import OFFSET_BEGINNING, consumer_config, lag_reporter, producer_config
from cronstream.shared.kafka.consumer import ConsumerThread, OnLane
from cronstream.shared.lifecycle import supervise, wait_or_stop
from cronstream.shared.logs import log
from cronstream.shared.producers import IdempotentProducer, OutRecord
from cronstream.shared.records import ExecutionEvent
from cronstream.shared.settings import Settings
from cronstream.shared.telemetry import Headers, Hop, messaging, new_headers, recording

logger = logging.getLogger(__name__)

SERVICE = "monitor"
BATCH = 20_000
# Batches start at least this far apart, unless the last one was full (a backlog: read on
# at once). Each is one PostgreSQL transaction (rows and offsets), whose fixed cost —
# round trips, commit, the statements' planning — is most of a small batch's; and the
# events of one execution (QUEUED, RUNNING, COMPLETED: ~0.1 s apart at load) that meet in
# one batch make one row written once instead of an insert and updates. At 3,000
# executions/s, 250 ms instead of 100 ms took the updates from 0.72 to 0.27 per execution
# and PostgreSQL's CPU from ~95 to ~65 µs per execution (decisions 0012, 0017). The
# projection runs at most this much later; start lag is not affected.
BATCH_GAP_SECONDS = 0.25
# The broker answers the monitor's fetch once this much is committed, or after
# FETCH_WAIT_MS: at load a few fetches a second carry everything, instead of one for every
# transaction a worker commits (each request costs the broker ~0.3 ms of CPU: decision
# 0026). Under FETCH_MIN_BYTES a second, the projection runs up to FETCH_WAIT_MS later.
FETCH_MIN_BYTES = 1 << 20
FETCH_WAIT_MS = 250
# ...and this far apart while the records arrive at BUSY_RECORDS_PER_SECOND or more. Fires
# committed ahead (decision 0027) put ~0.2 s between an execution's QUEUED and its end, so
# at 250 ms most executions spanned two batches: a row inserted, then updated — and an
# update that changes `status` rewrites every index entry of the row. A second apart, most
# executions are one row written once. The projection (the dashboards, DAG steps, requeues)
# then runs up to a second later, under load only.
BUSY_BATCH_GAP_SECONDS = 1.0
BUSY_RECORDS_PER_SECOND = 6_000
HOUSEKEEPING_SECONDS = 1.0


def batch_gap(records: int, seconds: float) -> float:
    """The gap before the next batch, after one of `records` gathered over `seconds`."""
    return BUSY_BATCH_GAP_SECONDS if records >= BUSY_RECORDS_PER_SECOND * seconds else BATCH_GAP_SECONDS


class DatabaseRestarted(ConnectionError):
    """The database server restarted since the last write: it may have lost commits."""


# Errors that mean "the database is away", waited out; anything else is a bug or a bad
# record and is retried a few times before the service gives up.
UNAVAILABLE: tuple[type[Exception], ...] = (
    *SESSION_LOST, OSError, TimeoutError, asyncpg.CannotConnectNowError, DatabaseRestarted)
RETRIABLE = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)


class MonitorService:
    name = SERVICE

    def __init__(self, settings: Settings, instance: str | None = None,
                 kafka: KafkaClients = REAL) -> None:
        self.settings = settings
        self.kafka = kafka
        self.topics = settings.topics
        self.instance = settings.instance(instance)
        self.health = Health(self.name)
        self.health.require("database", "assignment")
        self.group = f"{self.topics.prefix}monitor"
        self.outbound = Outbound(self.topics)
        self.decoder = Decoder(Inbound(SERVICE, self.topics), self.topics)
        self.dags = DagAdvancer(self.outbound)
        self.decisions = Decisions(self.outbound)
        self._store: ProjectionStore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._producer: IdempotentProducer | None = None
        self._consumer: ConsumerThread | None = None
        self._pending: asyncio.Queue[MonitorBatch] = asyncio.Queue(maxsize=2)
        self._writer: asyncio.Task[None] | None = None
        self._kafka_offsets: list[TopicPartition] = []
        self._stopping = asyncio.Event()
        # A database outage or restart: the writer drops what it holds and asks the poll loop
        # to resync (_resync); batches carry the epoch they were read in.
        self._database_lost = False
        self._resync_requested = False
        self._epoch = 0
        self._postmaster_started: object = None
        self.projected = 0

    async def run(self, stopping: asyncio.Event) -> None:
        # Retry tombstones go to their job's shard of `retries`: as many as the clock has.
        self.topics = self.outbound.topics = await resolved_topics(self.settings, self.kafka)
        pool = await self._connect(stopping)
        if pool is None:
            return
        store = ProjectionStore(pool, self.group, self.topics,
                                log_limit=self.settings.worker_log_limit_bytes)
        consumer, producer = self.open(store)
        housekeeping = Housekeeping(self.settings, pool, store, producer=producer,
                                    outbound=self.outbound, instance=self.instance, kafka=self.kafka)
        try:
            await self.serve(consumer, stopping, alongside=[
                partial(supervise, "housekeeping", partial(self._housekeeping, housekeeping, stopping),
                        self.health, stopping),
                partial(supervise, "retention", partial(retention_loop, pool, self.settings, stopping),
                        self.health, stopping)])
        finally:
            await housekeeping.close()
            await consumer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pool.close(), 10)
            with contextlib.suppress(KafkaException):
                await producer.flush_async(5.0)

    def open(self, store: ProjectionStore) -> tuple[ConsumerThread, IdempotentProducer]:
        """Make the Kafka clients around the projection `store` (none is contacted yet)."""
        self._loop = asyncio.get_running_loop()
        self._store = store
        producer = self._producer = self.kafka.idempotent(
            producer_config(self.settings, f"monitor-{self.instance}"))
        conf = consumer_config(self.settings, f"monitor-{self.instance}", self.group,
                               **{"fetch.min.bytes": FETCH_MIN_BYTES,
                                  "fetch.wait.max.ms": FETCH_WAIT_MS,
                                  "queued.min.messages": 2 * BATCH})
        conf["stats_cb"] = lag_reporter(self.topics, self.group, self.topics.execution_events,
                                        metrics.PROJECTION_LAG)
        consumer = self._consumer = self.kafka.consumer(conf, "monitor")
        return consumer, producer

    async def serve(self, consumer: ConsumerThread, stopping: asyncio.Event,
                    alongside: Sequence[Callable[[], Coroutine[Any, Any, None]]] = ()) -> None:
        """Join the group, then read batches and write them in order until `stopping` (or
        until the writer fails, with its error); `alongside` runs as tasks meanwhile."""
        self._stopping = stopping
        t = self.topics
        tasks: list[asyncio.Task[None]] = []
        try:
            await consumer.subscribe(
                [t.execution_events, t.execution_logs, t.heartbeats, t.job_definitions,
                 t.commands, t.alerts, t.calendars],
                on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke)
            writer = self._writer = asyncio.create_task(self._write_batches())
            tasks = [writer, *[asyncio.create_task(task()) for task in alongside]]
            log(logger, "monitor_started", instance=self.instance)
            last_batch, gap = 0.0, BATCH_GAP_SECONDS
            while not stopping.is_set() and not writer.done():
                if self._resync_requested:
                    await self._resync(consumer)
                if self._kafka_offsets:
                    done, self._kafka_offsets = self._kafka_offsets, []
                    await consumer.on_lane(partial(self._commit_to_kafka, offsets=done))
                wait = gap - (time.monotonic() - last_batch)
                if wait > 0:
                    await asyncio.sleep(wait)
                epoch = self._epoch  # before the consume: what it returns belongs to this epoch
                messages = await consumer.consume(BATCH, 0.1)
                if messages:
                    gap = batch_gap(len(messages), time.monotonic() - last_batch)
                    last_batch = time.monotonic() if len(messages) < BATCH else 0.0
                    batch = self.decoder.decode(messages)
                    batch.epoch = epoch
                    await self._pending.put(batch)
            if writer.done():
                writer.result()  # the writer failed: fail the service with its error
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._pending.join(), 30)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _connect(self, stopping: asyncio.Event) -> asyncpg.Pool | None:
        """The connection pool, once PostgreSQL answers (waited for with backoff)."""
        backoff = 0.5
        while not stopping.is_set():
            try:
                pool = await asyncpg.create_pool(self.settings.database_url, min_size=1, max_size=4,
                                                 init=self._connection_made)
                self.health.set("database", True)
                return pool
            except UNAVAILABLE as exc:
                self.health.set("database", False, f"cannot connect: {exc}")
                log(logger, "database_unavailable", logging.WARNING, error=str(exc),
                    retry_in_seconds=backoff)
                await wait_or_stop(stopping, backoff)
                backoff = min(backoff * 2, 5.0)
        return None

    # -- writing, in order, one transaction per batch ---------------------------------------

    async def _write_batches(self) -> None:
        while True:
            batch = await self._pending.get()
            try:
                if self._database_lost:
                    self._database_lost = False
                    self._resync_requested = True
                if self._resync_requested or batch.epoch != self._epoch:
                    continue  # read again after the resync
                offsets = await self._project_patiently(batch)
                # Committed to Kafka by the poll loop, on the consumer's lane: from here it
                # could block behind a rebalance callback that waits for this queue.
                self._kafka_offsets.extend(offsets)
            finally:
                self._pending.task_done()

    async def _project_patiently(self, batch: MonitorBatch) -> list[TopicPartition]:
        """Write the batch: through database outages (waiting, not ready), deadlocks
        (retried), and characters PostgreSQL refuses (written again, sanitised)."""
        backoff, failures, sanitize = 0.5, 0, False
        while True:
            try:
                offsets = await self._project(batch, sanitize)
                self.health.set("database", True)
                return offsets
            except UNAVAILABLE as exc:
                # The server may have lost its last commits too: give up this batch and
                # resume from what it holds once it is back (_resync).
                self.health.set("database", False, f"unavailable: {exc}")
                log(logger, "database_unavailable", logging.WARNING, error=str(exc),
                    action_taken="re-reading from the stored offsets once it is back")
                self._database_lost = True
                return []
            except RETRIABLE as exc:
                log(logger, "projection_retried", logging.WARNING, error=str(exc))
            except (asyncpg.DataError, asyncpg.UntranslatableCharacterError) as exc:
                if sanitize:
                    raise
                log(logger, "projection_sanitised", logging.WARNING, error=str(exc)[:300])
                sanitize = True
            except asyncpg.PostgresError as exc:
                failures += 1
                log(logger, "projection_failed", logging.ERROR, error=str(exc)[:300], failures=failures)
                if failures >= 5:
                    raise
                await asyncio.sleep(backoff)

    async def _resync(self, consumer: ConsumerThread) -> None:
        """Resume from what PostgreSQL holds (on the poll loop, between two consumes).

        A database that went away may have lost its last commits — `synchronous_commit=off`,
        a failover to a replica that lagged — rows and stored offsets alike; and the batches
        read meanwhile were dropped. So every assigned partition is sought back to its stored
        offset, and the epoch moves on: batches decoded before the seek are dropped by the
        writer, what follows is read again (records projected already are left out by the
        fence). Waits for the database."""
        assert self._store is not None
        while True:
            try:
                stored = await self._store.stored_offsets()
                break
            except UNAVAILABLE:
                if await wait_or_stop(self._stopping, 1.0):
                    return

        def rewind(inner: OnLane) -> list[str]:
            # Assigning again with explicit offsets moves every position at once, fetching or
            # not (a seek refuses a partition that has not started fetching).
            positions = inner.position(inner.assignment())
            inner.assign([TopicPartition(tp.topic, tp.partition,
                                         stored.get((tp.topic, tp.partition), OFFSET_BEGINNING))
                          for tp in positions])
            return [f"{self.topics.logical(tp.topic)}[{tp.partition}]:{tp.offset}->"
                    f"{stored.get((tp.topic, tp.partition), 'start')}" for tp in positions]

        moved = await consumer.on_lane(rewind)
        self._epoch += 1
        self._resync_requested = False
        self.health.set("database", True)
        log(logger, "projection_resynced", rewound=len(moved), partitions=",".join(moved)[:500])

    async def _project(self, batch: MonitorBatch, sanitize: bool) -> list[TopicPartition]:
        assert self._store is not None and self._producer is not None
        started = time.monotonic()
        async with self._store.transaction(batch) as fresh:
            if self._database_lost:
                # This connection found a restarted server: write nothing on what it may
                # have lost; resync first.
                raise DatabaseRestarted("the database restarted")
            patches = await self._store.write(fresh, sanitize)
            outgoing: list[OutRecord] = list(fresh.dead)
            for refused in fresh.refused:
                outgoing += self.decoder.reject(refused.message, refused.reason)
            outgoing += [self.outbound.permanently_failed(e, self._headers(fresh, e))
                         for e, _, _ in fresh.events
                         if isinstance(e, ExecutionEvent) and e.status == "PERMANENTLY_FAILED"]
            outgoing += await self.dags.advance(fresh.conn, patches)
            outgoing += await self._decide(fresh)
            if outgoing:
                # Before the commit: at least once, with deterministic ids (see above).
                for record in outgoing:
                    self._producer.produce(record)
                await self._producer.flush_async(30.0)
        self.projected += fresh.count
        self._count(fresh, time.monotonic() - started)
        if recording():
            self._trace(fresh)
        return [TopicPartition(t, p, o) for (t, p), o in fresh.offsets.items()]

    async def _decide(self, fresh: Fresh) -> list[OutRecord]:
        records: list[OutRecord] = []
        for command in fresh.commands:
            try:
                async with fresh.conn.transaction():  # a savepoint: one command, all or nothing
                    records += await self.decisions.apply(fresh.conn, command)
            except SESSION_LOST:
                raise
            except Exception as exc:  # one bad command never stops the projection
                log(logger, "command_failed", logging.ERROR, command=command.command,
                    execution_id=str(command.execution_id), error=f"{type(exc).__name__}: {exc}")
        return records

    @staticmethod
    def _headers(fresh: Fresh, event: EventRecord) -> Headers:
        traceparent = fresh.traces.get(event.event_id)
        return [("traceparent", traceparent.encode())] if traceparent else new_headers()

    def _trace(self, fresh: Fresh) -> None:
        """A projection span in the trace of each execution that reached its end."""
        topic = self.topics.execution_events
        for event, partition, offset in fresh.events:
            if event.terminal:
                Hop("cronstream.project", self._headers(fresh, event), attributes=messaging(
                    topic, partition, offset, job_id=event.job_id, execution_id=event.execution_id,
                    attempt=event.attempt_number, delivery=event.delivery, status=event.status)).end()

    def _count(self, fresh: Fresh, seconds: float) -> None:
        """Metrics of one committed batch (after the commit: exactly once per record)."""
        metrics.PROJECTION_BATCH.observe(seconds)
        t = self.topics
        for topic, count in ((t.execution_events, len(fresh.events)), (t.heartbeats, len(fresh.beats)),
                             (t.job_definitions, len(fresh.definitions)),
                             (t.calendars, len(fresh.calendars)),
                             (t.commands, len(fresh.commands)), (t.alerts, len(fresh.alerts)),
                             (t.execution_logs, len(fresh.logs))):
            if count:
                metrics.PROJECTED.labels(topic=t.logical(topic)).inc(count)
        for event, _, _ in fresh.events:
            if event.terminal:
                metrics.child(metrics.EXECUTIONS, event.status, event.queue or "",
                              event.priority or "").inc()
        for alert, _, _ in fresh.alerts:
            metrics.ALERTS.labels(kind=alert.kind, state=alert.state).inc()
        for refused in fresh.refused:
            for reason, lines in refused.lines.items():
                metrics.LOG_LINES_REFUSED.labels(reason=reason).inc(lines)

    @staticmethod
    def _commit_to_kafka(consumer: OnLane, offsets: list[TopicPartition]) -> None:
        try:
            consumer.commit(offsets, asynchronous=True)
        except Exception as exc:  # informational only: PostgreSQL holds the truth
            log(logger, "kafka_commit_skipped", logging.DEBUG, error=str(exc))

    # -- assignment: resume from PostgreSQL ---------------------------------------------------

    def _on_assign(self, consumer: OnLane, partitions: list[TopicPartition]) -> None:
        assert self._loop is not None
        # Batches read before this rebalance are written first, so the stored offsets
        # read below include them.
        stored = asyncio.run_coroutine_threadsafe(self._stored_offsets(), self._loop).result(300)
        for tp in partitions:
            tp.offset = stored.get((tp.topic, tp.partition), OFFSET_BEGINNING)
        consumer.assign(partitions)
        self.health.set("assignment", True)
        log(logger, "partitions_assigned", count=len(partitions))

    def _on_revoke(self, consumer: OnLane, partitions: list[TopicPartition]) -> None:
        self.health.set("assignment", False, "rebalancing")
        consumer.unassign()
        log(logger, "partitions_revoked", count=len(partitions))

    async def _stored_offsets(self) -> dict[tuple[str, int], int]:
        assert self._store is not None and self._writer is not None
        drained = asyncio.ensure_future(self._pending.join())
        await asyncio.wait([drained, self._writer], return_when=asyncio.FIRST_COMPLETED)
        if not drained.done():
            drained.cancel()
            raise RuntimeError("the projection writer stopped; see the error above")
        while True:  # the database may be away: the assignment waits for it
            try:
                return await self._store.stored_offsets()
            except UNAVAILABLE as exc:
                self.health.set("database", False, f"unavailable: {exc}")
                await asyncio.sleep(1.0)

    # -- housekeeping ----------------------------------------------------------------------

    async def _housekeeping(self, housekeeping: Housekeeping, stopping: asyncio.Event) -> None:
        while not await wait_or_stop(stopping, HOUSEKEEPING_SECONDS):
            try:
                await housekeeping.round(await self._caught_up_on_heartbeats())
            except UNAVAILABLE as exc:  # waited out: the next round tries again
                self._database_lost = True
                log(logger, "housekeeping_postponed", logging.WARNING, error=str(exc))
            except KafkaException as exc:
                log(logger, "housekeeping_postponed", logging.WARNING, error=str(exc))

    async def _connection_made(self, conn: asyncpg.Connection) -> None:
        """Every new connection checks when the server started: a restart noticed before
        anything is written on it (the server came back between two batches, no write
        failed) still resyncs the projection. And it gets the staging tables each batch is
        copied into, and the cheaper timestamptz codec for what it copies."""
        await fast_timestamps(conn)
        await create_staging(conn)
        started = await conn.fetchval(query("postmaster_started"))
        if self._postmaster_started is not None and started != self._postmaster_started:
            log(logger, "database_restarted", logging.WARNING)
            self._database_lost = True
        self._postmaster_started = started

    async def _caught_up_on_heartbeats(self) -> bool:
        """Only the monitor that owns `heartbeats` and has read it to the end may call a
        worker dead: one that is catching up would see every worker as silent. The end is
        asked of the broker (not the last fetch's cached figure, which stays "caught up"
        while the broker is away)."""
        assert self._consumer is not None
        tp = TopicPartition(self.topics.heartbeats, 0)

        def check(consumer: OnLane) -> bool:
            if tp not in [TopicPartition(a.topic, a.partition) for a in consumer.assignment()]:
                return False
            position = consumer.position([tp])[0].offset
            try:
                _low, high = consumer.watermarks(tp, timeout=HOUSEKEEPING_SECONDS)
            except KafkaException:
                return False  # the broker cannot be reached: this round saw nothing
            return position >= 0 and high >= 0 and high - position <= 10

        return bool(await self._consumer.on_lane(check))
