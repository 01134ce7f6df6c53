"""Dashboard benchmark (issue 13): each page's server time on a large install.

    python -m bench.ui                      # 100,000 jobs, 1,000,000 executions
    BENCH_UI_JOBS=10000 BENCH_UI_EXECUTIONS=100000 python -m bench.ui

Seeds a fresh database with set-based SQL (bench/ui_seed.sql: generate_series, never row
by row): the jobs, the executions (90% on the first 1,000 jobs, ~900 runs each, so the
first Jobs and Timeline pages are the busiest ones), one audit event per execution, live
RUNNING / QUEUED / AWAITING_APPROVAL executions, workers and alerts; then starts
`cronstream ui` and requests every page BENCH_UI_REQUESTS times (default 30), reading the
server's own time from the `Server-Timing` header. Reports p50 / p99 per page, in ms.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.harness import BenchSystem, percentile, write_result
from cronstream.shared.db import connect, named_blocks

SEED = named_blocks((Path(__file__).resolve().parent / "ui_seed.sql").read_text())


async def _seed(url: str, jobs: int, executions: int) -> dict[str, Any]:
    conn = await connect(url)
    timings: dict[str, float] = {}
    try:
        for name, args in (("seed_jobs", (jobs,)), ("seed_executions", (jobs, executions)),
                           ("seed_active", ()), ("seed_events", ()), ("seed_workers", ()),
                           ("seed_alerts", ()), ("analyze", ())):
            started = time.perf_counter()
            await conn.execute(SEED[name], *args, timeout=3600)
            timings[name] = round(time.perf_counter() - started, 2)
            print(f"  {name}: {timings[name]} s", flush=True)
        ids = await conn.fetchrow(SEED["sample_ids"])
    finally:
        await conn.close()
    assert ids is not None
    return {"seed_seconds": timings, "execution_id": str(ids["execution_id"]), "run_id": str(ids["run_id"])}


def _server_ms(base: str, path: str) -> tuple[float, float]:
    started = time.perf_counter()
    with urllib.request.urlopen(base + path, timeout=60) as response:
        response.read()
        header = response.headers.get("Server-Timing", "")
        status = response.status
    client = (time.perf_counter() - started) * 1000
    assert status == 200, (path, status)
    match = re.search(r"dur=([\d.]+)", header)
    assert match, f"no Server-Timing on {path}"
    return float(match[1]), client


def run() -> dict[str, Any]:
    jobs = int(os.environ.get("BENCH_UI_JOBS", "100000"))
    executions = int(os.environ.get("BENCH_UI_EXECUTIONS", "1000000"))
    requests = int(os.environ.get("BENCH_UI_REQUESTS", "30"))
    system = BenchSystem("ui")
    try:
        print(f"seeding {jobs:,} jobs and {executions:,} executions", flush=True)
        seeded = asyncio.run(_seed(system.settings.database_url, jobs, executions))
        (system.log_dir / "ui.log").unlink(missing_ok=True)  # its port is read from the log
        ui = system.start("ui", name="ui")
        ui.wait_for_log("action=live_listening")
        base = f"http://127.0.0.1:{ui.http_port()}"
        pages = {
            "jobs": "/jobs",
            "jobs_last_status_failed": "/jobs?status=FAILED",
            "jobs_search": "/jobs?q=job-0421",
            "jobs_page_500": f"/jobs?after=job-{500 * 50:06d}",
            "job_busy": "/jobs/job-000001",
            "job_quiet": f"/jobs/job-{jobs - 7:06d}",
            "runs": "/runs",
            "execution": f"/executions/{seeded['execution_id']}",
            "dag_run": f"/runs/{seeded['run_id']}",
            "timeline_24h": "/timeline",
            "timeline_7d": "/timeline?hours=168",
            "workers": "/workers",
            "alerts": "/alerts",
        }
        figures: dict[str, Any] = {}
        for name, path in pages.items():
            _server_ms(base, path)  # warm up: statement plans, template compilation
            server, client = [], []
            for _ in range(requests):
                s, c = _server_ms(base, path)
                server.append(s)
                client.append(c)
            figures[name] = {"path": path, "server_p50_ms": round(percentile(server, 50), 1),
                             "server_p99_ms": round(percentile(server, 99), 1),
                             "client_p50_ms": round(percentile(client, 50), 1)}
            print(f"  {name:26s} p50 {figures[name]['server_p50_ms']:7.1f} ms   "
                  f"p99 {figures[name]['server_p99_ms']:7.1f} ms   {path}", flush=True)
        return {"jobs": jobs, "executions": executions, "requests_per_page": requests,
                "seed_seconds": seeded["seed_seconds"], "pages": figures}
    finally:
        system.close()


def main() -> None:
    write_result("ui", run())


if __name__ == "__main__":
    main()
