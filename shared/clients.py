"""How a service makes its Kafka clients: injected into every service (`kafka=`), so that
a test runs the service's loop on the in-memory bus of tests/unit/bus.py (fakes of these
interfaces, never of Kafka) instead of writing the service's private fields."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cronstream.shared.kafka.admin import ensure_topics, group_members, latest_offsets, topic_names
from cronstream.shared.kafka.consumer import ConsumerThread
from cronstream.shared.producers import IdempotentProducer, TransactionalProducer
from cronstream.shared.settings import Settings
from cronstream.shared.topics import TopicSpec


@dataclass(frozen=True)
class KafkaClients:
    consumer: Callable[[dict[str, Any], str], ConsumerThread] = ConsumerThread
    transactional: Callable[[dict[str, Any]], TransactionalProducer] = TransactionalProducer
    idempotent: Callable[[dict[str, Any]], IdempotentProducer] = IdempotentProducer
    ensure_topics: Callable[[Settings, Sequence[TopicSpec]], Any] = ensure_topics
    # Blocking admin calls (services run them in an executor).
    topic_names: Callable[[Settings], list[str]] = topic_names
    latest_offsets: Callable[[Settings, str], list[int]] = latest_offsets
    group_members: Callable[[Settings, str], list[str]] = group_members


REAL = KafkaClients()
