"""Retry spread: 1,000 jobs failing at the same instant (docs/reference/semantics.md#retries).

    python -m bench.retries

Their retries must spread over the whole jitter window (retry_delay 10 s → 8–12 s), shown
as a histogram of delay = RetryRequest.due_at − failure time; a second group with
`max_retry_delay_seconds` below the base delay shows the cap holding.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.harness import BenchSystem, run_benches, summary
from bench.scheduler import publish, publisher
from tests.support import eventually, read_all


def histogram(values: list[float], low: float, high: float, bins: int) -> list[str]:
    width = (high - low) / bins
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, max(0, int((v - low) / width)))] += 1
    top = max(counts) or 1
    return [f"{low + i * width:5.2f}-{low + (i + 1) * width:5.2f}s {c:4d} {'#' * (40 * c // top)}"
            for i, c in enumerate(counts)]


def spread() -> dict[str, Any]:
    jobs = int(os.environ.get("BENCH_FAILING_JOBS", "1000"))
    system = BenchSystem("retries")
    try:
        scheduler = system.start("scheduler", name="scheduler")
        system.start("dispatcher", name="dispatcher")
        worker = system.start("worker", "--worker-id", "w0", "--concurrency", "64", name="worker")
        scheduler.wait_for_log("action=scheduler_ready")
        worker.wait_for_log("action=partitions_assigned")
        run_at = (datetime.now(UTC) + timedelta(seconds=10)).isoformat()
        items = [(f"fail-{i:04d}", {"job_id": f"fail-{i:04d}", "type": "ONE_TIME", "run_at": run_at,
                                    "handler": "fail", "max_retries": 1, "retry_delay_seconds": 10})
                 for i in range(jobs)]
        items += [(f"capped-{i:03d}", {"job_id": f"capped-{i:03d}", "type": "ONE_TIME", "run_at": run_at,
                                       "handler": "fail", "max_retries": 1, "retry_delay_seconds": 10,
                                       "max_retry_delay_seconds": 9}) for i in range(100)]
        publish(publisher(system.settings), system.settings.topics.job_definitions, items)
        def retry_requests() -> list[dict[str, Any]] | None:
            found = [json.loads(m.value()) for m in read_all(system.settings, system.settings.topics.retries)
                     if m.value() is not None]
            return found if len(found) >= jobs + 100 else None

        requests = eventually(retry_requests, 120, interval=1, message="every retry request")
        failed = {}
        for msg in read_all(system.settings, system.settings.topics.execution_events):
            event = json.loads(msg.value())
            if event["status"] == "FAILED":
                failed[event["run_id"]] = datetime.fromisoformat(event["completed_at"].replace("Z", "+00:00"))
        delays: dict[str, list[float]] = {"fail": [], "capped": []}
        for r in requests:
            due = datetime.fromisoformat(r["due_at"].replace("Z", "+00:00"))
            delays[r["job_id"].split("-")[0]].append((due - failed[r["run_id"]]).total_seconds())
        spread = delays["fail"]
        bars = histogram(spread, 8.0, 12.0, 10)
        print("\n".join(bars))
        return {"params": {"failing_jobs": jobs, "retry_delay_seconds": 10, "capped_jobs": 100,
                           "max_retry_delay_seconds_of_capped": 9},
                "delay_seconds": {k: round(v, 3) for k, v in summary(spread).items()},
                "min_delay_seconds": round(min(spread), 3),
                "histogram_8_to_12s": bars,
                "capped_max_delay_seconds": round(max(delays["capped"]), 3),
                "capped_min_delay_seconds": round(min(delays["capped"]), 3)}
    finally:
        system.close()


def main(names: list[str] | None = None) -> None:
    run_benches("retries", {"spread": spread}, names)


if __name__ == "__main__":
    main(sys.argv[1:] or None)
