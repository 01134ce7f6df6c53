"""The scheduler's clock: plans, commits, restores, misfires, retries and takeover."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronstream.services.scheduler.clock import Clock, JobClock, render_due, render_state
from cronstream.shared.ids import execution_id
from cronstream.shared.records import (
    JobDefinition,
    JobDue,
    JobSnapshot,
    RetryRequest,
    SchedulerState,
)
from cronstream.shared.schedule import from_epoch_ms, to_epoch_ms

T0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)


def ms(t: datetime) -> int:
    return to_epoch_ms(t)


def definition(job_id: str = "j", **fields: Any) -> JobDefinition:
    base = {"job_id": job_id, "type": "INTERVAL", "interval_seconds": 10, "handler": "noop"}
    return JobDefinition(**{**base, **fields})


def clock_with(d: JobDefinition, observed: datetime = T0) -> Clock:
    clock = Clock()
    clock.apply_definition(d.job_id, d, d.to_json(), offset=0, observed_ms=ms(observed))
    return clock


def test_fires_at_the_instant_and_advances_only_on_commit() -> None:
    clock = clock_with(definition())
    assert clock.next_due_ms() == ms(T0)
    assert not clock.plan(ms(T0) - 1)
    plan = clock.plan(ms(T0))
    assert [d.scheduled_ms for d in plan.dues] == [ms(T0)]
    assert plan.dues[0].execution_id == str(execution_id("j", T0, 1))
    assert plan.states[0].next_fire_ms == ms(T0 + timedelta(seconds=10))
    clock.restore(plan)  # aborted: the same fire comes again
    again = clock.plan(ms(T0))
    assert [d.execution_id for d in again.dues] == [d.execution_id for d in plan.dues]
    clock.commit(again)
    assert clock.next_due_ms() == ms(T0 + timedelta(seconds=10))
    assert not clock.plan(ms(T0 + timedelta(seconds=9)))


def test_allow_jobs_fire_ahead_the_others_and_retries_when_due() -> None:
    clock = Clock()
    for d in (definition("allow"), definition("forbid", concurrency_policy="FORBID"),
              definition("replace", concurrency_policy="REPLACE")):
        clock.apply_definition(d.job_id, d, d.to_json(), offset=0, observed_ms=ms(T0))
    clock.add_retry(RetryRequest(
        execution_id=uuid.uuid4(), job_id="allow", run_id=uuid.uuid4(), scheduled_at=T0,
        attempt_number=2, reason="RETRY", idempotency_key="k", job=JobSnapshot(handler="noop"),
        due_at=T0))
    before = ms(T0) - 100
    assert not clock.plan(before, ahead_ms=99)  # nothing due within the window
    plan = clock.plan(before, ahead_ms=150)
    assert [(d.job_id, d.scheduled_ms) for d in plan.dues] == [("allow", ms(T0))]
    assert [json.loads(d.value)["scheduled_at"] for d in plan.dues] == ["2026-06-01T12:00:00Z"]
    clock.commit(plan)
    # Held back, not lost: each of the others fires once it is due.
    assert clock.next_due_ms() == ms(T0)
    assert not clock.plan(ms(T0) - 1, ahead_ms=150)
    due = clock.plan(ms(T0), ahead_ms=150)
    assert sorted(d.job_id for d in due.dues) == ["allow", "forbid", "replace"]
    assert len(due.fired_retries) == 1
    assert ms(T0 + timedelta(seconds=10)) not in [d.scheduled_ms for d in due.dues]


def test_the_next_round_waits_longer_only_while_everything_fires_ahead() -> None:
    """A round that committed only fires ahead of their time lets the next one wait the
    long gap; a timer that waits for its time shortens that gap to its instant (never
    below the short gap); a round that fired something already due keeps the short gap."""
    from cronstream.services.scheduler.leader import (
        AHEAD_ROUND_GAP_SECONDS,
        ROUND_GAP_SECONDS,
        next_round_gap,
    )
    clock = Clock()
    for d in (definition("allow", start_at=T0),
              definition("forbid", concurrency_policy="FORBID", start_at=T0 - timedelta(milliseconds=30))):
        clock.apply_definition(d.job_id, d, d.to_json(), offset=0, observed_ms=ms(T0) - 300)
    now = ms(T0) - 100
    plan = clock.plan(now, ahead_ms=300)
    assert [d.job_id for d in plan.dues] == ["allow"]  # ahead; the FORBID job waits for its time
    assert plan.held_ms == now + 70
    assert ROUND_GAP_SECONDS < 0.07 < AHEAD_ROUND_GAP_SECONDS
    assert next_round_gap(plan, now) == pytest.approx(0.07)  # the next round: at its time
    clock.commit(plan)
    due = clock.plan(now + 70, ahead_ms=300)
    assert [d.job_id for d in due.dues] == ["forbid"]
    assert next_round_gap(due, now + 70) == ROUND_GAP_SECONDS
    alone = clock_with(definition("alone"))
    ahead = alone.plan(ms(T0) - 200, ahead_ms=300)
    assert ahead.dues and ahead.held_ms is None
    assert next_round_gap(ahead, ms(T0) - 200) == AHEAD_ROUND_GAP_SECONDS
    alone.restore(ahead)
    assert next_round_gap(alone.plan(ms(T0), ahead_ms=300), ms(T0)) == ROUND_GAP_SECONDS


def test_rounds_that_only_fire_ahead_are_spaced_by_the_window_less_a_margin() -> None:
    """Each fire is still committed at least the margin before its time, and a process of
    many shards commits fewer transactions the wider the window (decision 0027)."""
    from cronstream.services.scheduler.leader import (
        AHEAD_MARGIN_SECONDS,
        AHEAD_ROUND_GAP_MAX_SECONDS,
        AHEAD_ROUND_GAP_SECONDS,
        ahead_round_gap,
        next_round_gap,
    )
    assert ahead_round_gap(300) == pytest.approx(0.3 - AHEAD_MARGIN_SECONDS)  # the default
    assert ahead_round_gap(150) == AHEAD_ROUND_GAP_SECONDS  # never below the old gap
    assert ahead_round_gap(1000) == AHEAD_ROUND_GAP_MAX_SECONDS
    for window in range(100, 1001, 50):  # the committed fire keeps the margin
        gap = ahead_round_gap(window)
        assert window / 1000 - gap >= min(AHEAD_MARGIN_SECONDS, window / 1000 - AHEAD_ROUND_GAP_SECONDS)
    alone = clock_with(definition("alone"))
    ahead = alone.plan(ms(T0) - 200, ahead_ms=300)
    assert next_round_gap(ahead, ms(T0) - 200, ahead_round_gap(300)) == pytest.approx(0.2)


def late(clock: Clock, seconds: float) -> list[datetime]:
    plan = clock.plan(ms(T0 + timedelta(seconds=seconds)))
    clock.commit(plan)
    return [from_epoch_ms(d.scheduled_ms) for d in plan.dues]


def test_a_job_prepared_ahead_fires_exactly_as_one_that_was_not() -> None:
    """The leader's prepare loop renders a job's next fire and the one after it ahead of
    time; a plan uses them only while they still hold (the same instant, nothing later
    also due), and what it commits is byte for byte what it computes unprepared."""
    def planned(prepare: bool, now: datetime, d: JobDefinition) -> tuple[list[Any], list[Any]]:
        clock = clock_with(d)
        if prepare:
            clock.prepare(clock.jobs[d.job_id])
        plan = clock.plan(ms(now))
        clock.commit(plan)
        return ([(f.scheduled_ms, f.execution_id, f.value) for f in plan.dues],
                [(c.value, c.next_fire_ms, clock.next_due_ms()) for c in plan.states])

    cases = [(T0, definition()),  # the prepared instant
             (T0 + timedelta(seconds=25), definition()),  # later instants also due: computed
             (T0, JobDefinition(job_id="cron", type="CRON", schedule="*/5 * * * *", timezone="Europe/Berlin", handler="noop")),
             (T0, JobDefinition(job_id="once", type="ONE_TIME", run_at=T0, handler="noop"))]
    for now, d in cases:
        assert planned(True, now, d) == planned(False, now, d)
        assert planned(True, now, d)[0], d.job_id  # each case fires
    # Prepared for an instant that is no longer the next: computed again, not reused.
    clock = clock_with(definition())
    job = clock.jobs["j"]
    clock.prepare(job)
    clock.commit(clock.plan(ms(T0)))
    plan = clock.plan(ms(T0 + timedelta(seconds=10)))
    assert [d.scheduled_ms for d in plan.dues] == [ms(T0 + timedelta(seconds=10))]
    assert plan.states[0].next_fire_ms == ms(T0 + timedelta(seconds=20))


def test_late_within_grace_fires_normally() -> None:
    """Every instant missed by less than the grace is fired, whatever the policy, and all
    of them in one plan: a short outage's backlog does not go out one fire per job per
    round (it took a chaos run's broker restart 24 rounds to catch up)."""
    clock = clock_with(definition(misfire_policy="SKIP", misfire_grace_seconds=60))
    assert late(clock, 30) == [T0 + timedelta(seconds=s) for s in (0, 10, 20, 30)]
    assert clock.next_due_ms() == ms(T0 + timedelta(seconds=40))
    capped = clock_with(definition(misfire_policy="FIRE_ONCE", misfire_grace_seconds=60))
    plan = capped.plan(ms(T0 + timedelta(seconds=30)), limit=2)
    assert [from_epoch_ms(d.scheduled_ms) for d in plan.dues] == [T0, T0 + timedelta(seconds=10)]
    capped.commit(plan)
    assert late(capped, 30) == [T0 + timedelta(seconds=20), T0 + timedelta(seconds=30)]
    counted = clock_with(definition(misfire_policy="SKIP", misfire_grace_seconds=60, max_runs=3))
    assert late(counted, 50) == [T0 + timedelta(seconds=s) for s in (0, 10, 20)]
    assert counted.next_due_ms() is None


def test_misfire_fire_once_fires_the_first_missed_instant_then_resumes_after_now() -> None:
    clock = clock_with(definition(misfire_policy="FIRE_ONCE", misfire_grace_seconds=5))
    assert late(clock, 95) == [T0]
    assert clock.next_due_ms() == ms(T0 + timedelta(seconds=100))


def test_misfire_fire_all_fires_every_missed_instant() -> None:
    clock = clock_with(definition(misfire_policy="FIRE_ALL", misfire_grace_seconds=5))
    assert late(clock, 95) == [T0 + timedelta(seconds=s) for s in range(0, 100, 10)]
    assert clock.next_due_ms() == ms(T0 + timedelta(seconds=100))


def test_misfire_skip_fires_nothing_and_resumes_after_now() -> None:
    clock = clock_with(definition(misfire_policy="SKIP", misfire_grace_seconds=5))
    assert late(clock, 95) == []
    assert clock.next_due_ms() == ms(T0 + timedelta(seconds=100))


def test_pause_update_and_delete() -> None:
    d = definition()
    clock = clock_with(d)
    clock.commit(clock.plan(ms(T0)))
    paused = d.model_copy(update={"enabled": False})
    change = clock.apply_definition("j", paused, paused.to_json(), 1, ms(T0 + timedelta(seconds=1)))
    assert change.next_fire_ms is None and clock.next_due_ms() is None
    resumed = d.model_copy(update={"interval_seconds": 60})
    clock.apply_definition("j", resumed, resumed.to_json(), 2, ms(T0 + timedelta(seconds=75)))
    assert clock.next_due_ms() == ms(T0 + timedelta(seconds=120)), "resumes from now, new interval"
    tombstone = clock.apply_definition("j", None, None, 3, ms(T0 + timedelta(seconds=80)))
    assert tombstone.value is None and clock.next_due_ms() is None


def test_an_invalid_definition_suspends_the_job() -> None:
    clock = clock_with(definition())
    change = clock.apply_definition("j", None, b'{"job_id": 5}', 1, ms(T0))
    assert change.value is not None and change.next_fire_ms is None
    assert clock.next_due_ms() is None


def state(job_id: str, offset: int, next_at: datetime | None, last_at: datetime | None = None) -> bytes:
    return SchedulerState(job_id=job_id, definition_offset=offset,
                          next_fire_ms=None if next_at is None else ms(next_at),
                          last_fire_ms=None if last_at is None else ms(last_at)).to_json()


def test_takeover_trusts_matching_state_and_recomputes_stale_state() -> None:
    trusted, stale = definition("trusted"), definition("stale", interval_seconds=30)
    clock = Clock()
    clock.load_state("trusted", state("trusted", 0, T0 + timedelta(seconds=7)))
    clock.load_state("stale", state("stale", 0, T0, T0 - timedelta(seconds=30)))
    clock.load_state("gone", state("gone", 0, T0))
    clock.load_state("garbage", b"not json")
    clock.load_definition("trusted", trusted.to_json(), 0, ms(T0))
    clock.load_definition("stale", stale.to_json(), 1, ms(T0))
    changes = {c.job_id: c for c in clock.reconcile()}
    assert set(changes) == {"stale", "gone"}, "matching state needs no new record"
    recomputed = SchedulerState.model_validate_json(changes["stale"].value or b"")
    assert recomputed.next_fire_ms == ms(T0) and recomputed.definition_offset == 1
    assert changes["gone"].value is None
    assert clock.jobs["trusted"]._definition is None, "trusted jobs are not even parsed"
    assert clock.next_due_ms() == ms(T0)


@pytest.mark.parametrize("fire", [T0, T0 + timedelta(milliseconds=123)])
def test_fast_renderers_match_the_models_byte_for_byte(fire: datetime) -> None:
    for params in ({"idempotency_key": 'x"y', "n": [1, 2.5, None]}, {"n": 1}):
        check_render(definition(params=params, priority="high"), fire)


def check_render(d: JobDefinition, fire: datetime) -> None:
    job = JobClock("j", 5, d.to_json())
    rendered = render_due(job, ms(fire))
    expected = JobDue.first(d, fire, "SCHEDULE", definition_offset=5)
    assert rendered.value == expected.to_json()
    assert json.loads(rendered.value)["job"]["definition_offset"] == 5, "names its definition"
    assert rendered.execution_id == str(expected.execution_id)
    for next_ms, last_ms in ((ms(fire), None), (None, ms(fire))):
        model = SchedulerState(job_id="j", definition_offset=7, next_fire_ms=next_ms, last_fire_ms=last_ms)
        assert render_state("j", 7, next_ms, last_ms) == model.to_json()
        for calendar_offset, runs in ((12, 3), (None, 0), (0, None)):
            model = SchedulerState(job_id="j", definition_offset=7, next_fire_ms=next_ms,
                                   last_fire_ms=last_ms, calendar_offset=calendar_offset, runs=runs)
            assert render_state("j", 7, next_ms, last_ms, calendar_offset=calendar_offset,
                                runs=runs) == model.to_json()
    assert json.loads(rendered.value)["job"]["priority"] == "high"


def test_retries_fire_once_and_can_be_cancelled() -> None:
    clock = Clock()
    snapshot = JobSnapshot(handler="noop")
    requests = [RetryRequest(execution_id=uuid.uuid4(), job_id="j", run_id=uuid.uuid4(),
                             scheduled_at=T0 + timedelta(seconds=i), attempt_number=2,
                             reason="RETRY", idempotency_key="k", job=snapshot,
                             due_at=T0 + timedelta(seconds=i)) for i in range(3)]
    for r in requests:
        clock.add_retry(r)
    clock.cancel_retry(requests[1].execution_id)
    plan = clock.plan(ms(T0 + timedelta(seconds=5)))
    assert [d.execution_id for d in plan.dues] == [str(requests[0].execution_id), str(requests[2].execution_id)]
    assert all(json.loads(d.value)["reason"] == "RETRY" for d in plan.dues)
    clock.commit(plan)
    assert not clock.plan(ms(T0 + timedelta(seconds=60)))


def test_a_burst_is_planned_in_bounded_batches() -> None:
    clock = Clock()
    for i in range(25):
        d = definition(f"j{i}", interval_seconds=60)
        clock.apply_definition(d.job_id, d, d.to_json(), i, ms(T0))
    first = clock.plan(ms(T0), limit=10)
    assert len(first.dues) == 10
    clock.commit(first)
    rest = clock.plan(ms(T0), limit=100)
    assert len(rest.dues) == 15
    assert {d.job_id for d in first.dues}.isdisjoint({d.job_id for d in rest.dues})


def test_the_dag_index_follows_updates_and_deletes() -> None:
    clock = clock_with(definition("root"))
    a = JobDefinition(job_id="a", type="DEPENDENT", depends_on=["root"], handler="noop")
    assert clock.dag_problem(a) is None
    clock.apply_definition("a", a, a.to_json(), 1, ms(T0))
    assert clock._dependents_of("root") == ["a"]
    other = definition("other")
    clock.apply_definition("other", other, other.to_json(), 2, ms(T0))
    moved = a.model_copy(update={"depends_on": ["other"]})
    clock.apply_definition("a", moved, moved.to_json(), 3, ms(T0))
    assert clock._dependents_of("root") == [] and clock._dependents_of("other") == ["a"]
    cycle = JobDefinition(job_id="other", type="DEPENDENT", depends_on=["a"], handler="noop")
    assert "cycle" in (clock.dag_problem(cycle) or "")
    clock.apply_definition("a", None, None, 4, ms(T0))
    assert clock._dependents_of("other") == []


def test_the_dag_index_is_rebuilt_after_a_replay() -> None:
    clock = Clock()
    a = JobDefinition(job_id="a", type="DEPENDENT", depends_on=["root"], handler="noop")
    clock.load_state("root", state("root", 0, T0))
    clock.load_definition("root", definition("root").to_json(), 0, ms(T0))
    clock.load_definition("a", a.to_json(), 1, ms(T0))
    clock.reconcile()
    assert clock._dependents_of("root") == ["a"]
    assert clock.jobs["root"]._definition is None, "scheduled jobs are not parsed for it"


def test_a_definition_due_beyond_the_horizon_leaves_nothing_in_memory() -> None:
    """A first leader applies every definition of its shard: one due years ahead is on
    disk only — no job, and no timer left in the heap until it is due."""
    clock = Clock()
    clock.horizon_ms = ms(T0 + timedelta(minutes=2))
    far = definition("far", type="ONE_TIME", interval_seconds=None, run_at=T0 + timedelta(days=3650))
    near = definition("near")
    for d in (far, near):
        clock.apply_definition(d.job_id, d, d.to_json(), offset=0, observed_ms=ms(T0))
    assert clock.evict() == ["far"]
    assert [key for _due, _kind, key in clock._heap] == ["near"]
    assert clock.next_due_ms() == ms(T0)
