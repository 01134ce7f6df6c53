"""Monitor benchmarks (docs/reference/performance.md).

    python -m bench.monitor                 # both
    python -m bench.monitor projection

- projection, projection_two_monitors: a backlog of 50,000 execution events (10,000
  executions × QUEUED, RUNNING, PROGRESS, PROGRESS, COMPLETED) projected by one (two)
  monitors started afterwards; events/s until `execution_events` holds them all, and the
  CPU the monitors and PostgreSQL spent per event. Target ≥ 20,000/s.
- copy_rows: the client CPU of COPYing one execution's rows (three events, one patch) into
  the staging tables, with the monitor's timestamptz codec and with asyncpg's own
  (docs/decisions/0015), 3,000 executions a pass, passes interleaved.
- catch_up: the whole system at a steady rate (BENCH_RATE, default 1,000 executions/s on
  this 2-core machine), the monitor stopped for 60 s, then restarted: time until its
  projection is current again.
"""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from confluent_kafka import Producer

from bench.harness import BenchSystem, run_benches, server_pids, tree_cpu
from cronstream.client import Client
from cronstream.services.monitor.projection import event_rows, fold, patch_rows
from cronstream.services.monitor.store import create_staging
from cronstream.shared.db import connect, fast_timestamps
from cronstream.shared.fast_records import decode_event
from cronstream.shared.records import ExecutionEvent, JobDefinition
from tests.support import eventually, sql


def projection(count: int = 1) -> dict[str, Any]:
    executions = int(os.environ.get("BENCH_EXECUTIONS", "10000"))
    system = BenchSystem("projection")
    try:
        producer = Producer({"bootstrap.servers": system.settings.kafka_bootstrap_servers,
                             "linger.ms": 20, "enable.idempotence": True,
                             "partitioner": "murmur2_random", "compression.type": "lz4"})
        t0 = datetime.now(UTC)
        total = 0
        for i in range(executions):
            job_id = f"p-{i % 500}"
            execution, run = uuid.uuid4(), uuid.uuid4()
            for step, (status, extra) in enumerate((
                    ("QUEUED", {"priority": "normal", "queue": "default"}),
                    ("RUNNING", {"worker_id": "w1"}),
                    ("PROGRESS", {"worker_id": "w1", "progress": 30.0}),
                    ("PROGRESS", {"worker_id": "w1", "progress": 70.0}),
                    ("COMPLETED", {"worker_id": "w1", "result": {"i": i}, "progress": 100.0}))):
                at = t0 + timedelta(milliseconds=step)
                event = ExecutionEvent(event_id=uuid.uuid4(), execution_id=execution, job_id=job_id,
                                       run_id=run, status=status, attempt_number=1, scheduled_at=t0,
                                       occurred_at=at, started_at=t0 if step else None,
                                       completed_at=at if status == "COMPLETED" else None, **extra)
                while True:
                    try:
                        producer.produce(system.settings.topics.execution_events, event.to_json(),
                                         job_id.encode())
                        break
                    except BufferError:
                        producer.poll(0.05)
                total += 1
        assert producer.flush(60) == 0
        url = system.settings.database_url
        postgres = server_pids(system.settings)["postgres"]
        postgres_before = sum(tree_cpu(pid) for pid in postgres)
        started = time.monotonic()
        monitors = [system.start("monitor", "--instance-id", f"m{i}", name=f"monitor-{i}")
                    for i in range(count)]
        eventually(lambda: sql(url, "SELECT count(*) AS n FROM execution_events")[0]["n"] >= total,
                   300, interval=0.2, message="the backlog projected")
        elapsed = time.monotonic() - started
        # CPU of the whole projection, the monitors' start included (about a second of
        # imports each): what a change to the monitor's cost per event moves.
        monitor_cpu = sum(tree_cpu(m.pid) for m in monitors)
        postgres_cpu = sum(tree_cpu(pid) for pid in postgres) - postgres_before
        finished = datetime.now(UTC)
        assigned = min(re.findall(r"ts=(\S+) level=info service=monitor action=partitions_assigned",
                                  m.log())[-1] for m in monitors)  # the log may hold earlier runs
        since_assignment = finished - datetime.fromisoformat(assigned.replace("Z", "+00:00"))
        done = sql(url, "SELECT count(*) AS n FROM job_executions WHERE status = 'COMPLETED'")[0]["n"]
        return {"params": {"executions": executions, "events": total, "monitors": count},
                "seconds_including_start": round(elapsed, 2),
                "events_per_second_including_start": round(total / elapsed),
                "seconds_from_assignment": round(since_assignment.total_seconds(), 2),
                "events_per_second_from_assignment": round(total / since_assignment.total_seconds()),
                "completed_rows": done,
                "cpu_us_per_event": {"monitor": round(monitor_cpu / total * 1e6, 1),
                                     "postgres": round(postgres_cpu / total * 1e6, 1)}}
    finally:
        system.close()


def catch_up() -> dict[str, Any]:
    rate = int(os.environ.get("BENCH_RATE", "1000"))
    outage = int(os.environ.get("BENCH_OUTAGE", "60"))
    system = BenchSystem("catch_up")
    try:
        monitor = system.start("monitor", name="monitor")
        dispatcher = system.start("dispatcher", name="dispatcher")
        scheduler = system.start("scheduler", name="scheduler")
        workers = [system.start("worker", "--worker-id", f"w{i}", "--concurrency", "32",
                                name=f"worker-{i}") for i in range(2)]
        scheduler.wait_for_log("action=scheduler_ready")
        for proc in (monitor, dispatcher, *workers):
            proc.wait_for_log("action=partitions_assigned")
        base = datetime(2026, 1, 1, tzinfo=UTC)
        with Client(system.settings) as client:
            client.apply([JobDefinition(
                job_id=f"c-{i:05d}", type="INTERVAL", interval_seconds=1, handler="noop",
                start_at=base + timedelta(milliseconds=i * 1000 // rate)) for i in range(rate)])
        time.sleep(10)
        assert monitor.stop() == 0
        stopped_at = time.time()
        time.sleep(outage)  # the outage being measured
        url = system.settings.database_url
        restarted = time.monotonic()
        system.start("monitor", name="monitor-2")

        def current() -> bool:
            newest = sql(url, "SELECT max(occurred_at) AS t FROM execution_events")[0]["t"]
            return newest is not None and newest.timestamp() > time.time() - 2
        eventually(current, 600, interval=0.5, message="the projection is current")
        caught_up = time.monotonic() - restarted
        behind = sql(url, "SELECT count(*) AS n FROM execution_events WHERE occurred_at > to_timestamp($1)",
                       stopped_at)[0]["n"]
        return {"params": {"executions_per_second": rate, "outage_seconds": outage},
                "events_during_outage_and_catch_up": behind,
                "catch_up_seconds": round(caught_up, 1),
                "catch_up_events_per_second": round(behind / caught_up)}
    finally:
        system.close()


def copy_rows() -> dict[str, Any]:
    passes, executions = 7, 3000
    system = BenchSystem("copy_rows")
    try:
        t0 = datetime.now(UTC)
        events = []
        for i in range(executions):
            execution, run, job_id = uuid.uuid4(), uuid.uuid4(), f"bench-{i:06d}"
            for status, extra in (("QUEUED", {"priority": "normal", "queue": "default"}),
                                  ("RUNNING", {"worker_id": "w1", "started_at": t0}),
                                  ("COMPLETED", {"worker_id": "w1", "started_at": t0,
                                                 "completed_at": t0})):
                event = ExecutionEvent(event_id=uuid.uuid4(), execution_id=execution, job_id=job_id,
                                       run_id=run, status=status, attempt_number=1,
                                       scheduled_at=t0, occurred_at=t0, **extra)
                events.append((decode_event(event.to_json(), job_id.encode()), 0, len(events)))
        rows = event_rows(events)
        patches = patch_rows(sorted(fold([e for e, _, _ in events]).values(),
                                    key=lambda p: p.execution_id))

        async def one(fast: bool) -> float:
            conn = await connect(system.settings.database_url)
            try:
                if fast:
                    await fast_timestamps(conn)
                await create_staging(conn)
                began = time.process_time()
                async with conn.transaction():
                    await conn.copy_records_to_table("staged_events", records=rows)
                    await conn.copy_records_to_table("staged_executions", records=patches)
                return (time.process_time() - began) / executions * 1e6
            finally:
                await conn.close()

        async def measure() -> dict[str, list[float]]:
            figures: dict[str, list[float]] = {"asyncpg": [], "monitor": []}
            for _ in range(passes):
                figures["asyncpg"].append(await one(False))
                figures["monitor"].append(await one(True))
            return figures

        figures = asyncio.run(measure())
        return {"params": {"executions": executions, "passes": passes},
                "unit": "client CPU µs per execution (3 event rows + 1 patch row)",
                **{f"{codec}_codec": {"best": round(min(v), 2), "median": round(statistics.median(v), 2)}
                   for codec, v in figures.items()}}
    finally:
        system.close()


BENCHES = {"projection": projection, "projection_two_monitors": lambda: projection(2),
           "copy_rows": copy_rows, "catch_up": catch_up}


def main(names: list[str] | None = None) -> None:
    run_benches("monitor", BENCHES, names)


if __name__ == "__main__":
    main(sys.argv[1:] or None)
