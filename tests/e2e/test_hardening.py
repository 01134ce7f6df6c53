"""Hardening through the real services (issue 9): poison never stops a leader, SIGTERM to
a worker's process group drains, cancel
of a queued execution is decided by the worker that reaches it, FORBID holds through a
pending retry, a re-issued JobDue is queued once across a dispatcher restart, and a DAG
join whose upstreams finish under two monitors runs exactly once."""

from __future__ import annotations

import json
import os
import signal
import uuid
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from cronstream.shared.inbound import DLQ_ERROR, DLQ_ORIGINAL_SIZE, DLQ_TOPIC
from cronstream.shared.records import JobDue, JobSnapshot
from cronstream.shared.settings import Settings
from tests.conftest import Processes
from tests.support import cli, eventually, header, produce, produce_json, read_all, run_now, sql


def first_row_in(settings: Settings, job_id: str, wanted: set[str]) -> Any:
    """The job's first execution, once its status is one of `wanted` (else None)."""
    found = rows(settings, job_id)
    return found[0] if found and found[0]["status"] in wanted else None


def rows(settings: Settings, job_id: str) -> list[Any]:
    return sql(settings.database_url, "SELECT * FROM job_executions WHERE job_id = $1 "
               "ORDER BY scheduled_at, attempt_number", job_id)


def statuses(settings: Settings, execution_id: Any) -> list[str]:
    return [r["status"] for r in sql(settings.database_url,
                                     "SELECT status FROM execution_events WHERE execution_id = $1 "
                                     "ORDER BY kafka_partition, kafka_offset", execution_id)]


def completed(settings: Settings, job_id: str) -> int:
    return len([r for r in rows(settings, job_id) if r["status"] == "COMPLETED"])


def test_poison_definitions_are_dead_lettered_and_the_leader_keeps_firing(
    processes: Processes, topics: Settings,
) -> None:
    services = processes.system()
    t = topics.topics
    produce_json(topics, t.job_definitions, "steady", {
        "job_id": "steady", "type": "INTERVAL", "interval_seconds": 1, "handler": "noop"})
    eventually(lambda: completed(topics, "steady") >= 1, 30, message="the steady job runs")
    poison: dict[str, dict[str, Any]] = {
        "nested": {"job_id": "nested", "type": "DEPENDENT", "depends_on": ["steady"],
                   "handler": "noop",
                   "condition": "(" * 300 + 'steady.status == "COMPLETED"' + ")" * 300},
        "far-future": {"job_id": "far-future", "type": "CRON", "schedule": "0 * * * *",
                       "handler": "noop", "start_at": "9999-12-31T23:00:00Z"},
    }
    for job_id, value in poison.items():
        produce_json(topics, t.job_definitions, job_id, value)
    big = json.dumps({"job_id": "huge", "type": "INTERVAL", "interval_seconds": 1,
                      "handler": "noop", "params": {"blob": "x" * 990_000}}).encode()  # ~1 MB: fits librdkafka's
    # default message.max.bytes (1,000,000), larger than any record we would copy whole
    produce(topics, t.job_definitions, b"huge", big)
    before = completed(topics, "steady")

    def dead() -> dict[str, Any]:
        return {(m.key() or b"").decode(): m for m in read_all(topics, t.dead_letters)
                if header(m, DLQ_TOPIC) == t.job_definitions}

    found = eventually(lambda: (d := dead()) and {"nested", "far-future", "huge"} <= set(d) and d,
                       60, message="the three poison definitions dead-lettered")
    assert "deeper than" in (header(found["nested"], DLQ_ERROR) or "") or \
        "tokens" in (header(found["nested"], DLQ_ERROR) or "")
    assert "less than or equal to 2999-12-31" in (header(found["far-future"], DLQ_ERROR) or "")
    assert header(found["huge"], DLQ_ORIGINAL_SIZE) == str(len(big))
    assert len(found["huge"].value() or b"") < len(big), "the copy of a huge record is truncated"
    eventually(lambda: completed(topics, "steady") >= before + 3, 30,
               message="the leader keeps firing after the poison")
    for name, proc in services.items():
        assert proc.alive(), f"{name} died"
    log = services["scheduler"].log()
    assert "action=leader_failed" not in log and "reason=failed" not in log, "no shard's leader failed"
    assert log.count("action=leader_elected") == topics.scheduler_shards, "each shard led once, never again"


def test_sigterm_to_the_worker_process_group_drains_like_sigterm_to_the_worker(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    services = processes.system(worker_args=("--concurrency", "4"))
    for i in range(3):
        run_now(topics, f"long-{i}", "sleep", params={"seconds": 4})
    eventually(lambda: sum(1 for i in range(3) for r in rows(topics, f"long-{i}")
                           if r["status"] == "RUNNING") == 3, 30, message="three executions run")
    worker = services["worker-1"]
    os.killpg(worker.pid, signal.SIGTERM)  # systemd KillMode=control-group, an init, a terminal
    assert worker.proc.wait(40) == 0, worker.log()[-2000:]
    for i in range(3):
        row = eventually(partial(first_row_in, topics, f"long-{i}",
                                 {"COMPLETED", "FAILED", "PERMANENTLY_FAILED", "QUEUED"}), 30,
                         message="each execution drained")
        assert row["status"] == "COMPLETED", f"long-{i} ended {row['status']}: {row['error_message']}"


def test_cancelling_a_queued_execution_is_decided_by_the_worker_that_reaches_it(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    processes.start("monitor")
    processes.start("dispatcher").wait_for_log("action=dispatcher_started")
    processes.start("scheduler", "--instance-id", "s1").wait_for_log("action=scheduler_ready")
    path = tmp_path / "ran.txt"
    run_now(topics, "nobody-yet", "test.write", params={"path": str(path)}, queue="later")
    row = eventually(lambda: (r := rows(topics, "nobody-yet")) and r[0]["status"] == "QUEUED" and r[0],
                     30, message="queued, no worker on its queue")
    done = cli(topics, "cancel", str(row["execution_id"]), "--reason", "not needed")
    assert done.returncode == 0, done.stderr
    assert rows(topics, "nobody-yet")[0]["status"] == "QUEUED", "no service has decided yet"
    processes.worker("late", "--queues", "later")
    final = eventually(lambda: (r := rows(topics, "nobody-yet")) and r[0]["status"] == "CANCELLED"
                       and r[0], 30, message="the worker skips it")
    assert "not needed" in final["error_message"] and final["started_at"] is None
    assert final["cancelled_by"], "who cancelled is recorded"
    assert not path.exists(), "it never ran"
    assert "RUNNING" not in statuses(topics, row["execution_id"])


def test_forbid_holds_while_a_retry_is_pending(processes: Processes, topics: Settings) -> None:
    processes.system()
    produce_json(topics, topics.topics.job_definitions, "flaky", {
        "job_id": "flaky", "type": "INTERVAL", "interval_seconds": 1, "handler": "fail",
        "params": {"message": "boom", "succeed_on_attempt": 2}, "max_retries": 1,
        "retry_delay_seconds": 4, "concurrency_policy": "FORBID"})
    eventually(lambda: any(r["attempt_number"] == 2 and r["status"] == "COMPLETED"
                           for r in rows(topics, "flaky")), 40, message="a retry completes")
    all_rows = rows(topics, "flaky")
    first_failure = min(r["completed_at"] for r in all_rows if r["status"] == "FAILED")
    retry_done = min(r["completed_at"] for r in all_rows
                     if r["attempt_number"] == 2 and r["status"] == "COMPLETED")
    ran_meanwhile = [r for r in all_rows if r["attempt_number"] == 1 and r["started_at"] is not None
                     and first_failure < r["started_at"] < retry_done]
    assert not ran_meanwhile, "no new run started while the first one waited for its retry"
    assert any(r["status"] == "SKIPPED" and first_failure < r["completed_at"] < retry_done
               for r in all_rows), "fires during the pending retry are skipped"


def test_a_reissued_jobdue_is_queued_once_across_a_dispatcher_restart(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    services = processes.system()
    path = tmp_path / "ran.txt"
    now = datetime.now(UTC).replace(microsecond=0)
    due = JobDue(execution_id=uuid.uuid4(), job_id="again", run_id=uuid.uuid4(), scheduled_at=now,
                 reason="REQUEUE", delivery=2, idempotency_key="again@1",
                 job=JobSnapshot(handler="test.write", params={"path": str(path)}))
    produce(topics, topics.topics.job_due, b"again", due.to_json())
    eventually(lambda: path.exists() and path.read_text().count("\n") == 1, 30,
               message="it runs once")
    assert services["dispatcher"].stop() == 0
    processes.start("dispatcher", name="dispatcher-2").wait_for_log("action=partitions_assigned")
    produce(topics, topics.topics.job_due, b"again", due.to_json())  # the monitor re-issues it
    restarted = processes.started[-1]
    restarted.wait_for_log("action=duplicate_due_dropped", 30)
    run_now(topics, "after", "noop")
    eventually(lambda: completed(topics, "after") == 1, 30, message="later work flows")
    assert path.read_text().count("\n") == 1, "the repeat was dropped"


def test_a_join_whose_upstreams_finish_under_two_monitors_runs_once(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    processes.start("monitor", "--instance-id", "m1", name="monitor-1")
    processes.start("monitor", "--instance-id", "m2", name="monitor-2")
    processes.start("dispatcher").wait_for_log("action=dispatcher_started")
    processes.start("scheduler", "--instance-id", "s1").wait_for_log("action=scheduler_ready")
    processes.worker("w1", "--concurrency", "8")
    for m in processes.started[:2]:
        m.wait_for_log("action=partitions_assigned")
    t = topics.topics
    # Upstreams chosen to land on different partitions of three (the keys hash apart).
    for name in ("left", "right", "middle"):
        produce_json(topics, t.job_definitions, name, {
            "job_id": name, "type": "DEPENDENT", "depends_on": ["root"], "handler": "noop"})
    path = tmp_path / "join.txt"
    produce_json(topics, t.job_definitions, "join", {
        "job_id": "join", "type": "DEPENDENT", "depends_on": ["left", "right", "middle"],
        "handler": "test.write", "params": {"path": str(path)}})
    # The whole DAG is known before its root fires (a step defined after a run started
    # does not join that run).
    eventually(lambda: len(sql(topics.database_url, "SELECT 1 FROM job_dependencies")) == 6, 30,
               message="the DAG is projected")
    produce_json(topics, t.job_definitions, "root", {
        "job_id": "root", "type": "INTERVAL", "interval_seconds": 3, "handler": "noop"})
    eventually(lambda: len({r["run_id"] for r in rows(topics, "join")
                            if r["status"] == "COMPLETED"}) >= 4, 60,
               message="the join completes in four runs")
    joins = rows(topics, "join")
    per_run: dict[Any, int] = {}
    for r in joins:
        per_run[r["run_id"]] = per_run.get(r["run_id"], 0) + 1
    assert all(n == 1 for n in per_run.values()), f"a join evaluated twice in a run: {per_run}"
    settled = datetime.now(UTC) - timedelta(seconds=10)
    for run in {r["run_id"] for r in rows(topics, "root")}:
        ups = [[r for r in rows(topics, up) if r["run_id"] == run] for up in ("left", "right", "middle")]
        if all(u and u[0]["status"] == "COMPLETED" and u[0]["completed_at"] < settled for u in ups):
            assert per_run.get(run) == 1, f"run {run}: every upstream completed, the join never ran"
    lines = path.read_text().splitlines()
    assert len(lines) == len(set(lines)), "no join execution ran twice"
