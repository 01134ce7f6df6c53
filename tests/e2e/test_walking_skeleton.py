"""One job from a plain Kafka producer to PostgreSQL through all four services."""

from __future__ import annotations

import itertools
import json
from datetime import timedelta

from cronstream.shared.records import ExecutionEvent
from cronstream.shared.settings import Settings
from tests.conftest import Processes
from tests.support import eventually, headers, produce_json, read_all, sql, value

SPEC_EVENT_FIELDS = {
    "event_id", "execution_id", "job_id", "run_id", "status", "attempt_number", "scheduled_at",
    "occurred_at", "worker_id", "started_at", "completed_at", "error_message", "result",
    "progress", "progress_message", "schema_version",
}


def test_interval_job_published_by_a_plain_producer_completes_on_its_grid(
    processes: Processes, topics: Settings,
) -> None:
    settings = topics
    processes.system()
    params = {"greeting": "hello", "n": 3, "nested": {"ok": True}}
    produce_json(settings, settings.topics.job_definitions, "every-2s", {
        "job_id": "every-2s", "type": "INTERVAL", "interval_seconds": 2,
        "handler": "noop", "params": params,
    })

    rows = eventually(
        lambda: (r := sql(settings.database_url,
                          "SELECT * FROM job_executions WHERE job_id = 'every-2s' "
                          "AND status = 'COMPLETED' ORDER BY scheduled_at")) and len(r) >= 3 and r,
        timeout=60, message="three COMPLETED executions",
    )
    times = [r["scheduled_at"] for r in rows]
    assert all(b - a == timedelta(seconds=2) for a, b in itertools.pairwise(times)), times
    assert all(t.microsecond == 0 and t.second % 2 == 0 for t in times), "not on the 2 s grid"
    for row in rows:
        assert json.loads(row["result"]) == params
        assert row["worker_id"] == "w1"
        assert row["queued_at"] <= row["started_at"] <= row["completed_at"]
        # Queued ahead of its time, maybe (decision 0027); never started before it.
        assert row["scheduled_at"] <= row["started_at"], row

    first = rows[0]["execution_id"]
    statuses = {r["status"] for r in sql(
        settings.database_url, "SELECT status FROM execution_events WHERE execution_id = $1", first)}
    assert {"QUEUED", "RUNNING", "COMPLETED"} <= statuses

    on_topic = [m for m in read_all(settings, settings.topics.execution_events)
                if json.loads(value(m))["execution_id"] == str(first)]
    assert {json.loads(value(m))["status"] for m in on_topic} >= {"QUEUED", "RUNNING", "COMPLETED"}
    for msg in on_topic:
        body = json.loads(value(msg))
        assert set(body) >= SPEC_EVENT_FIELDS, SPEC_EVENT_FIELDS - set(body)
        assert body["schema_version"] == 1
        ExecutionEvent.model_validate_json(value(msg))
        assert msg.key() == b"every-2s"
        traceparent = headers(msg)["traceparent"]
        assert len(traceparent) == 55 and traceparent.startswith("00-")
    # Every event of one execution belongs to one trace.
    assert len({headers(m)["traceparent"][3:35] for m in on_topic}) == 1
