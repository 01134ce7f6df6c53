"""`cronstream analytics` against the real broker: each windowed alert fires once per
episode, resolves once, and a restart mid-window raises no duplicate."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from cronstream.shared.records import Alert
from cronstream.shared.settings import Settings
from tests.conftest import Processes
from tests.support import ServiceProcess, cli, eventually, produce_json, read_all, sql, value

HANDLERS = ("--import", "tests.e2e.analytics_handlers")
FAST = {
    "CRONSTREAM_ANALYTICS_LOOKBACK_SECONDS": "120",
    "CRONSTREAM_ANALYTICS_WINDOW_SECONDS": "60",
    "CRONSTREAM_ANALYTICS_RECENT_RUNS": "3",
    "CRONSTREAM_ANALYTICS_BASELINE_RUNS": "10",
    "CRONSTREAM_ANALYTICS_QUEUE_WINDOW_SECONDS": "2",
    "CRONSTREAM_ANALYTICS_QUEUE_WINDOWS": "3",
}


def start_analytics(processes: Processes, name: str = "analytics") -> ServiceProcess:
    proc = processes.start("analytics", name=name, extra_env=FAST)
    proc.wait_for_log("action=analytics_caught_up")
    return proc


def alerts(settings: Settings, kind: str, subject: str | None = None) -> list[Alert]:
    found = [Alert.model_validate_json(value(m)) for m in read_all(settings, settings.topics.alerts)]
    return [a for a in found if a.kind == kind and subject in (None, a.job_id, a.queue)]


def states(settings: Settings, kind: str, subject: str) -> list[str]:
    return [a.state for a in alerts(settings, kind, subject)]


def define(settings: Settings, job_id: str, **fields: Any) -> None:
    produce_json(settings, settings.topics.job_definitions, job_id, {"job_id": job_id, **fields})


def finished(settings: Settings, job_id: str, *statuses: str) -> int:
    return len(sql(settings.database_url, "SELECT 1 FROM job_executions WHERE job_id = $1 "
                   "AND status = ANY($2::text[])", job_id, list(statuses)))


def projected(settings: Settings, alert: Alert) -> Any:
    rows = sql(settings.database_url, "SELECT state, evidence FROM alerts WHERE alert_id = $1",
               alert.alert_id)
    return rows[0] if rows else None


def test_a_falling_success_rate_fires_once_survives_a_restart_and_resolves_once(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    flag = tmp_path / "failing"
    flag.touch()
    processes.system(worker_args=HANDLERS)
    analytics = start_analytics(processes)
    define(topics, "flaky", type="INTERVAL", interval_seconds=1, handler="test.fail-while-flagged",
           params={"path": str(flag)},
           alerts={"success_rate_percent": 80, "min_runs": 4, "window_seconds": 8})
    eventually(lambda: states(topics, "SUCCESS_RATE_LOW", "flaky") == ["FIRING"], 40,
               message="one FIRING once the window holds 4 failures")
    firing = alerts(topics, "SUCCESS_RATE_LOW", "flaky")[0]
    assert firing.evidence["success_rate_percent"] < 80 and firing.evidence["finished"] >= 4
    assert firing.severity == "error" and "flaky" in (firing.summary or "")

    # Killed mid-window (no chance to clean up), restarted: it replays the window, finds
    # the episode open on the alerts topic, and raises nothing new while still failing.
    analytics.signal(signal.SIGKILL)
    analytics.proc.wait(10)
    restarted = start_analytics(processes, name="analytics-2")
    failed = ("FAILED", "PERMANENTLY_FAILED")
    failures_after_restart = finished(topics, "flaky", *failed) + 3
    eventually(lambda: finished(topics, "flaky", *failed) >= failures_after_restart, 20,
               message="three more failures judged by the restarted service")
    restarted.wait_for_log("action=analytics_caught_up")
    assert states(topics, "SUCCESS_RATE_LOW", "flaky") == ["FIRING"]

    flag.unlink()  # the job recovers; the failures leave the 8 s window
    eventually(lambda: states(topics, "SUCCESS_RATE_LOW", "flaky") == ["FIRING", "RESOLVED"], 40,
               message="one RESOLVED once the window is healthy again")
    resolved = alerts(topics, "SUCCESS_RATE_LOW", "flaky")[1]
    assert resolved.alert_id == firing.alert_id
    assert resolved.evidence["success_rate_percent"] >= 80
    eventually(lambda: (r := projected(topics, firing)) and r["state"] == "RESOLVED", 20,
               message="the monitor projects the episode as RESOLVED")
    shown = cli(topics, "alerts", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    episode = [a for a in json.loads(shown.stdout) if a["alert_id"] == str(firing.alert_id)]
    assert [(a["kind"], a["state"], a["job_id"]) for a in episode] == [
        ("SUCCESS_RATE_LOW", "RESOLVED", "flaky")]


def test_a_job_whose_duration_triples_raises_a_regression_alert(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    told = tmp_path / "seconds"
    told.write_text("0.2")
    processes.system(worker_args=HANDLERS)
    start_analytics(processes)
    define(topics, "steady", type="INTERVAL", interval_seconds=1, handler="test.sleep-as-told",
           params={"path": str(told)}, alerts={"duration_factor": 2})
    eventually(lambda: finished(topics, "steady", "COMPLETED") >= 5, 30,
               message="a baseline of five runs")
    assert alerts(topics, "DURATION_REGRESSION") == []
    told.write_text("0.8")  # four times slower
    eventually(lambda: states(topics, "DURATION_REGRESSION", "steady") == ["FIRING"], 40,
               message="a regression alert")
    alert = alerts(topics, "DURATION_REGRESSION", "steady")[0]
    assert alert.evidence["factor"] > 2
    assert alert.evidence["recent_p95_seconds"] >= 0.8 > alert.evidence["baseline_p95_seconds"]
    assert alert.severity == "warning"


def test_a_queue_without_workers_raises_a_growth_alert_until_a_worker_drains_it(
    processes: Processes, topics: Settings,
) -> None:
    services = processes.system(workers=0)
    start_analytics(processes)
    for i in range(3):
        define(topics, f"orphan-{i}", type="INTERVAL", interval_seconds=1, handler="noop",
               queue="orphan")
    eventually(lambda: states(topics, "QUEUE_GROWING", "orphan") == ["FIRING"], 40,
               message="a queue-growth alert for the queue nobody serves")
    alert = alerts(topics, "QUEUE_GROWING", "orphan")[0]
    depths = alert.evidence["depths"]
    assert alert.evidence["priority"] == "normal" and depths == sorted(depths) and depths[-1] > depths[0]
    assert alert.job_id is None and alert.queue == "orphan"

    processes.worker("w1", "--queues", "orphan", "--concurrency", "8")
    eventually(lambda: states(topics, "QUEUE_GROWING", "orphan") == ["FIRING", "RESOLVED"], 40,
               message="resolved once a worker drains the queue")
    assert services["scheduler"].alive()


def test_a_missed_cron_fire_raises_a_late_alert_that_resolves_when_the_scheduler_returns(
    processes: Processes, topics: Settings,
) -> None:
    services = processes.system()
    start_analytics(processes)
    define(topics, "every-2s", type="CRON", schedule="*/2 * * * * *", handler="noop",
           alerts={"late_after_seconds": 2})
    eventually(lambda: finished(topics, "every-2s", "COMPLETED") >= 2, 30,
               message="the job fires on time")
    assert alerts(topics, "FIRE_LATE") == []
    assert services["scheduler"].stop() == 0  # no scheduler: the next fire is missed
    eventually(lambda: states(topics, "FIRE_LATE", "every-2s") == ["FIRING"], 30,
               message="a late alert")
    alert = alerts(topics, "FIRE_LATE", "every-2s")[0]
    assert alert.evidence["phase"] == "start" and alert.evidence["reason"] == "scheduler_down"

    processes.start("scheduler", "--instance-id", "s1", name="scheduler-2")
    eventually(lambda: states(topics, "FIRE_LATE", "every-2s") == ["FIRING", "RESOLVED"], 60,
               message="resolved once the scheduler fires again")
    assert alerts(topics, "FIRE_LATE", "every-2s")[1].alert_id == alert.alert_id
