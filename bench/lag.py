"""The projection's lag as a dashboard user meets it, sampled during a benchmark's window.

A rate PostgreSQL cannot show is not held (issue 54): the executions may keep up while the
projection falls behind, and then the dashboard, the CLI and every SQL panel show less
than happens. Each sample measures, for `execution-events`:

1. **seconds behind the present** (`seconds`): the age of the oldest event not yet in
   PostgreSQL. For each partition, the first record at or past the monitor's stored next
   offset (`consumer_offsets`), its Kafka timestamp (when a service wrote it); now minus
   that, 0 for a partition whose stored offset is at the log's end; the largest over the
   partitions. A dashboard N seconds behind shows every event older than N seconds and
   not one written since: "a run that ended N s ago may not be on the Runs page yet".
   (Not the age of the newest row: a partition that lags hides behind the others there.)
2. **offsets behind** (`offsets`): the log's end (the high watermark the sample's fetch
   returns) minus the stored next offset, summed over the partitions that are behind. The
   commit markers of the transactions in that range are offsets too, one for each
   transaction that wrote to the partition: workers commit a turn every 10-100 ms, so at
   low rates they are a good part of the count. Comparable between runs of one rate, not
   an event count; the seconds are the figure to read.
3. **the newest completion shown** (`newest_completion_age`): now minus the largest
   `completed_at` in `job_executions`, the first row of the Runs page. A cross-check, not
   the rule's figure: it includes the worker's own turn before the event is written.

The cost of a sample, kept small because the machine it measures is the machine it runs
on: one query on a held PostgreSQL connection (one row, an index's first entry for the
newest completion), and one fetch of at most a record batch per partition from a held,
group-less consumer, unassigned again at once so that it fetches nothing in between.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from types import TracebackType
from typing import Any

import asyncpg
from confluent_kafka import Consumer, KafkaError, TopicPartition

from bench.harness import percentile
from cronstream.shared.kafka.config import OFFSET_BEGINNING, reader_config
from cronstream.shared.settings import Settings

# How far apart the samples of a window are (seconds): a 30 s window gets ~30, enough for
# a p50 and a maximum; a sample costs a few milliseconds of CPU (reported per run).
SAMPLE_EVERY_SECONDS = 1.0
# A sample whose fetch does not reach every partition within this is dropped (and counted).
SAMPLE_TIMEOUT_SECONDS = 5.0

_OFFSETS = """
    SELECT coalesce(array_agg(partition), '{}') AS partitions,
           coalesce(array_agg(next_offset), '{}') AS offsets,
           (SELECT max(completed_at) FROM job_executions) AS newest
    FROM consumer_offsets WHERE topic = $1"""


@dataclass(frozen=True)
class LagSample:
    at: float  # time.time() of the sample
    seconds: float  # the age of the oldest event not yet projected (0: none)
    offsets: int  # offsets of the log past the monitor's stored ones (markers included)
    newest_completion_age: float | None  # now minus the newest completed_at (None: none yet)


@dataclass(frozen=True)
class Unprojected:
    """What one partition holds past the projection: where the projection stands, the log's
    end, and the timestamp (ms) of its first record not projected (None: at the end)."""

    next_offset: int
    end: int
    first_timestamp_ms: int | None


def lag_of(partitions: dict[int, Unprojected], now: float,
           newest_completion: datetime | None) -> LagSample:
    """One sample from what each partition holds past the projection (pure).

    E.g. partition 0 stored up to 1,000 with its first unprojected record written 2.5 s
    ago and the log's end at 4,000; partition 1 at its end: 2.5 s and 3,000 offsets."""
    seconds, offsets = 0.0, 0
    for p in partitions.values():
        if p.first_timestamp_ms is None:
            continue
        seconds = max(seconds, now - p.first_timestamp_ms / 1000)
        offsets += max(0, p.end - p.next_offset)
    age = None if newest_completion is None else max(0.0, now - newest_completion.timestamp())
    return LagSample(at=now, seconds=round(seconds, 3), offsets=offsets,
                     newest_completion_age=None if age is None else round(age, 3))


def summarise(samples: Sequence[LagSample], missed: int = 0) -> dict[str, Any]:
    """p50, maximum and last of a window's samples (pure): the figures beside every cell.
    `at_end` is the last sample, taken as the window closes."""
    def figures(values: list[float]) -> dict[str, float | None]:
        if not values:
            return {"p50": None, "max": None, "at_end": None}
        return {"p50": round(percentile(values, 50), 3), "max": round(max(values), 3),
                "at_end": round(values[-1], 3)}

    ages = [s.newest_completion_age for s in samples if s.newest_completion_age is not None]
    return {"samples": len(samples), "missed": missed, "every_seconds": SAMPLE_EVERY_SECONDS,
            "seconds": figures([s.seconds for s in samples]),
            "offsets": figures([float(s.offsets) for s in samples]),
            "newest_completion_age_seconds": figures(ages)}


class LagSampler:
    """Samples the projection's lag of one system (its own PostgreSQL connection and Kafka
    consumer, held across samples); `close` when done."""

    def __init__(self, settings: Settings) -> None:
        self.topic = settings.topics.execution_events
        self.samples: list[LagSample] = []
        self.missed = 0
        self.cpu_seconds = 0.0
        self.wall_seconds: list[float] = []
        self._loop = asyncio.new_event_loop()
        self._conn: asyncpg.Connection = self._loop.run_until_complete(
            asyncpg.connect(settings.database_url))
        # At most one record batch a partition, and nothing queued ahead: the fetch is
        # for one timestamp, and the consumer is unassigned right after it. Without a zero
        # fetch.queue.backoff.ms, a partition whose queue passed queued.min.messages waits
        # a second (librdkafka's default) before its next fetch: under load every sample
        # took a second, as long as the period.
        self._consumer = Consumer({**reader_config(settings, "bench-lag"),
                                   "max.partition.fetch.bytes": 16_384,
                                   "queued.min.messages": 1, "fetch.queue.backoff.ms": 0})
        metadata = self._consumer.list_topics(self.topic, timeout=10).topics[self.topic]
        self._partitions = sorted(metadata.partitions)

    def sample(self) -> LagSample | None:
        """One sample, kept in `samples` (None, counted in `missed`, if the log did not
        answer within SAMPLE_TIMEOUT_SECONDS)."""
        cpu, wall = time.process_time(), time.monotonic()
        try:
            row = self._loop.run_until_complete(self._conn.fetchrow(_OFFSETS, self.topic))
            assert row is not None  # an aggregate always answers one row
            now = time.time()
            stored = dict(zip(row["partitions"], row["offsets"], strict=True))
            found = self._unprojected(stored)
            if found is None:
                self.missed += 1
                return None
            taken = lag_of(found, now, row["newest"])
            self.samples.append(taken)
            return taken
        finally:
            self.cpu_seconds += time.process_time() - cpu
            self.wall_seconds.append(time.monotonic() - wall)

    def _unprojected(self, stored: dict[int, int]) -> dict[int, Unprojected] | None:
        """Each partition's first record at or past its stored offset, or its end."""
        starts = {p: stored.get(p, OFFSET_BEGINNING) for p in self._partitions}
        self._consumer.assign([TopicPartition(self.topic, p, o) for p, o in starts.items()])
        first: dict[int, int | None] = {}
        deadline = time.monotonic() + SAMPLE_TIMEOUT_SECONDS
        try:
            while len(first) < len(starts) and time.monotonic() < deadline:
                for msg in self._consumer.consume(len(starts), 0.05):
                    p, err = msg.partition() or 0, msg.error()
                    if p in first:
                        continue
                    if err is not None and err.code() == KafkaError._PARTITION_EOF:
                        first[p] = None
                    elif err is None:
                        first[p] = msg.timestamp()[1]
            if len(first) < len(starts):
                return None
            ends = {p: self._consumer.get_watermark_offsets(
                        TopicPartition(self.topic, p), cached=True)[1] for p in starts}
        finally:
            self._consumer.unassign()
        return {p: Unprojected(next_offset=max(0, starts[p]), end=ends[p], first_timestamp_ms=ts)
                for p, ts in first.items()}

    def sample_until(self, deadline: float, every: float = SAMPLE_EVERY_SECONDS) -> None:
        """Sample every `every` seconds until `deadline` (time.monotonic()), and once as
        it passes: the window's last sample is its end."""
        while True:
            began = time.monotonic()
            if began >= deadline:
                break
            self.sample()
            time.sleep(max(0.0, min(every - (time.monotonic() - began), deadline - time.monotonic())))
        self.sample()

    def summary(self) -> dict[str, Any]:
        """The window's figures (`summarise`) and what sampling cost: this process's CPU
        per sample and how long a sample took (each also costs the broker one fetch and
        PostgreSQL one query)."""
        return {**summarise(self.samples, self.missed),
                "sampler_cpu_ms_per_sample": round(
                    1000 * self.cpu_seconds / max(1, len(self.wall_seconds)), 2),
                "sample_ms": {"p50": round(1000 * percentile(self.wall_seconds, 50), 1),
                              "max": round(1000 * max(self.wall_seconds, default=float("nan")), 1)}}

    def reset(self) -> None:
        self.samples, self.missed, self.cpu_seconds, self.wall_seconds = [], 0, 0.0, []

    def close(self) -> None:
        self._consumer.close()
        self._loop.run_until_complete(self._conn.close())
        self._loop.close()

    def __enter__(self) -> LagSampler:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def as_rows(samples: Sequence[LagSample], since: float) -> list[dict[str, Any]]:
    """The samples with their time since `since` (for the JSON: the lag's course)."""
    return [{**asdict(s), "at": round(s.at - since, 2)} for s in samples]
