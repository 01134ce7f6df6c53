"""How every Kafka client of cronstream is configured: the settings' bootstrap servers
and pass-through properties, then what each kind of client needs (a group consumer, a
group-less reader of compacted state, an idempotent or transactional producer)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from cronstream.shared import metrics
from cronstream.shared.settings import Settings
from cronstream.shared.topics import Topics

# librdkafka's logical offset "from the beginning of the partition".
OFFSET_BEGINNING = -2
TRANSACTION_TIMEOUT_MS = 20_000


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
