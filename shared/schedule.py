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
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Protocol
from zoneinfo import ZoneInfo

from cronstream.shared.cron import CronExpression, parse_cron
from cronstream.shared.records import JobDefinition, zone_named

__all__ = ["StoredTiming", "Timing", "first_fire", "from_epoch_ms", "next_fire",
           "next_interval_fire_ms", "to_epoch_ms", "to_millis", "upcoming"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def to_epoch_ms(t: datetime) -> int:
    return (t - _EPOCH) // _MS


def from_epoch_ms(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


def to_millis(t: datetime) -> datetime:
    """Truncate to whole milliseconds (the precision of fire times)."""
    return t.replace(microsecond=t.microsecond - t.microsecond % 1000)


@lru_cache(maxsize=65536)
def _compiled(expression: str) -> CronExpression:
    return parse_cron(expression)


class Timing(Protocol):
    """What `next_fire` reads of a definition."""

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

    @property
    def zone(self) -> ZoneInfo:
        return zone_named(self.timezone)


def next_fire(definition: Timing, after: datetime) -> datetime | None:
    """The first fire of `definition` strictly after `after`, or None if there is none."""
    start, end = definition.start_at, definition.end_at
    if start is not None and after < start:
        after = start - _MS  # fires at start_at itself are allowed
    fire: datetime | None
    if definition.type == "CRON":
        assert definition.schedule is not None
        fire = _compiled(definition.schedule).next_after(after, definition.zone)
    elif definition.type == "INTERVAL":
        assert definition.interval_seconds is not None
        fire = _next_on_grid(
            to_millis(start) if start else _EPOCH, definition.interval_seconds, after
        )
    elif definition.type == "ONE_TIME":
        assert definition.run_at is not None
        run_at = to_millis(definition.run_at)
        fire = run_at if run_at > after else None
    else:
        fire = None
    if fire is None or (end is not None and fire > end):
        return None
    return to_millis(fire)


def first_fire(
    definition: JobDefinition, observed_at: datetime, last_fire: datetime | None
) -> datetime | None:
    """The next fire of a definition the scheduler has just read (new or updated).

    A new job fires from the moment it was published (`observed_at`, the record's Kafka
    timestamp, so every leader computes the same value); an updated one continues after
    its last fire, never before the update. A ONE_TIME job whose `run_at` has passed
    fires once, late, under its misfire policy; it does not fire again for the same
    `run_at`.
    """
    if definition.type == "ONE_TIME":
        assert definition.run_at is not None
        run_at = to_millis(definition.run_at)
        if last_fire is not None and run_at <= last_fire:
            return None
        if definition.end_at is not None and run_at > definition.end_at:
            return None
        if definition.start_at is not None and run_at < definition.start_at:
            return None
        return run_at
    after = observed_at - _MS  # a fire exactly at publication time counts
    if last_fire is not None and last_fire > after:
        after = last_fire
    return next_fire(definition, after)


_US = timedelta(microseconds=1)


def next_interval_fire_ms(interval_seconds: int, start: datetime | None, end: datetime | None,
                          after_ms: int) -> int | None:
    """`next_fire` of an INTERVAL definition, in epoch milliseconds, without building a
    datetime: the scheduler computes one per fire (tests/unit/test_schedule.py holds the
    two equal)."""
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


def upcoming(definition: JobDefinition, after: datetime, count: int) -> list[datetime]:
    """The next `count` fires after `after` (for `preview`)."""
    fires: list[datetime] = []
    t: datetime | None = after
    while t is not None and len(fires) < count:
        t = next_fire(definition, t)
        if t is not None:
            fires.append(t)
    return fires
