"""Workers against real Kafka and PostgreSQL: hard timeouts, cancellation, progress,
priorities, long jobs, drain, and handler names that are not registered."""

from __future__ import annotations

import json
import signal
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any
from uuid import uuid4

from confluent_kafka import Producer

from cronstream.shared.records import JobDue, JobSnapshot, Priority
from cronstream.shared.settings import Settings
from tests.conftest import Processes
from tests.support import cli, eventually, holding_the_workers_group, run_now, sql


def execution(settings: Settings, job_id: str, status: str | None = None) -> Any:
    rows = sql(settings.database_url, "SELECT * FROM job_executions WHERE job_id = $1 "
               "AND ($2::text IS NULL OR status = $2) ORDER BY scheduled_at", job_id, status)
    return rows[0] if rows else None


def events(settings: Settings, job_id: str) -> list[str]:
    return [r["status"] for r in sql(settings.database_url,
                                     "SELECT status FROM execution_events WHERE job_id = $1 "
                                     "ORDER BY occurred_at, kafka_offset", job_id)]


def test_blocking_and_cpu_bound_handlers_are_killed_at_their_timeout(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    services = processes.system(worker_args=("--concurrency", "2"))
    # One retry, far away: this attempt shows TIMED_OUT (attempts left), not PERMANENTLY_FAILED.
    retry = {"max_retries": 1, "retry_delay_seconds": 3600}
    run_now(topics, "blocked", "test.block", timeout_seconds=3, **retry)
    run_now(topics, "spinning", "test.cpu", timeout_seconds=3, **retry)
    for job in ("blocked", "spinning"):
        row = eventually(partial(execution, topics, job, "TIMED_OUT"), 30,
                         message=f"{job} TIMED_OUT")
        took = (row["completed_at"] - row["started_at"]).total_seconds()
        assert 3 <= took <= 6, f"{job} stopped after {took:.1f}s"
        assert "timed out after 3s" in row["error_message"]
    path = tmp_path / "after.txt"
    run_now(topics, "after", "test.write", params={"path": str(path)})
    eventually(lambda: execution(topics, "after", "COMPLETED"), 30, message="the worker still works")
    assert path.read_text().count("\n") == 1
    assert services["worker-1"].log().count("action=handler_process_replaced") == 2


def test_unknown_handler_fails_once_and_imports_nothing(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    marker = tmp_path / "imported"
    processes.system()
    for job_id, name in (("shell-out", "os.system"), ("module-path", "tests.e2e.evil_module:system")):
        run_now(topics, job_id, name, max_retries=3, retry_delay_seconds=1,
                params={"command": f"touch {marker}"})
    for job_id in ("shell-out", "module-path"):
        row = eventually(partial(execution, topics, job_id, "PERMANENTLY_FAILED"), 30,
                         message=f"{job_id} fails")
        assert "unknown handler" in row["error_message"]
    assert "tests.e2e.evil_module" not in Path("/proc/self/maps").read_text()
    rows = sql(topics.database_url, "SELECT count(*) AS n FROM job_executions "
               "WHERE job_id IN ('shell-out', 'module-path')")
    assert rows[0]["n"] == 2, "not retried"
    assert not marker.exists(), "nothing was imported or run"


def test_progress_is_reported_and_ends_at_100(processes: Processes, topics: Settings) -> None:
    processes.system()
    run_now(topics, "async", "test.async-double", params={"n": 21})  # an async handler
    done = eventually(lambda: execution(topics, "async", "COMPLETED"), 30, message="async completes")
    assert json.loads(done["result"]) == {"doubled": 42, "attempt": 1}
    run_now(topics, "sleeper", "sleep", params={"seconds": 3})
    row = eventually(lambda: execution(topics, "sleeper", "COMPLETED"), 30, message="sleep completes")
    assert row["progress"] == 100
    statuses = events(topics, "sleeper")
    assert statuses.count("PROGRESS") >= 2, statuses
    percents = [r["progress"] for r in sql(topics.database_url,
                "SELECT progress FROM execution_events WHERE job_id = 'sleeper' AND status = "
                "'PROGRESS' ORDER BY kafka_offset")]
    assert percents == sorted(percents) and percents[-1] == 100



def test_cancel_a_running_and_a_queued_execution(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    processes.system(worker_args=("--concurrency", "1"))
    path = tmp_path / "ran.txt"
    run_now(topics, "running", "test.slow-write", params={"seconds": 60, "path": str(path)})
    running = eventually(lambda: execution(topics, "running", "RUNNING"), 30, message="it runs")
    run_now(topics, "queued", "test.write", params={"path": str(path)})
    queued = eventually(lambda: execution(topics, "queued", "QUEUED"), 30, message="it waits")

    done = cli(topics, "cancel", str(queued["execution_id"]), "--reason", "not needed")
    assert done.returncode == 0, done.stderr
    assert cli(topics, "cancel", str(running["execution_id"])).returncode == 0
    row = eventually(lambda: execution(topics, "running", "CANCELLED"), 15,
                     message="running → CANCELLED")
    assert (row["completed_at"] - row["started_at"]).total_seconds() < 10
    # The worker is free again and reaches the cancelled work record: it skips it (only the
    # consumer of the work record decides, so nothing can start it meanwhile).
    skipped = eventually(lambda: execution(topics, "queued", "CANCELLED"), 15,
                         message="queued → CANCELLED by the worker that reaches it")
    assert skipped["error_message"] == "cancelled before it started: not needed"
    assert skipped["started_at"] is None and skipped["cancelled_by"]
    run_now(topics, "later", "test.write", params={"path": str(path)})
    eventually(lambda: execution(topics, "later", "COMPLETED"), 30, message="later completes")
    assert "RUNNING" not in events(topics, "queued"), "a cancelled queued execution never runs"
    assert str(queued["execution_id"]) not in path.read_text()
    again = cli(topics, "cancel", str(row["execution_id"]))
    assert again.returncode != 0 and "already ended: CANCELLED" in again.stderr


def test_higher_priority_starts_first_from_a_backlog(processes: Processes, topics: Settings) -> None:
    services = processes.system(workers=0)
    for priority in ("low", "normal", "high"):
        for i in range(8):
            run_now(topics, f"{priority}-{i}", "noop", priority=priority)
    eventually(lambda: sql(topics.database_url, "SELECT count(*) AS n FROM job_executions "
                           "WHERE status = 'QUEUED'")[0]["n"] == 24, 30, message="the backlog")
    processes.worker("w1", "--concurrency", "1")
    eventually(lambda: sql(topics.database_url, "SELECT count(*) AS n FROM job_executions "
                           "WHERE status = 'COMPLETED'")[0]["n"] == 24, 30, message="all done")
    order = [r["job_id"].split("-")[0] for r in sql(
        topics.database_url, "SELECT job_id FROM job_executions ORDER BY started_at")]
    assert order == ["high"] * 8 + ["normal"] * 8 + ["low"] * 8, order
    assert services["dispatcher"].alive()


def test_a_job_longer_than_the_poll_interval_causes_no_rebalance(
    processes: Processes, topics: Settings,
) -> None:
    processes.system(workers=0)
    worker = processes.worker("w1", extra_env={"CRONSTREAM_KAFKA_MAX_POLL_INTERVAL_MS": "10000"})
    run_now(topics, "long", "sleep", params={"seconds": 20}, timeout_seconds=60)
    eventually(lambda: execution(topics, "long", "COMPLETED"), 60, message="the 20 s job completes")
    log = worker.log()
    assert log.count("action=partitions_assigned") == 1 and "partitions_revoked" not in log, log[-3000:]
    assert "MAX_POLL_EXCEEDED" not in log and "maximum poll interval" not in log


def test_sigterm_drains_the_running_job_then_reports_offline(
    processes: Processes, topics: Settings,
) -> None:
    services = processes.system()
    run_now(topics, "draining", "sleep", params={"seconds": 4})
    eventually(lambda: execution(topics, "draining", "RUNNING"), 30, message="it runs")
    worker = services["worker-1"]
    worker.signal(signal.SIGTERM)
    assert worker.proc.wait(30) == 0
    assert execution(topics, "draining")["status"] in ("COMPLETED", "RUNNING")
    eventually(lambda: execution(topics, "draining", "COMPLETED"), 15, message="drained job completes")
    row = eventually(lambda: (r := sql(topics.database_url, "SELECT * FROM workers")) and
                     r[0]["status"] == "OFFLINE" and r[0], 15, message="the worker says OFFLINE")
    assert row["worker_id"] == "w1"
    assert "action=worker_draining" in worker.log()


def test_a_paused_worker_fetches_again_from_the_partitions_a_rebalance_gives_back(
    processes: Processes, topics: Settings,
) -> None:
    """A backlog pauses a worker's intake (every slot held by a long handler, its buffer
    reaches twice its limit: it claims nothing ahead behind runs that outlast the usual
    duration); a second worker joins, and the first gets part of its partitions back, its
    buffer emptied by the revocation: every execution still runs, on both workers. (librdkafka keeps a
    partition paused through revocation and re-assignment; whether a worker resumes
    before or after it is given partitions back depends on the rebalance's timing — the
    unit test `test_partitions_given_back_by_a_rebalance_are_fetched_again_after_a_pause`
    pins the order that once left a benchmark's worker idle for a whole run.)"""
    processes.system(workers=0)
    backlog = 2_400  # past twice the worker's buffer (1,000 records): its intake pauses
    producer = Producer({"bootstrap.servers": topics.kafka_bootstrap_servers,
                         "enable.idempotence": True, "linger.ms": 20})

    def due(job_id: str, handler: str, params: dict[str, Any], priority: Priority) -> None:
        record = JobDue(execution_id=uuid4(), job_id=job_id, run_id=uuid4(),
                        scheduled_at=datetime.now(UTC), reason="MANUAL", idempotency_key=job_id,
                        job=JobSnapshot(handler=handler, params=params, priority=priority))
        producer.produce(topics.topics.work(priority, "default"), record.to_json(), job_id.encode())

    for i in range(4):  # every slot of the first worker, held for a while
        due(f"hold-{i}", "sleep", {"seconds": 8, "blocking": True}, "high")
    assert producer.flush(30) == 0
    first = processes.worker("w1", "--concurrency", "4")
    eventually(lambda: sql(topics.database_url, "SELECT count(*) AS n FROM job_executions "
                           "WHERE status = 'RUNNING' AND job_id LIKE 'hold-%'")[0]["n"] == 4, 30,
               message="every slot of w1 held")
    for i in range(backlog):  # what w1 can only buffer: it pauses
        due(f"backlog-{i}", "noop", {}, "normal")
    assert producer.flush(30) == 0
    first.wait_for_log("action=intake_paused", timeout=30)
    processes.worker("w2")
    first.wait_for_log("action=partitions_assigned", count=2, timeout=30)
    eventually(lambda: sql(topics.database_url, "SELECT count(*) AS n FROM job_executions "
                           "WHERE status = 'COMPLETED'")[0]["n"] == backlog + 4, 90,
               message="every execution completes, those of the partitions w1 got back included")
    by_worker = {r["worker_id"]: r["n"] for r in sql(
        topics.database_url, "SELECT worker_id, count(*) AS n FROM job_executions "
        "WHERE job_id LIKE 'backlog-%' GROUP BY worker_id")}
    assert by_worker.get("w1", 0) > 0 and by_worker.get("w2", 0) > 0, by_worker


def test_a_worker_left_without_an_assignment_rejoins_with_a_fresh_consumer_and_runs(
    processes: Processes, topics: Settings,
) -> None:
    """A worker whose join does not come back within CRONSTREAM_WORKER_REJOIN_AFTER_SECONDS
    (after a broker restart a consumer can wait for good, nothing logged) starts over with a
    fresh consumer under its member id, and runs what comes once the group lets it in."""
    processes.system(workers=0)
    with holding_the_workers_group(topics):
        worker = processes.worker("w1", wait=False,
                                  extra_env={"CRONSTREAM_WORKER_REJOIN_AFTER_SECONDS": "2"})
        worker.wait_for_log("action=worker_rejoining", count=2, timeout=30)
        assert worker.alive() and worker.get("/readyz")[0] == 503
    worker.wait_for_log("action=partitions_assigned", timeout=30)
    run_now(topics, "after-rejoin", "noop")
    eventually(lambda: execution(topics, "after-rejoin", "COMPLETED"), 30,
               message="the rejoined worker runs and commits (its new consumer's group metadata)")
    assert events(topics, "after-rejoin")[-2:] == ["RUNNING", "COMPLETED"]


def test_a_worker_whose_consumer_is_fenced_as_a_static_member_rejoins_at_once(
    processes: Processes, topics: Settings,
) -> None:
    """A consumer that joins the workers' group under the worker's own group.instance.id
    fences the worker's consumer for good (after a coordinator moved, the client can do that
    to itself: the chaos suite's lost leader). The worker starts over with a fresh consumer
    at once — the rejoin timeout is set far beyond the test — and runs what comes."""
    processes.system(workers=0)
    worker = processes.worker("w1", extra_env={"CRONSTREAM_WORKER_REJOIN_AFTER_SECONDS": "600"})
    with holding_the_workers_group(topics, instance_id="w1"):
        pass  # it took the worker's place in the group; the worker's rejoin replaces it
    worker.wait_for_log('reason="the consumer failed for good"', timeout=30)
    worker.wait_for_log("action=partitions_assigned", count=2, timeout=30)
    run_now(topics, "after-fence", "noop")
    eventually(lambda: execution(topics, "after-fence", "COMPLETED"), 30,
               message="the rejoined worker runs and commits")
    assert worker.alive()
