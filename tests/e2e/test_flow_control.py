"""Flow control through the real CLI, services, broker and database (decision 0056): a pool
of 2 shared by jobs on different partitions, under two dispatchers, never runs 3 at once; two keys of one job run
side by side while each is serialised; every held-back execution is WAITING with its
reason, and the slots in use return to 0 when all is done."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from cronstream.client import Client
from cronstream.shared.settings import Settings
from tests.conftest import Processes
from tests.support import (
    ServiceProcess,
    cli,
    eventually,
    pool_slots_in_use,
    read_all,
    sql,
    start_ui,
)
from tests.support import most_at_once as spans_at_once


def rows(settings: Settings, job_ids: list[str]) -> list[Any]:
    return sql(settings.database_url, "SELECT *, job->'params' AS run_params FROM job_executions "
               "WHERE job_id = ANY($1::text[]) ORDER BY started_at NULLS LAST", job_ids)


def apply(settings: Settings, path: Path, documents: list[dict[str, Any]]) -> None:
    path.write_text(json.dumps(documents))
    done = cli(settings, "apply", "-f", str(path))
    assert done.returncode == 0, done.stderr


def most_at_once(runs: list[Any]) -> int:
    """The most runs whose [started_at, completed_at] overlap at one instant."""
    return spans_at_once([(r["started_at"], r["completed_at"]) for r in runs])


def overlap(a: Any, b: Any) -> bool:
    return bool(a["started_at"] < b["completed_at"] and b["started_at"] < a["completed_at"])


def slots_in_use(dispatcher: ServiceProcess, pool: str) -> float | None:
    return pool_slots_in_use(dispatcher.get("/metrics")[1], pool)


def test_a_pool_of_two_never_runs_three_and_its_slots_return_to_zero(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    services = processes.system(worker_args=("--concurrency", "8"))
    # Two dispatchers: the one that does not own the pool's partition forwards its jobs'
    # asks and ends on `admissions` (the one that does decides its own at once).
    second = processes.start("dispatcher", name="dispatcher-2")
    second.wait_for_log("action=partitions_assigned")
    dispatchers = [services["dispatcher"], second]
    done = cli(topics, "pool", "set", "etl", "--slots", "2", "--description", "the warehouse")
    assert done.returncode == 0, done.stderr
    listed = cli(topics, "pools", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert [(p["pool"], p["slots"]) for p in json.loads(listed.stdout)] == [("etl", 2)]
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat()  # runs only when triggered
    jobs = [f"load-{i}" for i in range(6)]  # on every partition, so the pool's is crossed
    apply(topics, tmp_path / "jobs.json", [
        {"job_id": j, "type": "ONE_TIME", "run_at": later, "handler": "sleep",
         "params": {"seconds": 1.5}, "pool": "etl"} for j in jobs])
    with Client(topics) as client:
        now = datetime.now(UTC)
        for j in jobs:
            client.trigger(j, now, by="burst@test")
    finished = eventually(lambda: len(done := [r for r in rows(topics, jobs)
                                               if r["status"] == "COMPLETED"]) == 6 and done,
                          90, message="the six runs complete")
    assert most_at_once(finished) <= 2, "never more than the pool's 2 slots at once"
    reasons = [r["waiting_reason"] for r in finished if r["waiting_reason"]]
    assert reasons, "some runs were held back"
    assert all(reason.startswith("pool etl: 2 of 2 slots in use") for reason in reasons), reasons
    assert read_all(topics, topics.topics.admissions), "asks crossed between the dispatchers"
    eventually(lambda: [slots_in_use(d, "etl") or 0 for d in dispatchers] == [0, 0]
               and any(slots_in_use(d, "etl") is not None for d in dispatchers), 30,
               message="the pool's slots in use return to 0")
    listed = cli(topics, "pools", "-o", "json")
    assert [(p["pool"], p["in_use"], p["waiting"], p["jobs"]) for p in json.loads(listed.stdout)] == \
        [("etl", 0, 0, jobs)]
    refused = cli(topics, "pool", "delete", "etl")
    assert refused.returncode == 1 and "is named by 6 job(s)" in refused.stderr
    assert cli(topics, "pool", "delete", "etl", "--force").returncode == 0
    assert json.loads(cli(topics, "pools", "-o", "json").stdout) == []


def test_two_keys_run_side_by_side_while_each_is_serialised(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    processes.system(worker_args=("--concurrency", "8"))
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    apply(topics, tmp_path / "job.json", [{
        "job_id": "per-customer", "type": "ONE_TIME", "run_at": later, "handler": "sleep",
        "params": {"seconds": 1.5, "customer": 0},
        "concurrency": {"key": "params.customer", "max_running": 1}}])
    with Client(topics) as client:
        now = datetime.now(UTC)
        for i, customer in enumerate([1, 2, 1, 2, 1, 2]):
            client.trigger("per-customer", now + timedelta(milliseconds=i),
                           params={"customer": customer}, by="burst@test")
    finished = eventually(lambda: len(done := [r for r in rows(topics, ["per-customer"])
                                               if r["status"] == "COMPLETED"]) == 6 and done,
                          90, message="the six runs complete")
    by_key = {c: [r for r in finished if json.loads(r["run_params"])["customer"] == c] for c in (1, 2)}
    for customer, runs in by_key.items():
        assert len(runs) == 3
        for a, b in itertools.pairwise(sorted(runs, key=lambda r: r["started_at"])):
            assert not overlap(a, b), f"two runs of customer {customer} overlap"
            assert a["scheduled_at"] < b["scheduled_at"], "first come, first served per key"
        assert [r["waiting_reason"] for r in runs if r["waiting_reason"]], \
            f"customer {customer}'s later runs waited"
        assert all(r["waiting_reason"].startswith(f"key customer={customer}: 1 of 1 running")
                   for r in runs if r["waiting_reason"])
    assert any(overlap(a, b) for a in by_key[1] for b in by_key[2]), \
        "the two customers run side by side"


def test_a_cancelled_waiting_run_never_starts_and_leaks_no_slot(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    services = processes.system(worker_args=("--concurrency", "4"))
    dashboard = start_ui(processes, "ui")
    assert cli(topics, "pool", "set", "solo", "--slots", "1").returncode == 0
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    apply(topics, tmp_path / "job.json", [{
        "job_id": "exclusive", "type": "ONE_TIME", "run_at": later, "handler": "sleep",
        "params": {"seconds": 4}, "pool": "solo"}])
    with Client(topics) as client:
        now = datetime.now(UTC)
        first, waiting, third = (client.trigger("exclusive", now + timedelta(milliseconds=i))
                                 for i in range(3))
        eventually(lambda: [r["status"] for r in rows(topics, ["exclusive"])
                            if r["execution_id"] == waiting] == ["WAITING"], 30,
                   message="the second run waits")
        page = httpx.get(dashboard + "/pools").text  # who holds the slot, what waits and why
        assert "1 of 1 slots in use" in page and f'data-execution-id="{waiting}"' in page
        assert "pool solo: 1 of 1 slots in use" in page
        client.cancel(waiting, "not needed")

    def ended() -> dict[Any, Any] | None:
        found = {r["execution_id"]: r for r in rows(topics, ["exclusive"]) if r["completed_at"]}
        return found if len(found) == 3 else None

    done = eventually(ended, 60, message="every run ends")
    assert done[waiting]["status"] == "CANCELLED" and done[waiting]["started_at"] is None
    assert "while waiting (pool solo: 1 of 1 slots in use" in done[waiting]["error_message"]
    assert done[first]["status"] == done[third]["status"] == "COMPLETED"
    assert not overlap(done[first], done[third])
    eventually(lambda: slots_in_use(services["dispatcher"], "solo") == 0, 30,
               message="the pool's slots in use return to 0")


def test_a_rate_limit_spreads_a_burst(processes: Processes, topics: Settings, tmp_path: Path) -> None:
    processes.system(worker_args=("--concurrency", "8"))
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    apply(topics, tmp_path / "job.json", [{
        "job_id": "polite", "type": "ONE_TIME", "run_at": later, "handler": "noop",
        "rate_limit": "2/s"}])
    with Client(topics) as client:
        now = datetime.now(UTC)
        for i in range(6):
            client.trigger("polite", now + timedelta(milliseconds=i))
    finished = eventually(lambda: len(done := [r for r in rows(topics, ["polite"])
                                               if r["status"] == "COMPLETED"]) == 6 and done,
                          60, message="the burst completes")
    starts = sorted(r["queued_at"] for r in finished)
    for first, third in zip(starts, starts[2:], strict=False):
        assert (third - first).total_seconds() >= 0.99, f"three starts within a second: {starts}"
    assert (starts[-1] - starts[0]).total_seconds() >= 1.98, "six starts at 2/s span two seconds"
    assert any((r["waiting_reason"] or "").startswith("rate limit 2/s, next start at ")
               for r in finished)


def test_a_dead_workers_run_keeps_its_slot_while_it_runs_again_elsewhere(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    services = processes.system(workers=2)
    assert cli(topics, "pool", "set", "solo", "--slots", "1").returncode == 0
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    apply(topics, tmp_path / "job.json", [{
        "job_id": "held", "type": "ONE_TIME", "run_at": later, "handler": "sleep",
        "params": {"seconds": 4}, "pool": "solo"}])
    with Client(topics) as client:
        now = datetime.now(UTC)
        first, second = (client.trigger("held", now + timedelta(milliseconds=i)) for i in range(2))
    running = eventually(lambda: next((r for r in rows(topics, ["held"]) if r["execution_id"] == first
                                       and r["status"] == "RUNNING"), None), 30,
                         message="the first run runs")
    services[f"worker-{running['worker_id'][1:]}"].kill()

    def ended() -> dict[Any, Any] | None:
        found = {r["execution_id"]: r for r in rows(topics, ["held"]) if r["status"] == "COMPLETED"}
        return found if len(found) == 2 else None

    done = eventually(ended, 60, message="both runs complete")
    assert done[first]["delivery"] == 2 and done[first]["worker_id"] != running["worker_id"]
    assert done[second]["queued_at"] >= done[first]["completed_at"], \
        "the waiting run was admitted only when the re-queued one ended: it kept its slot"
    assert done[second]["waiting_reason"].startswith("pool solo: 1 of 1 slots in use")
    eventually(lambda: slots_in_use(services["dispatcher"], "solo") == 0, 30,
               message="the pool's slots in use return to 0")


def test_a_dispatcher_killed_while_admitting_loses_and_doubles_no_slot(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    services = processes.system(worker_args=("--concurrency", "8"))
    assert cli(topics, "pool", "set", "etl", "--slots", "2").returncode == 0
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    jobs = [f"load-{i}" for i in range(4)]
    apply(topics, tmp_path / "jobs.json", [
        {"job_id": j, "type": "ONE_TIME", "run_at": later, "handler": "sleep",
         "params": {"seconds": 1.5}, "pool": "etl"} for j in jobs])
    with Client(topics) as client:
        now = datetime.now(UTC)
        for i in range(2):
            for j in jobs:
                client.trigger(j, now + timedelta(milliseconds=i))
    eventually(lambda: any(r["status"] == "WAITING" for r in rows(topics, jobs)), 30,
               message="runs wait for the pool")
    services["dispatcher"].kill()
    successor = processes.start("dispatcher", name="dispatcher-2")
    successor.wait_for_log("action=partitions_assigned")
    finished = eventually(lambda: len(done := [r for r in rows(topics, jobs)
                                               if r["status"] == "COMPLETED"]) == 8 and done,
                          90, message="the eight runs complete")
    assert most_at_once(finished) <= 2, "never more than the pool's 2 slots at once"
    assert all(r["delivery"] == 1 for r in finished), "each queued once"
    eventually(lambda: slots_in_use(successor, "etl") == 0, 30,
               message="the pool's slots in use return to 0")
