"""The monitor: the exactly-once PostgreSQL projection, DAG advancement, approvals,
dead-worker requeues, alerts and the figures dashboards read.

Projection. Consumes `execution-events`, `heartbeats`, `job-definitions` and `commands`
(read_committed) and writes each batch in one PostgreSQL transaction together with the
batch's next offsets (`consumer_offsets`). On assignment it resumes from the offsets in
PostgreSQL, not Kafka's, so a crash at any point neither loses nor doubles a row.

What it publishes (JobDue of DAG steps and approvals, SKIPPED / AWAITING_APPROVAL events,
alerts, dead letters) is produced and flushed *before* that PostgreSQL commit: after a
crash the batch is projected again and the same records are re-issued — with the same
deterministic ids, so the dispatcher drops the repeats (at least once, deduplicated).

Dead workers. Once a second, when it is caught up on `heartbeats`, the monitor declares
OFFLINE every worker silent for longer than `CRONSTREAM_WORKER_DEAD_AFTER_SECONDS`, and
re-queues its RUNNING executions: a REQUEUED event and a JobDue (reason REQUEUE) with the
same execution_id and `delivery + 1`. The dead worker's late reports carry the old
delivery and are ignored by the projection.

Alerts: every PERMANENTLY_FAILED event raises an Alert on `alerts` and an
`action=alert_raised` log line (the alert id is deterministic).

Dead letters: the monitor dead-letters what it cannot decode on `execution-events`,
`heartbeats` and `commands`. Bad `job-definitions` records are the scheduler's to
dead-letter; the monitor logs and skips them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4, uuid5

import asyncpg
from confluent_kafka import Consumer, Message, TopicPartition

from cronstream.services.monitor.dag import DAG_FINAL, Verdict, decide, upstream_view
from cronstream.services.monitor.projection import (
    ExecutionPatch,
    alert_arrays,
    event_arrays,
    fold,
    heartbeat_arrays,
    patch_arrays,
)
from cronstream.services.monitor.retention import retention_loop
from cronstream.shared import metrics
from cronstream.shared.codec import DecodeError, decode, decode_key, decode_many
from cronstream.shared.db import query
from cronstream.shared.health import Health
from cronstream.shared.ids import NAMESPACE, idempotency_key
from cronstream.shared.kafka import (
    ConsumerThread,
    IdempotentProducer,
    OutRecord,
    consumer_config,
    dead_letter,
    lag_reporter,
    log_consumer_error,
    position,
    producer_config,
    record_time_ms,
)
from cronstream.shared.logs import log
from cronstream.shared.records import (
    PRIORITIES,
    Alert,
    Command,
    ExecutionEvent,
    ExecutionStatus,
    Heartbeat,
    JobDefinition,
    JobDue,
    JobSnapshot,
    now_utc,
)
from cronstream.shared.retry import retry_execution_id
from cronstream.shared.schedule import from_epoch_ms, next_fire, to_millis
from cronstream.shared.settings import Settings
from cronstream.shared.telemetry import new_traceparent, trace_headers

logger = logging.getLogger(__name__)

SERVICE = "monitor"
BATCH = 5000
HOUSEKEEPING_SECONDS = 1.0
METRICS_EVERY = 5  # housekeeping rounds between metric refreshes


@dataclass
class _Batch:
    """One consumed batch, decoded. Every item keeps its (topic, partition, offset) so that
    the part another monitor has already projected can be left out (see `_fence`)."""

    events: list[tuple[ExecutionEvent, int, int]] = field(default_factory=list)
    beats: list[tuple[Heartbeat, int, int]] = field(default_factory=list)
    definitions: list[tuple[str, JobDefinition | None, datetime, int, int]] = field(default_factory=list)
    commands: list[tuple[Command, int, int]] = field(default_factory=list)
    alerts: list[tuple[Alert, int, int]] = field(default_factory=list)
    dead: list[tuple[OutRecord, str, int, int]] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    starts: dict[tuple[str, int], int] = field(default_factory=dict)

    def seen(self, topic: str, partition: int, offset: int) -> None:
        self.offsets[(topic, partition)] = offset + 1
        self.starts.setdefault((topic, partition), offset)


class MonitorService:
    name = SERVICE

    def __init__(self, settings: Settings, instance: str | None = None) -> None:
        self.settings = settings
        self.topics = settings.topics
        self.instance = settings.instance(instance)
        self.health = Health(self.name)
        self.health.require("database", "assignment")
        self.group = f"{self.topics.prefix}monitor"
        self._pool: asyncpg.Pool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._producer: IdempotentProducer | None = None
        self._consumer: ConsumerThread | None = None
        self._dag_upstreams: set[str] = set()
        self._pending: asyncio.Queue[_Batch] = asyncio.Queue(maxsize=2)
        self._writer: asyncio.Task[None] | None = None
        self._kafka_offsets: list[TopicPartition] = []
        self.projected = 0

    async def run(self, stopping: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._pool = await asyncpg.create_pool(self.settings.database_url, min_size=1, max_size=4)
        self.health.set("database", True)
        self._producer = IdempotentProducer(producer_config(self.settings, f"monitor-{self.instance}"))
        await self._refresh_dag_upstreams()
        conf = consumer_config(self.settings, f"monitor-{self.instance}", self.group,
                               **{"fetch.min.bytes": 1, "queued.min.messages": 20000})
        conf["stats_cb"] = lag_reporter(self.topics, self.group, self.topics.execution_events,
                                        metrics.PROJECTION_LAG)
        consumer = self._consumer = ConsumerThread(conf, "monitor")
        topics = [self.topics.execution_events, self.topics.heartbeats,
                  self.topics.job_definitions, self.topics.commands, self.topics.alerts]
        await consumer.call(lambda: consumer.consumer.subscribe(topics, on_assign=self._on_assign))
        housekeeping = asyncio.create_task(self._housekeeping(stopping))
        retention = asyncio.create_task(retention_loop(self._pool, self.settings, stopping))
        writer = self._writer = asyncio.create_task(self._write_batches())
        log(logger, "monitor_started", instance=self.instance)
        try:
            # Decoding batch n+1 overlaps with writing batch n; writes stay in order, one
            # transaction each, so each batch's offsets still commit with its rows.
            while not stopping.is_set() and not writer.done():
                if self._kafka_offsets:
                    done, self._kafka_offsets = self._kafka_offsets, []
                    await consumer.call(self._commit_to_kafka, consumer.consumer, done)
                messages = await consumer.consume(BATCH, 0.1)
                if messages:
                    await self._pending.put(self._decode(messages))
            if writer.done():
                writer.result()  # the writer failed: fail the service with its error
            await self._pending.join()
        finally:
            writer.cancel()
            housekeeping.cancel()
            retention.cancel()
            for task in (writer, housekeeping, retention):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await consumer.close()
            await self._pool.close()
            self._producer.flush(5.0)

    async def _write_batches(self) -> None:
        assert self._consumer is not None
        while True:
            batch = await self._pending.get()
            try:
                offsets = await self._project_with_retry(batch)
                # Committed to Kafka by the poll loop, on the consumer's thread: from here
                # it could block behind a rebalance callback that waits for this queue.
                self._kafka_offsets.extend(offsets)
            finally:
                self._pending.task_done()

    async def _project_with_retry(self, batch: _Batch) -> list[TopicPartition]:
        for attempt in range(1, 4):
            try:
                return await self._project(batch)
            except (asyncpg.DeadlockDetectedError, asyncpg.SerializationError) as exc:
                log(logger, "projection_retried", logging.WARNING, attempt=attempt, error=str(exc))
        return await self._project(batch)

    @staticmethod
    def _commit_to_kafka(consumer: Consumer, offsets: list[TopicPartition]) -> None:
        try:
            consumer.commit(offsets=offsets, asynchronous=True)
        except Exception as exc:  # informational only: PostgreSQL holds the truth
            log(logger, "kafka_commit_skipped", logging.DEBUG, error=str(exc))

    # -- assignment: resume from PostgreSQL -------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assert self._loop is not None
        # Batches read before this rebalance are written first, so the stored offsets
        # read below include them.
        stored = asyncio.run_coroutine_threadsafe(self._stored_offsets(), self._loop).result(120)
        for tp in partitions:
            tp.offset = stored.get((tp.topic, tp.partition), -2)  # -2: from the beginning
        consumer.assign(partitions)
        self.health.set("assignment", True)
        log(logger, "partitions_assigned", count=len(partitions))

    async def _stored_offsets(self) -> dict[tuple[str, int], int]:
        assert self._pool is not None
        assert self._writer is not None
        drained = asyncio.ensure_future(self._pending.join())
        await asyncio.wait([drained, self._writer], return_when=asyncio.FIRST_COMPLETED)
        if not drained.done():
            drained.cancel()
            raise RuntimeError("the projection writer stopped; see the error above")
        rows = await self._pool.fetch(query("load_offsets"), self.group)
        return {(r["topic"], r["partition"]): r["next_offset"] for r in rows}

    # -- projection -----------------------------------------------------------------

    async def _project(self, batch: _Batch) -> list[TopicPartition]:
        assert self._pool is not None and self._producer is not None
        t = self.topics
        started = time.monotonic()
        async with self._pool.acquire() as conn, conn.transaction():
            stored = await self._fence(conn, batch)

            def fresh(topic: str, partition: int, offset: int) -> bool:
                return offset >= stored.get((topic, partition), 0)

            events = [e for e in batch.events if fresh(t.execution_events, e[1], e[2])]
            beats = [b for b, p, o in batch.beats if fresh(t.heartbeats, p, o)]
            definitions = [d[:3] for d in batch.definitions if fresh(t.job_definitions, d[3], d[4])]
            commands = [c for c, p, o in batch.commands if fresh(t.commands, p, o)]
            alerts = [a for a in batch.alerts if fresh(t.alerts, a[1], a[2])]
            outgoing = [r for r, topic, p, o in batch.dead if fresh(topic, p, o)]
            outgoing += [self._alert(e) for e, _, _ in events if e.status == "PERMANENTLY_FAILED"]
            patches: list[ExecutionPatch] = []
            if events:
                await conn.execute(query("insert_events"), *event_arrays(events))
                patches = sorted(fold([e for e, _, _ in events]).values(), key=lambda p: p.execution_id)
                await conn.execute(query("upsert_executions"), *patch_arrays(patches))
            if beats:
                await conn.execute(query("upsert_workers"), *heartbeat_arrays(beats))
            if alerts:
                await conn.execute(query("upsert_alerts"), *alert_arrays(alerts))
            for job_id, definition, seen_at in definitions:
                await self._project_definition(conn, job_id, definition, seen_at)
            if definitions:
                self._dag_upstreams = {r[0] for r in await conn.fetch(query("dag_upstream_ids"))}
            finals = [p for p in patches if p.status in DAG_FINAL and p.job_id in self._dag_upstreams]
            if finals:
                outgoing += await self._advance_dags(conn, finals)
            for command in commands:
                outgoing += await self._apply_command(conn, command)
            if outgoing:
                # Before the commit: at least once, with deterministic ids (see above).
                for record in outgoing:
                    self._producer.produce(record)
                await asyncio.get_running_loop().run_in_executor(None, self._producer.flush, 30.0)
            offsets = {k: max(v, stored.get(k, 0)) for k, v in batch.offsets.items()}
            await conn.execute(
                query("store_offsets"), self.group,
                [t for t, _ in offsets], [p for _, p in offsets], list(offsets.values()))
        self.projected += len(events) + len(beats) + len(definitions) + len(commands)
        self._count(events, beats, definitions, commands, alerts, time.monotonic() - started)
        return [TopicPartition(t, p, o) for (t, p), o in offsets.items()]

    def _count(self, events: list[tuple[ExecutionEvent, int, int]], beats: list[Heartbeat],  # noqa: PLR0917
               definitions: list[Any], commands: list[Command],
               alerts: list[tuple[Alert, int, int]], seconds: float) -> None:
        """Metrics of one committed batch (after the commit: exactly once per record)."""
        metrics.PROJECTION_BATCH.observe(seconds)
        t = self.topics
        for topic, count in ((t.execution_events, len(events)), (t.heartbeats, len(beats)),
                             (t.job_definitions, len(definitions)), (t.commands, len(commands)),
                             (t.alerts, len(alerts))):
            if count:
                metrics.PROJECTED.labels(topic=t.logical(topic)).inc(count)
        for event, _, _ in events:
            if event.terminal:
                metrics.EXECUTIONS.labels(status=event.status, queue=event.queue or "",
                                          priority=event.priority or "").inc()
        for alert, _, _ in alerts:
            metrics.ALERTS.labels(kind=alert.kind, state=alert.state).inc()

    async def _fence(self, conn: Any, batch: _Batch) -> dict[tuple[str, int], int]:
        """Lock the offset rows of the batch's partitions (in a fixed order) and return
        them. Around a rebalance two monitors can hold records of the same partition: the
        lock serialises them, and whatever lies below the stored offset was projected
        already and is left out — so every record is projected once, in order."""
        keys = sorted(batch.starts)
        topics, partitions = [t for t, _ in keys], [p for _, p in keys]
        await conn.execute(query("ensure_offsets"), self.group, topics, partitions,
                           [batch.starts[k] for k in keys])
        stored = {(r["topic"], r["partition"]): r["next_offset"]
                  for r in await conn.fetch(query("lock_offsets"), self.group, topics, partitions)}
        overlap = [k for k in keys if stored.get(k, 0) > batch.starts[k]]
        if overlap:
            log(logger, "projected_records_skipped", partitions=len(overlap),
                reason="already projected (a rebalance moved the partition)")
        return stored

    def _decode(self, messages: list[Message]) -> _Batch:
        batch = _Batch()
        fast = self._decode_events_at_once(messages, batch)
        for msg in messages:
            if fast and msg.error() is None and msg.topic() == self.topics.execution_events:
                continue
            err = msg.error()
            if err is not None:
                log_consumer_error("monitor", err)
                continue
            topic, partition, offset = position(msg)
            batch.seen(topic, partition, offset)
            try:
                if topic == self.topics.execution_events:
                    event = decode(ExecutionEvent, msg.value(), key=msg.key(), key_field="job_id")
                    batch.events.append((event, partition, offset))
                elif topic == self.topics.heartbeats:
                    batch.beats.append((decode(Heartbeat, msg.value(), key=msg.key(),
                                               key_field="worker_id"), partition, offset))
                elif topic == self.topics.commands:
                    batch.commands.append((decode(Command, msg.value()), partition, offset))
                elif topic == self.topics.alerts:
                    batch.alerts.append((decode(Alert, msg.value()), partition, offset))
                else:
                    job_id = decode_key(msg.key())
                    definition = None if msg.value() is None else decode(
                        JobDefinition, msg.value(), key=msg.key(), key_field="job_id")
                    seen_at = from_epoch_ms(record_time_ms(msg))
                    batch.definitions.append((job_id, definition, seen_at, partition, offset))
            except DecodeError as exc:
                if topic == self.topics.job_definitions:
                    log(logger, "definition_skipped", logging.WARNING, offset=msg.offset(),
                        reason=str(exc)[:300])
                else:
                    batch.dead.append((dead_letter(self.topics, msg, str(exc), SERVICE),
                                       topic, partition, offset))
        return batch

    def _decode_events_at_once(self, messages: list[Message], batch: _Batch) -> bool:
        """Validate every execution event of the batch in one pydantic pass; False (and
        nothing recorded) when one of them is bad, so the slow path can name it."""
        mine = [m for m in messages if m.error() is None and m.topic() == self.topics.execution_events]
        decoded = decode_many(ExecutionEvent, [m.value() for m in mine])
        if decoded is None or any(m.key() != e.job_id.encode() for m, e in zip(mine, decoded, strict=True)):
            return False
        for msg, event in zip(mine, decoded, strict=True):
            topic, partition, offset = position(msg)
            batch.seen(topic, partition, offset)
            batch.events.append((event, partition, offset))
        return True

    async def _refresh_dag_upstreams(self) -> None:
        assert self._pool is not None
        self._dag_upstreams = {r[0] for r in await self._pool.fetch(query("dag_upstream_ids"))}

    # -- DAG runs ---------------------------------------------------------------------

    async def _advance_dags(self, conn: Any, finals: list[ExecutionPatch]) -> list[OutRecord]:
        records: list[OutRecord] = []
        for patch in finals:
            for row in await conn.fetch(query("dag_downstreams"), patch.job_id):
                definition = json.loads(row["definition"])
                depends_on = definition["depends_on"]
                states = await conn.fetch(query("run_states"), patch.run_id, depends_on)
                if len(states) < len(depends_on) or any(s["status"] not in DAG_FINAL for s in states):
                    continue  # not every upstream is final in this run yet
                verdict = decide(definition, upstream_view(list(states)))
                step = retry_execution_id(row["job_id"], patch.run_id, 1)
                claimed = await conn.fetchval(query("claim_evaluation"), patch.run_id, row["job_id"],
                                              step, verdict.decision, verdict.detail)
                if claimed is None:
                    continue  # evaluated already in this run
                metrics.DAG_EVALUATIONS.labels(decision=verdict.decision).inc()
                log(logger, "dag_step_decided", job_id=row["job_id"], run_id=str(patch.run_id),
                    execution_id=str(step), decision=verdict.decision, detail=verdict.detail)
                records += self._step_records(JobDefinition.model_validate_json(row["definition"]),
                                              patch.run_id, step, verdict)
        return records

    def _step_records(self, definition: JobDefinition, run_id: UUID, step: UUID,
                      verdict: Verdict) -> list[OutRecord]:
        now = to_millis(now_utc())
        snapshot = JobSnapshot.of(definition)
        given = snapshot.params.get("idempotency_key")
        key = idempotency_key(definition.job_id, now, snapshot.params) \
            if isinstance(given, str) and given else f"{definition.job_id}@{run_id}"
        if verdict.decision == "RUN":
            due = JobDue(execution_id=step, job_id=definition.job_id, run_id=run_id, scheduled_at=now,
                         attempt_number=1, reason="DEPENDENCY", idempotency_key=key, job=snapshot)
            return [self._due_record(due)]
        status: ExecutionStatus = "SKIPPED" if verdict.decision == "SKIP" else "AWAITING_APPROVAL"
        return [self._event_record(ExecutionEvent(
            event_id=uuid4(), execution_id=step, job_id=definition.job_id, run_id=run_id,
            status=status, attempt_number=1, scheduled_at=now, occurred_at=now,
            completed_at=now if status == "SKIPPED" else None, error_message=verdict.detail,
            reason="DEPENDENCY", idempotency_key=key, job=snapshot))]

    async def _apply_command(self, conn: Any, command: Command) -> list[OutRecord]:
        """APPROVE releases, REJECT skips, an execution AWAITING_APPROVAL. (CANCEL is the
        workers' and the CLI's.)"""
        if command.command == "CANCEL":
            return []
        row = await conn.fetchrow(query("awaiting_execution"), command.execution_id)
        if row is None:
            log(logger, "command_ignored", logging.WARNING, command=command.command,
                execution_id=str(command.execution_id), reason="not awaiting approval")
            return []
        who = f" by {command.issued_by}" if command.issued_by else ""
        log(logger, "execution_" + ("approved" if command.command == "APPROVE" else "rejected"),
            job_id=row["job_id"], execution_id=str(row["execution_id"]), issued_by=command.issued_by)
        if command.command == "APPROVE":
            due = JobDue(execution_id=row["execution_id"], job_id=row["job_id"], run_id=row["run_id"],
                         scheduled_at=row["scheduled_at"], attempt_number=row["attempt_number"],
                         reason="DEPENDENCY", delivery=row["delivery"],
                         idempotency_key=row["idempotency_key"],
                         job=JobSnapshot.model_validate_json(row["job"]),
                         approved_by=command.issued_by)
            return [self._due_record(due)]
        now = now_utc()
        return [self._event_record(ExecutionEvent(
            event_id=uuid4(), execution_id=row["execution_id"], job_id=row["job_id"],
            run_id=row["run_id"], status="SKIPPED", attempt_number=row["attempt_number"],
            scheduled_at=row["scheduled_at"], occurred_at=now, completed_at=now,
            delivery=row["delivery"], rejected_by=command.issued_by,
            error_message=f"rejected{who}: {command.reason or 'no reason given'}"))]

    def _due_record(self, due: JobDue) -> OutRecord:
        return OutRecord(self.topics.job_due, due.job_id.encode(), due.to_json(),
                         trace_headers(new_traceparent()))

    def _event_record(self, event: ExecutionEvent) -> OutRecord:
        return OutRecord(self.topics.execution_events, event.job_id.encode(), event.to_json(),
                         trace_headers(new_traceparent()))

    def _alert(self, event: ExecutionEvent) -> OutRecord:
        alert = Alert(
            alert_id=uuid5(NAMESPACE, f"alert|EXECUTION_PERMANENTLY_FAILED|{event.execution_id}"),
            kind="EXECUTION_PERMANENTLY_FAILED", severity="error", job_id=event.job_id,
            execution_id=event.execution_id, run_id=event.run_id,
            attempt_number=event.attempt_number, error_message=event.error_message,
            occurred_at=event.occurred_at, raised_at=now_utc())
        log(logger, "alert_raised", logging.ERROR, kind=alert.kind, job_id=alert.job_id,
            execution_id=str(alert.execution_id), attempt=alert.attempt_number,
            error=(alert.error_message or "")[:300])
        return OutRecord(self.topics.alerts, alert.key, alert.to_json())

    async def _project_definition(
        self, conn: Any, job_id: str, d: JobDefinition | None, seen_at: datetime,
    ) -> None:
        if d is None:
            await conn.execute(query("delete_definition"), job_id, seen_at)
            await conn.execute(query("delete_dependencies"), job_id)
            return
        upcoming = None
        if d.enabled and d.type != "DEPENDENT":
            upcoming = next_fire(d, max(now_utc(), seen_at))
        args: list[Any] = [
            d.job_id, d.name, d.type, d.schedule, d.interval_seconds, d.run_at, d.timezone,
            d.start_at, d.end_at, list(d.depends_on), d.trigger_rule, d.condition,
            d.requires_approval, d.handler, json.dumps(d.params), d.max_retries,
            d.retry_delay_seconds, d.max_retry_delay_seconds, d.timeout_seconds, d.priority,
            d.queue, d.concurrency_policy, d.misfire_policy, d.misfire_grace_seconds, d.enabled,
            d.created_by, d.created_at, upcoming, seen_at, d.model_dump_json(),
        ]
        await conn.execute(query("upsert_definition"), *args)
        await conn.execute(query("delete_dependencies"), job_id)
        if d.depends_on:
            await conn.execute(query("insert_dependencies"), job_id, list(d.depends_on))

    # -- housekeeping: dead workers, next runs, queue depth -----------------------------

    async def _housekeeping(self, stopping: asyncio.Event) -> None:
        rounds = 0
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), HOUSEKEEPING_SECONDS)
            if stopping.is_set():
                return
            rounds += 1
            try:
                owner = await self._caught_up_on_heartbeats()
                if owner:
                    await self._requeue_dead_workers()
                if rounds % METRICS_EVERY == 0:
                    await self._refresh_next_executions()
                    # One monitor measures the fleet-wide gauges, so that sums stay true.
                    if owner:
                        await self._measure_queue_depth()
            except (asyncpg.PostgresError, OSError) as exc:
                log(logger, "housekeeping_failed", logging.WARNING, error=str(exc))

    async def _caught_up_on_heartbeats(self) -> bool:
        """Only the monitor that owns `heartbeats` and has read it to the end may call a
        worker dead: one that is catching up would see every worker as silent."""
        assert self._consumer is not None
        consumer = self._consumer.consumer
        tp = TopicPartition(self.topics.heartbeats, 0)

        def check() -> bool:
            if tp not in [TopicPartition(a.topic, a.partition) for a in consumer.assignment()]:
                return False
            position = consumer.position([tp])[0].offset
            _low, high = consumer.get_watermark_offsets(tp, cached=True)
            return position >= 0 and high >= 0 and high - position <= 10

        return bool(await self._consumer.call(check))

    async def _requeue_dead_workers(self) -> None:
        assert self._pool is not None and self._producer is not None
        dead = await self._pool.fetch(query("dead_workers"), self.settings.worker_dead_after_seconds)
        if not dead:
            return
        ids = [r["worker_id"] for r in dead]
        running = await self._pool.fetch(query("running_on_workers"), ids)
        records: list[OutRecord] = []
        now = now_utc()
        for row in running:
            job = JobSnapshot.model_validate_json(row["job"]) if not row["from_definition"] else \
                JobSnapshot.of(JobDefinition.model_validate_json(row["job"]))
            delivery = row["delivery"] + 1
            key = row["idempotency_key"] or f"{row['job_id']}@{row['run_id']}"
            records.append(self._event_record(ExecutionEvent(
                event_id=uuid4(), execution_id=row["execution_id"], job_id=row["job_id"],
                run_id=row["run_id"], status="REQUEUED", attempt_number=row["attempt_number"],
                scheduled_at=row["scheduled_at"], occurred_at=now, delivery=delivery,
                error_message=f"worker {row['worker_id']} stopped sending heartbeats")))
            records.append(self._due_record(JobDue(
                execution_id=row["execution_id"], job_id=row["job_id"], run_id=row["run_id"],
                scheduled_at=row["scheduled_at"], attempt_number=row["attempt_number"],
                reason="REQUEUE", delivery=delivery, idempotency_key=key, job=job)))
            log(logger, "execution_requeued", job_id=row["job_id"],
                execution_id=str(row["execution_id"]), delivery=delivery, reason="dead worker",
                worker_id=row["worker_id"])
        for record in records:
            self._producer.produce(record)
        await asyncio.get_running_loop().run_in_executor(None, self._producer.flush, 30.0)
        await self._pool.execute(query("mark_workers_offline"), ids)
        metrics.REQUEUES.labels(reason="dead_worker").inc(len(running))
        for row in dead:
            log(logger, "worker_declared_dead", logging.WARNING, worker_id=row["worker_id"],
                last_heartbeat=row["last_heartbeat"].isoformat(), requeued=len(running))

    async def _refresh_next_executions(self) -> None:
        """Keep `job_definitions.next_execution_at` current for the dashboards and `jobs`."""
        assert self._pool is not None
        rows = await self._pool.fetch(query("due_for_next_execution"))
        if not rows:
            return
        now = now_utc()
        ids, times = [], []
        for row in rows:
            definition = JobDefinition.model_validate_json(row["definition"])
            ids.append(row["job_id"])
            times.append(next_fire(definition, now))
        await self._pool.execute(query("set_next_execution"), ids, times)

    async def _measure_queue_depth(self) -> None:
        """Queue depth per tier and queue: the workers group's lag on each work topic."""
        assert self._pool is not None
        depth = await asyncio.get_running_loop().run_in_executor(None, self._work_lag)
        if depth:
            await self._pool.execute(query("upsert_queue_depth"), [p for p, _, _ in depth],
                                     [q for _, q, _ in depth], [d for _, _, d in depth])
        for priority, queue, value in depth:
            metrics.QUEUE_DEPTH.labels(queue=queue, priority=priority).set(value)
        counts = {r["status"]: r["n"] for r in await self._pool.fetch(query("workers_by_status"))}
        for status in ("ACTIVE", "DRAINING", "OFFLINE"):
            metrics.WORKERS.labels(status=status).set(counts.get(status, 0))

    def _work_lag(self) -> list[tuple[str, str, int]]:
        reader = Consumer({"bootstrap.servers": self.settings.kafka_bootstrap_servers,
                           "group.id": f"{self.topics.prefix}workers", "enable.auto.commit": False,
                           "isolation.level": "read_committed", **self.settings.kafka_config})
        try:
            prefix = f"{self.topics.prefix}work."
            metadata = reader.list_topics(timeout=10).topics
            out = []
            for name, topic in metadata.items():
                if not name.startswith(prefix):
                    continue
                priority, queue = name[len(prefix):].split(".", 1)
                if priority not in PRIORITIES:
                    continue
                tps = [TopicPartition(name, p) for p in topic.partitions]
                committed = reader.committed(tps, timeout=10)
                lag = 0
                for tp in committed:
                    low, high = reader.get_watermark_offsets(TopicPartition(name, tp.partition), 10)
                    lag += max(0, high - (tp.offset if tp.offset >= 0 else low))
                out.append((priority, queue, lag))
            return out
        finally:
            reader.close()

