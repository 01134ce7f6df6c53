"""The dispatcher: turns a due job into a queued execution.

Consumes `job-due` and `execution-events` in one group with the range assignor, so
partition i of both topics (same partition count, both keyed by job_id) lands on the
same instance: the events it sees are those of the jobs it dispatches. Each batch is one
consume-transform-produce transaction: the QUEUED events, the work records, the state
they change (concurrency policy, remembered dues) and the consumed offsets commit
together or not at all (KIP-447 fencing through the group metadata), so a JobDue is
queued exactly once even if a dispatcher dies mid-batch.

When a transaction is aborted, or hangs and its producer is replaced (outcome unknown:
shared/producers.py), nothing of the batch is trusted: the partitions rewind to their
committed offsets and the state is read back from `dispatcher-state`, both settled by
then, and the batch is processed again from what actually committed.

Flow control (flow.py, admission.py: decision 0056): the JobDues of jobs with
`concurrency`, `pool` or `rate_limit` ask their admission partition to start; held back,
they are WAITING until admitted. The group also consumes `admissions` (the requests
forwarded to a pool's partition), and each instance follows `pools`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from confluent_kafka import KafkaException, Message, TopicPartition

from cronstream.services.dispatcher.admission import PREFIX as FLOW_PREFIX
from cronstream.services.dispatcher.admission import Ask
from cronstream.services.dispatcher.dedupe import KEY_PREFIX, SeenDues
from cronstream.services.dispatcher.flow import (
    END_HEADER,
    END_MARK,
    Flow,
    ask_of,
    end_request,
    ended,
    is_end,
    limited,
)
from cronstream.services.dispatcher.policy import PolicyState
from cronstream.shared import metrics
from cronstream.shared.clients import REAL, KafkaClients
from cronstream.shared.codec import DecodeError
from cronstream.shared.fast_records import (
    DueRecord,
    as_model,
    decode_due,
    decode_event,
    ending_of,
)
from cronstream.shared.health import Health
from cronstream.shared.ids import fast_uuid7
from cronstream.shared.inbound import Batch, Inbound
from cronstream.shared.kafka.config import (
    consumer_config,
    producer_config,
    reader_config,
)
from cronstream.shared.kafka.consumer import ConsumerThread, OnLane
from cronstream.shared.kafka.reading import position, read_to_end
from cronstream.shared.logs import log
from cronstream.shared.producers import OutRecord, ProducerFenced, TransactionAborted, TransactionalProducer
from cronstream.shared.records import (
    Command,
    ExecutionEvent,
    ExecutionStatus,
    Pool,
    now_utc,
    render_event,
)
from cronstream.shared.settings import Settings
from cronstream.shared.statuses import TERMINAL, Status
from cronstream.shared.telemetry import Hop, messaging, new_headers, recording

logger = logging.getLogger(__name__)
# The statuses that end nothing flow control holds (an unreadable one is decoded whole).
NOT_ENDED = frozenset(str(s) for s in Status) - TERMINAL

SERVICE = "dispatcher"
# Batches (transactions) start at least this far apart. A transaction costs the broker
# milliseconds whatever it holds (bench.transactions); taken as soon as anything arrives,
# a batch at moderate load is a scheduler round's few JobDues or a handful of execution
# events, one transaction each. Waiting out the gap gathers them: at 1,000 executions/s
# it cuts the dispatcher's transactions to a third, and a due job waits at most this
# long here (decision 0012). A full batch means a backlog: the next one is read at once.
BATCH_GAP_SECONDS = 0.05
# ...and this long after a batch whose JobDues were all still at least this far ahead of
# their scheduled_at (fires committed ahead, decision 0027): none of them waits on the
# dispatcher, and the next batch carries twice as many in one transaction. A batch with
# a due job that was not that far ahead (a retry, a FORBID job, a trigger, or a backlog)
# keeps the short gap for the next.
AHEAD_BATCH_GAP_SECONDS = 0.1
# Records per batch (JobDues and execution events together: ~3 events per execution).
# A batch's cost is mostly its transaction's, not its size: under a backlog the batches
# grow (2,000 records held only ~500 JobDues) and follow each other without the gap.
BATCH = 10_000
# How often the dispatcher reads what changed on `pools` (a new size admits at once).
POOLS_EVERY_SECONDS = 0.5
# How often the rate logs that left their windows are forgotten (and tombstoned).
SWEEP_SECONDS = 60.0
# A static member (a stable --instance-id) whose group join has not come back for this long
# starts over with a fresh consumer (_rejoin). Rebalances take seconds.
REJOIN_AFTER_SECONDS = 30.0


@dataclass(frozen=True)
class _Headers:
    """The headers of a record that has no hop of its own (an admission decided later)."""

    headers: Any


@dataclass
class _Work:
    """What one batch turns into, before its transaction."""

    records: list[OutRecord] = field(default_factory=list)
    hops: list[Hop] = field(default_factory=list)
    added: list[DueRecord] = field(default_factory=list)
    new_queues: set[str] = field(default_factory=set)
    least_lead_ms: float | None = None  # the least time to its scheduled_at of any JobDue


class DispatcherService:
    name = SERVICE

    def __init__(self, settings: Settings, instance: str | None = None,
                 kafka: KafkaClients = REAL) -> None:
        self.settings = settings
        self.kafka = kafka
        self.topics = settings.topics
        self.instance = settings.instance(instance)
        self._stable_name = bool(instance or settings.instance_id)  # not hostname-pid
        self.health = Health(self.name)
        self.health.require("kafka", "assignment")
        self.inbound = Inbound(SERVICE, self.topics)
        self.seen = SeenDues()
        self.policy = PolicyState()
        self.flow = Flow(self.topics.partitions)
        self._pools_reader: Any = None
        self._pools_read = 0.0
        self._swept = 0.0
        self._queues: set[str] = set()
        self._owned: set[int] = set()
        self._rebalanced = False
        self._decided: Counter[str] = Counter()  # decisions of the batch, counted on commit
        self._gap = BATCH_GAP_SECONDS  # before the next batch: _process
        self._loop: asyncio.AbstractEventLoop | None = None
        self._consumer: ConsumerThread | None = None
        self._consumer_conf: dict[str, Any] = {}
        self._waiting_since: float | None = None  # the last rebalance began; no assignment yet
        self._producer: TransactionalProducer | None = None

    def open(self) -> None:
        """Make the Kafka clients (none is contacted yet)."""
        self._loop = asyncio.get_running_loop()
        static: dict[str, Any] = {}
        if self._stable_name:
            # Static membership for a stable name (a StatefulSet's pod, --instance-id): a
            # member whose session ran out while the broker was away (librdkafka notices it
            # when the broker is back, and joins again as a new member) or that restarts
            # takes its partitions back at once. A new dynamic member waits until the old
            # one's session expires on the broker, which restarted the clock of every member
            # when it loaded the group: ~6 s without a fire dispatched (decision 0007).
            static["group.instance.id"] = self.instance
        self._consumer_conf = consumer_config(
            self.settings, f"dispatcher-{self.instance}", f"{self.topics.prefix}dispatcher",
            **{"partition.assignment.strategy": "range"}, **static,
        )
        self._consumer = self.kafka.consumer(self._consumer_conf, "dispatcher")
        # A stable id: a restarted instance fences its predecessor and settles its
        # open transaction at once (instead of after transaction.timeout.ms).
        tid = f"{self.topics.prefix}dispatcher-{self.instance}"
        self._producer = self.kafka.transactional(
            producer_config(self.settings, f"dispatcher-{self.instance}", transactional_id=tid))

    async def run(self, stopping: asyncio.Event) -> None:
        self.open()
        producer = self._producer
        assert self._consumer is not None and producer is not None
        try:
            await producer.init()
            self._queues = await self._known_queues(stopping)
            self.health.set("kafka", True)
            await self._follow_pools()
            await self._subscribe()
            log(logger, "dispatcher_started", instance=self.instance)
            last_batch = 0.0
            while not stopping.is_set():
                gap = self._gap - (time.monotonic() - last_batch)
                if gap > 0:
                    await asyncio.sleep(gap)
                assert self._consumer is not None
                messages = await self._consumer.consume(BATCH, 0.1)
                try:
                    batch = self.inbound.batch(messages)
                except KafkaException as exc:
                    # The consumer is dead (fenced as a static member, above all): a fresh
                    # one takes its place.
                    await self._rejoin(f"the consumer failed for good: {exc}")
                    continue
                waiting = self._waiting_since
                if waiting is not None and time.monotonic() - waiting > REJOIN_AFTER_SECONDS:
                    await self._rejoin("no assignment since the last rebalance began")
                    continue
                changed = await self._read_pools()
                if messages:
                    last_batch = time.monotonic() if len(messages) < BATCH else 0.0
                    await self._process(messages, batch)
                elif changed or self._wakes(time.time()):
                    await self._process([])  # only admissions: a pool grew, a rate window moved
        except ProducerFenced as exc:
            log(logger, "dispatcher_fenced", logging.ERROR, instance=self.instance, error=str(exc),
                hint="another dispatcher runs with the same --instance-id")
            raise
        finally:
            if self._consumer is not None:
                await self._consumer.close()
            await producer.close()
            if self._pools_reader is not None:
                await self._pools_reader.close()

    async def _subscribe(self) -> None:
        assert self._consumer is not None
        self._waiting_since = time.monotonic()
        await self._consumer.subscribe([self.topics.job_due, self.topics.execution_events,
                                        self.topics.admissions],
                                       on_assign=self._on_assign, on_revoke=self._on_revoke,
                                       on_lost=self._on_revoke)

    async def _rejoin(self, reason: str) -> None:
        """Start over in the group with a fresh consumer (the same static member id).

        A static member can be fenced by its own join after a session that ran out (a fatal
        error: the consumer is dead for good), or be left waiting for an assignment that
        never comes after a broker restart (confluent-kafka-go #494); the worker does the
        same (worker/service.py). Nothing is lost: each batch committed before the next
        consume, so nothing is in flight, and the next assignment reads the state again."""
        assert self._consumer is not None
        waited = 0.0 if self._waiting_since is None else time.monotonic() - self._waiting_since
        log(logger, "dispatcher_rejoining", logging.WARNING, instance=self.instance,
            waited_seconds=round(waited, 1), reason=reason)
        old, self._consumer = self._consumer, None
        await old.close()  # a static member does not leave the group on close
        self._forget()
        self._consumer = self.kafka.consumer(self._consumer_conf, "dispatcher")
        await self._subscribe()

    # -- pools: every instance follows `pools` ------------------------------------------

    async def _follow_pools(self) -> None:
        """Read `pools` to its end, then keep the reader to pick up what changes."""
        self._pools_reader = self.kafka.consumer(
            reader_config(self.settings, f"dispatcher-{self.instance}-pools"), "pools")
        await read_to_end(self._pools_reader, [TopicPartition(self.topics.pools, 0)],
                          self._load_pools)
        self._pools_read = time.monotonic()

    async def _read_pools(self) -> bool:
        """What changed on `pools` since the last read (at most every POOLS_EVERY_SECONDS)."""
        if self._pools_reader is None or time.monotonic() - self._pools_read < POOLS_EVERY_SECONDS:
            return False
        self._pools_read = time.monotonic()
        messages = self.inbound.batch(await self._pools_reader.consume(100, 0)).records
        self._load_pools(messages)
        return bool(messages)

    def _load_pools(self, messages: list[Message]) -> None:
        for m in messages:
            name = (m.key() or b"").decode("utf-8", "replace")
            value = m.value()
            if value is None:
                self.flow.pools.pop(name, None)
                continue
            try:
                self.flow.pools[name] = Pool.model_validate_json(value).slots
            except ValueError:
                continue  # not a pool (the CLI and SDK refuse it; another producer wrote it)

    def _flow_metrics(self) -> None:
        in_use = self.flow.in_use()
        for pool in set(in_use) | set(self.flow.pools):
            metrics.POOL_SLOTS_IN_USE.labels(pool=pool).set(in_use.get(pool, 0))
        for kind, n in self.flow.waiting_by_kind(time.time()).items():
            metrics.WAITING.labels(reason=kind).set(n)

    def _wakes(self, now: float) -> bool:
        """Whether a rate limit lets a waiting execution start by now."""
        at = self.flow.next_wakeup()
        return at is not None and at <= now

    async def _known_queues(self, stopping: asyncio.Event) -> set[str]:
        """The queues that have work topics already (waiting out a broker that is away)."""
        prefix = f"{self.topics.prefix}work."
        backoff = 0.5
        while True:
            try:
                topics = await asyncio.get_running_loop().run_in_executor(
                    None, self.kafka.topic_names, self.settings)
                return {name[len(prefix):].split(".", 1)[1] for name in topics
                        if name.startswith(prefix) and "." in name[len(prefix):]}
            except KafkaException as exc:
                if stopping.is_set():
                    raise
                self.health.set("kafka", False, "cannot list topics")
                log(logger, "kafka_unavailable", logging.WARNING, error=str(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    # -- one batch, one transaction ---------------------------------------------------

    async def _process(self, messages: list[Message], batch: Batch | None = None) -> None:
        """One batch in one transaction (`batch`: `messages` already read through the
        inbound path)."""
        assert self._consumer is not None and self._producer is not None
        started = time.monotonic()
        batch = batch or self.inbound.batch(messages)
        work = _Work()
        now_ms = time.time_ns() // 1_000_000
        for msg in batch.records:
            topic = msg.topic()
            if topic == self.topics.job_due:
                self._take(msg, batch, work, now_ms)
            elif topic == self.topics.admissions:
                self._request(msg, work)
            else:
                self._observe(msg, work)
        self._admit(work)
        records, hops, added, new_queues = work.records, work.hops, work.added, work.new_queues
        lead = work.least_lead_ms
        self._gap = (AHEAD_BATCH_GAP_SECONDS if lead is not None and lead >= AHEAD_BATCH_GAP_SECONDS * 1000
                     else BATCH_GAP_SECONDS)
        records.extend(batch.dead)
        if new_queues:
            await asyncio.get_running_loop().run_in_executor(
                None, self.kafka.ensure_topics, self.settings, self.topics.work_specs(sorted(new_queues)))
            self._queues |= new_queues
        state_headers = new_headers()
        records.extend(
            OutRecord(self.topics.dispatcher_state, job_id.encode(), value, state_headers,
                      partition=partition)
            for job_id, partition, value in self.policy.drain_dirty())
        records.extend(OutRecord(self.topics.dispatcher_state, key.encode(), None, state_headers,
                                 partition=p)
                       for key, p in self.seen.expired)
        records.extend(OutRecord(self.topics.dispatcher_state, key.encode(), value, state_headers,
                                 partition=p)
                       for key, p, value in self.flow.drain_dirty())
        self.seen.expired = []
        try:
            if self._rebalanced:
                # A fresh producer after a rebalance: one that cached the old group
                # coordinator (a broker restart) can hang in send_offsets (librdkafka #5511).
                self._rebalanced = False
                await self._producer.renew()
            await self._producer.commit(records, batch.offsets(), self._consumer.group_metadata)
        except TransactionAborted as exc:
            log(logger, "dispatch_batch_aborted", logging.WARNING, error=str(exc),
                outcome_known=type(exc) is TransactionAborted)
            self._decided.clear()
            for hop in hops:
                hop.end(str(exc))
            await self._recover(batch)
            return
        for hop in hops:
            hop.end()
        metrics.DISPATCH_BATCH.observe(time.monotonic() - started)
        if self.flow.cores:
            self._flow_metrics()
        for decision, count in self._decided.items():
            metrics.DISPATCH_DECISIONS.labels(decision=decision).inc(count)
        self._decided.clear()
        if added:
            log(logger, "executions_queued", logging.DEBUG, count=len(added))

    def _take(self, msg: Message, batch: Batch, work: _Work, now_ms: int) -> None:
        """One JobDue: dropped as a repeat, dead-lettered, or turned into records."""
        due = batch.read(decode_due, msg)
        if due is None:
            return
        lead = due.scheduled_at.timestamp() * 1000 - now_ms
        if work.least_lead_ms is None or lead < work.least_lead_ms:
            work.least_lead_ms = lead
        if self.seen.seen(due):
            self._decided["DUPLICATE"] += 1
            log(logger, "duplicate_due_dropped", job_id=due.job_id,
                execution_id=str(due.execution_id), delivery=due.delivery, reason=due.reason)
            return
        hop = self._hop(due, msg)
        try:
            out = self._dispatch(due, msg, hop)
        except Exception as exc:  # one record never stops the dispatcher
            batch.reject(msg, f"dispatch failed: {type(exc).__name__}: {exc}")
            hop.end(str(exc))
            return
        work.hops.append(hop)
        work.records.extend(out)
        self.seen.remember(due)
        work.added.append(due)
        if self.seen.durable(due):
            key, value = self.seen.record(due, now_ms)
            work.records.append(OutRecord(self.topics.dispatcher_state, key, value, hop.headers,
                                          partition=position(msg)[1]))
        if due.job.queue not in self._queues:
            work.new_queues.add(due.job.queue)

    async def _recover(self, batch: Batch) -> None:
        """After an aborted or unknown transaction: rewind to what committed and read the
        state back, so that the batch is processed again from the settled log."""
        assert self._consumer is not None
        partitions = [TopicPartition(t, p) for t, p in batch.next_offsets]
        await self._consumer.on_lane(lambda consumer: consumer.seek_to_committed(partitions))
        await self._load_state(set(self._owned))

    def _hop(self, due: DueRecord, msg: Message) -> Hop:
        """The queue span: a child of the fire that made the JobDue."""
        topic, partition, offset = position(msg)
        attributes = messaging(topic, partition, offset, job_id=due.job_id,
                               execution_id=due.execution_id, attempt=due.attempt_number,
                               delivery=due.delivery) if recording() else None
        return Hop("cronstream.queue", msg.headers(), attributes=attributes)

    def _dispatch(self, due: DueRecord, msg: Message, hop: Hop) -> list[OutRecord]:
        """The records one JobDue turns into, under its job's concurrency policy."""
        decision = self.policy.decide(due)
        self._decided[{"SKIP": "SKIPPED", "REPLACE": "REPLACED"}.get(decision, "QUEUED")] += 1
        if decision == "SKIP":
            log(logger, "execution_skipped", job_id=due.job_id,
                execution_id=str(due.execution_id), policy=due.job.concurrency_policy,
                max_concurrent_runs=due.job.max_concurrent_runs)
            # With what the run was asked with (who, params, definition), as QUEUED would.
            return [self._event(due, hop, "SKIPPED", priority=due.job.priority, queue=due.job.queue,
                                reason=due.reason, idempotency_key=due.idempotency_key,
                                job=as_model(due).job, triggered_by=due.triggered_by,
                                error_message=self.policy.skip_reason(due))]
        records = self._replace(due, msg, hop) if decision == "REPLACE" else []
        if limited(due.job) and due.reason != "REQUEUE":
            # A requeue is the same execution, still holding what it was admitted with.
            records.extend(self._ask(due, msg, hop))
        else:
            records.extend(self._queue(due, msg.value(), hop.headers))
        self.policy.queued(due, position(msg)[1])
        return records

    # -- flow control -----------------------------------------------------------------

    def _ask(self, due: DueRecord, msg: Message, hop: Hop) -> list[OutRecord]:
        """A limited execution asks its admission partition: decided here when that is
        its own, else forwarded there (flow.py)."""
        arrived_on = position(msg)[1]
        home = self.flow.home_of(due, arrived_on)
        ask = ask_of(due, msg.value() or b"")
        if home != arrived_on:
            assert due.job.pool is not None
            self.flow.route(arrived_on, due.execution_id, due.job_id, due.job.pool)
            if home not in self._owned:
                return [OutRecord(self.topics.admissions, msg.key(), msg.value(), hop.headers,
                                  partition=home)]
            # The pool's partition is this dispatcher's too: decided here, its state in this
            # batch's transaction with the JobDue's offset (no hop through `admissions`).
        self.flow.followed.add(due.job_id)
        return self._decide(ask, home, due, msg.value(), hop.headers)

    def _decide(self, ask: Ask, home: int, due: DueRecord, raw: bytes | None,
                headers: Any) -> list[OutRecord]:
        started, reason = self.flow.core(home).ask(ask, time.time())
        if started:
            self._decided["ADMITTED"] += 1
            return self._queue(due, raw, headers)
        self._decided["WAITING"] += 1
        log(logger, "execution_waiting", job_id=due.job_id, execution_id=str(due.execution_id),
            waiting_reason=reason)
        return [self._event(due, _Headers(headers), "WAITING", priority=due.job.priority,
                            queue=due.job.queue, reason=due.reason,
                            idempotency_key=due.idempotency_key, job=as_model(due).job,
                            triggered_by=due.triggered_by, waiting_reason=reason)]

    def _request(self, msg: Message, work: _Work) -> None:
        """A request on `admissions`, at the partition that decides its pool: an `end`, or
        a JobDue asking to start (flow.py)."""
        home = position(msg)[1]
        if is_end(msg.headers()):
            try:
                self.flow.core(home).end(ended(msg.value()))
            except ValueError as exc:
                log(logger, "admission_request_skipped", logging.WARNING, error=str(exc)[:300])
            return
        raw = msg.value() or b""
        try:
            due = decode_due(raw, msg.key())
        except DecodeError as exc:
            log(logger, "admission_request_skipped", logging.WARNING, error=str(exc)[:300])
            return
        self.flow.followed.add(due.job_id)
        work.records.extend(self._decide(ask_of(due, raw), home, due, raw, msg.headers()))
        if due.job.queue not in self._queues:
            work.new_queues.add(due.job.queue)

    def _admit(self, work: _Work) -> None:
        """What may start now on each owned partition, queued with this batch (and, now and
        then, the rate logs that left their windows forgotten)."""
        now = time.time()
        sweep = now - self._swept >= SWEEP_SECONDS
        if sweep:
            self._swept = now
        for partition, core in list(self.flow.cores.items()):
            if sweep:
                core.sweep(now)
            admitted = core.admit(now)
            if admitted:
                # What waited and starts now (a waiting run's own line says why it waited).
                log(logger, "waiting_admitted", partition=partition, count=len(admitted),
                    first_execution_id=str(admitted[0].execution_id), first_job_id=admitted[0].job_id)
            for ask in admitted:
                try:
                    due = decode_due(ask.due.encode(), ask.job_id.encode())
                except DecodeError:
                    core.release(ask.execution_id)
                    continue
                self._decided["ADMITTED"] += 1
                work.records.extend(self._queue(due, ask.due.encode(), new_headers()))
                if due.job.queue not in self._queues:
                    work.new_queues.add(due.job.queue)

    def _ended(self, execution_id: UUID, job_id: str, partition: int, work: _Work) -> None:
        """A terminal event of a followed job: what the execution held or waited for is
        settled, here or at its pool's partition."""
        if self.flow.core(partition).end(execution_id):
            return
        pool = self.flow.unroute(partition, execution_id)
        if pool is not None and self.flow.home_of_pool(pool) in self._owned:
            self.flow.core(self.flow.home_of_pool(pool)).end(execution_id)
        elif pool is not None:
            key, value = end_request(execution_id, job_id)
            work.records.append(OutRecord(
                self.topics.admissions, key, value, [*new_headers(), (END_HEADER, END_MARK)],
                partition=self.flow.home_of_pool(pool)))

    def _event(self, due: DueRecord, hop: Hop | _Headers, status: ExecutionStatus,
               **fields: Any) -> OutRecord:
        """An event of `due`'s execution (ExecutionEvent.for_due); a terminal one completes it now."""
        now = now_utc()
        if status in TERMINAL:
            fields.setdefault("completed_at", now)
        event = ExecutionEvent.for_due(due, status, occurred_at=now, **fields)
        return OutRecord(self.topics.execution_events, due.job_id.encode(), event.to_json(), hop.headers)

    def _queue(self, due: DueRecord, value: bytes | None, headers: Any) -> list[OutRecord]:
        key = due.job_id.encode()
        job = due.job
        queued = render_event(due, "QUEUED", fast_uuid7(), now_utc(), priority=job.priority,
                              queue=job.queue, reason=due.reason,
                              idempotency_key=due.idempotency_key, job=job,
                              approved_by=due.approved_by, triggered_by=due.triggered_by)
        return [
            OutRecord(self.topics.execution_events, key, queued, headers),
            # The work record is the JobDue itself, byte for byte.
            OutRecord(self.topics.work(due.job.priority, due.job.queue), key, value, headers),
        ]

    def _replace(self, due: DueRecord, msg: Message, hop: Hop) -> list[OutRecord]:
        """REPLACE: ask every other non-terminal execution of the job to stop.

        Only a CANCEL command: a running one is stopped by its worker, a queued one is
        skipped by the worker that reaches its work record (which is what makes cancelling
        a queued execution race-free: only the consumer of the work record decides
        whether it starts or ends CANCELLED)."""
        records = []
        reason = f"replaced by execution {due.execution_id} (concurrency_policy REPLACE)"
        for other in self.policy.others(due):
            command = Command(command="CANCEL", execution_id=other.execution_id,
                              job_id=due.job_id, reason=reason, issued_at=now_utc(),
                              issued_by=f"dispatcher/{self.instance}")
            records.append(OutRecord(self.topics.commands, str(other.execution_id).encode(),
                                     command.to_json(), hop.headers))
            self.policy.remove(due.job_id, other.execution_id, position(msg)[1])
            log(logger, "execution_replaced", job_id=due.job_id,
                execution_id=str(other.execution_id), by=str(due.execution_id))
        return records

    def _observe(self, msg: Message, work: _Work) -> None:
        """An execution event: follow tracked jobs (bad events are the monitor's to
        dead-letter). Events of untracked jobs — ALLOW jobs without max_concurrent_runs
        or flow control — are not even decoded."""
        key = msg.key()
        job_id = None if key is None else key.decode("utf-8", "replace")
        if job_id is None:
            return
        if job_id not in self.policy.jobs:
            if job_id not in self.flow.followed:
                return
            # Flow control needs only the ends, and only their execution: read no more.
            ending = ending_of(msg.value())
            if ending is not None and ending[0] in NOT_ENDED:
                return
            if ending is not None and ending[0] in TERMINAL:
                self._ended(ending[1], job_id, position(msg)[1], work)
                return
        try:
            event = decode_event(msg.value(), msg.key())  # the common events: msgspec (0018)
        except DecodeError:
            return
        partition = position(msg)[1]
        self.policy.observe(event, partition)
        if event.status in TERMINAL and job_id in self.flow.followed:
            self._ended(event.execution_id, job_id, partition, work)

    # -- assignment: the state of the assigned partitions ---------------------------------

    def _on_assign(self, consumer: OnLane, partitions: list[TopicPartition]) -> None:
        self._owned = {tp.partition for tp in partitions if tp.topic == self.topics.job_due}
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._load_state(self._owned), self._loop).result(120)
        consumer.assign(partitions)
        self._rebalanced = True
        self._waiting_since = None
        self.health.set("assignment", True)
        log(logger, "partitions_assigned", count=len(partitions),
            tracked_jobs=len(self.policy.jobs), remembered_dues=len(self.seen))

    async def _load_state(self, partitions: set[int]) -> None:
        """Rebuild the policy state and the remembered dues of the owned partitions."""
        self.policy = PolicyState()
        self.seen = SeenDues()
        self.flow = Flow(self.topics.partitions, pools=self.flow.pools)
        if not partitions:
            return
        now_ms = time.time_ns() // 1_000_000
        flow_records: dict[int, list[tuple[str, bytes | None]]] = {p: [] for p in partitions}

        def load(messages: list[Message]) -> None:
            for m in messages:
                key = (m.key() or b"").decode("utf-8", "replace")
                if not key:
                    continue
                partition = position(m)[1]
                if key.startswith(KEY_PREFIX):
                    self.seen.load(key, m.value(), partition, now_ms)
                    continue
                if key.startswith(FLOW_PREFIX):
                    flow_records.setdefault(partition, []).append((key, m.value()))
                    continue
                try:
                    self.policy.load(partition, m.value(), key)
                except ValueError as exc:  # a record we cannot read is forgotten, not fatal
                    log(logger, "state_record_skipped", logging.WARNING, key=key[:200],
                        error=str(exc)[:300])

        await self.read_state([TopicPartition(self.topics.dispatcher_state, p)
                               for p in sorted(partitions)], load)
        for partition, records in flow_records.items():
            try:
                self.flow.load(partition, records)
            except ValueError as exc:  # as above: unreadable state is forgotten, not fatal
                log(logger, "state_record_skipped", logging.WARNING, partition=partition,
                    error=str(exc)[:300])

    async def read_state(self, partitions: list[TopicPartition],
                         load: Callable[[list[Message]], None]) -> None:
        """Feed `dispatcher-state` of `partitions`, to its end, to `load` (a seam: unit tests
        give the service a bus of their own)."""
        reader = self.kafka.consumer(reader_config(self.settings, f"dispatcher-{self.instance}-state"),
                                     "dispatcher-state")
        try:
            await read_to_end(reader, partitions, load)
        finally:
            await reader.close()

    def _on_revoke(self, consumer: OnLane, partitions: list[TopicPartition]) -> None:
        # Each batch is committed before the next consume(), so nothing is in flight here.
        self._forget()
        self._waiting_since = time.monotonic()
        consumer.unassign()
        log(logger, "partitions_revoked", count=len(partitions))

    def _forget(self) -> None:
        """Drop the state of the partitions this instance owned (none is owned now)."""
        self._owned = set()
        self.policy = PolicyState()
        self.seen = SeenDues()
        self.flow = Flow(self.topics.partitions, pools=self.flow.pools)
        self.health.set("assignment", False, "rebalancing")
