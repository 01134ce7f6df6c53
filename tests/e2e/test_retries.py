"""Retries: exponential backoff with jitter, permanent failure with one alert, timeouts
retried like failures, errors that are never retried, cancelling a pending retry."""

from __future__ import annotations

import json
import time
from functools import partial
from typing import Any

from cronstream.shared.settings import Settings
from tests.conftest import Processes
from tests.support import cli, eventually, read_all, run_now, sql, value


def attempts(settings: Settings, job_id: str) -> list[Any]:
    return sql(settings.database_url, "SELECT * FROM job_executions WHERE job_id = $1 "
               "ORDER BY attempt_number", job_id)


def has_statuses(settings: Settings, job_id: str, wanted: list[str]) -> bool:
    return statuses(settings, job_id) == wanted


def statuses(settings: Settings, job_id: str) -> list[str]:
    return [r["status"] for r in attempts(settings, job_id)]


def test_backoff_doubles_with_jitter_and_retries_start_on_time(
    processes: Processes, topics: Settings,
) -> None:
    processes.system()
    run_now(topics, "flaky", "fail", params={"succeed_on_attempt": 3},
            max_retries=3, retry_delay_seconds=1)
    eventually(lambda: statuses(topics, "flaky") == ["FAILED", "FAILED", "COMPLETED"], 40,
               message="attempts 1, 2, 3")
    rows = attempts(topics, "flaky")
    assert [r["attempt_number"] for r in rows] == [1, 2, 3]
    assert len({r["run_id"] for r in rows}) == 1, "one run"
    for previous, following, (low, high) in ((rows[0], rows[1], (0.8, 1.2)),
                                             (rows[1], rows[2], (1.6, 2.4))):
        gap = (following["scheduled_at"] - previous["completed_at"]).total_seconds()
        assert low - 0.002 <= gap <= high + 0.002, f"gap {gap:.3f}s outside {low}-{high}"
        late = (following["started_at"] - following["scheduled_at"]).total_seconds()
        assert late < 0.75, f"retry started {late:.2f}s late"
    assert json.loads(rows[2]["result"]) == {"succeeded_on_attempt": 3}
    dues = [json.loads(value(m)) for m in read_all(topics, topics.topics.job_due)]
    assert {d["idempotency_key"] for d in dues if d["job_id"] == "flaky"} == {dues[0]["idempotency_key"]}
    assert [d["reason"] for d in dues if d["job_id"] == "flaky"] == ["SCHEDULE", "RETRY", "RETRY"]


def test_always_failing_ends_permanently_failed_with_one_alert(
    processes: Processes, topics: Settings,
) -> None:
    services = processes.system()
    run_now(topics, "doomed", "fail", params={"message": "boom"}, max_retries=2,
            retry_delay_seconds=0.2)
    eventually(lambda: statuses(topics, "doomed") == ["FAILED", "FAILED", "PERMANENTLY_FAILED"], 30,
               message="FAILED, FAILED, PERMANENTLY_FAILED")
    last = attempts(topics, "doomed")[-1]
    assert last["error_message"] == "RuntimeError: boom"
    alerts = eventually(lambda: read_all(topics, topics.topics.alerts), 15, message="an alert")
    assert len(alerts) == 1
    alert = json.loads(value(alerts[0]))
    assert (alert["kind"], alert["job_id"], alert["execution_id"], alert["attempt_number"]) == (
        "EXECUTION_PERMANENTLY_FAILED", "doomed", str(last["execution_id"]), 3)
    assert "action=alert_raised" in services["monitor"].log()


def test_a_timeout_is_retried_like_a_failure(processes: Processes, topics: Settings) -> None:
    processes.system()
    run_now(topics, "stuck", "test.block", timeout_seconds=1, max_retries=1, retry_delay_seconds=0.2)
    eventually(lambda: statuses(topics, "stuck") == ["TIMED_OUT", "PERMANENTLY_FAILED"], 30,
               message="TIMED_OUT then PERMANENTLY_FAILED")
    assert "timed out after 1s" in attempts(topics, "stuck")[-1]["error_message"]


def test_non_retryable_errors_are_not_retried(processes: Processes, topics: Settings) -> None:
    processes.system()
    run_now(topics, "refused", "test.refuse", max_retries=3, retry_delay_seconds=0.2)
    run_now(topics, "bad-params", "sleep", params={"seconds": "soon"}, max_retries=3,
            retry_delay_seconds=0.2)
    for job_id in ("refused", "bad-params"):
        eventually(partial(has_statuses, topics, job_id, ["PERMANENTLY_FAILED"]), 30,
                   message=f"{job_id} fails for good")
    run_now(topics, "marker", "noop")  # by the time this completes, a retry would have fired
    eventually(lambda: statuses(topics, "marker") == ["COMPLETED"], 30, message="marker")
    time_of_marker = attempts(topics, "marker")[0]["completed_at"]
    assert (time_of_marker - attempts(topics, "refused")[0]["completed_at"]).total_seconds() > 0
    assert statuses(topics, "refused") == ["PERMANENTLY_FAILED"]
    assert "params.seconds must be a non-negative number" in attempts(topics, "bad-params")[0]["error_message"]
    assert not [m for m in read_all(topics, topics.topics.retries) if m.value() is not None]


def test_cancelling_a_failed_execution_cancels_its_pending_retry(
    processes: Processes, topics: Settings,
) -> None:
    processes.system()
    run_now(topics, "later", "fail", max_retries=2, retry_delay_seconds=3)
    first = eventually(lambda: (r := attempts(topics, "later")) and r[0]["status"] == "FAILED" and r[0],
                       30, message="the first attempt fails")
    done = cli(topics, "cancel", str(first["execution_id"]))
    assert done.returncode == 0, done.stderr
    assert "cancelled the pending retry (attempt 2" in done.stdout
    retry_due = first["completed_at"].timestamp() + 3.6  # the latest the retry could fire
    eventually(lambda: time.time() > retry_due + 2, 15, message="the retry's time has passed")
    rows = attempts(topics, "later")
    assert [r["status"] for r in rows] == ["FAILED", "CANCELLED"]
    assert "pending retry cancelled" in rows[1]["error_message"]
    assert not [m for m in read_all(topics, topics.topics.job_due)
                if json.loads(value(m))["attempt_number"] == 2]
