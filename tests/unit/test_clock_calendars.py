"""The clock with calendars, jitter and max_runs (docs/decisions/0055), no Kafka: fires on
included days only (SKIP, NEXT_DAY), a calendar edit re-plans its jobs at once, a job
naming a calendar not known waits and fires once it comes, a jitter that a re-created
clock (a failover) computes alike, max_runs counted across a takeover."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from typing import Any

from cronstream.services.scheduler.calendars import CalendarTable
from cronstream.services.scheduler.clock import Clock, StateChange
from cronstream.shared.records import Calendar, JobDefinition, SchedulerState
from cronstream.shared.schedule import from_epoch_ms, jitter_ms, to_epoch_ms, upcoming

T0 = datetime(2026, 6, 1, 0, 0, tzinfo=UTC)  # a Monday
WEEKDAYS_ONLY = {"calendar_id": "biz", "exclude_weekdays": ["SAT", "SUN"]}


def ms(t: datetime) -> int:
    return to_epoch_ms(t)


def job(job_id: str = "j", **fields: Any) -> JobDefinition:
    base = {"job_id": job_id, "type": "CRON", "schedule": "0 9 * * *", "handler": "noop",
            "calendar": "biz"}
    return JobDefinition(**{**base, **fields})


def table(*calendars: dict[str, Any], offset: int = 0, at: datetime = T0 - timedelta(days=30)) -> CalendarTable:
    found = CalendarTable(ready=True)
    for i, fields in enumerate(calendars):
        found.put(Calendar.from_dict(fields), offset + i, ms(at))
    return found


def clock_with(*definitions: JobDefinition, calendars: CalendarTable, observed: datetime = T0) -> Clock:
    clock = Clock(calendars=calendars)
    for offset, d in enumerate(definitions):
        clock.apply_definition(d.job_id, d, d.to_json(), offset=offset, observed_ms=ms(observed))
    return clock


def run_until(clock: Clock, until: datetime) -> list[datetime]:
    """Fire everything due up to `until`, each round at its due instant: the fires."""
    fired: list[datetime] = []
    while (due := clock.next_due_ms()) is not None and due <= ms(until):
        plan = clock.plan(due)
        clock.commit(plan)
        fired += [from_epoch_ms(d.scheduled_ms) for d in plan.dues]
    return fired


def state_of(change: StateChange) -> SchedulerState:
    assert change.value is not None
    return SchedulerState.model_validate_json(change.value)


def test_a_calendar_bound_job_skips_the_days_its_calendar_excludes() -> None:
    clock = clock_with(job(), calendars=table(WEEKDAYS_ONLY, offset=4))
    fired = run_until(clock, T0 + timedelta(days=14))
    assert [t.date().isoformat() for t in fired] == [
        "2026-06-01", "2026-06-02", "2026-06-03", "2026-06-04", "2026-06-05",
        "2026-06-08", "2026-06-09", "2026-06-10", "2026-06-11", "2026-06-12"]
    assert all(t.hour == 9 for t in fired)
    assert clock.jobs["j"].calendar_offset == 4, "the timing names the calendar version"


def test_an_interval_job_with_a_calendar_skips_whole_days() -> None:
    cal = {"calendar_id": "biz", "exclude_dates": ["2026-06-02"]}
    clock = clock_with(job(type="INTERVAL", schedule=None, interval_seconds=6 * 3600), calendars=table(cal))
    fired = run_until(clock, T0 + timedelta(days=3) - timedelta(seconds=1))
    assert [t.isoformat()[:13] for t in fired] == [
        "2026-06-01T00", "2026-06-01T06", "2026-06-01T12", "2026-06-01T18",
        "2026-06-03T00", "2026-06-03T06", "2026-06-03T12", "2026-06-03T18"]


def test_next_day_moves_a_fire_to_the_next_included_day() -> None:
    # 2026-08-01 is a Saturday: the 1st's fire lands on Monday the 3rd, at 09:00.
    clock = clock_with(job(schedule="0 9 1 * *", on_excluded="NEXT_DAY"), calendars=table(WEEKDAYS_ONLY),
                       observed=datetime(2026, 7, 15, tzinfo=UTC))
    fired = run_until(clock, datetime(2026, 10, 31, tzinfo=UTC))
    assert [t.isoformat() for t in fired] == [
        "2026-08-03T09:00:00+00:00", "2026-09-01T09:00:00+00:00", "2026-10-01T09:00:00+00:00"]


def test_editing_a_calendar_replans_its_jobs_at_once() -> None:
    calendars = table(WEEKDAYS_ONLY, offset=3)
    hourly = job("hourly", type="INTERVAL", schedule=None, interval_seconds=3600)
    plain = JobDefinition(job_id="plain", type="INTERVAL", interval_seconds=3600, handler="noop")
    clock = clock_with(hourly, plain, calendars=calendars)
    assert run_until(clock, T0 + timedelta(hours=2)) == [T0, T0, T0 + timedelta(hours=1),
                                                        T0 + timedelta(hours=1), T0 + timedelta(hours=2),
                                                        T0 + timedelta(hours=2)]
    # Today (Monday 2026-06-01) is excluded from now on.
    edited = {**WEEKDAYS_ONLY, "exclude_dates": ["2026-06-01"]}
    calendars.put(Calendar.from_dict(edited), 9, ms(T0 + timedelta(hours=2, minutes=30)))
    [change] = clock.replan_calendar("biz")
    assert change.job_id == "hourly", "only the jobs naming the calendar"
    state = state_of(change)
    assert state.next_fire_ms == ms(datetime(2026, 6, 2, tzinfo=UTC)) and state.calendar_offset == 9
    assert state.last_fire_ms == ms(T0 + timedelta(hours=2)) and state.runs == 3
    fired = run_until(clock, datetime(2026, 6, 2, 1, tzinfo=UTC))
    assert [t for t in fired if t.date() == date(2026, 6, 1) and t.hour > 2] == [
        T0 + timedelta(hours=h) for h in range(3, 24)], "the plain job fires on"
    assert [t for t in fired if t.date() == date(2026, 6, 2)] == [datetime(2026, 6, 2, h, tzinfo=UTC)
                                                                 for h in (0, 0, 1, 1)]


def test_a_fire_planned_with_an_older_calendar_version_is_not_fired_but_replanned() -> None:
    """The safety net under the re-plan: a clock that plans before it was told of a change
    fires nothing its calendar now excludes."""
    calendars = table(WEEKDAYS_ONLY)
    clock = clock_with(job(), calendars=calendars)
    assert clock.next_due_ms() == ms(T0 + timedelta(hours=9))
    calendars.put(Calendar.from_dict({**WEEKDAYS_ONLY, "exclude_dates": ["2026-06-01"]}), 1, ms(T0))
    plan = clock.plan(ms(T0 + timedelta(hours=9)))
    assert not plan.dues
    assert [s.next_fire_ms for s in plan.states] == [ms(datetime(2026, 6, 2, 9, tzinfo=UTC))]
    assert state_of(plan.states[0]).calendar_offset == 1
    clock.commit(plan)
    assert run_until(clock, datetime(2026, 6, 2, 23, tzinfo=UTC)) == [datetime(2026, 6, 2, 9, tzinfo=UTC)]


def test_a_job_naming_a_calendar_not_known_waits_then_fires_once_it_comes() -> None:
    calendars = table()
    clock = clock_with(job(calendar="later"), calendars=calendars)
    assert clock.next_due_ms() is None and clock.waiting == {"j": "later"}
    assert not clock.suspended and not clock.suspensions, "waiting is not a suspension"
    assert not run_until(clock, T0 + timedelta(days=2))
    # The calendar comes on Tuesday at noon: the job fires from then on, never before.
    calendars.put(Calendar.from_dict({"calendar_id": "later", "exclude_dates": ["2026-06-03"]}), 5,
                  ms(datetime(2026, 6, 2, 12, tzinfo=UTC)))
    [change] = clock.replan_calendar("later")
    assert state_of(change).calendar_offset == 5 and not clock.waiting
    assert run_until(clock, datetime(2026, 6, 5, tzinfo=UTC)) == [datetime(2026, 6, 4, 9, tzinfo=UTC)]
    # Deleted: it waits again, and fires nothing.
    calendars.delete("later")
    [gone] = clock.replan_calendar("later")
    assert gone.next_fire_ms is None and state_of(gone).calendar_offset is None
    assert clock.waiting == {"j": "later"}
    assert not run_until(clock, datetime(2026, 6, 9, tzinfo=UTC))


def test_jitter_is_the_same_for_a_recreated_clock_and_ids_follow_the_fire() -> None:
    jittered = job(schedule="*/5 * * * *", calendar=None, jitter_seconds=120)
    first = clock_with(jittered, calendars=table())
    fires: list[tuple[int, str]] = []
    states: list[StateChange] = []
    while len(fires) < 6 and (due := first.next_due_ms()) is not None:
        plan = first.plan(due)
        first.commit(plan)
        fires += [(d.scheduled_ms, d.execution_id) for d in plan.dues]
        states += plan.states
    nominal = [T0 + timedelta(minutes=5 * i) for i in range(6)]
    assert [at for at, _ in fires] == [ms(n) + jitter_ms("j", n, 120) for n in nominal]
    assert len({at - ms(n) for (at, _), n in zip(fires, nominal, strict=True)}) > 1, "spread"
    # A failover after the third fire: a new clock from the state the old one committed.
    second = Clock(calendars=table())
    second.load_state("j", states[2].value)
    second.load_definition("j", jittered.to_json(), 0, ms(T0))
    assert second.reconcile() == [], "the stored timing is trusted"
    again: list[tuple[int, str]] = []
    while len(again) < 3 and (due := second.next_due_ms()) is not None:
        plan = second.plan(due)
        second.commit(plan)
        again += [(d.scheduled_ms, d.execution_id) for d in plan.dues]
    assert again == fires[3:], "same instants, same execution ids"
    # A leader computing from scratch (no state) agrees on the first fire too.
    fresh = clock_with(jittered, calendars=table())
    assert fresh.next_due_ms() == fires[0][0]


def test_max_runs_stops_the_job_across_a_takeover() -> None:
    limited = JobDefinition(job_id="m", type="INTERVAL", interval_seconds=10, handler="noop", max_runs=3)
    clock = clock_with(limited, calendars=table())
    plan = clock.plan(ms(T0))
    clock.commit(plan)
    plan = clock.plan(ms(T0 + timedelta(seconds=10)))
    clock.commit(plan)
    assert state_of(plan.states[0]).runs == 2
    # Takeover from the state after two fires: one more, then none.
    successor = Clock(calendars=table())
    successor.load_state("m", plan.states[0].value)
    successor.load_definition("m", limited.to_json(), 0, ms(T0))
    successor.reconcile()
    fired = run_until(successor, T0 + timedelta(minutes=5))
    assert fired == [T0 + timedelta(seconds=20)]
    assert successor.next_due_ms() is None and successor.jobs["m"].runs == 3
    # FIRE_ALL after an outage fires at most what is left.
    late = Clock(calendars=table())
    late.apply_definition("m", limited.model_copy(update={"misfire_policy": "FIRE_ALL"}),
                          limited.to_json(), 0, ms(T0))
    plan = late.plan(ms(T0 + timedelta(minutes=10)))
    assert len(plan.dues) == 3 and plan.states[0].next_fire_ms is None
    assert json.loads(plan.states[0].value or b"")["runs"] == 3


def test_a_new_leader_trusts_a_timing_only_if_its_calendar_version_is_current() -> None:
    d = job()
    stored = SchedulerState(job_id="j", definition_offset=0, next_fire_ms=ms(T0 + timedelta(hours=9)),
                            calendar_offset=3, runs=7).to_json()
    same = Clock(calendars=table(WEEKDAYS_ONLY, offset=3))
    same.load_state("j", stored)
    same.load_definition("j", d.to_json(), 0, ms(T0))
    assert same.reconcile() == [] and same.jobs["j"].runs == 7
    edited = Clock(calendars=table({**WEEKDAYS_ONLY, "exclude_dates": ["2026-06-01"]}, offset=4))
    edited.load_state("j", stored)
    edited.load_definition("j", d.to_json(), 0, ms(T0))
    [change] = edited.reconcile()
    assert state_of(change).next_fire_ms == ms(datetime(2026, 6, 2, 9, tzinfo=UTC))
    assert state_of(change).calendar_offset == 4 and state_of(change).runs == 7


def test_plain_jobs_count_their_fires_and_name_no_calendar() -> None:
    plain = JobDefinition(job_id="p", type="INTERVAL", interval_seconds=10, handler="noop")
    clock = clock_with(plain, calendars=table())
    run_until(clock, T0 + timedelta(seconds=20))
    assert clock.jobs["p"].runs == 3 and clock.jobs["p"].calendar_offset is None


def test_the_clock_and_preview_agree_on_every_fire() -> None:
    """One code path: the clock's fires (continuing after each fire without the jitter's
    search: `next_after_nominal`) are `upcoming`'s, for every kind of job."""
    us = {"calendar_id": "biz", "timezone": "America/New_York", "holidays": {"country": "US"},
          "exclude_weekdays": ["SAT", "SUN"], "exclude_dates": ["2026-06-03"]}
    cases = [
        job(schedule="*/7 * * * *", calendar=None, jitter_seconds=300),
        job(type="INTERVAL", schedule=None, interval_seconds=5400, jitter_seconds=3000),
        job(schedule="30 8 * * *", timezone="America/New_York", on_excluded="NEXT_DAY", jitter_seconds=600),
        job(schedule="0 17 L * *", timezone="America/New_York", on_excluded="PREVIOUS_DAY"),
        job(schedule="0 */5 * * *", jitter_seconds=3600),
        job(type="INTERVAL", schedule=None, interval_seconds=7200, jitter_seconds=60, max_runs=40),
        job(type="INTERVAL", schedule=None, interval_seconds=5 * 3600, start_at=datetime(2026, 5, 30, 1, 2, 3, 456789, tzinfo=UTC)),
        job(type="INTERVAL", schedule=None, interval_seconds=3600, max_runs=100),
    ]
    for d in cases:
        calendars = table(us)
        clock = clock_with(d, calendars=calendars)
        fired = run_until(clock, T0 + timedelta(days=120))
        known = calendars.get("biz")
        assert known is not None
        expected = upcoming(d, T0 - timedelta(milliseconds=1), len(fired) + 1,
                            calendar=known.resolved if d.calendar else None, fired=0)
        if d.max_runs is not None:
            assert len(fired) == d.max_runs and len(expected) == d.max_runs
        assert fired == expected[:len(fired)], d.schedule or d.interval_seconds
        assert len(fired) >= 3
