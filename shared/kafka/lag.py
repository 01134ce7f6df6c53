"""Queue depth: the workers group's lag on every work topic (`work.<priority>.<queue>`).

Records on a work topic that the workers have not taken yet: the log end minus the
group's committed offset (the partition's start when the group never committed, as for
a queue no worker ever served). Blocking calls: run `measure` off the event loop.
"""

from __future__ import annotations

from confluent_kafka import Consumer, TopicPartition

from cronstream.shared.kafka.config import consumer_config
from cronstream.shared.records import PRIORITIES
from cronstream.shared.settings import Settings

TIMEOUT = 10.0


class WorkLag:
    """A group-less reader of the workers group's offsets, kept open between samples."""

    def __init__(self, settings: Settings, client_id: str = "cronstream-work-lag") -> None:
        self.prefix = f"{settings.topics.prefix}work."
        # The workers' group id, to read its committed offsets; it never subscribes, so it
        # never joins the group.
        conf = consumer_config(settings, client_id, f"{settings.topics.prefix}workers")
        conf.pop("stats_cb", None)
        conf["statistics.interval.ms"] = 0
        self._reader = Consumer(conf)

    def measure(self) -> list[tuple[str, str, int]]:
        """(priority, queue, depth) of every work topic."""
        out = []
        for name, topic in self._reader.list_topics(timeout=TIMEOUT).topics.items():
            if not name.startswith(self.prefix):
                continue
            priority, _, queue = name[len(self.prefix):].partition(".")
            if priority not in PRIORITIES or not queue:
                continue
            tps = [TopicPartition(name, p) for p in topic.partitions]
            lag = 0
            for tp in self._reader.committed(tps, timeout=TIMEOUT):
                low, high = self._reader.get_watermark_offsets(
                    TopicPartition(name, tp.partition), TIMEOUT)
                lag += max(0, high - (tp.offset if tp.offset >= 0 else low))
            out.append((priority, queue, lag))
        return out

    def close(self) -> None:
        self._reader.close()
