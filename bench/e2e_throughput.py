"""End-to-end throughput: many INTERVAL no-op jobs through all four services.

    python -m bench.e2e_throughput            # defaults below; env overrides
    BENCH_JOBS=3000 BENCH_SECONDS=60 python -m bench.e2e_throughput

Figures, read from PostgreSQL (the monitor's projection):
- completions per second over the measured window (fire → COMPLETED in PostgreSQL);
- start lag (scheduled_at → started_at) and end-to-end lag (scheduled_at → completed_at)
  percentiles; queue lag (scheduled_at → queued_at) shows scheduler + dispatcher.
Target (SPEC §9): ≥ 3,000 executions/s sustained for 60 s; start lag p99 ≤ 250 ms at 1,000/s.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta

from bench.harness import BenchSystem, percentile, summary, write_result
from cronstream.client import Client
from cronstream.shared.records import JobDefinition
from tests.support import eventually, sql


def main() -> dict[str, object]:
    jobs = int(os.environ.get("BENCH_JOBS", "1000"))
    interval = int(os.environ.get("BENCH_INTERVAL", "1"))
    seconds = int(os.environ.get("BENCH_SECONDS", "60"))
    workers = int(os.environ.get("BENCH_WORKERS", "2"))
    concurrency = os.environ.get("BENCH_CONCURRENCY", "32")
    system = BenchSystem("e2e_throughput")
    try:
        monitor = system.start("monitor", name="monitor")
        dispatcher = system.start("dispatcher", name="dispatcher")
        scheduler = system.start("scheduler", name="scheduler")
        started = [system.start("worker", "--worker-id", f"bench-w{i}", "--concurrency", concurrency,
                                "--import", "bench.handlers", name=f"worker-{i}",
                                env={"PYTHONPATH": os.getcwd()}) for i in range(workers)]
        scheduler.wait_for_log("action=leader_ready")
        for proc in (monitor, dispatcher, *started):
            proc.wait_for_log("action=partitions_assigned")
        time.sleep(3)  # the group settles once every worker joined
        # Spread over the interval (BENCH_SPREAD=0: every job fires at the same instant).
        spread = os.environ.get("BENCH_SPREAD", "1") == "1"
        base = datetime(2026, 1, 1, tzinfo=UTC)
        definitions = [JobDefinition(
            job_id=f"bench-{i:06d}", type="INTERVAL", interval_seconds=interval,
            handler=os.environ.get("BENCH_HANDLER", "noop"), params={"i": i},
            start_at=base + timedelta(milliseconds=i * interval * 1000 // jobs) if spread else None)
            for i in range(jobs)]
        with Client(system.settings) as client:
            client.apply(definitions)
        url = system.settings.database_url
        # Measure a steady window: skip the first seconds while every job gets going.
        time.sleep(int(os.environ.get("BENCH_WARMUP", "10")))
        window_start = sql(url, "SELECT now() AS t")[0]["t"]
        time.sleep(seconds)
        window_end = sql(url, "SELECT now() AS t")[0]["t"]
        with Client(system.settings) as client:
            for d in definitions:
                client.delete(d.job_id)
        eventually(lambda: sql(url, "SELECT count(*) AS n FROM job_executions WHERE status "
                                      "NOT IN ('COMPLETED','FAILED','PERMANENTLY_FAILED')")[0]["n"] == 0,
                   timeout=120, message="backlog drained")
        rows = sql(url, """
            SELECT extract(epoch FROM scheduled_at - $1) AS at,
                   extract(epoch FROM queued_at - scheduled_at) AS queue_lag,
                   extract(epoch FROM started_at - scheduled_at) AS start_lag,
                   extract(epoch FROM completed_at - scheduled_at) AS e2e_lag
            FROM job_executions
            WHERE scheduled_at >= $1 AND scheduled_at < $2 AND status = 'COMPLETED'""",
                     window_start, window_end)
        span = (window_end - window_start).total_seconds()
        offered = jobs / interval
        figures = {
            "params": {"jobs": jobs, "interval_seconds": interval, "offered_per_second": offered,
                       "spread": spread, "handler": os.environ.get("BENCH_HANDLER", "noop"),
                       "window_seconds": round(span, 1), "workers": workers,
                       "worker_concurrency": int(concurrency), "partitions": system.partitions},
            "completed_per_second": round(len(rows) / span, 1),
            "completed_fraction_of_offered": round(len(rows) / (offered * span), 4),
            "queue_lag_ms": {k: round(v * 1000, 1) if k != "count" else v for k, v in
                             summary([float(r["queue_lag"]) for r in rows]).items()},
            "start_lag_ms": {k: round(v * 1000, 1) if k != "count" else v for k, v in
                             summary([float(r["start_lag"]) for r in rows]).items()},
            "e2e_lag_ms": {k: round(v * 1000, 1) if k != "count" else v for k, v in
                           summary([float(r["e2e_lag"]) for r in rows]).items()},
        }
        buckets: dict[int, list[float]] = {}
        for r in rows:
            buckets.setdefault(int(float(r["at"])) // 5 * 5, []).append(float(r["start_lag"]))
        figures["start_lag_p99_ms_by_5s"] = {
            k: round(percentile(v, 99) * 1000) for k, v in sorted(buckets.items())}
        write_result("e2e_throughput", figures)
        return figures
    finally:
        system.close()


if __name__ == "__main__":
    main()
