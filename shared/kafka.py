"""Kafka plumbing shared by every service: configs, consumers, admin.

confluent-kafka is synchronous; services are asyncio programs. Each consumer owns one
lane (`shared/lanes.py`: a daemon thread) on which every call on it runs, so rebalance
callbacks run there too, the event loop is never blocked by a poll, and no call can hold
the service hostage: each has a deadline, after which the service fails loudly (and its
supervisor restarts it) instead of hanging. Producers live in `shared/producers.py`,
the inbound path (decode, validate, dead-letter) in `shared/inbound.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from cronstream.shared import metrics
from cronstream.shared.lanes import CallTimedOut, Lane
from cronstream.shared.logs import log
from cronstream.shared.settings import Settings
from cronstream.shared.telemetry import Headers
from cronstream.shared.topics import Topics, TopicSpec

logger = logging.getLogger(__name__)

T = TypeVar("T")

# librdkafka's logical offset "from the beginning of the partition".
OFFSET_BEGINNING = -2
# A call on a consumer that has not returned after this long is stuck (a rebalance
# callback included, which may load state): the service fails and is restarted.
CONSUMER_CALL_DEADLINE = 120.0
CLOSE_DEADLINE = 10.0
TRANSACTION_TIMEOUT_MS = 20_000



class OutRecord(NamedTuple):
    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers | None = None
    partition: int | None = None  # None: the partitioner chooses by key


# -- configuration --------------------------------------------------------------------


def client_config(settings: Settings, client_id: str) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.kafka_bootstrap_servers,
        "client.id": client_id,
        # librdkafka's own log lines go through our formatter, not raw to stderr.
        "logger": logging.getLogger("librdkafka"),
        # Reconnect within a second of a broker coming back (librdkafka's backoff grows to
        # 10 s while it is away, which alone would delay recovery by as much).
        "reconnect.backoff.max.ms": 1000,
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


# How long the broker holds a fetch that finds nothing new. It answers as soon as a
# transaction commits anything the fetch reads, so a consumer that tails its topics loses
# no latency to this; at 50 ms each one sent 20 empty fetches a second whenever its
# upstream paused for longer, and every request costs the broker about 0.3 ms of CPU
# (docs/decisions/0026). The end of a partition (EOF), though, is only told when such a
# fetch returns: a reader that loads state up to the end keeps END_FETCH_WAIT_MS.
IDLE_FETCH_WAIT_MS = 250
END_FETCH_WAIT_MS = 50


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
            "fetch.wait.max.ms": IDLE_FETCH_WAIT_MS,
            # The broker's default minimum: a member that died (or a whole group after a
            # broker restart) is noticed in 6 s, well inside dead_after + a few seconds.
            "session.timeout.ms": 6_000,
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
        **{"enable.partition.eof": True, "fetch.wait.max.ms": END_FETCH_WAIT_MS},
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
        # Our transactions last milliseconds. A short timeout bounds how long the open
        # transaction of a killed process holds back read_committed consumers (the last
        # stable offset) when nobody fences it sooner; message.timeout.ms must stay below it.
        conf["transaction.timeout.ms"] = TRANSACTION_TIMEOUT_MS
        conf["message.timeout.ms"] = TRANSACTION_TIMEOUT_MS // 2
    return conf


# -- consumers --------------------------------------------------------------------------


class ConsumerThread:
    """A confluent-kafka Consumer whose every call runs on one lane, with a deadline."""

    def __init__(self, conf: dict[str, Any], name: str) -> None:
        self.name = name
        self._lane = Lane(f"consumer-{name}")
        self.consumer: Consumer = self._lane.run(Consumer, conf, deadline=CONSUMER_CALL_DEADLINE)
        self._closed = False

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._lane.call(fn, *args, deadline=CONSUMER_CALL_DEADLINE)

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
        """Run on the consumer's lane from a non-event-loop context."""
        return self._lane.run(fn, *args, deadline=CONSUMER_CALL_DEADLINE)

    async def close(self) -> None:
        """Leave the group and close; a close that hangs (no coordinator) is abandoned."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._lane.call(self.consumer.close, deadline=CLOSE_DEADLINE)
        except (KafkaException, RuntimeError, CallTimedOut) as exc:
            log(logger, "consumer_close_failed", logging.WARNING, consumer=self.name, error=str(exc))
        self._lane.close()


def position(msg: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a consumed record (always set on one)."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


def record_time_ms(msg: Message) -> int:
    """The record's Kafka timestamp in epoch ms (now, for a record without one)."""
    kind, ts = msg.timestamp()
    return ts if kind and ts > 0 else time.time_ns() // 1_000_000


# The cluster refused this principal (its authorizer, or the credentials themselves):
# nothing a retry changes. The service stops with the reason, and a supervisor's restarts
# show it, rather than waiting for an ACL forever (docs/deploy.md, per-service principals).
NOT_AUTHORIZED = frozenset({
    KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._AUTHENTICATION})
NOT_AUTHORIZED_HINT = "this principal lacks an ACL: `cronstream kafka-acls` lists what each part needs"


class NotAuthorized(Exception):
    """Kafka refused this principal something it needs (`NOT_AUTHORIZED`)."""


def not_authorized(err: KafkaError | None) -> bool:
    return err is not None and err.code() in NOT_AUTHORIZED


def consumer_error_is_fatal(err: KafkaError) -> bool:
    """Whether the consumer is dead after `err`. A fatal error reaches the application as
    an error event coded _FATAL, without the fatal flag (a static member fenced by another
    with its group.instance.id, after a coordinator moved)."""
    return bool(err.fatal()) or err.code() == KafkaError._FATAL


def log_consumer_error(consumer: str, err: KafkaError) -> None:
    if err.code() == KafkaError._PARTITION_EOF:
        return
    if not_authorized(err):
        log(logger, "kafka_not_authorized", logging.ERROR, consumer=consumer, error=err.str(),
            code=err.name(), hint=NOT_AUTHORIZED_HINT)
        raise NotAuthorized(f"{consumer}: {err.str()} ({err.name()}): {NOT_AUTHORIZED_HINT}")
    fatal = consumer_error_is_fatal(err)
    log(logger, "consumer_error", logging.ERROR if fatal else logging.WARNING, consumer=consumer,
        error=err.str(), code=err.name())
    if fatal:
        raise KafkaException(err)


def kafka_error(exc: KafkaException) -> KafkaError | None:
    return exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None


# What a broker answers while it settles, retried at start by every service (issue 45):
# for a moment after a topic is created (`cronstream init` just before: offsets_for_times
# and the watermarks answered NOT_LEADER in 5 tries of 5 right after ensure_topics), while
# a partition's leader moves, while a coordinator loads its partition after a broker start.
SETTLING = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION,
    KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.FENCED_LEADER_EPOCH, KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR, KafkaError._WAIT_COORD, KafkaError.REQUEST_TIMED_OUT,
    KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN})
# How long a start-up call waits for the broker to settle before the error stands (a
# broker away for longer is an outage: the service's supervisor restarts it).
SETTLE_PATIENCE = 60.0


def settling(exc: BaseException) -> bool:
    """Whether `exc` is what a settling broker answers (retry), not a real failure."""
    err = kafka_error(exc) if isinstance(exc, KafkaException) else None
    return err is not None and not err.fatal() and (bool(err.retriable()) or err.code() in SETTLING)


async def settled(call: Callable[[], Awaitable[T]], what: str, patience: float = SETTLE_PATIENCE) -> T:
    """`await call()`, again with backoff (0.1 s doubling to 2 s) while the broker answers
    a SETTLING error, for up to `patience` seconds; any other error at once."""
    deadline = time.monotonic() + patience
    delay = 0.1
    while True:
        try:
            return await call()
        except KafkaException as exc:
            if not settling(exc) or time.monotonic() > deadline:
                raise
            log(logger, "kafka_settling", what=what, error=str(exc), retry_in_seconds=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


async def _high_watermark(reader: ConsumerThread, tp: TopicPartition) -> int:
    """The partition's end, once the broker has settled."""
    _low, high = await settled(
        lambda: reader.call(reader.consumer.get_watermark_offsets, tp, 10.0, False),
        f"end of {tp.topic}[{tp.partition}]")
    return int(high)


async def offsets_since(reader: ConsumerThread, topic: str, since_ms: int,
                        ) -> tuple[list[TopicPartition], dict[tuple[str, int], int]]:
    """Where to read each partition of `topic` from to see its records since `since_ms`
    (its end, where nothing is that recent), and the end each has now: once the broker
    has settled."""
    metadata = await settled(lambda: reader.call(reader.consumer.list_topics, topic, 10.0),
                             f"partitions of {topic}")
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise RuntimeError(f"topic {topic} does not exist: run `cronstream init`")
    wanted = [TopicPartition(topic, p, since_ms) for p in sorted(found.partitions)]
    starts: list[TopicPartition] = await settled(
        lambda: reader.call(reader.consumer.offsets_for_times, wanted, 10.0), f"offsets of {topic}")
    ends: dict[tuple[str, int], int] = {}
    for tp in starts:
        ends[(tp.topic, tp.partition)] = high = await _high_watermark(reader, tp)
        if tp.offset < 0:
            tp.offset = high
    return starts, ends


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
        ends[(tp.topic, tp.partition)] = await _high_watermark(reader, tp)
    # Every partition is assigned, even an empty one: the caller may keep consuming.
    await reader.call(
        consumer.assign,
        [TopicPartition(t, p, OFFSET_BEGINNING) for (t, p) in ends],
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
            err = kafka_error(exc)
            if err is None or err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    _wait_for_metadata(admin, [s.name for s in missing], timeout)
    return created


def delete_topics(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Delete every topic of the settings' prefix (tests and benchmarks clean up with it)."""
    admin = AdminClient(client_config(settings, "cronstream-admin"))
    names = [n for n in admin.list_topics(timeout=timeout).topics if n.startswith(settings.topic_prefix)]
    if not names or not settings.topic_prefix:
        return []
    for future in admin.delete_topics(names, operation_timeout=timeout).values():
        with contextlib.suppress(KafkaException):
            future.result()
    return names


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
