"""The monitor: exactly-once projection across a SIGKILL, dead-worker requeues (and a
zombie's late report), DAG runs with conditions, trigger rules and approval gates."""

from __future__ import annotations

import contextlib
import json
import signal
from collections import Counter
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from cronstream.services.monitor.projection import fold
from cronstream.shared.records import ExecutionEvent
from cronstream.shared.settings import Settings
from cronstream.shared.statuses import FINAL
from tests.conftest import Processes
from tests.support import (
    ServiceProcess,
    cli,
    eventually,
    header,
    produce,
    produce_json,
    read_all,
    run_now,
    sql,
    value,
)


def rows(settings: Settings, job_id: str) -> list[Any]:
    return sql(settings.database_url, "SELECT * FROM job_executions WHERE job_id = $1 "
               "ORDER BY attempt_number, scheduled_at", job_id)


def status_of(settings: Settings, job_id: str) -> str | None:
    found = rows(settings, job_id)
    return found[-1]["status"] if found else None


def define_steady_jobs(settings: Settings, prefix: str, count: int) -> None:
    """`count` no-op jobs firing every second."""
    for i in range(count):
        produce_json(settings, settings.topics.job_definitions, f"{prefix}-{i}", {
            "job_id": f"{prefix}-{i}", "type": "INTERVAL", "interval_seconds": 1, "handler": "noop"})


def projected_beyond(settings: Settings, count: int) -> bool:
    return projected(settings) > count


def projected(settings: Settings) -> int:
    return int(sql(settings.database_url, "SELECT count(*) AS n FROM execution_events")[0]["n"])


def assert_projection_is_the_log(settings: Settings, timeout: float = 30) -> list[ExecutionEvent]:
    """Once the stream is at rest: `execution_events` holds the topic's events, each once,
    and `job_executions` is their fold. Returns the topic's events. (Workers may still be
    ending the last runs when a test stops its scheduler: "at rest" is the topic, the events
    table and the executions table agreeing at one look, not the events table alone.)"""
    last: dict[str, Any] = {}

    def agree() -> bool:
        on_topic = [ExecutionEvent.model_validate_json(value(m))
                    for m in read_all(settings, settings.topics.execution_events)]
        in_db = {str(r["event_id"]) for r in sql(settings.database_url,
                                                 "SELECT event_id FROM execution_events")}
        expected = {k: (p.status, p.attempt_number) for k, p in fold(on_topic).items()}
        actual = {r["execution_id"]: (r["status"], r["attempt_number"])
                  for r in sql(settings.database_url, "SELECT * FROM job_executions")}
        last.update(on_topic=on_topic, expected=expected, actual=actual,
                    events_match=in_db == {str(e.event_id) for e in on_topic})
        return bool(last["events_match"]) and actual == expected

    with contextlib.suppress(AssertionError):  # the asserts below say how they differ
        eventually(agree, timeout, message="the projection at rest equals the topic's fold")
    assert last["events_match"], "execution_events differs from the topic"
    assert last["actual"] == last["expected"]
    return list(last["on_topic"])


def all_completed(settings: Settings) -> bool:
    return sql(settings.database_url, "SELECT count(*) AS n FROM job_executions "
               "WHERE status NOT IN ('COMPLETED')")[0]["n"] == 0


def test_a_killed_monitor_resumes_exactly_once(processes: Processes, topics: Settings) -> None:
    services = processes.system()
    define_steady_jobs(topics, "steady", 10)
    eventually(lambda: projected(topics) > 100, 30, message="events flowing")
    services["monitor"].signal(signal.SIGKILL)
    services["monitor"].proc.wait(10)
    eventually(lambda: len(read_all(topics, topics.topics.execution_events)) > 400, 30,
               message="events pile up while the monitor is down")
    processes.start("monitor", name="monitor-2")
    assert services["scheduler"].stop() == 0  # let the stream come to rest
    eventually(lambda: all_completed(topics), 30, message="all done")
    on_topic = assert_projection_is_the_log(topics)
    assert len({e.event_id for e in on_topic}) == len(on_topic)


def test_the_monitor_rides_out_its_database_sessions_ending_mid_batch(
        processes: Processes, topics: Settings) -> None:
    # PostgreSQL ending the monitor's sessions (a failover, an operator, a restart) may
    # end one inside a batch's transaction; asyncpg then raises whatever the protocol was
    # in the middle of. The monitor must neither stop nor skip nor repeat an event.
    services = processes.system()
    define_steady_jobs(topics, "steady", 20)
    eventually(lambda: projected(topics) > 100, 30, message="events flowing")
    ended = 0
    for _ in range(25):
        before = projected(topics)
        ended += sql(topics.database_url, "SELECT count(pg_terminate_backend(pid)) AS n "
                     "FROM pg_stat_activity WHERE datname = current_database() "
                     "AND pid <> pg_backend_pid()")[0]["n"]
        eventually(partial(projected_beyond, topics, before), 30,
                   message="projecting again after the sessions ended")
    assert ended >= 25
    assert services["monitor"].proc.poll() is None, "the monitor stopped"
    assert services["scheduler"].stop() == 0  # let the stream come to rest
    eventually(lambda: all_completed(topics), 30, message="all done")
    assert_projection_is_the_log(topics)
    assert services["monitor"].proc.poll() is None, "the monitor stopped"


def test_monitors_joining_and_leaving_mid_stream_project_every_event_once(
    processes: Processes, topics: Settings,
) -> None:
    services = processes.system()
    define_steady_jobs(topics, "busy", 10)
    eventually(lambda: projected(topics) > 60, 30, message="events flowing")
    second = processes.start("monitor", "--instance-id", "m2", name="monitor-2")  # a rebalance
    second.wait_for_log("action=partitions_assigned")
    eventually(lambda: projected(topics) > 200, 30, message="both project")
    assert services["monitor"].stop() == 0  # another rebalance
    assert services["scheduler"].stop() == 0
    assert_projection_is_the_log(topics, timeout=40)


def running_row(settings: Settings, job_id: str) -> Any:
    found = [r for r in rows(settings, job_id) if r["status"] == "RUNNING"]
    return found[0] if found else None


def slow_job_on_one_of_two_workers(
    processes: Processes, settings: Settings, job_id: str, seconds: float, path: Path,
) -> tuple[Any, ServiceProcess]:
    """Start a slow job with two workers up; its RUNNING row and the worker that runs it."""
    services = processes.system(workers=2)
    run_now(settings, job_id, "test.slow-write", params={"seconds": seconds, "path": str(path)})
    first = eventually(lambda: running_row(settings, job_id), 30, message="it runs")
    return first, services[f"worker-{first['worker_id'][1:]}"]


def test_a_killed_worker_is_declared_offline_and_its_run_finishes_elsewhere_once(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    path = tmp_path / "runs.txt"
    first, victim = slow_job_on_one_of_two_workers(processes, topics, "long", 4, path)
    victim.kill()
    killed_at = datetime.now(UTC)  # the monitor stamps its events from the same clock
    requeued = eventually(lambda: sql(topics.database_url, "SELECT occurred_at FROM execution_events "
                                      "WHERE execution_id = $1 AND status = 'REQUEUED'",
                                      first["execution_id"]), 20, interval=0.1,
                          message="the dead worker's execution re-queued")
    # docs/reference/performance.md#recovery: a dead worker's executions are re-queued within dead_after + 2 s.
    took = (requeued[0]["occurred_at"] - killed_at).total_seconds()
    print(f"re-queued {took:.2f}s after the kill (dead_after {topics.worker_dead_after_seconds:g}s)")
    assert took <= topics.worker_dead_after_seconds + 2
    assert sql(topics.database_url, "SELECT status FROM workers WHERE worker_id = $1",
               first["worker_id"])[0]["status"] == "OFFLINE"
    done = eventually(lambda: (r := rows(topics, "long")) and r[0]["status"] == "COMPLETED" and r[0],
                      30, message="the execution completes elsewhere")
    assert done["execution_id"] == first["execution_id"]
    assert done["worker_id"] != first["worker_id"] and done["delivery"] == 2
    assert path.read_text().count(str(first["execution_id"])) == 1, "it ran to the end once"
    statuses = Counter(r["status"] for r in sql(topics.database_url,
                       "SELECT status FROM execution_events WHERE execution_id = $1", done["execution_id"]))
    assert statuses["COMPLETED"] == 1 and statuses["REQUEUED"] == 1


def test_a_zombie_is_fenced_and_its_late_report_never_commits(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    """A worker paused past dead_after (GC, a frozen VM) is fenced before its execution is
    re-queued: when it wakes up, its late report of that execution — and the RetryRequest
    a failure would carry — can never commit, and it exits with a clear error
    (docs/decisions/0008)."""
    first, zombie = slow_job_on_one_of_two_workers(
        processes, topics, "paused-worker", 10, tmp_path / "runs.txt")
    zombie.signal(signal.SIGSTOP)
    done = eventually(lambda: (r := rows(topics, "paused-worker")) and r[0]["status"] == "COMPLETED" and r[0],
                      40, message="the requeued run completes")
    assert done["worker_id"] != first["worker_id"]
    zombie.signal(signal.SIGCONT)
    # The zombie's handler finished meanwhile (its pool process was not stopped): it tries
    # to report, is refused, and stops.
    assert zombie.proc.wait(60) != 0, "the fenced worker exits"
    assert "action=worker_fenced" in zombie.log()
    late = sql(topics.database_url, "SELECT status FROM execution_events WHERE execution_id = $1 "
               "AND delivery = 1 AND status NOT IN ('QUEUED', 'RUNNING', 'PROGRESS')",
               first["execution_id"])
    assert late == [], "no report of the stale delivery ever committed"
    row = rows(topics, "paused-worker")[0]
    assert (row["worker_id"], row["delivery"], row["completed_at"]) == (
        done["worker_id"], 2, done["completed_at"])

def dependent(job_id: str, depends_on: list[str], **fields: Any) -> dict[str, Any]:
    return {"job_id": job_id, "type": "DEPENDENT", "depends_on": depends_on, "handler": "noop",
            "params": {"step": job_id}, **fields}


def test_a_dag_run_with_a_condition_a_join_and_a_failed_upstream(
    processes: Processes, topics: Settings,
) -> None:
    processes.system()
    defs = topics.topics.job_definitions
    for d in (dependent("big-only", ["root"], condition="root.result.rows > 10"),
              dependent("small-only", ["root"], condition="root.result.rows == 5 and root.status == \"COMPLETED\""),
              dependent("breaks", ["root"], handler="fail", params={"message": "no"}),
              dependent("join", ["big-only", "breaks"], trigger_rule="ALL_DONE"),
              dependent("needs-success", ["breaks"]),
              dependent("after-join", ["join", "small-only"])):
        produce_json(topics, defs, d["job_id"], d)
    eventually(lambda: len(sql(topics.database_url, "SELECT 1 FROM job_dependencies")) == 8, 30,
               message="the DAG is projected")
    produce_json(topics, defs, "root", {"job_id": "root", "type": "ONE_TIME", "handler": "noop",
                                        "run_at": datetime.now(UTC).isoformat(), "params": {"rows": 5}})
    eventually(lambda: status_of(topics, "after-join") in FINAL, 40, message="the DAG completes")
    expected = {"root": "COMPLETED", "big-only": "SKIPPED", "small-only": "COMPLETED",
                "breaks": "PERMANENTLY_FAILED", "join": "COMPLETED", "needs-success": "SKIPPED",
                "after-join": "COMPLETED"}
    assert {j: status_of(topics, j) for j in expected} == expected
    assert "condition is false: root.result.rows > 10" in rows(topics, "big-only")[0]["error_message"]
    assert "trigger rule ALL_SUCCESS does not hold" in rows(topics, "needs-success")[0]["error_message"]
    run = rows(topics, "root")[0]["run_id"]
    assert {r["run_id"] for j in expected for r in rows(topics, j)} == {run}, "one run"
    counts = Counter(r["job_id"] for r in sql(topics.database_url, "SELECT job_id FROM job_executions"))
    assert all(n == 1 for n in counts.values()), f"each step at most once per run: {counts}"


def test_approval_gates(processes: Processes, topics: Settings) -> None:
    processes.system()
    defs = topics.topics.job_definitions
    produce_json(topics, defs, "gated", dependent("gated", ["release"], requires_approval=True))
    produce_json(topics, defs, "vetoed", dependent("vetoed", ["release"], requires_approval=True))
    eventually(lambda: len(sql(topics.database_url, "SELECT 1 FROM job_dependencies")) == 2, 30,
               message="projected")
    produce_json(topics, defs, "release", {"job_id": "release", "type": "ONE_TIME", "handler": "noop",
                                           "run_at": datetime.now(UTC).isoformat()})
    eventually(lambda: status_of(topics, "gated") == "AWAITING_APPROVAL" and
               status_of(topics, "vetoed") == "AWAITING_APPROVAL", 30, message="both wait")
    waiting_since = datetime.now(UTC)
    eventually(lambda: datetime.now(UTC) > waiting_since + timedelta(seconds=2), 5,
               message="a while passes")
    assert status_of(topics, "gated") == "AWAITING_APPROVAL", "nothing runs without approval"
    assert cli(topics, "approve", str(rows(topics, "gated")[0]["execution_id"])).returncode == 0
    done = cli(topics, "reject", str(rows(topics, "vetoed")[0]["execution_id"]), "--reason", "not today")
    assert done.returncode == 0, done.stderr
    eventually(lambda: status_of(topics, "gated") == "COMPLETED", 30, message="approved runs")
    eventually(lambda: status_of(topics, "vetoed") == "SKIPPED", 30, message="rejected is skipped")
    assert "not today" in rows(topics, "vetoed")[0]["error_message"]
    assert rows(topics, "vetoed")[0]["started_at"] is None


def test_cycles_and_second_roots_are_refused(processes: Processes, topics: Settings, tmp_path: Path) -> None:
    processes.start("scheduler", name="scheduler").wait_for_log("action=scheduler_ready")
    defs = topics.topics.job_definitions
    produce_json(topics, defs, "r1", {"job_id": "r1", "type": "INTERVAL", "interval_seconds": 3600,
                                      "handler": "noop"})
    produce_json(topics, defs, "r2", {"job_id": "r2", "type": "INTERVAL", "interval_seconds": 3600,
                                      "handler": "noop"})
    produce_json(topics, defs, "a", dependent("a", ["r1"]))
    path = tmp_path / "dag.yaml"
    path.write_text("job_id: b\ntype: DEPENDENT\ndepends_on: [a, r2]\nhandler: noop\n")
    done = cli(topics, "apply", "-f", str(path))
    assert done.returncode != 0 and "more than one scheduled root" in done.stderr, done.stderr
    path.write_text("job_id: c\ntype: DEPENDENT\ndepends_on: [d]\nhandler: noop\n---\n"
                    "job_id: d\ntype: DEPENDENT\ndepends_on: [c]\nhandler: noop\n")
    done = cli(topics, "apply", "-f", str(path))
    assert done.returncode != 0 and "cycle" in done.stderr, done.stderr
    # Published raw, a cycle reaches the scheduler, which dead-letters it.
    produce_json(topics, defs, "x", dependent("x", ["y"]))
    produce(topics, defs, b"y", json.dumps(dependent("y", ["x"])).encode())
    letters = eventually(lambda: [m for m in read_all(topics, topics.topics.dead_letters)
                                  if m.key() == b"y"], 30, message="the cycle is dead-lettered")
    assert "invalid DAG: depends_on: cycle" in (header(letters[0], "cronstream.dlq.error") or "")


def test_dashboards_figures_and_cli_views(processes: Processes, topics: Settings) -> None:
    processes.system()
    produce_json(topics, topics.topics.job_definitions, "often", {
        "job_id": "often", "type": "INTERVAL", "interval_seconds": 1, "handler": "noop"})
    eventually(lambda: sql(topics.database_url, "SELECT finished FROM job_stats_24h WHERE job_id = 'often'")
               and sql(topics.database_url, "SELECT finished FROM job_stats_24h WHERE job_id = 'often'")[0]["finished"] >= 3,
               30, message="stats")
    stats = sql(topics.database_url, "SELECT * FROM job_stats_24h WHERE job_id = 'often'")[0]
    assert stats["success_rate_percent"] == 100 and stats["duration_p99_seconds"] is not None
    eventually(lambda: (r := sql(topics.database_url, "SELECT next_execution_at FROM job_definitions "
                                 "WHERE job_id = 'often'")) and r[0]["next_execution_at"] > datetime.now(UTC),
               15, message="next_execution_at kept current")
    eventually(lambda: sql(topics.database_url, "SELECT * FROM queue_depth WHERE priority = 'normal'"),
               15, message="queue depth measured")
    assert sql(topics.database_url, "SELECT * FROM worker_utilisation")[0]["capacity"] == 8
    jobs = cli(topics, "jobs")
    assert jobs.returncode == 0 and "often" in jobs.stdout and "100%" in jobs.stdout, jobs.stdout
    workers = cli(topics, "workers")
    assert workers.returncode == 0 and "w1" in workers.stdout and "ACTIVE" in workers.stdout
    runs = cli(topics, "runs", "--limit", "3")
    assert runs.returncode == 0 and "COMPLETED" in runs.stdout
