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
  worker killed mid-run can be held to keeping the lines it had shipped (issue 46).
Every job is FIRE_ALL: fires found late after an outage are all fired, so the window's
fires are exactly its grid points, whatever the fault did to the scheduler.

Sizing (2 shared cores, everything on one machine): 14 + 3 + 1 + 1 = 19 fires/s by default,
about 10 executions in the pool at any time over two workers of 32 slots, so that a
surviving worker can take a dead one's share without queueing (harness.WORKER_CONCURRENCY). Override with
CRONSTREAM_CHAOS_NOOP_JOBS / _SLEEP_JOBS / _LONG_JOBS / _PRINT_JOBS.
"""

from __future__ import annotations

import json
import os
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

    @classmethod
    def from_env(cls) -> LoadShape:
        return cls(noop_jobs=_env_int("CRONSTREAM_CHAOS_NOOP_JOBS", cls.noop_jobs),
                   sleep_jobs=_env_int("CRONSTREAM_CHAOS_SLEEP_JOBS", cls.sleep_jobs),
                   long_jobs=_env_int("CRONSTREAM_CHAOS_LONG_JOBS", cls.long_jobs),
                   print_jobs=_env_int("CRONSTREAM_CHAOS_PRINT_JOBS", cls.print_jobs))

    @property
    def fires_per_second(self) -> int:
        return self.noop_jobs + self.sleep_jobs + self.long_jobs + self.print_jobs

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
