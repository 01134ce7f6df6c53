"""Calendars, on_excluded, jitter and max_runs: what a job's fires are (docs/decisions/0055).

Vectors in Europe/Berlin and America/New_York, across month ends, leap years and both DST
changes; and the properties the scheduler relies on: fires strictly increase, and
`next_fire(after)` is the first fire of the sequence after `after`, from any `after`
(the scheduler continues after its last fire, jitter included).
"""

from __future__ import annotations

import itertools
import json
import random
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml
from click.testing import CliRunner
from pydantic import ValidationError

from cronstream.cli import cli
from cronstream.shared.calendars import CalendarMissingError, ResolvedCalendar, resolve
from cronstream.shared.codec import describe
from cronstream.shared.records import Calendar, JobDefinition
from cronstream.shared.schedule import (
    excluded_instants,
    first_fire,
    jitter_ms,
    next_fire,
    plan_next,
    planned,
    runs_left,
    upcoming,
)

NEW_YORK = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")


def calendar(**fields: Any) -> ResolvedCalendar:
    return resolve(Calendar.from_dict({"calendar_id": "cal", **fields}))


def job(**fields: Any) -> JobDefinition:
    return JobDefinition.from_dict({"job_id": "j", "handler": "noop", "type": "CRON", **fields})


def local_fires(definition: JobDefinition, cal: ResolvedCalendar | None, start: datetime,
                count: int, fmt: str = "%a %m-%d %H:%M %Z") -> list[str]:
    return [f.astimezone(definition.zone).strftime(fmt)
            for f in upcoming(definition, start, count, calendar=cal)]


# -- the calendar's days -------------------------------------------------------------------


def test_us_holidays_with_observed_days_and_their_reasons() -> None:
    us = calendar(holidays={"country": "US"})
    # 2026-07-04 is a Saturday: observed on Friday the 3rd. 2021-12-25 a Saturday: the 24th.
    assert us.excluded(date(2026, 7, 4)) == "holiday: Independence Day (US)"
    assert us.excluded(date(2026, 7, 3)) == "holiday: Independence Day (observed) (US)"
    assert us.excluded(date(2021, 12, 24)) == "holiday: Christmas Day (observed) (US)"
    # New Year's Day 2022 is a Saturday: observed on Friday 2021-12-31, in the year before.
    assert us.excluded(date(2021, 12, 31)) == "holiday: New Year's Day (observed) (US)"
    assert us.excluded(date(2026, 7, 6)) is None


def test_subdivision_holidays_in_english_and_weekday_reasons() -> None:
    bavaria = calendar(timezone="Europe/Berlin", holidays={"country": "DE", "subdivision": "BY"},
                       exclude_weekdays=["SAT", "SUN", "WED"])
    assert bavaria.excluded(date(2026, 1, 6)) == "holiday: Epiphany (DE-BY)"
    assert calendar(holidays={"country": "DE"}).excluded(date(2026, 1, 6)) is None, "not in all of DE"
    assert bavaria.excluded(date(2026, 12, 25)) == "holiday: Christmas Day (DE-BY)"
    assert bavaria.excluded(date(2026, 12, 26)) == "holiday: Second Day of Christmas (DE-BY)"
    assert bavaria.excluded(date(2026, 12, 19)) == "weekend: SAT"
    assert bavaria.excluded(date(2026, 12, 20)) == "weekend: SUN"
    assert bavaria.excluded(date(2026, 12, 16)) == "excluded weekday: WED"
    assert bavaria.excluded(date(2026, 12, 17)) is None


def test_include_dates_override_every_exclusion() -> None:
    cal = calendar(holidays={"country": "US"}, exclude_weekdays=["SAT", "SUN"],
                   exclude_dates=["2026-12-28"],
                   include_dates=["2026-07-03", "2026-12-26", "2026-12-28"])
    assert cal.excluded(date(2026, 7, 3)) is None, "an observed holiday worked"
    assert cal.excluded(date(2026, 12, 26)) is None, "a working Saturday"
    assert cal.excluded(date(2026, 12, 28)) is None, "listed in both: included"
    assert cal.excluded(date(2026, 12, 27)) == "weekend: SUN"
    assert calendar(exclude_dates=["2026-12-28"]).excluded(date(2026, 12, 28)) == "excluded date"


def test_a_holiday_on_an_excluded_weekday_is_named_as_the_holiday() -> None:
    cal = calendar(holidays={"country": "US"}, exclude_weekdays=["SAT", "SUN"])
    assert cal.excluded(date(2027, 12, 25)) == "holiday: Christmas Day (US)"  # a Saturday


def test_a_calendar_version_is_resolved_once_and_its_holidays_per_year_lazily() -> None:
    record = Calendar.from_dict({"calendar_id": "once", "holidays": {"country": "US"}})
    assert resolve(record) is resolve(Calendar.from_dict(record.model_dump(mode="json")))
    resolved = resolve(record)
    resolved.excluded(date(2031, 1, 1))
    assert 2031 in resolved._holidays and 2032 not in resolved._holidays


@pytest.mark.parametrize(("fields", "needle"), [
    ({"holidays": {"country": "XX"}}, "holidays: country: 'XX' is not a country"),
    ({"holidays": {"country": "US", "subdivision": "ZZ"}}, "subdivision: 'ZZ' is not a subdivision of US"),
    ({"holidays": {"country": "us"}}, "holidays.country: String should match pattern"),
    ({"exclude_weekdays": ["SAT", "FUN"]}, "exclude_weekdays.1: Input should be 'MON'"),
    ({"exclude_weekdays": ["SAT", "SAT"]}, "exclude_weekdays: lists a weekday more than once"),
    ({"exclude_dates": ["2026-13-01"]}, "exclude_dates.0: Input should be a valid date"),
    ({"include_dates": ["yesterday"]}, "include_dates.0: Input should be a valid date"),
    ({"timezone": "Mars/Olympus"}, "timezone: unknown IANA timezone 'Mars/Olympus'"),
    ({"calendar_id": "no spaces"}, "calendar_id: String should match pattern"),
    ({"exclude": ["2026-01-01"]}, "exclude: Extra inputs are not permitted"),
])
def test_calendar_validation_names_the_field(fields: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Calendar.from_dict({"calendar_id": "cal", **fields})
    assert needle in describe(caught.value)


@pytest.mark.parametrize(("fields", "needle"), [
    ({"type": "ONE_TIME", "schedule": None, "run_at": "2026-01-01T00:00:00Z", "calendar": "c"},
     "calendar: only for types CRON and INTERVAL, not ONE_TIME"),
    ({"schedule": "0 9 * * *", "on_excluded": "NEXT_DAY"}, "on_excluded: NEXT_DAY needs a calendar"),
    ({"type": "INTERVAL", "schedule": None, "interval_seconds": 60, "calendar": "c",
      "on_excluded": "PREVIOUS_DAY"}, "on_excluded: PREVIOUS_DAY moves a fire"),
    ({"type": "INTERVAL", "schedule": None, "interval_seconds": 60, "jitter_seconds": 60},
     "jitter_seconds: 60 must be less than interval_seconds (60)"),
    ({"schedule": "0 9 * * *", "jitter_seconds": 3601}, "jitter_seconds: Input should be less than or equal to 3600"),
    ({"schedule": "0 9 * * *", "max_runs": 0}, "max_runs: Input should be greater than or equal to 1"),
    ({"schedule": None, "type": "DEPENDENT", "depends_on": ["a"], "max_runs": 3},
     "max_runs: not for type DEPENDENT"),
    ({"schedule": "0 9 * * *", "on_excluded": "TOMORROW", "calendar": "c"}, "on_excluded: Input should be 'SKIP'"),
    ({"schedule": "0 0 L-31 * *"}, "schedule: invalid cron expression '0 0 L-31 * *': "
                                   "day of month field: 'L-31'"),
    ({"schedule": "H 9 * * 1#6"}, "day of week field: '1#6'"),
])
def test_definition_validation_names_the_field(fields: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError) as caught:
        job(**fields)
    assert needle in describe(caught.value)


def test_h_is_hashed_from_the_job_id_in_validation_too() -> None:
    # H(28-31) in February: whether it ever fires depends on the job_id.
    assert job(schedule="0 0 H(1-28) 2 *").schedule
    outcomes = set()
    for n in range(40):
        try:
            JobDefinition.from_dict({"job_id": f"j{n}", "handler": "noop", "type": "CRON",
                                     "schedule": "0 0 H(30-31) 2 *"})
            outcomes.add("valid")
        except ValidationError as exc:
            assert "never fires" in describe(exc)
            outcomes.add("never fires")
    assert outcomes == {"never fires"}


# -- SKIP ----------------------------------------------------------------------------------

BUSINESS_US = {"timezone": "America/New_York", "holidays": {"country": "US"},
               "exclude_weekdays": ["SAT", "SUN"]}


def test_skip_drops_the_fires_of_excluded_days() -> None:
    cal = calendar(**BUSINESS_US)
    d = job(schedule="0 9 * * *", timezone="America/New_York", calendar="cal")
    assert local_fires(d, cal, datetime(2026, 12, 23, tzinfo=UTC), 4) == [
        "Wed 12-23 09:00 EST", "Thu 12-24 09:00 EST", "Mon 12-28 09:00 EST", "Tue 12-29 09:00 EST"]


def test_skip_steps_over_excluded_days_of_a_dense_schedule_whole() -> None:
    cal = calendar(**BUSINESS_US)
    d = job(schedule="* * * * * *", timezone="America/New_York", calendar="cal")
    # Friday 2026-12-25 23:59:59 EST... and the weekend: the next fire is Monday's first second.
    fire = next_fire(d, datetime(2026, 12, 24, 23, 59, 59, tzinfo=NEW_YORK), calendar=cal)
    assert fire == datetime(2026, 12, 28, 0, 0, tzinfo=NEW_YORK)


def test_skip_judges_a_day_in_the_calendars_timezone() -> None:
    # 23:30 UTC is already the next day in Berlin: Christmas Eve's 23:30Z fire is on the 25th.
    cal = calendar(timezone="Europe/Berlin", holidays={"country": "DE"})
    d = job(schedule="30 23 * * *", calendar="cal")
    assert [f.strftime("%m-%d") for f in upcoming(d, datetime(2026, 12, 23, tzinfo=UTC), 3, calendar=cal)] == [
        "12-23", "12-26", "12-27"]


def test_skip_applies_to_an_interval_grid() -> None:
    cal = calendar(exclude_weekdays=["SAT", "SUN"])
    d = job(type="INTERVAL", schedule=None, interval_seconds=3600, calendar="cal")
    fires = upcoming(d, datetime(2026, 12, 25, 22, 30, tzinfo=UTC), 3, calendar=cal)
    assert fires == [datetime(2026, 12, 25, 23, tzinfo=UTC), datetime(2026, 12, 28, 0, tzinfo=UTC),
                     datetime(2026, 12, 28, 1, tzinfo=UTC)]


def test_a_calendar_that_excludes_every_day_leaves_no_fire() -> None:
    cal = calendar(exclude_weekdays=["MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"],
                   include_dates=["2026-12-30"])
    d = job(schedule="0 9 * * *", calendar="cal")
    assert upcoming(d, datetime(2026, 12, 1, tzinfo=UTC), 3, calendar=cal) == [
        datetime(2026, 12, 30, 9, tzinfo=UTC)]


# -- NEXT_DAY / PREVIOUS_DAY: month ends, merges, DST ------------------------------------------


def moved(definition: JobDefinition, cal: ResolvedCalendar, start: datetime, count: int) -> list[str]:
    zone = definition.zone
    out = []
    for f in planned(definition, start, count, calendar=cal):
        text = f.at.astimezone(zone).strftime("%a %Y-%m-%d %H:%M %Z")
        if f.moved_from is not None:
            text += f" <- {f.moved_from.astimezone(zone).strftime('%a %m-%d %H:%M %Z')} ({f.moved_because})"
        out.append(text)
    return out


def test_next_day_moves_a_month_end_into_the_next_month() -> None:
    cal = calendar(**BUSINESS_US)
    d = job(schedule="0 9 L * *", timezone="America/New_York", calendar="cal", on_excluded="NEXT_DAY")
    # 2026-01-31 is a Saturday (and Feb 1st a Sunday): Monday Feb 2nd. 2026-05-31 a Sunday: June 1st.
    assert moved(d, cal, datetime(2026, 1, 1, tzinfo=UTC), 5) == [
        "Mon 2026-02-02 09:00 EST <- Sat 01-31 09:00 EST (weekend: SAT)",
        "Mon 2026-03-02 09:00 EST <- Sat 02-28 09:00 EST (weekend: SAT)",
        "Tue 2026-03-31 09:00 EDT",
        "Thu 2026-04-30 09:00 EDT",
        "Mon 2026-06-01 09:00 EDT <- Sun 05-31 09:00 EDT (weekend: SUN)"]


def test_previous_day_moves_a_month_start_into_the_previous_month() -> None:
    cal = calendar(**BUSINESS_US)
    d = job(schedule="0 9 1 * *", timezone="America/New_York", calendar="cal", on_excluded="PREVIOUS_DAY")
    # 2026-02-01 is a Sunday: Friday January 30th. 2026-01-01 is New Year's Day: 2025-12-31.
    assert moved(d, cal, datetime(2025, 12, 2, tzinfo=UTC), 4) == [
        "Wed 2025-12-31 09:00 EST <- Thu 01-01 09:00 EST (holiday: New Year's Day (US))",
        "Fri 2026-01-30 09:00 EST <- Sun 02-01 09:00 EST (weekend: SUN)",
        "Fri 2026-02-27 09:00 EST <- Sun 03-01 09:00 EST (weekend: SUN)",
        "Wed 2026-04-01 09:00 EDT"]


def test_next_day_across_a_year_end_and_a_long_weekend() -> None:
    cal = calendar(**BUSINESS_US)
    d = job(schedule="0 9 1 * *", timezone="America/New_York", calendar="cal", on_excluded="NEXT_DAY")
    # 2027-01-01 is a Friday and a holiday; the 2nd and 3rd a weekend: Monday the 4th.
    assert moved(d, cal, datetime(2026, 12, 15, tzinfo=UTC), 1) == [
        "Mon 2027-01-04 09:00 EST <- Fri 01-01 09:00 EST (holiday: New Year's Day (US))"]


def test_fires_moved_onto_the_same_instant_are_one_fire() -> None:
    cal = calendar(**BUSINESS_US)
    daily = job(schedule="0 9 * * *", timezone="America/New_York", calendar="cal", on_excluded="NEXT_DAY")
    # Friday the 25th (Christmas), Saturday and Sunday all land on Monday 09:00, Monday's own.
    assert moved(daily, cal, datetime(2026, 12, 24, 15, tzinfo=UTC), 2) == [
        "Mon 2026-12-28 09:00 EST", "Tue 2026-12-29 09:00 EST"]
    back = job(schedule="0 9 * * *", timezone="America/New_York", calendar="cal", on_excluded="PREVIOUS_DAY")
    assert moved(back, cal, datetime(2026, 12, 23, 15, tzinfo=UTC), 2) == [
        "Thu 2026-12-24 09:00 EST", "Mon 2026-12-28 09:00 EST"]


def test_next_day_into_a_spring_forward_gap_fires_at_the_first_instant_after_it() -> None:
    # Saturday 02:30 excluded; Sunday 2026-03-29 02:30 does not exist in Berlin: 03:00 CEST.
    cal = calendar(timezone="Europe/Berlin", exclude_dates=["2026-03-28"])
    d = job(schedule="30 2 * * 6", timezone="Europe/Berlin", calendar="cal", on_excluded="NEXT_DAY")
    got = planned(d, datetime(2026, 3, 27, tzinfo=UTC), 2, calendar=cal)
    assert got[0].at == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    assert got[0].moved_from == datetime(2026, 3, 28, 1, 30, tzinfo=UTC)
    assert moved(d, cal, datetime(2026, 3, 27, tzinfo=UTC), 2) == [
        "Sun 2026-03-29 03:00 CEST <- Sat 03-28 02:30 CET (excluded date)", "Sat 2026-04-04 02:30 CEST"]
    ny = calendar(timezone="America/New_York", exclude_dates=["2026-03-07"])
    d = job(schedule="30 2 * * 6", timezone="America/New_York", calendar="cal", on_excluded="NEXT_DAY")
    assert next_fire(d, datetime(2026, 3, 6, tzinfo=UTC), calendar=ny) == datetime(2026, 3, 8, 7, 0, tzinfo=UTC)


def test_next_day_onto_a_repeated_time_fires_at_its_first_occurrence_once() -> None:
    cal = calendar(timezone="Europe/Berlin", exclude_dates=["2026-10-24"])
    d = job(schedule="30 2 * * 6", timezone="Europe/Berlin", calendar="cal", on_excluded="NEXT_DAY")
    assert moved(d, cal, datetime(2026, 10, 23, tzinfo=UTC), 2) == [
        "Sun 2026-10-25 02:30 CEST <- Sat 10-24 02:30 CEST (excluded date)", "Sat 2026-10-31 02:30 CET"]
    ny = calendar(timezone="America/New_York", exclude_dates=["2026-10-31"])
    d = job(schedule="30 1 * * 6", timezone="America/New_York", calendar="cal", on_excluded="NEXT_DAY")
    fires = upcoming(d, datetime(2026, 10, 30, tzinfo=UTC), 2, calendar=ny)
    assert fires[0] == datetime(2026, 11, 1, 5, 30, tzinfo=UTC), "01:30 EDT, the first 01:30"


def test_previous_day_out_of_a_gap_day_keeps_the_wall_time() -> None:
    # Sunday 2026-03-08 (New York's change) excluded: its 02:30 fires Saturday 02:30 EST.
    cal = calendar(timezone="America/New_York", exclude_weekdays=["SUN"])
    d = job(schedule="30 2 * * 0", timezone="America/New_York", calendar="cal", on_excluded="PREVIOUS_DAY")
    assert moved(d, cal, datetime(2026, 3, 1, 12, tzinfo=UTC), 2) == [
        "Sat 2026-03-07 02:30 EST <- Sun 03-08 03:00 EDT (weekend: SUN)",
        "Sat 2026-03-14 02:30 EDT <- Sun 03-15 02:30 EDT (weekend: SUN)"]


def test_leap_day_with_next_day() -> None:
    # 2032-02-29 is a Sunday: the monthly fire on the last day moves to Monday March 1st.
    cal = calendar(exclude_weekdays=["SAT", "SUN"])
    d = job(schedule="0 12 L 2 *", calendar="cal", on_excluded="NEXT_DAY")
    assert [f.strftime("%Y-%m-%d") for f in upcoming(d, datetime(2029, 1, 1, tzinfo=UTC), 4, calendar=cal)] == [
        "2029-02-28", "2030-02-28", "2031-02-28", "2032-03-01"]


def test_moving_by_days_needs_the_calendars_timezone() -> None:
    cal = calendar(timezone="Europe/Berlin", exclude_weekdays=["SAT"])
    d = job(schedule="0 9 * * *", timezone="UTC", calendar="cal", on_excluded="NEXT_DAY")
    with pytest.raises(ValueError, match=r"on_excluded: NEXT_DAY .* the job's timezone \(UTC\) must be its "
                                         r"calendar's \(Europe/Berlin\)"):
        next_fire(d, datetime(2026, 1, 1, tzinfo=UTC), calendar=cal)


def test_a_missing_or_another_calendar_is_refused() -> None:
    d = job(schedule="0 9 * * *", calendar="cal")
    with pytest.raises(CalendarMissingError, match="calendar: 'cal' is not known"):
        next_fire(d, datetime(2026, 1, 1, tzinfo=UTC))
    other = resolve(Calendar.from_dict({"calendar_id": "other"}))
    with pytest.raises(ValueError, match="calendar: the definition names 'cal', not 'other'"):
        next_fire(d, datetime(2026, 1, 1, tzinfo=UTC), calendar=other)


# -- the properties the scheduler relies on ----------------------------------------------------

SCHEDULES = ["0 9 * * *", "*/20 8-18 * * *", "0 9 L * *", "30 2 * * 6", "0 9 1W * *", "0 0 * * 1#2",
             "45 1 * * *", "H H * * *", "*/5 * * * *"]


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York"])
@pytest.mark.parametrize("mode", ["SKIP", "NEXT_DAY", "PREVIOUS_DAY"])
def test_fires_strictly_increase_and_next_fire_is_the_first_after_any_instant(zone: str, mode: str) -> None:
    rng = random.Random(f"{zone}{mode}")
    country = "DE" if zone == "Europe/Berlin" else "US"
    for schedule in SCHEDULES:
        cal = calendar(timezone=zone, holidays={"country": country},
                       # Never Monday or Saturday: SKIP would leave `30 2 * * 6` no fire at all.
                       exclude_weekdays=rng.sample(["TUE", "WED", "THU", "FRI", "SUN"], 2),
                       exclude_dates=["2026-03-29", "2026-10-25", "2026-03-08", "2026-11-01"])
        jitter = rng.choice([0, 0, 90, 3600])
        d = job(schedule=schedule, timezone=zone, calendar="cal", on_excluded=mode, jitter_seconds=jitter)
        start = rng.choice([datetime(2026, 3, 20, tzinfo=UTC), datetime(2026, 10, 20, tzinfo=UTC),
                            datetime(2026, 12, 20, tzinfo=UTC)])
        fires = upcoming(d, start, 40, calendar=cal)
        assert len(fires) == 40
        assert all(a < b for a, b in itertools.pairwise(fires)), (schedule, mode)
        assert all(f.microsecond % 1000 == 0 for f in fires)
        for _ in range(25):
            t = start + (fires[-1] - start) * rng.random()
            expected = next(f for f in fires if f > t)
            assert next_fire(d, t, calendar=cal) == expected, (schedule, mode, jitter, t)
        for f in fires[:-1]:
            assert next_fire(d, f, calendar=cal) == fires[fires.index(f) + 1]


def test_without_exclusions_every_mode_is_the_plain_schedule() -> None:
    cal = calendar(timezone="America/New_York")
    for schedule in SCHEDULES:
        plain = job(schedule=schedule, timezone="America/New_York")
        expected = upcoming(plain, datetime(2026, 3, 1, tzinfo=UTC), 60)
        for mode in ("SKIP", "NEXT_DAY", "PREVIOUS_DAY"):
            d = job(schedule=schedule, timezone="America/New_York", calendar="cal", on_excluded=mode)
            assert upcoming(d, datetime(2026, 3, 1, tzinfo=UTC), 60, calendar=cal) == expected, (schedule, mode)


# -- jitter and max_runs ---------------------------------------------------------------------


def test_jitter_is_deterministic_in_range_and_spread() -> None:
    t = datetime(2026, 6, 1, 9, tzinfo=UTC)
    delays = [jitter_ms(f"job-{n}", t, 300) for n in range(2000)]
    assert delays == [jitter_ms(f"job-{n}", t, 300) for n in range(2000)]
    assert all(0 <= x < 300_000 for x in delays)
    assert len(set(delays)) > 1900 and min(delays) < 15_000 and max(delays) > 285_000
    assert jitter_ms("j", t, 300) != jitter_ms("j", t + timedelta(days=1), 300), "per fire, not per job"
    assert jitter_ms("j", t, 0) == 0
    # A value computed by another process (another leader) after a failover: the same.
    assert jitter_ms("nightly", datetime(2026, 1, 1, 2, tzinfo=UTC), 600) == 545_082


def test_jitter_delays_each_fire_and_stays_below_the_gap_to_the_next() -> None:
    d = job(schedule="0 9 * * *", jitter_seconds=600)
    fires = planned(d, datetime(2026, 6, 1, tzinfo=UTC), 10)
    assert all(timedelta(0) <= f.at - f.nominal < timedelta(minutes=10) for f in fires)
    assert len({f.jitter_ms for f in fires}) == 10
    dense = job(schedule="* * * * *", jitter_seconds=3600)
    fires = planned(dense, datetime(2026, 6, 1, tzinfo=UTC), 200)
    assert all(timedelta(0) <= f.at - f.nominal < timedelta(minutes=1) for f in fires)
    assert all(a.at < b.at for a, b in itertools.pairwise(fires))


def test_a_jittered_fire_is_found_again_after_a_failover_from_the_last_fire() -> None:
    d = job(schedule="*/10 * * * *", jitter_seconds=599)
    fires = upcoming(d, datetime(2026, 6, 1, tzinfo=UTC), 30)
    # A new leader continues after the last fire it finds in the state: the same next fire.
    for last, following in itertools.pairwise(fires):
        assert first_fire(d, datetime(2026, 5, 1, tzinfo=UTC), last) == following


def test_one_time_and_interval_jitter() -> None:
    run_at = datetime(2026, 6, 1, 9, tzinfo=UTC)
    one = job(type="ONE_TIME", schedule=None, run_at=run_at.isoformat(), jitter_seconds=60)
    fire = first_fire(one, run_at - timedelta(hours=1), None)
    assert fire is not None and run_at <= fire < run_at + timedelta(minutes=1)
    assert fire == next_fire(one, run_at - timedelta(hours=1))
    assert first_fire(one, run_at, fire) is None, "once"
    grid = job(type="INTERVAL", schedule=None, interval_seconds=60, jitter_seconds=30)
    fires = planned(grid, run_at, 20)
    assert all(timedelta(0) <= f.at - f.nominal < timedelta(seconds=30) for f in fires)
    assert all(f.nominal.second == 0 for f in fires)


def test_runs_left_and_upcoming_stop_after_max_runs() -> None:
    assert runs_left(None, 10**6) is None
    assert runs_left(3, 0) == 3 and runs_left(3, 2) == 1 and runs_left(3, 3) == 0 and runs_left(3, 7) == 0
    d = job(schedule="0 9 * * *", max_runs=3)
    assert len(upcoming(d, datetime(2026, 6, 1, tzinfo=UTC), 10, fired=0)) == 3
    assert len(upcoming(d, datetime(2026, 6, 1, tzinfo=UTC), 10, fired=2)) == 1
    assert upcoming(d, datetime(2026, 6, 1, tzinfo=UTC), 10, fired=3) == []
    assert len(upcoming(d, datetime(2026, 6, 1, tzinfo=UTC), 10)) == 10, "unknown count: no cut"


# -- what preview and the timeline show -----------------------------------------------------------


def test_excluded_instants_with_their_reason() -> None:
    cal = calendar(**BUSINESS_US)
    d = job(schedule="0 9 * * *", timezone="America/New_York", calendar="cal")
    found = excluded_instants(d, datetime(2026, 12, 24, 15, tzinfo=UTC), datetime(2026, 12, 29, tzinfo=UTC),
                              cal, 10)
    assert [(e.day.isoformat(), e.reason) for e in found] == [
        ("2026-12-25", "holiday: Christmas Day (US)"), ("2026-12-26", "weekend: SAT"),
        ("2026-12-27", "weekend: SUN")]
    assert found[0].at == datetime(2026, 12, 25, 14, tzinfo=UTC)
    assert plan_next(d, datetime(2026, 12, 24, 15, tzinfo=UTC), calendar=cal) is not None


def write(tmp_path: Path, name: str, data: Any) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_preview_json_is_the_spec_shape(tmp_path: Path) -> None:
    jobs = write(tmp_path, "jobs.yaml", [
        {"job_id": "report", "type": "CRON", "schedule": "0 9 * * *", "timezone": "America/New_York",
         "handler": "noop", "calendar": "us-business", "jitter_seconds": 300, "max_runs": 3},
        {"job_id": "after", "type": "DEPENDENT", "depends_on": ["report"], "handler": "noop"},
    ])
    cals = write(tmp_path, "cal.yaml", {"calendar_id": "us-business", **BUSINESS_US})
    result = CliRunner().invoke(cli, ["preview", "-f", jobs, "--calendar-file", cals, "--from",
                                      "2026-12-24T15:00:00Z", "--count", "5", "-o", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [set(p) for p in data] == [{"job_id", "fires", "excluded"}] * 2
    report = data[0]
    assert report["job_id"] == "report" and len(report["fires"]) == 3, "max_runs"
    assert all(set(f) == {"utc", "local"} for f in report["fires"])
    assert report["fires"][0]["utc"].startswith("2026-12-28T14:0") and report["fires"][0]["utc"].endswith("Z")
    assert report["fires"][0]["local"].startswith("2026-12-28T09:0") and report["fires"][0]["local"].endswith("-05:00")
    assert report["excluded"] == [
        {"utc": "2026-12-25T14:00:00.000Z",
         "reason": "calendar us-business excludes 2026-12-25: holiday: Christmas Day (US)"},
        {"utc": "2026-12-26T14:00:00.000Z", "reason": "calendar us-business excludes 2026-12-26: weekend: SAT"},
        {"utc": "2026-12-27T14:00:00.000Z", "reason": "calendar us-business excludes 2026-12-27: weekend: SUN"}]
    assert data[1] == {"job_id": "after", "fires": [], "excluded": []}
    # The fires are the scheduler's: next_fire, one after the other.
    d = JobDefinition.from_dict(yaml.safe_load(Path(jobs).read_text())[0])
    cal = resolve(Calendar.from_dict({"calendar_id": "us-business", **BUSINESS_US}))
    t: datetime | None = datetime(2026, 12, 24, 15, tzinfo=UTC)
    for fire in report["fires"]:
        assert t is not None
        t = next_fire(d, t, calendar=cal)
        assert t is not None and fire["utc"] == t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def test_preview_text_shows_exclusions_moves_jitter_and_max_runs(tmp_path: Path) -> None:
    jobs = write(tmp_path, "jobs.yaml", {
        "job_id": "month-start", "type": "CRON", "schedule": "0 9 1 * *", "timezone": "America/New_York",
        "handler": "noop", "calendar": "us-business", "on_excluded": "NEXT_DAY", "jitter_seconds": 60,
        "max_runs": 2})
    cals = write(tmp_path, "cal.yaml", {"calendar_id": "us-business", **BUSINESS_US})
    result = CliRunner().invoke(cli, ["preview", "-f", jobs, "--calendar-file", cals, "--from",
                                      "2026-12-15T00:00:00Z"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == ("month-start (CRON, America/New_York, calendar us-business: NEXT_DAY, jitter < 60s, "
                        "stops after 2 runs):")
    assert "excluded: calendar us-business excludes 2027-01-01: holiday: New Year's Day (US)" in lines[1]
    assert "2027-01-04T09:00" in lines[2] and "jitter +" in lines[2]
    assert "moved from Fri 2027-01-01 09:00 (holiday: New Year's Day (US))" in lines[2]
    assert lines[-1] == "  (then no more: max_runs 2)"


def test_preview_names_a_calendar_it_cannot_find(tmp_path: Path) -> None:
    jobs = write(tmp_path, "jobs.yaml", {"job_id": "x", "type": "CRON", "schedule": "0 9 * * *",
                                         "handler": "noop", "calendar": "nope"})
    cals = write(tmp_path, "cal.yaml", {"calendar_id": "other"})
    result = CliRunner().invoke(cli, ["--bootstrap-servers", "127.0.0.1:1", "--timeout", "0.5", "preview",
                                      "-f", jobs, "--calendar-file", cals])
    assert result.exit_code != 0
    assert "--calendar-file" in result.output


def test_calendar_preview_lists_each_day(tmp_path: Path) -> None:
    cals = write(tmp_path, "cal.yaml", {"calendar_id": "us-business", **BUSINESS_US,
                                        "include_dates": ["2026-12-26"]})
    result = CliRunner().invoke(cli, ["calendar", "preview", "us-business", "-f", cals, "--from", "2026-12-24",
                                      "--to", "2026-12-28", "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == [
        {"date": "2026-12-24", "weekday": "THU", "included": True, "reason": None},
        {"date": "2026-12-25", "weekday": "FRI", "included": False, "reason": "holiday: Christmas Day (US)"},
        {"date": "2026-12-26", "weekday": "SAT", "included": True, "reason": None},
        {"date": "2026-12-27", "weekday": "SUN", "included": False, "reason": "weekend: SUN"},
        {"date": "2026-12-28", "weekday": "MON", "included": True, "reason": None}]


def test_calendar_apply_refuses_before_sending_naming_the_field(tmp_path: Path) -> None:
    cals = write(tmp_path, "cal.yaml", [{"calendar_id": "a", "holidays": {"country": "XX"}},
                                        {"calendar_id": "b", "exclude_weekdays": ["FUN"]}])
    result = CliRunner().invoke(cli, ["--bootstrap-servers", "127.0.0.1:1", "calendar", "apply", "-f", cals])
    assert result.exit_code == 1
    assert "nothing was sent" in result.output
    assert "calendar #1 (calendar_id 'a'): holidays: country: 'XX'" in result.output
    assert "calendar #2 (calendar_id 'b'): exclude_weekdays.0: Input should be 'MON'" in result.output


def test_the_timeline_row_shows_excluded_days_and_moved_fires() -> None:
    from cronstream.ui.timeline import Window, project_row

    cal = calendar(**BUSINESS_US)
    d = job(schedule="0 9 1 * *", timezone="America/New_York", calendar="cal", on_excluded="NEXT_DAY")
    now = datetime(2026, 12, 30, tzinfo=UTC)
    window = Window(now, now + timedelta(days=7), 168)
    row = project_row(d, enabled=True, last_fire=None, typical_seconds=None, now=now, window=window,
                      calendar=cal)
    assert [(e.day, e.reason) for e in row.excluded] == [
        ("2027-01-01", "holiday: New Year's Day (US)"), ("2027-01-02", "weekend: SAT"),
        ("2027-01-03", "weekend: SUN")]
    # New York midnight is 05:00Z: the first span starts in hour-bucket 24 + 24 + 5.
    assert (row.excluded[0].first, row.excluded[-1].last) == (53, 124)
    [mark] = row.marks
    assert mark.kind == "moved" and mark.at == datetime(2027, 1, 4, 14, tzinfo=UTC)
    assert mark.detail == "moved from Fri 2027-01-01 09:00 (holiday: New Year's Day (US))"
    orphan = project_row(d, enabled=True, last_fire=None, typical_seconds=None, now=now, window=window)
    assert orphan.note == "calendar cal is not applied: no fires" and not orphan.marks


def test_the_integer_interval_path_is_only_for_plain_intervals() -> None:
    from cronstream.shared.schedule import plain_interval

    assert plain_interval(job(type="INTERVAL", schedule=None, interval_seconds=60))
    assert not plain_interval(job(type="INTERVAL", schedule=None, interval_seconds=60, jitter_seconds=5))
    assert not plain_interval(job(type="INTERVAL", schedule=None, interval_seconds=60, calendar="cal"))
    assert not plain_interval(job(schedule="* * * * *"))


@pytest.mark.parametrize("on_excluded", ["NEXT_DAY", "PREVIOUS_DAY"])
@pytest.mark.parametrize("schedule", ["* * * * *", "30 2 * * *", "0 9 * * 1-5", "15 */6 * * *", "0 9 1 * *"])
def test_the_lean_path_of_moved_fires_agrees_with_the_long_way(
        monkeypatch: pytest.MonkeyPatch, on_excluded: str, schedule: str) -> None:
    """Where no excluded day is near, a NEXT_DAY / PREVIOUS_DAY job's next fire is its own
    schedule's, and an every-day schedule's moved fires are SKIP's (the lean paths); the
    long way, day by day, must say the same — across a holiday season and both of Berlin's
    DST changes."""
    import cronstream.shared.schedule as sched

    cal = calendar(timezone="Europe/Berlin", exclude_weekdays=["SAT"], holidays={"country": "DE"},
                   exclude_dates=["2026-03-30", "2026-10-26"])
    d = job(schedule=schedule, timezone="Europe/Berlin", calendar="cal", on_excluded=on_excluded)
    rng = random.Random(schedule + on_excluded)
    starts = [datetime(2026, m, day, tzinfo=UTC) + timedelta(minutes=rng.randrange(1440))
              for m, day in ((3, 27), (3, 28), (3, 29), (10, 24), (10, 25), (12, 22), (12, 27))]
    lean = [planned(d, s, 12, calendar=cal) for s in starts]
    monkeypatch.setattr(sched, "_OWN_FIRE_DAYS", -1)  # every fire the long way
    monkeypatch.setattr(sched, "_every_day", lambda _cron: False)
    assert [planned(d, s, 12, calendar=cal) for s in starts] == lean
