"""The dispatcher: turns a due job into a queued execution.

Consumes `job-due` and `execution-events` in one group with the range assignor, so
partition i of both topics (same partition count, both keyed by job_id) lands on the
same instance: the events it sees are those of the jobs it dispatches. Each batch is one
consume-transform-produce transaction: the QUEUED events, the work records and the
consumed offsets commit together or not at all (KIP-447 fencing through the group
metadata), so a JobDue is queued exactly once even if a dispatcher dies mid-batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from functools import partial
from uuid import UUID, uuid4

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from cronstream.services.dispatcher.policy import ActiveExecution, PolicyState
from cronstream.shared import metrics
from cronstream.shared.codec import DecodeError, decode
from cronstream.shared.health import Health
from cronstream.shared.kafka import (
    ConsumerThread,
    OutRecord,
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
from cronstream.shared.logs import log
from cronstream.shared.records import Command, ExecutionEvent, ExecutionStatus, JobDue, now_utc
from cronstream.shared.settings import Settings
from cronstream.shared.telemetry import child_traceparent, trace_headers, traceparent_of

logger = logging.getLogger(__name__)

SERVICE = "dispatcher"
SEEN_LIMIT = 1_000_000


class DispatcherService:
    name = SERVICE

    def __init__(self, settings: Settings, instance: str | None = None) -> None:
        self.settings = settings
        self.topics = settings.topics
        self.instance = settings.instance(instance)
        self.health = Health(self.name)
        self.health.require("assignment")
        # (execution_id, delivery) already queued by this instance; bounded LRU.
        self._seen: OrderedDict[tuple[UUID, int], None] = OrderedDict()
        self._queues: set[str] = set()
        self.policy = PolicyState()
        self._owned: set[int] = set()
        self._decided: Counter[str] = Counter()  # decisions of the batch, counted on commit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._consumer: ConsumerThread | None = None
        self._producer: TransactionalProducer | None = None

    async def run(self, stopping: asyncio.Event) -> None:
        loop = self._loop = asyncio.get_running_loop()
        conf = consumer_config(
            self.settings, f"dispatcher-{self.instance}", f"{self.topics.prefix}dispatcher",
            **{"partition.assignment.strategy": "range"},
        )
        consumer = self._consumer = ConsumerThread(conf, "dispatcher")
        tid = f"{self.topics.prefix}dispatcher-{self.instance}"
        producer = self._producer = TransactionalProducer(
            producer_config(self.settings, f"dispatcher-{self.instance}", transactional_id=tid))
        await loop.run_in_executor(None, producer.init)
        await loop.run_in_executor(None, self._known_queues)
        await consumer.call(
            lambda: consumer.consumer.subscribe(
                [self.topics.job_due, self.topics.execution_events],
                on_assign=self._on_assign, on_revoke=self._on_revoke)
        )
        log(logger, "dispatcher_started", instance=self.instance)
        try:
            while not stopping.is_set():
                messages = await consumer.consume(2000, 0.1)
                if messages:
                    await self._process(messages)
        finally:
            await consumer.close()
            await loop.run_in_executor(None, producer.close)

    def _known_queues(self) -> None:
        from confluent_kafka.admin import AdminClient

        from cronstream.shared.kafka import client_config

        admin = AdminClient(client_config(self.settings, "dispatcher-admin"))
        prefix = f"{self.topics.prefix}work."
        for name in admin.list_topics(timeout=30).topics:
            if name.startswith(prefix):
                self._queues.add(name[len(prefix):].split(".", 1)[1])

    async def _process(self, messages: list[Message]) -> None:
        assert self._consumer is not None and self._producer is not None
        started = time.monotonic()
        records: list[OutRecord] = []
        offsets: dict[tuple[str, int], int] = {}
        new_queues: set[str] = set()
        added: list[tuple[UUID, int]] = []
        for msg in messages:
            err = msg.error()
            if err is not None:
                log_consumer_error("dispatcher", err)
                continue
            topic, partition, offset = position(msg)
            offsets[(topic, partition)] = offset + 1
            if msg.topic() != self.topics.job_due:
                self._observe(msg)
                continue
            try:
                due = decode(JobDue, msg.value(), key=msg.key(), key_field="job_id")
            except DecodeError as exc:
                records.append(dead_letter(self.topics, msg, str(exc), SERVICE))
                continue
            seen_key = (due.execution_id, due.delivery)
            if seen_key in self._seen:
                metrics.DISPATCH_DECISIONS.labels(decision="DUPLICATE").inc()
                log(logger, "duplicate_due_dropped", job_id=due.job_id,
                    execution_id=str(due.execution_id), delivery=due.delivery)
                continue
            self._remember(seen_key)
            added.append(seen_key)
            records.extend(self._dispatch(due, msg))
            if due.job.queue not in self._queues:
                new_queues.add(due.job.queue)
        if new_queues:
            specs = self.topics.work_specs(sorted(new_queues))
            await asyncio.get_running_loop().run_in_executor(
                None, ensure_topics, self.settings, specs)
            self._queues |= new_queues
        records.extend(
            OutRecord(self.topics.dispatcher_state, job_id.encode(), value, partition=partition)
            for job_id, partition, value in self.policy.drain_dirty())
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(
                None,
                partial(self._producer.commit_records, records, tps,
                        self._consumer.consumer.consumer_group_metadata),
            )
        except (TransactionAborted, KafkaException) as exc:
            # Nothing of the batch is visible: forget it and read it again.
            log(logger, "dispatch_batch_aborted", logging.WARNING, error=str(exc))
            self._decided.clear()
            for key in added:
                self._seen.pop(key, None)
            await self._consumer.call(self._rewind, list(offsets))
            await self._load_state(self._assigned_partitions())  # undo this batch's changes
            return
        metrics.DISPATCH_BATCH.observe(time.monotonic() - started)
        for decision, count in self._decided.items():
            metrics.DISPATCH_DECISIONS.labels(decision=decision).inc(count)
        self._decided.clear()
        if added:
            log(logger, "executions_queued", logging.DEBUG, count=len(added))

    def _dispatch(self, due: JobDue, msg: Message) -> list[OutRecord]:
        """The records one JobDue turns into, under its job's concurrency policy."""
        decision = self.policy.decide(due)
        self._decided[{"SKIP": "SKIPPED", "REPLACE": "REPLACED"}.get(decision, "QUEUED")] += 1
        if decision == "SKIP":
            running = self.policy.others(due)[0]
            log(logger, "execution_skipped", job_id=due.job_id,
                execution_id=str(due.execution_id), policy="FORBID")
            return [self._event(due, msg, "SKIPPED", priority=due.job.priority, queue=due.job.queue,
                                error_message=(
                f"skipped: execution {running.execution_id} of this job is still "
                f"{running.status} (concurrency_policy FORBID)"))]
        records = self._replace(due, msg) if decision == "REPLACE" else []
        records.extend(self._queue(due, msg))
        self.policy.queued(due, msg.partition())
        return records

    def _event(self, due: JobDue | ActiveExecution, msg: Message, status: ExecutionStatus,
               job_id: str | None = None, **fields: object) -> OutRecord:
        job = job_id or due.job_id  # type: ignore[union-attr]
        terminal = status in ("SKIPPED", "CANCELLED")
        event = ExecutionEvent(
            event_id=uuid4(), execution_id=due.execution_id, job_id=job, run_id=due.run_id,
            status=status, attempt_number=due.attempt_number, scheduled_at=due.scheduled_at,
            occurred_at=now_utc(), delivery=due.delivery,
            completed_at=now_utc() if terminal else None, **fields,  # type: ignore[arg-type]
        )
        return OutRecord(self.topics.execution_events, job.encode(), event.to_json(),
                         trace_headers(child_traceparent(traceparent_of(msg.headers()))))

    def _queue(self, due: JobDue, msg: Message) -> list[OutRecord]:
        key = due.job_id.encode()
        return [
            self._event(due, msg, "QUEUED", priority=due.job.priority, queue=due.job.queue,
                        reason=due.reason, idempotency_key=due.idempotency_key, job=due.job,
                        approved_by=due.approved_by),
            # The work record is the JobDue itself, byte for byte.
            OutRecord(self.topics.work(due.job.priority, due.job.queue), key, msg.value(),
                      trace_headers(child_traceparent(traceparent_of(msg.headers())))),
        ]

    def _replace(self, due: JobDue, msg: Message) -> list[OutRecord]:
        """REPLACE: stop every other non-terminal execution of the job."""
        records = []
        reason = f"replaced by execution {due.execution_id} (concurrency_policy REPLACE)"
        for other in self.policy.others(due):
            command = Command(command="CANCEL", execution_id=other.execution_id,
                              job_id=due.job_id, reason=reason, issued_at=now_utc(),
                              issued_by=f"dispatcher/{self.instance}")
            records.append(OutRecord(self.topics.commands, str(other.execution_id).encode(),
                                     command.to_json()))
            if other.status == "QUEUED":
                records.append(self._event(other, msg, "CANCELLED", job_id=due.job_id,
                                           error_message=reason, cancelled_by=command.issued_by))
                self.policy.remove(due.job_id, other.execution_id, msg.partition())
            log(logger, "execution_replaced", job_id=due.job_id,
                execution_id=str(other.execution_id), by=str(due.execution_id))
        return records

    def _observe(self, msg: Message) -> None:
        """An execution event: follow tracked jobs (bad events are the monitor's to
        dead-letter). Events of untracked jobs — all ALLOW jobs — are not even decoded."""
        key = msg.key()
        if key is None or key.decode("utf-8", "replace") not in self.policy.jobs:
            return
        try:
            event = decode(ExecutionEvent, msg.value(), key=msg.key(), key_field="job_id")
        except DecodeError:
            return
        self.policy.observe(event, msg.partition())

    def _remember(self, key: tuple[UUID, int]) -> None:
        self._seen[key] = None
        if len(self._seen) > SEEN_LIMIT:
            self._seen.popitem(last=False)

    def _rewind(self, partitions: list[tuple[str, int]]) -> None:
        """Seek the given partitions back to their committed offsets."""
        assert self._consumer is not None
        consumer = self._consumer.consumer
        committed = consumer.committed([TopicPartition(t, p) for t, p in partitions], 10.0)
        for tp in committed:
            tp.offset = tp.offset if tp.offset >= 0 else -2
            try:
                consumer.seek(tp)
            except KafkaException as exc:
                log(logger, "rewind_failed", logging.WARNING, topic=tp.topic,
                    partition=tp.partition, error=str(exc))

    # -- assignment: the policy state of the assigned partitions ---------------------------

    def _assigned_partitions(self) -> set[int]:
        return set(self._owned)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._owned = {tp.partition for tp in partitions if tp.topic == self.topics.job_due}
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._load_state(self._owned), self._loop).result(120)
        consumer.assign(partitions)
        self.health.set("assignment", True)
        log(logger, "partitions_assigned", count=len(partitions),
            tracked_jobs=len(self.policy.jobs))

    async def _load_state(self, partitions: set[int]) -> None:
        """Read `dispatcher-state` for the owned partitions (to its end)."""
        self.policy = PolicyState()
        if not partitions:
            return
        reader = ConsumerThread(reader_config(self.settings, f"dispatcher-{self.instance}-state"),
                                "dispatcher-state")

        def load(messages: list[Message]) -> None:
            for m in messages:
                key = m.key()
                if key:
                    self.policy.load(position(m)[1], m.value(), key.decode())

        try:
            await read_to_end(reader, [TopicPartition(self.topics.dispatcher_state, p)
                                       for p in sorted(partitions)], load)
        finally:
            await reader.close()

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Each batch is committed before the next consume(), so nothing is in flight here.
        self._owned = set()
        self.policy = PolicyState()
        self.health.set("assignment", False, "rebalancing")
        consumer.unassign()
        log(logger, "partitions_revoked", count=len(partitions))
