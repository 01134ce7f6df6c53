"""When a job fires: the one function the scheduler fires with and `preview` prints.

Times are aware UTC datetimes with at most millisecond precision (the wire precision of
`scheduled_at`), so that a fire computed by one leader equals the fire computed by the
next one bit for bit, and its deterministic `execution_id` with it.

- CRON: the compiled expression in the job's timezone (DST rule in `cron.next_after`).
- INTERVAL: an exact grid `anchor + k × interval_seconds`, anchored at `start_at` or, when
  absent, at the Unix epoch. The grid is a pure function of the definition: it never
  drifts with fire latency, survives failover and re-publishing, and ignores DST.
- ONE_TIME: `run_at`, once.
- DEPENDENT: never on a clock; the monitor starts them when their upstreams finish.
`start_at` bounds fires from below (inclusive), `end_at` from above (inclusive).

Then, in this order (docs/decisions/0055):
1. the calendar (`calendar`, given resolved: `shared/calendars.py`): a fire whose date in
   the calendar's timezone is excluded is dropped (`on_excluded: SKIP`), or moved to the
   nearest included day at the same wall-clock time (NEXT_DAY, PREVIOUS_DAY: see
   `_moved`); the fires of a job are a set of instants, so fires moved onto the same
   instant are one fire. `start_at` / `end_at` bound these *nominal* instants;
2. the jitter: each nominal instant n is delayed by `jitter_ms(job_id, n, jitter_seconds)`,
   kept below the gap to the next nominal instant, so jittered fires never reorder nor
   meet. `next_fire(d, after)` is the first *jittered* fire after `after`: the scheduler
   keeps its last fire as it fired, and continues after it.
`max_runs` is counted by whoever fires (`runs_left`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo

from cronstream.shared.calendars import MAX_EXCLUDED_DAYS, CalendarMissingError, ResolvedCalendar
from cronstream.shared.cron import CronExpression, compiled, resolve_local
from cronstream.shared.records import JobDefinition, zone_named

__all__ = ["Excluded", "Fire", "StoredTiming", "Timing", "excluded_instants", "first_fire",
           "from_epoch_ms", "jitter_ms", "next_after_nominal", "next_fire", "next_interval_fire_ms",
           "plain_interval",
           "plan_next", "planned", "runs_left", "to_epoch_ms", "to_millis", "upcoming"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_US = timedelta(microseconds=1)
_DAY = timedelta(days=1)
_SECOND = timedelta(seconds=1)


def to_epoch_ms(t: datetime) -> int:
    return (t - _EPOCH) // _MS


def from_epoch_ms(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


def to_millis(t: datetime) -> datetime:
    """Truncate to whole milliseconds (the precision of fire times)."""
    return t.replace(microsecond=t.microsecond - t.microsecond % 1000)


class Timing(Protocol):
    """What `next_fire` reads of a definition."""

    @property
    def job_id(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def schedule(self) -> str | None: ...
    @property
    def interval_seconds(self) -> int | None: ...
    @property
    def run_at(self) -> datetime | None: ...
    @property
    def start_at(self) -> datetime | None: ...
    @property
    def end_at(self) -> datetime | None: ...
    @property
    def zone(self) -> ZoneInfo: ...
    @property
    def calendar(self) -> str | None: ...
    @property
    def on_excluded(self) -> str: ...
    @property
    def jitter_seconds(self) -> int: ...


@dataclass(frozen=True, slots=True)
class StoredTiming:
    """The timing columns of a projected definition (`job_definitions`), for `next_fire`
    without parsing and validating the whole definition again."""

    type: str
    schedule: str | None
    interval_seconds: int | None
    run_at: datetime | None
    timezone: str
    start_at: datetime | None
    end_at: datetime | None
    job_id: str = ""
    jitter_seconds: int = 0
    calendar: str | None = None
    on_excluded: str = "SKIP"

    @property
    def zone(self) -> ZoneInfo:
        return zone_named(self.timezone)


@dataclass(frozen=True, slots=True)
class Fire:
    """One fire of a job: when it fires (`at`, jitter included), its nominal instant, and,
    for a fire the calendar moved to another day, the instant it was moved from and why."""

    at: datetime
    nominal: datetime
    moved_from: datetime | None = None
    moved_because: str | None = None

    @property
    def jitter_ms(self) -> int:
        return (self.at - self.nominal) // _MS


# -- jitter and max_runs ---------------------------------------------------------------


def jitter_ms(job_id: str, instant: datetime, jitter_seconds: int, limit_ms: int | None = None) -> int:
    """The delay of the fire of `job_id` at the nominal `instant`: a deterministic amount in
    [0, jitter_seconds × 1000) milliseconds (and below `limit_ms` when given: the gap to the
    next nominal fire), from a hash of the two, so every scheduler computes the same."""
    span = jitter_seconds * 1000 if limit_ms is None else min(jitter_seconds * 1000, limit_ms)
    if span <= 1:
        return 0
    digest = hashlib.blake2b(f"{job_id}|{to_epoch_ms(instant)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % span


def runs_left(max_runs: int | None, fired: int) -> int | None:
    """How many more fires a job with `max_runs` has after `fired` of them (None: no limit).
    At 0 the job no longer fires."""
    return None if max_runs is None else max(0, max_runs - fired)


# -- the nominal fires -----------------------------------------------------------------


def _raw_next(definition: Timing, after: datetime) -> datetime | None:
    """The first fire of the definition's own schedule strictly after `after`."""
    if definition.type == "CRON":
        assert definition.schedule is not None
        return _cron(definition).next_after(after, definition.zone)
    if definition.type == "INTERVAL":
        assert definition.interval_seconds is not None
        start = definition.start_at
        return _next_on_grid(to_millis(start) if start else _EPOCH, definition.interval_seconds, after)
    if definition.type == "ONE_TIME":
        assert definition.run_at is not None
        run_at = to_millis(definition.run_at)
        return run_at if run_at > after else None
    return None


def _cron(definition: Timing) -> CronExpression:
    assert definition.schedule is not None
    return compiled(definition.schedule, definition.job_id)


def _checked(definition: Timing, calendar: ResolvedCalendar | None) -> ResolvedCalendar | None:
    """The calendar the definition's fires follow: None without one; refused when the
    definition names another one, or one that was not given."""
    wanted = definition.calendar
    if wanted is None:
        return None
    if calendar is None:
        raise CalendarMissingError(f"calendar: {wanted!r} is not known (not applied, or deleted)")
    if calendar.calendar_id != wanted:
        raise ValueError(f"calendar: the definition names {wanted!r}, not {calendar.calendar_id!r}")
    return calendar


def _plain(definition: Timing, after: datetime) -> datetime | None:
    """The first nominal fire after `after` without a calendar (bounds applied): the path
    of every job without a calendar, kept lean (the scheduler computes one per fire)."""
    start, end = definition.start_at, definition.end_at
    if start is not None and after < start:
        after = start - _MS  # fires at start_at itself are allowed
    at = _raw_next(definition, after)
    if at is None or (end is not None and at > end):
        return None
    return to_millis(at)


def _nominal(definition: Timing, after: datetime, calendar: ResolvedCalendar | None) -> Fire | None:
    """The first nominal fire (calendar applied, bounds applied, no jitter) after `after`."""
    if calendar is None:
        at = _plain(definition, after)
        return None if at is None else Fire(at, at)
    start, end = definition.start_at, definition.end_at
    if start is not None and after < start:
        after = start - _MS  # fires at start_at itself are allowed
    fire: Fire | None
    if definition.on_excluded == "SKIP":
        fire = _skipping(definition, after, calendar, end)
    else:
        fire = _moved(definition, after, calendar)
    if fire is None or (end is not None and fire.nominal > end):
        return None
    at = to_millis(fire.nominal)
    return Fire(at, at, fire.moved_from, fire.moved_because)


def _skipping(definition: Timing, after: datetime, calendar: ResolvedCalendar,
              end: datetime | None) -> Fire | None:
    """SKIP: the first fire of the schedule after `after` on an included day. An excluded
    day is stepped over whole (from the next midnight in the calendar's timezone), so a
    fire every second costs one step per excluded day, not one per fire."""
    zone = calendar.zone
    t = after
    for _ in range(MAX_EXCLUDED_DAYS):
        at = _raw_next(definition, t)
        if at is None or (end is not None and at > end):
            return None
        day = at.astimezone(zone).date()
        if calendar.included(day):
            return Fire(at, at)
        t = resolve_local(datetime.combine(day + _DAY, time()), zone) - _US
    return None


def _moved(definition: Timing, after: datetime, calendar: ResolvedCalendar) -> Fire | None:
    """NEXT_DAY / PREVIOUS_DAY: the first fire after `after` when the fires of an excluded
    day move to the nearest included day after (before) it, at their wall-clock times.

    By days, in the job's timezone (which must be the calendar's): a run of excluded days
    lands on the included day after it (NEXT_DAY) or before it (PREVIOUS_DAY), so an
    included day T fires at the cron's times of day when the cron's day fields match T or
    any day of the run that lands on T — fires landing together are one. A wall-clock
    time T does not have (spring forward) fires at the first instant after the gap; one it
    has twice (fall back) at its first occurrence: the DST rule, as for any fire.

    Worked example, `0 9 * * *` with Saturdays and Sundays excluded, NEXT_DAY: Saturday's
    and Sunday's 09:00 land on Monday 09:00, which is also Monday's own: one fire Monday.
    `0 9 1 * *` in a month whose 1st is a Sunday: Monday the 2nd at 09:00 (moved_from the
    1st). With PREVIOUS_DAY: Friday the 30th (or 29th) at 09:00.
    """
    zone = definition.zone
    if zone.key != calendar.zone.key:
        raise ValueError(f"on_excluded: {definition.on_excluded} moves a fire to another day at the "
                         f"same wall-clock time, so the job's timezone ({zone.key}) must be its "
                         f"calendar's ({calendar.zone.key})")
    cron = _cron(definition)
    forward = definition.on_excluded == "NEXT_DAY"
    local_after = after.astimezone(zone).replace(tzinfo=None)
    first_day = local_after.date()
    if _every_day(cron):
        # Every day fires at the same wall-clock times: an excluded day's fires land on an
        # included day at times it fires at anyway (fires landing together are one), so the
        # moved schedule is SKIP's, stepped a day at a time.
        return _skipping(definition, after, calendar, None)
    lean = _own_fire(definition, after, calendar, first_day)
    if lean is not None:
        return lean
    day: date | None = _included_from(calendar, first_day, 1)
    for _ in range(MAX_EXCLUDED_DAYS):
        if day is None:
            return None
        run = _run(calendar, day, -1 if forward else 1)
        own = cron.matches_day(day)
        source = None if own else next((d for d in run if cron.matches_day(d)), None)
        if own or source is not None:
            found = _fire_on(cron, zone, day, local_after if day == first_day else None, after)
            if found is not None:
                if source is None:
                    return Fire(found, found)
                naive = _naive_time_of(cron, day, found, zone)
                moved = resolve_local(datetime.combine(source, naive), zone)
                return Fire(found, found, moved, calendar.excluded(source))
        # The next day the cron matches after this day's run, and the day it lands on.
        beyond = (run[-1] if run and not forward else day) + _DAY
        matching = cron.next_day(beyond)
        if matching is None:
            return None
        # NEXT_DAY: it lands on the first included day from it. PREVIOUS_DAY: on the last
        # included day up to it, which is `beyond` or later (`beyond` is included).
        day = _included_from(calendar, matching, 1 if forward else -1)
    return None


def _own_fire(definition: Timing, after: datetime, calendar: ResolvedCalendar,
              first_day: date) -> Fire | None:
    """The common case of `_moved`, on the schedule's own lean path: when every day from
    the one before `after`'s to the one after the schedule's next fire is included (at most
    a week), no excluded day's fire can land before that fire — it is the answer, as it is
    (fires of included days follow the DST rule on either path). None: take the long way."""
    at = _raw_next(definition, after)
    if at is None:
        return None
    last = at.astimezone(definition.zone).date()
    if (last - first_day).days > _OWN_FIRE_DAYS:
        return None
    day = first_day - _DAY
    while day <= last + _DAY:
        if not calendar.included(day):
            return None
        day += _DAY
    return Fire(at, at)


def _every_day(cron: CronExpression) -> bool:
    """The schedule fires on every day of every month, at the same times of day."""
    return (not cron.dom_restricted and not cron.dow_restricted and len(cron.months) == 12
            and not (cron.last_offsets or cron.nearest or cron.last_weekday or cron.nth or cron.last_of))


# How far ahead `_own_fire` looks for excluded days before it gives up the lean path.
_OWN_FIRE_DAYS = 7


def _included_from(calendar: ResolvedCalendar, day: date, step: int) -> date | None:
    """The first included day from `day` (itself included) in direction `step`."""
    for _ in range(MAX_EXCLUDED_DAYS):
        if calendar.included(day):
            return day
        day += _DAY * step
    return None


def _run(calendar: ResolvedCalendar, day: date, step: int) -> list[date]:
    """The excluded days next to `day` in direction `step` (-1: before it, nearest first),
    up to the next included day."""
    run: list[date] = []
    d = day + _DAY * step
    while len(run) < MAX_EXCLUDED_DAYS and not calendar.included(d):
        run.append(d)
        d += _DAY * step
    return run


def _fire_on(cron: CronExpression, zone: ZoneInfo, day: date, local_after: datetime | None,
             after: datetime) -> datetime | None:
    """The first instant after `after` at one of the cron's times of `day` (from the wall
    time `local_after` on, when `day` is its date)."""
    t = cron.first_time_on(day, local_after.time().replace(microsecond=0) if local_after else time())
    while t is not None:
        instant = resolve_local(t, zone)
        if instant > after:
            return instant
        if t.time() == time(23, 59, 59):
            return None
        t = cron.first_time_on(day, (t + _SECOND).time())
    return None


def _naive_time_of(cron: CronExpression, day: date, instant: datetime, zone: ZoneInfo) -> time:
    """The cron's wall-clock time of `day` that fires at `instant` (the first, when a
    spring-forward gap merged several)."""
    t = cron.first_time_on(day, time())
    while t is not None and resolve_local(t, zone) < instant:
        t = cron.first_time_on(day, (t + _SECOND).time()) if t.time() != time(23, 59, 59) else None
    return instant.astimezone(zone).time() if t is None else t.time()


# -- jittered fires ----------------------------------------------------------------------


def plan_next(definition: Timing, after: datetime, *,
              calendar: ResolvedCalendar | None = None) -> Fire | None:
    """The first fire of `definition` strictly after `after` (jitter included), with its
    nominal instant and, when the calendar moved it, where from; None if there is none.

    With a jitter J, the fire of nominal instant n is n + jitter_ms(job_id, n, J, gap to
    the next nominal instant): fires keep their order, so the first fire after `after` is
    that of the last nominal instant in (after − J, after] when it lands after `after`,
    else that of the first nominal instant after `after`. The former is found with at most
    ~log2(J ms) nominal computations (a bisection), however dense the schedule.
    """
    cal = _checked(definition, calendar)
    jitter = definition.jitter_seconds
    following = _nominal(definition, after, cal)
    if not jitter:
        return following
    span = timedelta(seconds=jitter)
    previous = _last_nominal_until(definition, after, span, cal)
    if previous is not None:
        fire = _jittered(definition, previous, following)
        if fire.at > after:
            return fire
    if following is None:
        return None
    return _jittered(definition, following, _nominal(definition, following.nominal, cal))


def _jittered(definition: Timing, fire: Fire, following: Fire | None) -> Fire:
    gap = None if following is None else (following.nominal - fire.nominal) // _MS
    delay = jitter_ms(definition.job_id, fire.nominal, definition.jitter_seconds, gap)
    return Fire(fire.nominal + delay * _MS, fire.nominal, fire.moved_from, fire.moved_because)


def _last_nominal_until(definition: Timing, after: datetime, span: timedelta,
                        cal: ResolvedCalendar | None) -> Fire | None:
    """The last nominal fire in (after − span, after], or None."""
    lo = after - span
    first = _nominal(definition, lo, cal)
    if first is None or first.nominal > after:
        return None
    second = _nominal(definition, first.nominal, cal)
    if second is None or second.nominal > after:
        return first
    # Bisect: the nominal fire after `lo` is at or before `after`, the one after `hi` is not.
    lo, hi = first.nominal, after
    while hi - lo > _MS:
        mid = to_millis(lo + (hi - lo) / 2)
        if mid <= lo:
            mid = lo + _MS
        found = _nominal(definition, mid, cal)
        if found is not None and found.nominal <= after:
            lo = mid
        else:
            hi = mid
    return _nominal(definition, lo, cal)


def next_after_nominal(definition: Timing, nominal: datetime, *,
                       calendar: ResolvedCalendar | None = None) -> Fire | None:
    """The fire that follows the fire of nominal instant `nominal`: `plan_next(definition,
    f)` where f is that fire (jitter included), without its search — the scheduler, going
    on after a fire it made, knows the fire's nominal instant. The same: a fire lands
    before the next nominal instant (the jitter is below the gap), so no nominal instant
    lies in (nominal, f], and the first fire after f is that of the nominal instant after
    `nominal` (tests/unit/test_clock_calendars.py holds the two equal)."""
    cal = _checked(definition, calendar)
    following = _nominal(definition, nominal, cal)
    if following is None or not definition.jitter_seconds:
        return following
    return _jittered(definition, following, _nominal(definition, following.nominal, cal))


def next_fire(definition: Timing, after: datetime, *,
              calendar: ResolvedCalendar | None = None) -> datetime | None:
    """The first fire of `definition` strictly after `after`, or None if there is none.
    `calendar`: the resolved calendar the definition names (CalendarMissingError when it
    names one and none is given)."""
    if definition.calendar is None and not definition.jitter_seconds and calendar is None:
        return _plain(definition, after)
    fire = plan_next(definition, after, calendar=calendar)
    return None if fire is None else fire.at


def first_fire(
    definition: JobDefinition, observed_at: datetime, last_fire: datetime | None, *,
    calendar: ResolvedCalendar | None = None,
) -> datetime | None:
    """The next fire of a definition the scheduler has just read (new or updated).

    A new job fires from the moment it was published (`observed_at`, the record's Kafka
    timestamp, so every leader computes the same value); an updated one continues after
    its last fire, never before the update. A ONE_TIME job whose `run_at` has passed
    fires once, late, under its misfire policy; it does not fire again for the same
    `run_at`. A change of the job's calendar is an update too: `observed_at` is then the
    calendar record's timestamp, so a fire the change moves into the past is not fired.
    """
    if definition.type == "ONE_TIME":
        assert definition.run_at is not None
        run_at = to_millis(definition.run_at)
        if definition.end_at is not None and run_at > definition.end_at:
            return None
        if definition.start_at is not None and run_at < definition.start_at:
            return None
        fire = run_at + jitter_ms(definition.job_id, run_at, definition.jitter_seconds) * _MS
        if last_fire is not None and fire <= last_fire:
            return None
        return fire
    after = observed_at - _MS  # a fire exactly at publication time counts
    if last_fire is not None and last_fire > after:
        after = last_fire
    return next_fire(definition, after, calendar=calendar)


def plain_interval(definition: Timing) -> bool:
    """Whether `next_interval_fire_ms` computes the definition's fires: an INTERVAL job
    without a calendar nor a jitter (any other goes through `next_fire`)."""
    return (definition.type == "INTERVAL" and definition.interval_seconds is not None
            and definition.calendar is None and not definition.jitter_seconds)


def next_interval_fire_ms(interval_seconds: int, start: datetime | None, end: datetime | None,
                          after_ms: int) -> int | None:
    """`next_fire` of an INTERVAL definition without a calendar nor a jitter, in epoch
    milliseconds, without building a datetime: the scheduler computes one per fire
    (tests/unit/test_schedule.py holds the two equal)."""
    start_us = None if start is None else (start - _EPOCH) // _US
    end_us = None if end is None else (end - _EPOCH) // _US
    after_us = after_ms * 1000
    if start_us is not None and after_us < start_us:
        after_us = start_us - 1000  # fires at start_at itself are allowed
    anchor_us = 0 if start_us is None else start_us - start_us % 1000
    step_us = interval_seconds * 1_000_000
    delta_us = after_us - anchor_us
    fire_us = anchor_us + (delta_us // step_us + 1 if delta_us >= 0 else 0) * step_us
    if end_us is not None and fire_us > end_us:
        return None
    return fire_us // 1000


def _next_on_grid(anchor: datetime, interval_seconds: int, after: datetime) -> datetime:
    step_us = interval_seconds * 1_000_000
    delta_us = (after - anchor) // _US
    k = delta_us // step_us + 1 if delta_us >= 0 else 0
    return anchor + timedelta(microseconds=k * step_us)


def upcoming(definition: JobDefinition, after: datetime, count: int, *,
             calendar: ResolvedCalendar | None = None, fired: int | None = None) -> list[datetime]:
    """The next `count` fires after `after` (for `preview`); given how many times the job
    has `fired`, at most the runs its `max_runs` leaves (preview assumes 0)."""
    return [f.at for f in planned(definition, after, count, calendar=calendar, fired=fired)]


def planned(definition: JobDefinition, after: datetime, count: int, *,
            calendar: ResolvedCalendar | None = None, fired: int | None = None) -> list[Fire]:
    """`upcoming`, with each fire's nominal instant and calendar move."""
    left = None if fired is None else runs_left(definition.max_runs, fired)
    if left is not None:
        count = min(count, left)
    fires: list[Fire] = []
    t: datetime | None = after
    while t is not None and len(fires) < count:
        fire = plan_next(definition, t, calendar=calendar)
        if fire is not None:
            fires.append(fire)
        t = None if fire is None else fire.at
    return fires


@dataclass(frozen=True, slots=True)
class Excluded:
    """An instant of the job's own schedule that its calendar excludes."""

    at: datetime
    day: date
    reason: str


def excluded_instants(definition: Timing, after: datetime, until: datetime,
                      calendar: ResolvedCalendar | None, limit: int) -> list[Excluded]:
    """The instants of the definition's own schedule in (after, until] (bounds applied)
    that `calendar` excludes, at most `limit`, with the reason: what preview and the
    timeline show beside the fires."""
    cal = _checked(definition, calendar)
    if cal is None:
        return []
    found: list[Excluded] = []
    t = after
    for _ in range(MAX_EXCLUDED_DAYS * 4):
        fire = _nominal(definition, t, None)
        if fire is None or fire.nominal > until or len(found) >= limit:
            break
        day = fire.nominal.astimezone(cal.zone).date()
        reason = cal.excluded(day)
        if reason is None:  # an included day: on from its end
            t = resolve_local(datetime.combine(day + _DAY, time()), cal.zone) - _US
            continue
        found.append(Excluded(fire.nominal, day, reason))
        t = fire.nominal
    return found
