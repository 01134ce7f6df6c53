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
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from cronstream.shared.records import JobDefinition
from cronstream.shared.schedule import next_fire

__all__ = ["Mark", "Row", "Window", "load", "missed_fires", "project_row"]

_MS = timedelta(milliseconds=1)
MAX_MISSED = 1000

MarkKind = Literal["ok", "failed", "active", "projected", "late", "skipped", "due"]


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


@dataclass
class Row:
    job_id: str
    marks: list[Mark] = field(default_factory=list)
    note: str = ""           # why nothing is projected, or a warning (overlaps)
    overlaps: bool = False
    typical_seconds: float | None = None


def missed_fires(definition: JobDefinition, last_fire: datetime | None,
                 now: datetime) -> list[tuple[datetime, MarkKind]]:
    """Fires due between the scheduler's last fire and `now`, with what the scheduler
    will do about each: "due" (within the grace), "late" (will fire when the scheduler
    catches up), "skipped" (the misfire policy drops it)."""
    if last_fire is None:
        return []
    due = next_fire(definition, last_fire)
    if due is None or due > now:
        return []
    if (now - due).total_seconds() <= definition.misfire_grace_seconds:
        return [(due, "due")]
    missed: list[datetime] = []
    t: datetime | None = due
    while t is not None and t <= now and len(missed) < MAX_MISSED:
        missed.append(t)
        t = next_fire(definition, t)
    policy = definition.misfire_policy
    late: MarkKind = "late"
    skipped: MarkKind = "skipped"
    if policy == "FIRE_ALL":
        return [(t, late) for t in missed]
    if policy == "FIRE_ONCE":
        return [(missed[0], late)] + [(t, skipped) for t in missed[1:]]
    return [(t, skipped) for t in missed]


def _projected(definition: JobDefinition, after: datetime, window: Window,
               typical: timedelta) -> list[Mark]:
    """At most one mark per bucket from `after` to the end of the window."""
    marks: list[Mark] = []
    t = after
    while len(marks) <= window.buckets:
        fire = next_fire(definition, t)
        if fire is None or fire >= window.end:
            break
        first = window.bucket(fire)
        marks.append(Mark(first, window.bucket(fire + typical), "projected", fire))
        # Jump to the end of this bucket: the next mark lands in a later one.
        t = max(fire, window.bucket_end(first) - _MS)
    return marks


def _min_gap(definition: JobDefinition, now: datetime) -> timedelta | None:
    fires: list[datetime] = []
    t: datetime | None = now
    while t is not None and len(fires) < 4:
        t = next_fire(definition, t)
        if t is not None:
            fires.append(t)
    gaps = [b - a for a, b in itertools.pairwise(fires)]
    return min(gaps) if gaps else None


def project_row(definition: JobDefinition, *, enabled: bool, last_fire: datetime | None,
                typical_seconds: float | None, now: datetime, window: Window) -> Row:
    """The projected part of one job's row (past runs are added by the caller)."""
    row = Row(definition.job_id, typical_seconds=typical_seconds)
    if definition.type == "DEPENDENT":
        row.note = "runs after " + ", ".join(definition.depends_on)
        return row
    if not enabled:
        row.note = "paused: no fires until resumed"
        return row
    typical = timedelta(seconds=typical_seconds or 0)
    for at, kind in missed_fires(definition, last_fire, now):
        if window.contains(at):
            row.marks.append(Mark(window.bucket(at), window.bucket(at), kind, at))
    row.marks.extend(_projected(definition, max(now, window.start - _MS), window, typical))
    gap = _min_gap(definition, now)
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
