"""How a service makes its Kafka clients: injected into every service (`kafka=`), so that
a test runs the service's loop on the in-memory bus of tests/unit/bus.py (fakes of these
interfaces, never of Kafka) instead of writing the service's private fields."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cronstream.shared.kafka.admin import (
    ensure_topics,
    group_members,
    latest_offsets,
    partition_counts,
    topic_names,
)
from cronstream.shared.kafka.consumer import ConsumerThread
from cronstream.shared.producers import IdempotentProducer, TransactionalProducer
from cronstream.shared.settings import Settings
from cronstream.shared.topics import Topics, TopicSpec


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
    partition_counts: Callable[[Settings, list[str]], dict[str, int]] = partition_counts


REAL = KafkaClients()


async def resolved_topics(settings: Settings, kafka: KafkaClients = REAL) -> Topics:
    """The settings' topics with the shard count the clock's topics really have (a
    deployment keeps the count it was made with: `init` never changes it)."""
    topics = settings.topics
    found = await asyncio.get_running_loop().run_in_executor(
        None, kafka.partition_counts, settings, [topics.job_definitions])
    shards = found.get(topics.job_definitions)
    return topics if shards is None else dataclasses.replace(topics, shards=shards)
