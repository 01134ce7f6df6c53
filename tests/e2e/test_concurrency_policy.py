"""Concurrency policies through the real dispatcher: FORBID never overlaps (and survives a
dispatcher restart), REPLACE cancels the running execution."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from cronstream.shared.settings import Settings
from tests.conftest import Processes
from tests.support import eventually, produce_json, sql


def rows(settings: Settings, job_id: str) -> list[Any]:
    return sql(settings.database_url, "SELECT * FROM job_executions WHERE job_id = $1 "
               "ORDER BY scheduled_at", job_id)


def test_forbid_never_overlaps_and_records_skips_across_a_dispatcher_restart(
    processes: Processes, topics: Settings,
) -> None:
    services = processes.system(worker_args=("--concurrency", "4"))
    produce_json(topics, topics.topics.job_definitions, "exclusive", {
        "job_id": "exclusive", "type": "INTERVAL", "interval_seconds": 1, "handler": "sleep",
        "params": {"seconds": 2.5}, "concurrency_policy": "FORBID"})
    eventually(lambda: len([r for r in rows(topics, "exclusive") if r["status"] == "COMPLETED"]) >= 1,
               30, message="a first run completes")
    assert services["dispatcher"].stop() == 0
    processes.start("dispatcher", name="dispatcher-2").wait_for_log("action=partitions_assigned")
    eventually(lambda: len([r for r in rows(topics, "exclusive") if r["status"] == "COMPLETED"]) >= 3,
               40, message="three runs complete")
    done = [r for r in rows(topics, "exclusive") if r["status"] in ("COMPLETED", "RUNNING")]
    done.sort(key=lambda r: r["started_at"])
    for a, b in itertools.pairwise(done):
        assert a["completed_at"] is not None and b["started_at"] >= a["completed_at"], \
            f"{a['execution_id']} and {b['execution_id']} overlap"
    skipped = [r for r in rows(topics, "exclusive") if r["status"] == "SKIPPED"]
    assert len(skipped) >= 2
    assert all("concurrency_policy FORBID" in r["error_message"] for r in skipped)
    assert all(r["started_at"] is None for r in skipped), "a skipped fire never runs"


def test_replace_cancels_the_running_execution(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    processes.system(worker_args=("--concurrency", "4"))
    produce_json(topics, topics.topics.job_definitions, "latest-wins", {
        "job_id": "latest-wins", "type": "INTERVAL", "interval_seconds": 2,
        "handler": "test.slow-write", "params": {"seconds": 30, "path": str(tmp_path / "x")},
        "concurrency_policy": "REPLACE"})
    eventually(lambda: len([r for r in rows(topics, "latest-wins") if r["status"] == "CANCELLED"]) >= 2,
               40, message="runs replaced")
    all_rows = rows(topics, "latest-wins")
    cancelled = [r for r in all_rows if r["status"] == "CANCELLED"]
    assert all("concurrency_policy REPLACE" in r["error_message"] for r in cancelled)
    for row in cancelled:
        replacer = next(r for r in all_rows if str(r["execution_id"]) in row["error_message"])
        assert replacer["scheduled_at"] > row["scheduled_at"]
        stopped_after = (row["completed_at"] - replacer["queued_at"]).total_seconds()
        assert stopped_after < 5, f"the replaced run kept going {stopped_after:.1f}s"
    running = [r for r in all_rows if r["status"] == "RUNNING"]
    assert len(running) <= 1, "at most one run at a time"
