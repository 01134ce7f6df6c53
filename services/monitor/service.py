"""The monitor: the exactly-once PostgreSQL projection of the event stream.

Consumes `execution-events`, `heartbeats` and `job-definitions` (read_committed) and
writes each batch in one PostgreSQL transaction together with the batch's next offsets
(`consumer_offsets`). On assignment it resumes from the offsets stored in PostgreSQL,
not from Kafka's, so a crash at any point neither loses nor doubles a row. Offsets are
also committed to Kafka afterwards, for lag tooling only.

Alerts: every PERMANENTLY_FAILED event raises an Alert on `alerts` and an
`action=alert_raised` log line (at least once; the alert id is deterministic).

Dead letters: the monitor dead-letters what it cannot decode on `execution-events` and
`heartbeats`. Bad `job-definitions` records are the scheduler's to dead-letter (one
dead letter per bad record); the monitor logs and skips them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime
from typing import Any
from uuid import uuid5

import asyncpg
from confluent_kafka import Consumer, Message, TopicPartition

from cronstream.services.monitor.projection import (
    event_arrays,
    fold,
    heartbeat_arrays,
    patch_arrays,
)
from cronstream.shared.codec import DecodeError, decode, decode_key
from cronstream.shared.db import query
from cronstream.shared.ids import NAMESPACE
from cronstream.shared.kafka import (
    ConsumerThread,
    IdempotentProducer,
    OutRecord,
    consumer_config,
    dead_letter,
    log_consumer_error,
    producer_config,
)
from cronstream.shared.logs import log
from cronstream.shared.records import Alert, ExecutionEvent, Heartbeat, JobDefinition, now_utc
from cronstream.shared.schedule import from_epoch_ms, next_fire
from cronstream.shared.settings import Settings, default_worker_id

logger = logging.getLogger(__name__)

SERVICE = "monitor"
BATCH = 5000


class MonitorService:
    name = SERVICE

    def __init__(self, settings: Settings, instance: str | None = None) -> None:
        self.settings = settings
        self.topics = settings.topics
        self.instance = instance or default_worker_id()
        self.group = f"{self.topics.prefix}monitor"
        self._pool: asyncpg.Pool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dlq: IdempotentProducer | None = None
        self.projected = 0

    async def run(self, stopping: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._pool = await asyncpg.create_pool(self.settings.database_url, min_size=1, max_size=4)
        self._dlq = IdempotentProducer(producer_config(self.settings, f"monitor-{self.instance}"))
        conf = consumer_config(self.settings, f"monitor-{self.instance}", self.group,
                               **{"fetch.min.bytes": 1, "queued.min.messages": 20000})
        consumer = ConsumerThread(conf, "monitor")
        topics = [self.topics.execution_events, self.topics.heartbeats, self.topics.job_definitions]
        await consumer.call(lambda: consumer.consumer.subscribe(topics, on_assign=self._on_assign))
        log(logger, "monitor_started", instance=self.instance)
        try:
            while not stopping.is_set():
                messages = await consumer.consume(BATCH, 0.1)
                if messages:
                    offsets = await self._project(messages)
                    if offsets:
                        await consumer.call(self._commit_to_kafka, consumer.consumer, offsets)
        finally:
            await consumer.close()
            await self._pool.close()
            self._dlq.flush(5.0)

    @staticmethod
    def _commit_to_kafka(consumer: Consumer, offsets: list[TopicPartition]) -> None:
        try:
            consumer.commit(offsets=offsets, asynchronous=True)
        except Exception as exc:  # informational only: PostgreSQL holds the truth
            log(logger, "kafka_commit_skipped", logging.DEBUG, error=str(exc))

    # -- assignment: resume from PostgreSQL -------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assert self._loop is not None
        stored = asyncio.run_coroutine_threadsafe(self._stored_offsets(), self._loop).result(60)
        for tp in partitions:
            tp.offset = stored.get((tp.topic, tp.partition), -2)  # -2: from the beginning
        consumer.assign(partitions)
        log(logger, "partitions_assigned", count=len(partitions))

    async def _stored_offsets(self) -> dict[tuple[str, int], int]:
        assert self._pool is not None
        rows = await self._pool.fetch(query("load_offsets"), self.group)
        return {(r["topic"], r["partition"]): r["next_offset"] for r in rows}

    # -- projection -----------------------------------------------------------------

    async def _project(self, messages: list[Message]) -> list[TopicPartition]:
        assert self._pool is not None and self._dlq is not None
        events: list[tuple[ExecutionEvent, int, int]] = []
        beats: list[Heartbeat] = []
        definitions: list[tuple[str, JobDefinition | None, datetime]] = []
        offsets: dict[tuple[str, int], int] = {}
        dead: list[OutRecord] = []
        for msg in messages:
            err = msg.error()
            if err is not None:
                log_consumer_error("monitor", err)
                continue
            topic = msg.topic()
            offsets[(topic, msg.partition())] = msg.offset() + 1
            try:
                if topic == self.topics.execution_events:
                    event = decode(ExecutionEvent, msg.value(), key=msg.key(), key_field="job_id")
                    events.append((event, msg.partition(), msg.offset()))
                elif topic == self.topics.heartbeats:
                    beats.append(decode(Heartbeat, msg.value(), key=msg.key(),
                                        key_field="worker_id"))
                else:
                    job_id = decode_key(msg.key())
                    definition = None if msg.value() is None else decode(
                        JobDefinition, msg.value(), key=msg.key(), key_field="job_id")
                    definitions.append((job_id, definition, _timestamp(msg)))
            except DecodeError as exc:
                if topic == self.topics.job_definitions:
                    log(logger, "definition_skipped", logging.WARNING, offset=msg.offset(),
                        reason=str(exc)[:300])
                else:
                    dead.append(dead_letter(self.topics, msg, str(exc), SERVICE))
        outgoing = dead + [self._alert(e) for e, _, _ in events if e.status == "PERMANENTLY_FAILED"]
        if outgoing:
            # Before the PostgreSQL commit: at least once (alerts carry a deterministic id).
            for record in outgoing:
                self._dlq.produce(record)
            await asyncio.get_running_loop().run_in_executor(None, self._dlq.flush, 30.0)
        async with self._pool.acquire() as conn, conn.transaction():
            if events:
                await conn.execute(query("insert_events"), *event_arrays(events))
                patches = list(fold([e for e, _, _ in events]).values())
                await conn.execute(query("upsert_executions"), *patch_arrays(patches))
            if beats:
                await conn.execute(query("upsert_workers"), *heartbeat_arrays(beats))
            for job_id, definition, seen_at in definitions:
                await self._project_definition(conn, job_id, definition, seen_at)
            await conn.execute(
                query("store_offsets"), self.group,
                [t for t, _ in offsets], [p for _, p in offsets], list(offsets.values()))
        self.projected += len(messages)
        return [TopicPartition(t, p, o) for (t, p), o in offsets.items()]

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
        return OutRecord(self.topics.alerts, alert.job_id.encode(), alert.to_json())

    async def _project_definition(
        self, conn: asyncpg.Connection, job_id: str, d: JobDefinition | None, seen_at: datetime,
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


def _timestamp(msg: Message) -> datetime:
    kind, ts = msg.timestamp()
    if kind and ts > 0:
        return from_epoch_ms(ts)
    return now_utc()
