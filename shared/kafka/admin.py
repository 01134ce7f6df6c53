"""Topics: created idempotently (`cronstream init`, services at start), listed, their
partitions' ends asked of their leaders, deleted by prefix (tests and benchmarks).
Blocking calls: services run them in an executor."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec  # type: ignore[attr-defined]

from cronstream.shared.kafka.config import client_config
from cronstream.shared.kafka.errors import kafka_error
from cronstream.shared.settings import Settings
from cronstream.shared.topics import TopicSpec

# A request to a group's coordinator that times out in librdkafka while the coordinator
# is away aborts the process when the coordinator comes back: the timed-out request's
# coordinator lookup goes on, finds the request gone, fails, and its failure releases a
# reference never taken (`rd_kafka_enq_once_del_source_return: Assertion
# eonce->refcnt > 0`; rdkafka_admin.c rd_kafka_admin_coord_request returns _DESTROY,
# rdkafka_coord.c then calls rd_kafka_coord_req_fail). A scheduler asking its group's
# members through a broker restart died so in one chaos run in three. So such a request
# is given far more time than any outage, and a caller that stops waiting keeps its
# client (with the request) until the request ends; the next call uses a new client,
# which a broker that came back answers (a request sent while it was away may never be).
COORDINATOR_REQUEST_TIMEOUT = 3600.0
_PENDING: list[tuple[AdminClient, Future[Any]]] = []
_PENDING_LOCK = threading.Lock()


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
    admin = AdminClient(client_config(settings, "cronstream-admin"))
    return sorted(admin.list_topics(timeout=timeout).topics)


def latest_offsets(settings: Settings, topic: str, timeout: float = 10.0) -> list[int]:
    """The high watermark of each partition of `topic` (index = partition), asked of the
    partition leaders now: not the last stable offset, which another producer's open
    transaction holds back."""
    admin = AdminClient(client_config(settings, "cronstream-admin"))
    partitions = sorted(admin.list_topics(topic, timeout).topics[topic].partitions)
    futures = admin.list_offsets(
        {TopicPartition(topic, p): OffsetSpec.latest()  # type: ignore[no-untyped-call]
         for p in partitions},
        isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=timeout)
    ends = {tp.partition: future.result(timeout + 5).offset for tp, future in futures.items()}
    return [ends[p] for p in partitions]


def group_members(settings: Settings, group: str, timeout: float = 10.0) -> list[str]:
    """The client ids of a consumer group's live members (none while it is empty).

    Waits `timeout` seconds, then raises a retriable _TIMED_OUT (COORDINATOR_REQUEST_TIMEOUT:
    why the request itself is not timed out)."""
    with _PENDING_LOCK:
        _PENDING[:] = [(client, asked) for client, asked in _PENDING if not asked.done()]
    admin = AdminClient(client_config(settings, "cronstream-admin"))
    asked = admin.describe_consumer_groups([group], request_timeout=COORDINATOR_REQUEST_TIMEOUT)[group]
    try:
        described = asked.result(timeout)
    except FutureTimeout:
        with _PENDING_LOCK:
            _PENDING.append((admin, asked))
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"the members of {group}: no answer in "
                                        f"{timeout:g}s", retriable=True)) from None
    return sorted(m.client_id for m in described.members)


def partition_counts(settings: Settings, topics: list[str], timeout: float = 10.0) -> dict[str, int]:
    """How many partitions each of `topics` that exists has."""
    admin = AdminClient(client_config(settings, "cronstream-admin"))
    found = admin.list_topics(timeout=timeout).topics
    return {t: len(found[t].partitions) for t in topics if t in found and found[t].error is None}
