"""The steady load a chaos test runs under, and the fires it must produce.

Interval jobs, every one firing each second over a bounded window [start_at, end_at], so
that the set of fires is known in advance, computed by the scheduler's own firing code
(`shared/schedule.py`), and their execution ids by `shared/ids.py`:
- `noop` jobs: cheap, inline executions (most of the load);
- `sleep` jobs of `sleep_seconds`: executions in the handler pool, RUNNING when a
  worker dies;
- `long` sleep jobs, longer than the workers' drain grace: a drain re-queues them;
- `print` jobs (`test.print-lines`, registered with `--import tests.e2e.handlers_for_tests`):
  eight lines a quarter of a second apart, each with the time it was printed, so that a
  worker killed mid-run can be held to keeping the lines it had shipped (issue 46);
- flow control (issue 57): `pooled` sleep jobs sharing the pool `POOL` of `pool_slots`
  slots, and a `keyed` noop job serialised by its concurrency key (`max_running: 1`). An
  outage leaves them a backlog that only their limits let through, so the ledger can hold
  the limits to never more running than allowed and the pool to no slot leaked. Their
  backlog is the limit at work, not a slow recovery: the recovery figures leave them out
  (`recovery_job_ids`);
- an event trigger (issue 56): `EVENT_JOB` runs with the records a writer streams to a
  source topic through the window (`event_rate` a second, half of them passing its
  filter, `event_batch` to a run), so that the ledger can hold every matching record to
  exactly one run, whatever the fault did to the scheduler, the broker or the writer.
Every job is FIRE_ALL: fires found late after an outage are all fired, so the window's
fires are exactly its grid points, whatever the fault did to the scheduler.

Sizing (2 shared cores, everything on one machine): 14 + 3 + 1 + 1 + 1.5 + 1 = 21.5 fires/s by default,
about 10 executions in the pool at any time over two workers of 32 slots, so that a
surviving worker can take a dead one's share without queueing (harness.WORKER_CONCURRENCY). Override with
CRONSTREAM_CHAOS_NOOP_JOBS / _SLEEP_JOBS / _LONG_JOBS / _PRINT_JOBS / _POOLED_JOBS / _KEYED_JOBS.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from confluent_kafka import Producer

from cronstream.shared.ids import execution_id
from cronstream.shared.records import JobDefinition
from cronstream.shared.schedule import upcoming
from cronstream.shared.settings import Settings

_MS = timedelta(milliseconds=1)
PRINT_HANDLER = "test.print-lines"
HANDLER_MODULE = "tests.e2e.handlers_for_tests"  # the workers import it (harness.start_system)
POOL = "chaos-pool"
EVENT_JOB = "event-00"


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


@dataclass(frozen=True)
class LoadShape:
    noop_jobs: int = 14
    sleep_jobs: int = 3
    sleep_seconds: float = 2.0
    long_jobs: int = 1
    long_seconds: float = 4.0
    print_jobs: int = 1
    print_lines: int = 8
    print_every: float = 0.25
    # Three jobs firing every 2 s share two slots: a third of the pool busy in steady
    # state (a run costs its sleep plus an admission's round trip), so an outage's backlog
    # queues on the limit and drains in seconds, not minutes.
    pooled_jobs: int = 3
    pooled_every: int = 2
    pooled_seconds: float = 0.1
    pool_slots: int = 2
    keyed_jobs: int = 1
    event_rate: int = 10
    event_batch: int = 5

    @classmethod
    def from_env(cls) -> LoadShape:
        return cls(noop_jobs=_env_int("CRONSTREAM_CHAOS_NOOP_JOBS", cls.noop_jobs),
                   sleep_jobs=_env_int("CRONSTREAM_CHAOS_SLEEP_JOBS", cls.sleep_jobs),
                   long_jobs=_env_int("CRONSTREAM_CHAOS_LONG_JOBS", cls.long_jobs),
                   print_jobs=_env_int("CRONSTREAM_CHAOS_PRINT_JOBS", cls.print_jobs),
                   pooled_jobs=_env_int("CRONSTREAM_CHAOS_POOLED_JOBS", cls.pooled_jobs),
                   keyed_jobs=_env_int("CRONSTREAM_CHAOS_KEYED_JOBS", cls.keyed_jobs),
                   event_rate=_env_int("CRONSTREAM_CHAOS_EVENT_RATE", cls.event_rate))

    def event_definition(self, topic: str) -> dict[str, Any]:
        """The EVENT job: the source's records whose value keeps, `event_batch` to a run,
        from the topic's start (it is new: nothing is written before the window)."""
        return {"job_id": EVENT_JOB, "type": "EVENT", "handler": "noop",
                "event": {"topic": topic, "filter": "value.keep == true", "start": "earliest",
                          "batch": {"max_events": self.event_batch, "max_wait_seconds": 1}}}

    @property
    def fires_per_second(self) -> float:
        return (self.noop_jobs + self.sleep_jobs + self.long_jobs + self.print_jobs
                + self.pooled_jobs / self.pooled_every + self.keyed_jobs)

    def recovery_job_ids(self, job_ids: list[str]) -> list[str]:
        """The jobs whose first fires after a fault measure recovery: not those a limit
        holds back (a pool's backlog drains at the pool's pace, as its users asked)."""
        limited = set(self.pooled) | set(self.keyed)
        return [j for j in job_ids if j not in limited]

    @property
    def pooled(self) -> list[str]:
        return [f"pooled-{i:02d}" for i in range(self.pooled_jobs)]

    @property
    def keyed(self) -> list[str]:
        return [f"keyed-{i:02d}" for i in range(self.keyed_jobs)]

    def definitions(self, start: datetime, end: datetime) -> list[dict[str, Any]]:
        window = {"type": "INTERVAL", "interval_seconds": 1, "start_at": start.isoformat(),
                  "end_at": end.isoformat(), "misfire_policy": "FIRE_ALL", "timeout_seconds": 120}
        jobs: list[dict[str, Any]] = []
        jobs += [{"job_id": f"noop-{i:02d}", "handler": "noop", "params": {"i": i}, **window}
                 for i in range(self.noop_jobs)]
        jobs += [{"job_id": f"sleep-{i:02d}", "handler": "sleep",
                  "params": {"seconds": self.sleep_seconds}, **window}
                 for i in range(self.sleep_jobs)]
        jobs += [{"job_id": f"long-{i:02d}", "handler": "sleep",
                  "params": {"seconds": self.long_seconds}, **window}
                 for i in range(self.long_jobs)]
        jobs += [{"job_id": f"print-{i:02d}", "handler": PRINT_HANDLER,
                  "params": {"lines": self.print_lines, "every": self.print_every}, **window}
                 for i in range(self.print_jobs)]
        jobs += [{"job_id": job_id, "handler": "sleep", "params": {"seconds": self.pooled_seconds},
                  "pool": POOL, **window, "interval_seconds": self.pooled_every} for job_id in self.pooled]
        jobs += [{"job_id": job_id, "handler": "noop", "params": {"tenant": job_id},
                  "concurrency": {"key": "params.tenant", "max_running": 1}, **window}
                 for job_id in self.keyed]
        return jobs


@dataclass(frozen=True)
class Fire:
    job_id: str
    scheduled_at: datetime


def expected_fires(definitions: list[dict[str, Any]]) -> dict[UUID, Fire]:
    """Every first-attempt execution the window must produce, by execution id."""
    fires: dict[UUID, Fire] = {}
    for raw in definitions:
        definition = JobDefinition.model_validate_json(json.dumps(raw))
        assert definition.start_at is not None and definition.end_at is not None
        for at in upcoming(definition, definition.start_at - _MS, 100_000):
            fires[execution_id(definition.job_id, at, 1)] = Fire(definition.job_id, at)
    return fires


def publish(settings: Settings, definitions: list[dict[str, Any]]) -> None:
    """Publish the definitions as any Kafka client would (keyed by job_id)."""
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                         "enable.idempotence": True, "partitioner": "murmur2_random"})
    for definition in definitions:
        producer.produce(settings.topics.job_definitions, json.dumps(definition).encode(),
                         definition["job_id"].encode())
    assert producer.flush(30) == 0, "the load's definitions were not all delivered"


class EventStream:
    """Writes the event trigger's source through a window: record n = {"n": n, "keep": n
    is even}, `rate` a second, idempotent (a broker outage is waited out by the producer,
    never written twice). What was written is what the broker acknowledged: `delivered`,
    (partition, offset, n), from the delivery reports."""

    def __init__(self, settings: Settings, topic: str, rate: int) -> None:
        self.topic = topic
        self.rate = rate
        self.delivered: list[tuple[int, int, int]] = []
        self.failed: list[str] = []
        self._producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                                   "enable.idempotence": True, "linger.ms": 5,
                                   "message.timeout.ms": 300_000})
        self._thread: threading.Thread | None = None

    def _report(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed.append(str(err))
        else:
            self.delivered.append((msg.partition(), msg.offset(), json.loads(msg.value())["n"]))

    def start(self, start: datetime, end: datetime) -> None:
        def write() -> None:
            n = 0
            while True:
                due = start + timedelta(seconds=n / self.rate)
                if due > end:
                    break
                wait = (due - datetime.now(due.tzinfo)).total_seconds()
                if wait > 0:
                    time.sleep(wait)  # the stream's pace, not a synchronisation
                self._producer.produce(self.topic, json.dumps({"n": n, "keep": n % 2 == 0}).encode(),
                                       f"k{n % 7}".encode(), on_delivery=self._report)
                self._producer.poll(0)
                n += 1

        self._thread = threading.Thread(target=write, name="chaos-event-stream", daemon=True)
        self._thread.start()

    def finish(self, timeout: float = 120.0) -> None:
        """Wait for the writer and every delivery report."""
        if self._thread is not None:
            self._thread.join(timeout)
        remaining = self._producer.flush(timeout)
        if remaining:
            self.failed.append(f"{remaining} records not acknowledged after {timeout:.0f}s")

    @property
    def matching(self) -> set[tuple[int, int]]:
        """(partition, offset) of every acknowledged record the filter passes."""
        return {(p, o) for p, o, n in self.delivered if n % 2 == 0}
