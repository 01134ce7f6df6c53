"""A worker's slots without Kafka: claimed executions start as slots free, a slot is free
again when its handler returns, an execution stays the worker's own (listed in its
heartbeats) from the commit of its claim to the commit of its end, and how much a turn
claims follows the handlers' durations."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from cronstream.services.worker.executions import Finished, Running
from cronstream.services.worker.runner import Outcome
from cronstream.services.worker.slots import CLAIM_AT_MOST, Slots
from cronstream.shared.records import JobDue, JobSnapshot
from cronstream.shared.telemetry import Hop

NOW = datetime(2026, 12, 4, tzinfo=UTC)


def running() -> Running:
    due = JobDue(execution_id=uuid.uuid4(), job_id="job", run_id=uuid.uuid4(), scheduled_at=NOW,
                 reason="SCHEDULE", idempotency_key="k", job=JobSnapshot(handler="noop"))
    return Running(due, Hop("test", None), NOW)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def done(run: Running) -> Finished:
    return Finished(run, Outcome("COMPLETED"), NOW)


def test_claims_start_as_slots_free_and_stay_listed_until_their_end_is_reported() -> None:
    slots = Slots(2)
    claims = [running() for _ in range(3)]
    ids = [run.due.execution_id for run in claims]
    slots.committing(claims)
    assert slots.listed() == ids  # listed while the claim commits ...
    slots.committed()
    for run in claims:
        slots.claim(run)
    started = [slots.next_start(), slots.next_start()]
    assert started == claims[:2] and slots.next_start() is None  # two slots
    assert slots.free() == 0 and slots.listed() == ids  # ... and the waiting one too
    slots.finish(done(claims[0]), 0.01)
    assert slots.free() == 1  # free before its end is reported
    assert slots.next_start() is claims[2]
    finished = slots.take_finished()
    slots.give_back(finished)  # the turn did not commit: reported by the next one
    assert slots.has_finished() and claims[0].due.execution_id in slots.listed()
    slots.reported(slots.take_finished())
    assert slots.listed() == ids[1:]


def test_a_turn_claims_what_the_slots_will_run_before_the_turn_after_next() -> None:
    clock = Clock()
    slots = Slots(8, clock)
    assert slots.claimable(0.1) == 8  # nothing known of the handlers: the free slots
    slots.claim(running())
    assert slots.claimable(0.1) == 7  # one claimed waits for a slot already
    slots.next_start()
    slots.duration = 0.02  # 20 ms handlers: each slot runs five before the turn after next
    assert slots.claimable(0.1) == 7 + 8 * 5
    slots.duration = 10.0  # long handlers: nothing claimed ahead, nothing hoarded
    assert slots.claimable(0.1) == 7
    slots.duration = 0.000_01  # inline no-ops: bounded
    assert slots.claimable(0.1) == 7 + CLAIM_AT_MOST


def test_slots_held_by_runs_longer_than_usual_claim_nothing_ahead() -> None:
    """Short handlers so far, and every slot now held by a long one: claiming ahead would
    leave executions waiting behind it while another worker idles."""
    clock = Clock()
    slots = Slots(4, clock)
    slots.duration = 0.001
    for _ in range(4):
        slots.claim(running())
        slots.next_start()
    assert slots.claimable(0.1) > 0  # just begun: they will free as usual
    clock.now += 5.0  # they outlast the usual duration many times over
    assert slots.claimable(0.1) == 0


def test_the_duration_follows_the_handlers_that_ran_not_those_that_never_began() -> None:
    slots = Slots(4)
    runs = [running() for _ in range(3)]
    for run in runs:
        slots.claim(run)
        slots.next_start()
    slots.finish(done(runs[0]), 1.0)
    assert slots.duration == 1.0
    slots.finish(done(runs[1]), None)  # cancelled before it began
    assert slots.duration == 1.0 and slots.free() == 3
    slots.finish(done(runs[2]), 3.0)
    assert 1.0 < slots.duration < 3.0
