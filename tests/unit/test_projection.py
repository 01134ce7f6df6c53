"""The monitor's fold: terminal states are final, stale deliveries are ignored."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from cronstream.services.monitor.projection import fold
from cronstream.shared.records import ExecutionEvent, ExecutionStatus

T0 = datetime(2026, 6, 1, 12, tzinfo=UTC)
EXECUTION, RUN = uuid.uuid4(), uuid.uuid4()


def event(status: ExecutionStatus, second: int, **fields: Any) -> ExecutionEvent:
    return ExecutionEvent(event_id=uuid.uuid4(), execution_id=EXECUTION, job_id="j", run_id=RUN,
                          status=status, attempt_number=1, scheduled_at=T0,
                          occurred_at=T0 + timedelta(seconds=second), **fields)


def test_lifecycle_accumulates_fields() -> None:
    patch = fold([
        event("QUEUED", 0, priority="high", queue="q"),
        event("RUNNING", 1, worker_id="w1", started_at=T0 + timedelta(seconds=1)),
        event("PROGRESS", 2, worker_id="w1", progress=40, progress_message="half"),
        event("COMPLETED", 3, worker_id="w1", result={"ok": 1}, progress=100),
    ])[EXECUTION]
    assert (patch.status, patch.worker_id, patch.priority, patch.queue, patch.progress) == (
        "COMPLETED", "w1", "high", "q", 100)
    assert patch.queued_at == T0 and patch.started_at == T0 + timedelta(seconds=1)
    assert patch.completed_at == T0 + timedelta(seconds=3) and patch.result == '{"ok":1}'


def test_started_at_is_when_the_handler_began_not_when_it_was_claimed() -> None:
    """A worker claims ahead (decision 0029): its RUNNING says when it claimed the
    execution, its end says when the handler began, which the row keeps."""
    claimed, began = T0 + timedelta(seconds=1), T0 + timedelta(seconds=1.08)
    patch = fold([event("RUNNING", 1, worker_id="w1", started_at=claimed),
                  event("COMPLETED", 2, worker_id="w1", started_at=began)])[EXECUTION]
    assert patch.started_at == began
    patch = fold([event("RUNNING", 1, worker_id="w1", started_at=claimed)])[EXECUTION]
    assert patch.started_at == claimed  # until then, the claim


def test_terminal_is_final() -> None:
    patch = fold([event("RUNNING", 1, worker_id="w1"), event("CANCELLED", 2, worker_id="w1"),
                  event("COMPLETED", 3, worker_id="w1")])[EXECUTION]
    assert patch.status == "CANCELLED"


def test_a_zombie_report_of_an_older_delivery_is_ignored() -> None:
    patch = fold([
        event("RUNNING", 1, worker_id="w1"),
        event("PROGRESS", 2, worker_id="w1", progress=40),
        event("REQUEUED", 3, delivery=2),
        event("RUNNING", 4, worker_id="w2", delivery=2),
        event("COMPLETED", 5, worker_id="w1", delivery=1),
    ])[EXECUTION]
    assert (patch.status, patch.delivery, patch.worker_id, patch.progress) == ("RUNNING", 2, "w2", None)


def test_progress_alone_means_running() -> None:
    patch = fold([event("PROGRESS", 1, worker_id="w1", progress=10)])[EXECUTION]
    assert patch.status == "RUNNING" and patch.last_event == "PROGRESS"


def test_the_projection_batches_a_second_apart_only_under_load() -> None:
    """Under load the monitor's batches come a second apart, so that an execution's
    events (QUEUED ~0.2 s before its end) are mostly one row written once; light, every
    250 ms, so that the dashboards and DAG steps follow closely."""
    from cronstream.services.monitor.service import (
        BATCH_GAP_SECONDS,
        BUSY_BATCH_GAP_SECONDS,
        BUSY_RECORDS_PER_SECOND,
        batch_gap,
    )
    assert batch_gap(10, 0.25) == BATCH_GAP_SECONDS
    assert batch_gap(int(BUSY_RECORDS_PER_SECOND * 0.25), 0.25) == BUSY_BATCH_GAP_SECONDS
    assert batch_gap(9_000, 1.0) == BUSY_BATCH_GAP_SECONDS  # 3,000 executions/s
    assert batch_gap(3_000, 1.0) == BATCH_GAP_SECONDS  # the load dropped: back to 250 ms
