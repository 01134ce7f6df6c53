"""Per-execution Python costs of each service's hot path, no servers needed.

    python -m bench.hot_path

What every execution costs in each service before Kafka and PostgreSQL do anything:
decoding the records it consumes, building the records it produces, its metrics. Each
figure is the best of ROUNDS passes over COUNT items, in microseconds per item, on a quiet
machine; under the end-to-end benchmark (two cores shared by every service, the broker
and the database) the same code costs about three times as much, so a microsecond here is
worth about three per execution there (bench.e2e_throughput's CPU per execution).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from bench.harness import run_benches
from cronstream.handlers import REGISTRY
from cronstream.services.worker import builtins  # noqa: F401  (registers noop)
from cronstream.services.worker.executions import Finished, Reporter, Running, count_finished, count_started
from cronstream.services.worker.pool import PoolRunner
from cronstream.services.worker.runner import Outcome
from cronstream.shared import telemetry
from cronstream.shared.codec import decode
from cronstream.shared.fast_records import decode_due, decode_event
from cronstream.shared.records import ExecutionEvent, JobDefinition, JobDue, JobSnapshot, now_utc
from cronstream.shared.schedule import StoredTiming, next_fire
from cronstream.shared.settings import Settings

COUNT = 3000
ROUNDS = 7
KEY = b"bench-000123"
TRACEPARENT = [("traceparent", b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01")]


def _us(fn: Callable[[], Any], count: int = COUNT) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return round(best / count * 1e6, 2)


def _due() -> JobDue:
    return JobDue(execution_id=uuid.uuid4(), job_id="bench-000123", run_id=uuid.uuid4(),
                  scheduled_at=now_utc(), reason="SCHEDULE", idempotency_key="k-123",
                  job=JobSnapshot(handler="noop"))


def _events(status: str) -> list[bytes]:
    now = datetime.now(UTC)
    more: dict[str, Any] = {
        "QUEUED": {"priority": "normal", "queue": "default", "reason": "SCHEDULE",
                   "job": JobSnapshot(handler="noop")},
        "RUNNING": {"worker_id": "bench-w0", "started_at": now},
        "COMPLETED": {"worker_id": "bench-w0", "started_at": now, "completed_at": now,
                      "progress": 100.0, "priority": "normal", "queue": "default"},
    }[status]
    return [ExecutionEvent(event_id=uuid.uuid4(), execution_id=uuid.uuid4(), job_id="bench-000123",
                           run_id=uuid.uuid4(), status=status, attempt_number=1,  # type: ignore[arg-type]
                           scheduled_at=now, occurred_at=now, **more).to_json()
            for _ in range(COUNT)]


def _no_progress(percent: float, message: str | None) -> None:
    pass


def per_execution() -> dict[str, Any]:
    topics = Settings(topic_prefix="bench.").topics
    runner = PoolRunner(REGISTRY, 1, [])
    reporter = Reporter(topics, "bench-w0")
    dues = [_due() for _ in range(COUNT)]
    raw_dues = [d.to_json() for d in dues]
    runs = [Running(d, telemetry.Hop("cronstream.run", TRACEPARENT), now_utc()) for d in dues]
    done = Outcome(status="COMPLETED", result=None, error=None)
    finished = [Finished(r, done, now_utc(), status="COMPLETED") for r in runs]
    interval = JobDefinition.from_dict({"job_id": "bench-000123", "type": "INTERVAL",
                                        "interval_seconds": 1, "handler": "noop",
                                        "start_at": "2026-01-01T00:00:00.123Z"})
    stored = StoredTiming(interval.type, interval.schedule, interval.interval_seconds,
                          interval.run_at, interval.timezone, interval.start_at, interval.end_at)
    definition_json = interval.model_dump_json()
    now = now_utc()
    queued, running, completed = _events("QUEUED"), _events("RUNNING"), _events("COMPLETED")
    return {
        "unit": "microseconds per item (best of 7 passes over 3,000)",
        # One record at a time, as the monitor decodes them (services/monitor/decoding.py:
        # the fast decoder, decision 0018), and through the model as before it.
        "monitor_decode_queued": _us(lambda: [decode_event(v, KEY) for v in queued]),
        "monitor_decode_running": _us(lambda: [decode_event(v, KEY) for v in running]),
        "monitor_decode_completed": _us(lambda: [decode_event(v, KEY) for v in completed]),
        "model_decode_queued": _us(lambda: [decode(ExecutionEvent, v) for v in queued]),
        "model_decode_running": _us(lambda: [decode(ExecutionEvent, v) for v in running]),
        "model_decode_completed": _us(lambda: [decode(ExecutionEvent, v) for v in completed]),
        # A JobDue, as the dispatcher and the workers decode it (decode_due, decision 0018),
        # and through the model as before it.
        "decode_job_due": _us(lambda: [decode_due(v, b"bench-000123") for v in raw_dues]),
        "model_decode_job_due": _us(lambda: [decode(JobDue, v, key=b"bench-000123", key_field="job_id")
                                              for v in raw_dues]),
        "worker_running_record": _us(lambda: [reporter.running(r) for r in runs]),
        # A no-op's whole run since the inline path runs where the start commits.
        "worker_inline_run": _us(lambda: [runner.run_now(r.due, _no_progress, None) for r in runs]),
        "worker_completed_record": _us(lambda: [reporter.finished(Finished(f.running, done, f.completed_at))
                                                for f in finished]),
        "worker_metrics": _us(lambda: [(count_started(f.running), count_finished(f)) for f in finished]),
        "scheduler_fire_headers": _us(lambda: [telemetry.headers_of(telemetry.root("cronstream.fire"))
                                               for _ in range(COUNT)]),
        "monitor_next_run_from_columns": _us(lambda: [next_fire(stored, now) for _ in range(COUNT)]),
        "monitor_next_run_from_definition": _us(lambda: [
            next_fire(JobDefinition.model_validate_json(definition_json), now) for _ in range(COUNT)]),
    }


def main() -> None:
    run_benches("hot_path", {"per_execution": per_execution})


if __name__ == "__main__":
    main()
