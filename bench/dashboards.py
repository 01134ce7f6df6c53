"""Dashboard and retention benchmarks on a realistic projection (issue 11).

    python -m bench.dashboards                 # both
    python -m bench.dashboards panels
    BENCH_EXECUTIONS=200000 python -m bench.dashboards prune

Both seed a fresh, migrated database with 1,000 jobs and 1,000,000 executions over 60
days (BENCH_EXECUTIONS), set-based (tests/seed.sql), into ordinary logged tables.

- panels: every SQL panel of deploy/grafana, expanded as Grafana expands it over the
  dashboard's default time range, run BENCH_RUNS times (after one warm-up): p50 and max
  milliseconds each. Target: every panel under 200 ms.
- prune: three execution events per execution too (3,000,000). The monitor projects a
  backlog of BENCH_BACKLOG executions (× 5 events) from Kafka into that database twice:
  alone, then while `cronstream prune --older-than 30d` deletes the older half (about
  500,000 executions and 1,500,000 events) in batches. Figures: events/s of each
  projection, and the prune's duration and rows/s. Retention must not slow the
  projection below its benchmark rate.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from statistics import median
from typing import Any

import asyncpg
from confluent_kafka import Producer

from bench.harness import BenchSystem, run_benches
from cronstream.shared.kafka.admin import ensure_topics
from cronstream.shared.records import ExecutionEvent
from deploy.grafana import generate
from tests.seed import seed
from tests.support import env_for, eventually, sql

EXECUTIONS = int(os.environ.get("BENCH_EXECUTIONS", "1000000"))
RUNS = int(os.environ.get("BENCH_RUNS", "5"))
BACKLOG = int(os.environ.get("BENCH_BACKLOG", "20000"))


def _seed(system: BenchSystem, events_every: int) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        conn = await asyncpg.connect(system.settings.database_url)
        try:
            return await seed(conn, jobs=1000, executions=EXECUTIONS, days=60,
                              events_every=events_every, unlogged=False)
        finally:
            await conn.close()

    started = time.monotonic()
    took = asyncio.run(run())
    took["total"] = round(time.monotonic() - started, 1)
    return took


def panels() -> dict[str, Any]:
    system = BenchSystem("dashboards")
    try:
        seeded = _seed(system, events_every=0)
        url = system.settings.database_url
        now = datetime.now(UTC)
        root = sql(url, generate.sql_blocks()["var_roots"])[0]["job_id"]
        run = sql(url, generate.expand(generate.sql_blocks()["var_runs"], now, now, 60,
                                       {"root": root}))[0]["run_id"]
        variables = {"job": "job-0042", "root": root, "run": run}

        async def measure() -> dict[str, Any]:
            conn = await asyncpg.connect(url)
            figures: dict[str, Any] = {}
            try:
                for dashboard, panel in generate.sql_panels():
                    start, end = generate.default_range(dashboard, now)
                    statement = generate.expand(generate.sql_blocks()[panel.query], start, end, 300,
                                                variables)
                    await conn.fetch(statement)  # warm-up: plan and cache
                    times = []
                    for _ in range(RUNS):
                        t0 = time.perf_counter()
                        rows = await conn.fetch(statement)
                        times.append((time.perf_counter() - t0) * 1000)
                    figures[f"{dashboard.uid.removeprefix('cronstream-')}/{panel.query}"] = {
                        "p50_ms": round(median(times), 1), "max_ms": round(max(times), 1),
                        "rows": len(rows)}
            finally:
                await conn.close()
            return figures

        figures = asyncio.run(measure())
        slowest = max(figures.values(), key=lambda f: f["max_ms"])["max_ms"]
        return {"params": {"jobs": 1000, "executions": EXECUTIONS, "runs": RUNS},
                "seed_seconds": seeded, "panels": figures, "slowest_max_ms": slowest,
                "all_under_200_ms": slowest < 200}
    finally:
        system.close()


def _backlog(system: BenchSystem, prefix: str) -> int:
    """BACKLOG executions × 5 events on `prefix`'s execution-events topic; returns the count."""
    settings = system.settings.model_copy(update={"topic_prefix": prefix})
    ensure_topics(settings, settings.topics.specs())
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers, "linger.ms": 20,
                         "enable.idempotence": True, "partitioner": "murmur2_random",
                         "compression.type": "lz4"})
    t0, total = datetime.now(UTC), 0
    for i in range(BACKLOG):
        job_id = f"job-{i % 1000:04d}"
        execution, run = uuid.uuid4(), uuid.uuid4()
        for step, status in enumerate(("QUEUED", "RUNNING", "PROGRESS", "PROGRESS", "COMPLETED")):
            at = t0 + timedelta(milliseconds=step)
            event = ExecutionEvent(event_id=uuid.uuid4(), execution_id=execution, job_id=job_id,
                                   run_id=run, status=status, attempt_number=1, scheduled_at=t0,
                                   occurred_at=at, started_at=t0 if step else None,
                                   completed_at=at if status == "COMPLETED" else None,
                                   worker_id="w1" if step else None,
                                   progress=50.0 if status == "PROGRESS" else None)
            while True:
                try:
                    producer.produce(settings.topics.execution_events, event.to_json(), job_id.encode())
                    break
                except BufferError:
                    producer.poll(0.05)
            total += 1
    assert producer.flush(60) == 0
    return total


def _project(system: BenchSystem, prefix: str, total: int, name: str) -> float:
    """Start a monitor on `prefix`; seconds until its backlog of `total` events is projected
    (its stored offsets, committed with the rows, reach the end of the log)."""
    url = system.settings.database_url
    progress = ("SELECT COALESCE(sum(next_offset), 0) AS n FROM consumer_offsets "
                "WHERE consumer = $1 AND topic = $2")
    started = time.monotonic()
    proc = system.start("monitor", "--instance-id", name, name=name,
                        env={"CRONSTREAM_TOPIC_PREFIX": prefix, "CRONSTREAM_RETENTION_DAYS": "0"})
    eventually(lambda: sql(url, progress, f"{prefix}monitor", f"{prefix}execution-events")[0]["n"] >= total,
               900, interval=0.25, message="the backlog projected")
    elapsed = time.monotonic() - started
    proc.stop()
    return elapsed


def prune() -> dict[str, Any]:
    system = BenchSystem("prune")
    try:
        seeded = _seed(system, events_every=1)
        alone_prefix, during_prefix = f"b{uuid.uuid4().hex[:8]}.", f"b{uuid.uuid4().hex[:8]}."
        alone_total = _backlog(system, alone_prefix)
        during_total = _backlog(system, during_prefix)
        alone = _project(system, alone_prefix, alone_total, "alone")

        pruning = subprocess.Popen(
            [sys.executable, "-m", "cronstream", "prune", "--older-than", "30d"],
            env=env_for(system.settings), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        prune_started = time.monotonic()
        during = _project(system, during_prefix, during_total, "during")
        projected_while_pruning = pruning.poll() is None
        output, _ = pruning.communicate(timeout=3600)
        prune_seconds = time.monotonic() - prune_started
        assert pruning.returncode == 0, output
        deleted = {name.replace(" ", "_"): int(n) for n, name in
                   re.findall(r"(\d+) ([a-z ]+?)(?:,|$)", output.strip().splitlines()[-1].split(": ", 1)[1])}
        return {
            "params": {"executions": EXECUTIONS, "backlog_events": alone_total,
                       "retention_batch": system.settings.retention_batch},
            "seed_seconds": seeded,
            "projection_alone_events_per_second": round(alone_total / alone),
            "projection_while_pruning_events_per_second": round(during_total / during),
            "prune_still_running_when_projection_finished": projected_while_pruning,
            "prune_seconds": round(prune_seconds, 1),
            "deleted": deleted,
            "prune_rows_per_second": round(sum(deleted.values()) / prune_seconds),
        }
    finally:
        system.close()


BENCHES = {"panels": panels, "prune": prune}


def main(names: list[str] | None = None) -> None:
    run_benches("dashboards", BENCHES, names)


if __name__ == "__main__":
    main(sys.argv[1:] or None)
