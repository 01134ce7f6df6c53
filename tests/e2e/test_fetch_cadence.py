"""How often our consumers ask the broker when nothing comes (docs/decisions/0026): every
request costs the broker about 0.3 ms of CPU, and a tailing consumer waits for its
upstream's next commit most of the time. It must idle on few fetches and still read what
is committed; a reader that loads state must still learn the end of its partitions
promptly (it is only told when an empty fetch returns)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from cronstream.shared.kafka.config import OFFSET_BEGINNING, consumer_config, producer_config, reader_config
from cronstream.shared.producers import OutRecord, TransactionalProducer
from cronstream.shared.settings import Settings

IDLE_SECONDS = 4.0


class FetchCount:
    """The broker's Fetch requests of one consumer, from librdkafka's statistics."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fetches = 0

    def __call__(self, stats: str) -> None:
        brokers = json.loads(stats).get("brokers", {})
        total = sum(b.get("req", {}).get("Fetch", 0) for name, b in brokers.items()
                    if not name.startswith("GroupCoordinator"))
        with self.lock:
            self.fetches = total


def _poll_until(consumer: Consumer, condition: Callable[[], bool], seconds: float,
                into: list[Any] | None = None) -> None:
    """Poll `consumer` until `condition` holds or `seconds` pass; its records (not errors
    such as an end of partition) go `into` the list."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        records = consumer.consume(100, 0.1)
        if into is not None:
            into.extend(m for m in records if m.error() is None)


def _idle_fetches(conf: dict[str, Any], topic: str) -> int:
    """Fetch requests a consumer with `conf`, assigned `topic` and caught up, sends while
    nothing arrives for IDLE_SECONDS."""
    count = FetchCount()
    consumer = Consumer({**conf, "statistics.interval.ms": 200, "stats_cb": count})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        # Caught up: the first fetch has come back (it waits out the idle wait at most).
        _poll_until(consumer, lambda: count.fetches > 0, 10.0)
        with count.lock:
            before = count.fetches
        started = time.monotonic()
        _poll_until(consumer, lambda: time.monotonic() - started >= IDLE_SECONDS, IDLE_SECONDS + 1)
        _poll_until(consumer, lambda: False, 0.5)  # one more statistics report
        with count.lock:
            return count.fetches - before
    finally:
        consumer.close()


def test_tailing_consumers_idle_on_few_fetches_and_loaders_keep_prompt_ends(
        topics: Settings) -> None:
    topic = topics.topics.commands
    tail = _idle_fetches(consumer_config(topics, "cadence-tail", f"{topics.topic_prefix}c"), topic)
    loader = _idle_fetches(reader_config(topics, "cadence-loader"), topic)
    # An empty fetch waits 250 ms: ~16 in 4 s (at the old 50 ms: ~80). A loader's waits
    # 50 ms, since the end of a partition is only told when one returns.
    assert tail <= 24, f"{tail} fetches while idle for {IDLE_SECONDS} s"
    assert loader >= 2 * tail, (tail, loader)


def test_a_commit_reaches_a_consumer_whose_fetch_is_waiting(topics: Settings) -> None:
    topic = topics.topics.commands
    consumer = Consumer({**consumer_config(topics, "cadence-read", f"{topics.topic_prefix}c"),
                         "stats_cb": lambda stats: None})
    producer = TransactionalProducer(producer_config(topics, "cadence-p", "cadence-p"))

    async def commit() -> None:
        await producer.init()
        await producer.commit([OutRecord(topic, b"k", b"v", partition=0)])
        await producer.close()

    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        _poll_until(consumer, lambda: False, 1.0)  # caught up: an empty fetch waits
        asyncio.run(commit())
        read: list[Any] = []
        _poll_until(consumer, lambda: bool(read), 10.0, into=read)
        assert [m.value() for m in read] == [b"v"]
    finally:
        consumer.close()
