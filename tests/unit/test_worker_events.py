"""The worker's two events of every execution, rendered without the model, are byte for
byte what the model writes — for any job id, time, attempt, delivery, queue and result."""

from __future__ import annotations

import math
import random
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from cronstream.services.worker.executions import render_event
from cronstream.services.worker.runner import check_result
from cronstream.shared.records import ExecutionEvent, JobDue, JobSnapshot

RESULTS: list[Any] = [
    None, True, 0, -7, 2**70, 0.1, 1e-7, 1.5e300, "", "plain", 'quote " back \\ slash',
    "tab\tnew\nline \x00 \u2028 é ✓ 𝄞", [1, "two", None, [3.25]], {"nested": {"k": [1, 2]}},
    {"é": "ü", "": 0}, {"tuple": (1, 2)}, {"bool": False, "float": -0.0},
]


def _due(rng: random.Random) -> JobDue:
    offset = timezone(timedelta(hours=rng.choice([0, 2, -5])))
    scheduled = datetime(2026, rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 23),
                         rng.randint(0, 59), rng.randint(0, 59),
                         rng.choice([0, 1000, 123456]), tzinfo=offset)
    return JobDue(execution_id=uuid.uuid4(), job_id=rng.choice(["job", "a.b-c_d", "X" * 128]),
                  run_id=uuid.uuid4(), scheduled_at=scheduled, reason="SCHEDULE",
                  attempt_number=rng.randint(1, 1000), delivery=rng.randint(1, 1_000_000),
                  idempotency_key="k",
                  job=JobSnapshot(handler="noop", queue=rng.choice(["default", "q-1_x"]),
                                  priority=rng.choice(["high", "normal", "low"])))


def test_running_and_completed_events_render_as_the_model_writes_them() -> None:
    rng = random.Random(16)
    for i in range(300):
        due = _due(rng)
        event_id = uuid.uuid4()
        occurred = datetime.now(UTC) + timedelta(microseconds=rng.choice([0, 1, 999_999]) * i)
        started = occurred.replace(microsecond=0) if i % 3 == 0 else occurred
        worker = rng.choice(["w1", "host.example:8080@pod-7"])
        running = render_event(due, "RUNNING", event_id, occurred, worker_id=worker,
                               started_at=started)
        assert running == ExecutionEvent.for_due(
            due, "RUNNING", event_id=event_id, occurred_at=occurred, worker_id=worker,
            started_at=started).to_json()
        result = RESULTS[i % len(RESULTS)]
        assert check_result(result).status == "COMPLETED"
        completed_at = started + timedelta(milliseconds=i)
        completed = render_event(due, "COMPLETED", event_id, occurred, worker_id=worker,
                                 started_at=started, completed_at=completed_at, result=result,
                                 progress=100.0, priority=due.job.priority, queue=due.job.queue)
        model = ExecutionEvent.for_due(
            due, "COMPLETED", event_id=event_id, occurred_at=occurred, worker_id=worker,
            started_at=started, completed_at=completed_at, result=result, progress=100.0,
            priority=due.job.priority, queue=due.job.queue)
        assert completed == model.to_json(), result
        assert ExecutionEvent.model_validate_json(completed) == ExecutionEvent.model_validate_json(
            model.to_json())


def test_a_result_json_cannot_hold_is_refused_before_it_is_rendered() -> None:
    assert check_result({"when": datetime.now(UTC)}).status == "FAILED"
    assert check_result("x" * 70_000).status == "FAILED"
    assert check_result(math.pi).status == "COMPLETED"
