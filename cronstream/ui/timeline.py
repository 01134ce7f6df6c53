"""The Timeline: past runs and the next projected fires of many jobs on one time axis.

Pure, no I/O. Fire times come from the firing code itself (`shared/schedule.next_fire`,
the function the scheduler fires with), so DST, `start_at` / `end_at` and interval
grids are exactly the scheduler's. Fires the scheduler has missed (its last fire is
older than the next expected one) are shown under the job's misfire policy, with the
rule of `services/scheduler/clock.py` (a unit test holds the two together):

- a fire late by no more than `misfire_grace_seconds` is simply due;
- FIRE_ALL fires every missed instant; FIRE_ONCE the first one, the others are
  skipped; SKIP fires none of them.

The axis is cut into buckets (one per few pixels); a job is asked for at most one fire
per bucket by jumping to the end of each bucket before asking for the next fire, so a
job firing every second costs as much to draw as one firing every hour.

A job with a calendar (docs/decisions/0055) is projected with it: the days it excludes
are shown as spans of the row, with the reason, and a fire the calendar moved to another
day (NEXT_DAY, PREVIOUS_DAY) is marked `moved`, saying from where.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from typing import Literal

from cronstream.shared.calendars import ResolvedCalendar
from cronstream.shared.cron import resolve_local
from cronstream.shared.records import JobDefinition
from cronstream.shared.schedule import next_fire, plan_next

__all__ = ["ExcludedDay", "Mark", "Row", "Window", "excluded_days", "load", "missed_fires",
           "project_row"]

_MS = timedelta(milliseconds=1)
MAX_MISSED = 1000

MarkKind = Literal["ok", "failed", "active", "projected", "moved", "late", "skipped", "due"]


@dataclass(frozen=True)
class Window:
    start: datetime
    end: datetime
    buckets: int

    @property
    def step(self) -> timedelta:
        return (self.end - self.start) / self.buckets

    def bucket(self, t: datetime) -> int:
        """The bucket of `t`, clamped to the window."""
        index = int((t - self.start) / self.step)
        return min(max(index, 0), self.buckets - 1)

    def bucket_end(self, index: int) -> datetime:
        return self.start + self.step * (index + 1)

    def contains(self, t: datetime) -> bool:
        return self.start <= t < self.end


@dataclass(frozen=True)
class Mark:
    first: int  # bucket where it starts
    last: int   # bucket where it ends (inclusive)
    kind: MarkKind
    at: datetime
    count: int = 1
    detail: str = ""  # a moved fire: where from, and why


@dataclass(frozen=True)
class ExcludedDay:
    """A day the job's calendar excludes, as a span of its row."""

    first: int
    last: int
    day: str  # YYYY-MM-DD, in the calendar's timezone
    reason: str


@dataclass
class Row:
    job_id: str
    marks: list[Mark] = field(default_factory=list)
    note: str = ""           # why nothing is projected, or a warning (overlaps)
    overlaps: bool = False
    typical_seconds: float | None = None
    excluded: list[ExcludedDay] = field(default_factory=list)
    calendar: str | None = None


def missed_fires(definition: JobDefinition, last_fire: datetime | None,
                 now: datetime, *, calendar: ResolvedCalendar | None = None
                 ) -> list[tuple[datetime, MarkKind]]:
    """Fires due between the scheduler's last fire and `now`, with what the scheduler
    will do about each: "due" (within the grace), "late" (will fire when the scheduler
    catches up), "skipped" (the misfire policy drops it)."""
    if last_fire is None:
        return []
    due = next_fire(definition, last_fire, calendar=calendar)
    if due is None or due > now:
        return []
    if (now - due).total_seconds() <= definition.misfire_grace_seconds:
        return [(due, "due")]
    missed: list[datetime] = []
    t: datetime | None = due
    while t is not None and t <= now and len(missed) < MAX_MISSED:
        missed.append(t)
        t = next_fire(definition, t, calendar=calendar)
    policy = definition.misfire_policy
    late: MarkKind = "late"
    skipped: MarkKind = "skipped"
    if policy == "FIRE_ALL":
        return [(t, late) for t in missed]
    if policy == "FIRE_ONCE":
        return [(missed[0], late)] + [(t, skipped) for t in missed[1:]]
    return [(t, skipped) for t in missed]


def _projected(definition: JobDefinition, after: datetime, window: Window,
               typical: timedelta, calendar: ResolvedCalendar | None) -> list[Mark]:
    """At most one mark per bucket from `after` to the end of the window."""
    marks: list[Mark] = []
    t = after
    zone = definition.zone
    while len(marks) <= window.buckets:
        planned = plan_next(definition, t, calendar=calendar)
        if planned is None or planned.at >= window.end:
            break
        fire = planned.at
        first = window.bucket(fire)
        if planned.moved_from is not None:
            moved = planned.moved_from.astimezone(zone).strftime("%a %Y-%m-%d %H:%M")
            marks.append(Mark(first, window.bucket(fire + typical), "moved", fire,
                              detail=f"moved from {moved} ({planned.moved_because})"))
        else:
            marks.append(Mark(first, window.bucket(fire + typical), "projected", fire))
        # Jump to the end of this bucket: the next mark lands in a later one.
        t = max(fire, window.bucket_end(first) - _MS)
    return marks


def excluded_days(calendar: ResolvedCalendar, window: Window) -> list[ExcludedDay]:
    """The days of the window `calendar` excludes, each a span from its midnight to the
    next (in the calendar's timezone), clamped to the window."""
    zone = calendar.zone
    found: list[ExcludedDay] = []
    day = window.start.astimezone(zone).date()
    while True:
        start = resolve_local(datetime.combine(day, time()), zone)
        if start >= window.end:
            return found
        end = resolve_local(datetime.combine(day + timedelta(days=1), time()), zone)
        reason = calendar.excluded(day)
        if reason is not None and end > window.start:
            found.append(ExcludedDay(window.bucket(max(start, window.start)),
                                     window.bucket(min(end, window.end) - _MS), day.isoformat(), reason))
        day += timedelta(days=1)


def _min_gap(definition: JobDefinition, now: datetime,
             calendar: ResolvedCalendar | None) -> timedelta | None:
    fires: list[datetime] = []
    t: datetime | None = now
    while t is not None and len(fires) < 4:
        t = next_fire(definition, t, calendar=calendar)
        if t is not None:
            fires.append(t)
    gaps = [b - a for a, b in itertools.pairwise(fires)]
    return min(gaps) if gaps else None


def project_row(definition: JobDefinition, *, enabled: bool, last_fire: datetime | None,
                typical_seconds: float | None, now: datetime, window: Window,
                calendar: ResolvedCalendar | None = None) -> Row:
    """The projected part of one job's row (past runs are added by the caller);
    `calendar`: the one the definition names, when it does."""
    row = Row(definition.job_id, typical_seconds=typical_seconds, calendar=definition.calendar)
    if definition.type == "DEPENDENT":
        row.note = "runs after " + ", ".join(definition.depends_on)
        return row
    if definition.calendar is not None:
        if calendar is None:
            row.note = f"calendar {definition.calendar} is not applied: no fires"
            return row
        row.excluded = excluded_days(calendar, window)
    if not enabled:
        row.note = "paused: no fires until resumed"
        return row
    typical = timedelta(seconds=typical_seconds or 0)
    for at, kind in missed_fires(definition, last_fire, now, calendar=calendar):
        if window.contains(at):
            row.marks.append(Mark(window.bucket(at), window.bucket(at), kind, at))
    row.marks.extend(_projected(definition, max(now, window.start - _MS), window, typical, calendar))
    gap = _min_gap(definition, now, calendar)
    limit = definition.max_concurrent_runs
    if gap is not None and typical_seconds and typical > gap:
        row.overlaps = True
        row.note = {
            "FORBID": "runs outlast the interval: FORBID will skip fires",
            "REPLACE": "runs outlast the interval: REPLACE will cancel runs",
        }.get(definition.concurrency_policy, "runs outlast the interval: runs overlap")
        if limit is not None and definition.concurrency_policy == "ALLOW":
            row.note = (f"runs outlast {limit} intervals: max_concurrent_runs will skip fires"
                        if typical > gap * limit else f"runs overlap, at most {limit} at once")
    if not row.marks and not row.note:
        row.note = "no fire in this window"
    return row


def load(rows: list[Row], buckets: int) -> list[int]:
    """How many jobs have a run (past or projected) in each bucket: peaks and quiet hours."""
    counts = [0] * buckets
    for row in rows:
        covered: set[int] = set()
        for mark in row.marks:
            if mark.kind == "skipped":
                continue
            covered.update(range(mark.first, mark.last + 1))
        for index in covered:
            counts[index] += 1
    return counts
