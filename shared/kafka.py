"""Kafka plumbing shared by every service: configs, consumers, transactions, dead letters.

confluent-kafka is synchronous; services are asyncio programs. Each consumer owns one
thread (`ConsumerThread`) on which every call on it runs, so rebalance callbacks run on
that thread too, and the event loop is never blocked by a poll. Producers' blocking
transactional calls run on a thread of their own for the same reason.

Transactions follow librdkafka's three error classes (INTRODUCTION.md, "Transactional
producer API"): retriable errors retry the same call, abortable errors abort and replay
the whole transaction (records are materialised so replay is exact), fatal errors — a
fenced producer above all — raise `ProducerFenced` and the owner must drop the producer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, TypeVar

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from cronstream.shared import metrics
from cronstream.shared.logs import log
from cronstream.shared.settings import Settings
from cronstream.shared.telemetry import Headers
from cronstream.shared.topics import Topics, TopicSpec

logger = logging.getLogger(__name__)

T = TypeVar("T")

DLQ_TOPIC = "cronstream.dlq.topic"
DLQ_PARTITION = "cronstream.dlq.partition"
DLQ_OFFSET = "cronstream.dlq.offset"
DLQ_ERROR = "cronstream.dlq.error"
DLQ_SERVICE = "cronstream.dlq.service"


class OutRecord(NamedTuple):
    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers | None = None
    partition: int | None = None  # None: the partitioner chooses by key


class ProducerFenced(Exception):
    """A fatal producer error: another instance owns this transactional.id now."""


class TransactionAborted(Exception):
    """The transaction could not be committed and was aborted; nothing of it is visible."""


# -- configuration --------------------------------------------------------------------


def client_config(settings: Settings, client_id: str) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.kafka_bootstrap_servers,
        "client.id": client_id,
        # librdkafka's own log lines go through our formatter, not raw to stderr.
        "logger": logging.getLogger("librdkafka"),
    }
    conf.update(settings.kafka_config)
    return conf


STATS_INTERVAL_MS = 5_000


def lag_reporter(topics: Topics, group: str, total_of: str | None = None,
                 total: Any = None) -> Callable[[str], None]:
    """A librdkafka `stats_cb` that publishes this consumer's lag per partition.

    librdkafka computes `consumer_lag` against the last stable offset for read_committed
    consumers (STATISTICS.md), which is the lag that matters here. The callback runs on
    the consumer's thread inside poll(), every STATS_INTERVAL_MS. With `total_of`, the
    summed lag of that topic is also set on the gauge `total`.
    """
    service = metrics.service()

    def report(stats_json: str) -> None:
        try:
            stats = json.loads(stats_json)
        except ValueError:
            return
        summed = 0
        for topic, data in stats.get("topics", {}).items():
            name = topics.logical(topic)
            for partition, p in data.get("partitions", {}).items():
                if partition == "-1" or p.get("fetch_state") != "active":
                    continue
                lag = p.get("consumer_lag", -1)
                if lag >= 0:
                    metrics.CONSUMER_LAG.labels(service=service, group=group, topic=name,
                                                partition=partition).set(lag)
                    if topic == total_of:
                        summed += lag
        if total is not None:
            total.set(summed)

    return report


def consumer_config(
    settings: Settings, client_id: str, group_id: str, **extra: Any
) -> dict[str, Any]:
    conf = client_config(settings, client_id)
    conf.update(
        {
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 50,
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 1_000,
            "statistics.interval.ms": STATS_INTERVAL_MS,
            "stats_cb": lag_reporter(settings.topics, group_id),
        }
    )
    conf.update(extra)
    return conf


def reader_config(settings: Settings, client_id: str) -> dict[str, Any]:
    """A group-less consumer that reads assigned partitions (compacted state, commands)."""
    conf = consumer_config(
        settings,
        client_id,
        group_id=f"{settings.topic_prefix}reader-unused",
        **{"enable.partition.eof": True},
    )
    # No group, no lag to report.
    del conf["stats_cb"]
    conf["statistics.interval.ms"] = 0
    return conf


def producer_config(
    settings: Settings, client_id: str, transactional_id: str | None = None
) -> dict[str, Any]:
    conf = client_config(settings, client_id)
    conf.update(
        {
            # librdkafka leaves idempotence off by default; every producer here needs it.
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "lz4",
            "message.timeout.ms": 30_000,
            # The Java client's partitioner, so that a job lands on the same partition
            # whichever client produced it (topics.py: co-partitioning).
            "partitioner": "murmur2_random",
        }
    )
    if transactional_id is not None:
        conf["transactional.id"] = transactional_id
        # message.timeout.ms must stay below transaction.timeout.ms.
        conf["transaction.timeout.ms"] = 60_000
    return conf


# -- consumers --------------------------------------------------------------------------


class ConsumerThread:
    """A confluent-kafka Consumer whose every call runs on one dedicated thread."""

    def __init__(self, conf: dict[str, Any], name: str) -> None:
        self.name = name
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.consumer: Consumer = self._executor.submit(Consumer, conf).result()
        self._closed = False

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    async def consume(self, max_messages: int, timeout: float) -> list[Message]:
        """Up to `max_messages`, returning as soon as any are available.

        `Consumer.consume(n, timeout)` waits until n records arrive or the timeout ends,
        which turns a batch size into latency. Instead: wait for the first record with
        `poll`, then take whatever else is already fetched without waiting.
        """
        return await self.call(self._consume, max_messages, timeout)

    def _consume(self, max_messages: int, timeout: float) -> list[Message]:
        first = self.consumer.poll(timeout)
        if first is None:
            return []
        if max_messages <= 1:
            return [first]
        return [first, *self.consumer.consume(max_messages - 1, 0)]

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """Run on the consumer thread from a non-event-loop context."""
        return self._executor.submit(fn, *args).result()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.call(self.consumer.close)
        except (KafkaException, RuntimeError) as exc:
            log(logger, "consumer_close_failed", logging.WARNING, consumer=self.name, error=str(exc))
        self._executor.shutdown(wait=True)


def position(msg: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a consumed record (always set on one)."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


def record_time_ms(msg: Message) -> int:
    """The record's Kafka timestamp in epoch ms (now, for a record without one)."""
    kind, ts = msg.timestamp()
    return ts if kind and ts > 0 else time.time_ns() // 1_000_000


def message_error(msg: Message) -> KafkaError | None:
    err = msg.error()
    if err is None:
        return None
    return err  # type: ignore[no-any-return]


def log_consumer_error(consumer: str, err: KafkaError) -> None:
    if err.code() == KafkaError._PARTITION_EOF:
        return
    level = logging.ERROR if err.fatal() else logging.WARNING
    log(logger, "consumer_error", level, consumer=consumer, error=err.str(), code=err.name())
    if err.fatal():
        raise KafkaException(err)


async def read_to_end(
    reader: ConsumerThread,
    partitions: Sequence[TopicPartition],
    handle: Callable[[list[Message]], None],
    batch: int = 10_000,
) -> None:
    """Assign `partitions` from the beginning and feed every record to `handle` until
    the end each had when the call began (the last stable offset: read_committed).

    The reader must have `enable.partition.eof`. Control records (transaction markers)
    occupy offsets, so the end is recognised by EOF or by position, not by last offset.
    """
    consumer = reader.consumer
    ends: dict[tuple[str, int], int] = {}
    for tp in partitions:
        _low, high = await reader.call(consumer.get_watermark_offsets, tp, 10.0, False)
        ends[(tp.topic, tp.partition)] = high
    # Every partition is assigned, even an empty one: the caller may keep consuming.
    await reader.call(
        consumer.assign,
        [TopicPartition(t, p, -2) for (t, p) in ends],  # -2: OFFSET_BEGINNING
    )
    pending = {k for k, end in ends.items() if end > 0}
    while pending:
        messages = await reader.consume(batch, 0.5)
        records = []
        for msg in messages:
            err = msg.error()
            topic, partition, offset = position(msg)
            key = (topic, partition)
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if offset >= ends.get(key, 0):
                        pending.discard(key)
                    continue
                log_consumer_error(reader.name, err)
                continue
            records.append(msg)
            if offset + 1 >= ends.get(key, 0):
                pending.discard(key)
        if records:
            handle(records)
        if pending and not messages:
            positions = await reader.call(
                consumer.position, [TopicPartition(t, p) for (t, p) in pending]
            )
            for tp in positions:
                if tp.offset >= ends[(tp.topic, tp.partition)]:
                    pending.discard((tp.topic, tp.partition))


# -- producers --------------------------------------------------------------------------


def _produce(producer: Producer, record: OutRecord, on_delivery: Callable[..., None] | None = None) -> None:
    kwargs: dict[str, Any] = {"headers": record.headers}
    if on_delivery is not None:
        kwargs["on_delivery"] = on_delivery
    if record.partition is not None:
        kwargs["partition"] = record.partition
    while True:
        try:
            producer.produce(record.topic, record.value, record.key, **kwargs)
            return
        except BufferError:
            producer.poll(0.05)  # local queue full: serve deliveries, then retry


def _kafka_error(exc: KafkaException) -> KafkaError | None:
    return exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None


class TransactionalProducer:
    """A transactional producer with librdkafka's error-class handling (blocking API)."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.transactional_id = conf["transactional.id"]
        self._producer = Producer(conf)
        self._closed = False

    def init(self, timeout: float = 30.0) -> None:
        """Take ownership of the transactional.id, fencing any previous owner."""
        self._retry(lambda: self._producer.init_transactions(timeout), "init_transactions")

    def commit_records(
        self,
        records: Iterable[OutRecord],
        offsets: list[TopicPartition] | None = None,
        group_metadata: Callable[[], Any] | None = None,
        attempts: int = 3,
        timeout: float = 30.0,
    ) -> None:
        """Produce `records` (and commit `offsets` for the group) in one transaction.

        Raises TransactionAborted when abortable errors persist over `attempts`, and
        ProducerFenced on a fatal error.
        """
        materialised = list(records)
        for attempt in range(1, attempts + 1):
            try:
                self._producer.begin_transaction()
                for record in materialised:
                    _produce(self._producer, record)
                if offsets:
                    assert group_metadata is not None
                    self._retry(
                        lambda: self._producer.send_offsets_to_transaction(
                            offsets, group_metadata(), timeout
                        ),
                        "send_offsets_to_transaction",
                    )
                self._retry(lambda: self._producer.commit_transaction(timeout), "commit_transaction")
                return
            except KafkaException as exc:
                err = _kafka_error(exc)
                if err is not None and err.fatal():
                    raise ProducerFenced(str(err)) from exc
                if err is not None and err.txn_requires_abort():
                    metrics.TRANSACTION_ABORTS.labels(service=metrics.service()).inc()
                    log(logger, "transaction_aborted", logging.WARNING,
                        transactional_id=self.transactional_id, attempt=attempt, error=err.str())
                    self._abort(timeout)
                    continue
                raise
        raise TransactionAborted(f"transaction aborted {attempts} times")

    def _abort(self, timeout: float) -> None:
        try:
            self._retry(lambda: self._producer.abort_transaction(timeout), "abort_transaction")
        except KafkaException as exc:
            err = _kafka_error(exc)
            if err is not None and err.fatal():
                raise ProducerFenced(str(err)) from exc
            raise

    def _retry(self, call: Callable[[], object], what: str, attempts: int = 5) -> None:
        for attempt in range(1, attempts + 1):
            try:
                call()
                return
            except KafkaException as exc:
                err = _kafka_error(exc)
                if err is not None and err.fatal():
                    raise ProducerFenced(f"{what}: {err.str()}") from exc
                if err is not None and err.retriable() and attempt < attempts:
                    time.sleep(0.05 * attempt)
                    continue
                raise

    def close(self) -> None:
        """Drop the producer; an open transaction is aborted by the broker or successor."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(KafkaException):
            self._producer.flush(1.0)


class IdempotentProducer:
    """A non-transactional, idempotent producer with a delivery-report check on flush."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self._producer = Producer(conf)
        self._errors: list[str] = []

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self._errors.append(err.str())

    def produce(self, record: OutRecord) -> None:
        _produce(self._producer, record, self._on_delivery)
        self._producer.poll(0)

    def poll(self, timeout: float = 0) -> None:
        self._producer.poll(timeout)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait for every record; raise if any failed or some are still undelivered."""
        remaining = self._producer.flush(timeout)
        if remaining:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{remaining} records undelivered"))
        if self._errors:
            errors, self._errors = self._errors, []
            raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, "; ".join(errors[:3])))


# -- dead letters -----------------------------------------------------------------------


def dead_letter(topics: Topics, msg: Message, error: str, service: str) -> OutRecord:
    """The dead-letter copy of `msg`: original key and bytes, the reason in headers."""
    headers = list(msg.headers() or [])
    headers += [
        (DLQ_TOPIC, (msg.topic() or "").encode()),
        (DLQ_PARTITION, str(msg.partition()).encode()),
        (DLQ_OFFSET, str(msg.offset()).encode()),
        (DLQ_ERROR, error[:2000].encode()),
        (DLQ_SERVICE, service.encode()),
    ]
    metrics.DEAD_LETTERS.labels(service=service, topic=topics.logical(msg.topic() or "")).inc()
    log(logger, "record_dead_lettered", logging.WARNING, service=service, topic=msg.topic(),
        partition=msg.partition(), offset=msg.offset(), reason=error[:300])
    return OutRecord(topics.dead_letters, msg.key(), msg.value(), headers)


# -- admin ------------------------------------------------------------------------------


def ensure_topics(settings: Settings, specs: Sequence[TopicSpec], timeout: float = 30.0) -> list[str]:
    """Create the topics that do not exist yet; return the names created."""
    admin = AdminClient(client_config(settings, "cronstream-admin"))
    existing = admin.list_topics(timeout=timeout).topics
    missing = [s for s in specs if s.name not in existing]
    if not missing:
        return []
    extra = {} if settings.topic_min_insync_replicas is None else {
        "min.insync.replicas": str(settings.topic_min_insync_replicas)}
    futures = admin.create_topics(
        [NewTopic(s.name, num_partitions=s.partitions,
                  replication_factor=settings.topic_replication_factor, config={**s.config, **extra})
         for s in missing],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            err = _kafka_error(exc)
            if err is None or err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    _wait_for_metadata(admin, [s.name for s in missing], timeout)
    return created


def _wait_for_metadata(admin: AdminClient, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        topics = admin.list_topics(timeout=timeout).topics
        ready = all(
            n in topics and topics[n].error is None
            and all(p.leader >= 0 for p in topics[n].partitions.values())
            for n in names
        )
        if ready:
            return
        time.sleep(0.1)
    raise TimeoutError(f"topics not ready after {timeout}s: {names}")
