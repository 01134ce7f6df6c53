"""A worker's slots without Kafka: a slot is free again when its handler returns, and an
execution stays the worker's own (listed in its heartbeats) from the commit of its start
to the commit of its end."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from cronstream.services.worker.executions import Finished, Running
from cronstream.services.worker.runner import Outcome
from cronstream.services.worker.slots import Slots
from cronstream.shared.records import JobDue, JobSnapshot
from cronstream.shared.telemetry import Hop

NOW = datetime(2026, 12, 4, tzinfo=UTC)


def running() -> Running:
    due = JobDue(execution_id=uuid.uuid4(), job_id="job", run_id=uuid.uuid4(), scheduled_at=NOW,
                 reason="SCHEDULE", idempotency_key="k", job=JobSnapshot(handler="noop"))
    return Running(due, Hop("test", None), NOW)


def test_a_slot_is_free_when_its_handler_returns_and_the_run_listed_until_reported() -> None:
    slots = Slots(2)
    first, second = running(), running()
    slots.committing([first, second])
    assert slots.listed() == [first.due.execution_id, second.due.execution_id]
    slots.committed()
    slots.start(first)
    slots.start(second)
    assert slots.free() == 0
    slots.finish(Finished(first, Outcome("COMPLETED"), NOW))
    assert slots.free() == 1  # free before its end is reported ...
    assert first.due.execution_id in slots.listed()  # ... and still listed as its own
    finished = slots.take_finished()
    slots.give_back(finished)  # the turn did not commit: reported by the next one
    assert slots.has_finished() and slots.free() == 1
    slots.reported(slots.take_finished())
    assert slots.listed() == [second.due.execution_id]
    assert slots.free() == 1
