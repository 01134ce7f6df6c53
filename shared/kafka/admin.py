"""Topics: created idempotently (`cronstream init`, services at start), listed, their
partitions' ends asked of their leaders, deleted by prefix (tests and benchmarks).
Blocking calls: services run them in an executor."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec  # type: ignore[attr-defined]

from cronstream.shared.kafka.config import client_config
from cronstream.shared.kafka.errors import kafka_error
from cronstream.shared.settings import Settings
from cronstream.shared.topics import TopicSpec

_KEPT: dict[tuple[tuple[str, str], ...], AdminClient] = {}
_KEPT_LOCK = threading.Lock()


def _kept(settings: Settings) -> AdminClient:
    """One admin client per cluster for the calls a service repeats while it runs, kept
    for the life of the process. A client dropped with a request still waiting for a
    broker aborts the process in librdkafka when the request's wait ends
    (`rd_kafka_enq_once_del_source_return: Assertion eonce->refcnt > 0`: a scheduler
    asking its group's members through a broker restart, one chaos run in three)."""
    conf = client_config(settings, "cronstream-admin")
    key = tuple(sorted((k, str(v)) for k, v in conf.items()))
    with _KEPT_LOCK:
        admin = _KEPT.get(key)
        if admin is None:
            admin = _KEPT[key] = AdminClient(conf)
        return admin


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


def topic_names(settings: Settings, timeout: float = 10.0) -> list[str]:
    """Every topic the cluster holds."""
    admin = _kept(settings)
    return sorted(admin.list_topics(timeout=timeout).topics)


def latest_offsets(settings: Settings, topic: str, timeout: float = 10.0) -> list[int]:
    """The high watermark of each partition of `topic` (index = partition), asked of the
    partition leaders now: not the last stable offset, which another producer's open
    transaction holds back."""
    admin = _kept(settings)
    partitions = sorted(admin.list_topics(topic, timeout).topics[topic].partitions)
    futures = admin.list_offsets(
        {TopicPartition(topic, p): OffsetSpec.latest()  # type: ignore[no-untyped-call]
         for p in partitions},
        isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=timeout)
    ends = {tp.partition: future.result(timeout + 5).offset for tp, future in futures.items()}
    return [ends[p] for p in partitions]


def group_members(settings: Settings, group: str, timeout: float = 10.0) -> list[str]:
    """The client ids of a consumer group's live members (none while it is empty)."""
    admin = _kept(settings)
    described = admin.describe_consumer_groups([group], request_timeout=timeout)[group].result(timeout + 5)
    return sorted(m.client_id for m in described.members)


def partition_counts(settings: Settings, topics: list[str], timeout: float = 10.0) -> dict[str, int]:
    """How many partitions each of `topics` that exists has."""
    admin = AdminClient(client_config(settings, "cronstream-admin"))
    found = admin.list_topics(timeout=timeout).topics
    return {t: len(found[t].partitions) for t in topics if t in found and found[t].error is None}
