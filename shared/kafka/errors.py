"""What Kafka's errors mean to a service: refused (stop with the reason), fatal (the client
is dead), settling (a broker that starts or moves a leader: retry at start), or passing."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException

from cronstream.shared.logs import log

logger = logging.getLogger(__name__)

T = TypeVar("T")


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
