"""When jobs fire: interval grid, one-time, bounds, first fires of new and updated jobs."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta
from typing import Any

from cronstream.shared.records import JobDefinition
from cronstream.shared.schedule import (
    first_fire,
    from_epoch_ms,
    next_fire,
    next_interval_fire_ms,
    to_epoch_ms,
    upcoming,
)


def job(**fields: Any) -> JobDefinition:
    return JobDefinition(**{"job_id": "j", "handler": "noop", **fields})


T0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)


def test_interval_grid_is_exact_and_anchored_at_the_epoch() -> None:
    d = job(type="INTERVAL", interval_seconds=7)
    fires = upcoming(d, T0 + timedelta(milliseconds=123), 50)
    assert all(int(f.timestamp()) % 7 == 0 and f.microsecond == 0 for f in fires)
    assert all(b - a == timedelta(seconds=7) for a, b in itertools.pairwise(fires))


def test_interval_grid_anchored_at_start_at_and_bounded_by_end_at() -> None:
    start = T0 + timedelta(milliseconds=250)
    d = job(type="INTERVAL", interval_seconds=10, start_at=start, end_at=start + timedelta(seconds=30))
    assert upcoming(d, T0 - timedelta(days=1), 10) == [start + timedelta(seconds=s) for s in (0, 10, 20, 30)]


def test_the_scheduler_integer_interval_fire_equals_next_fire() -> None:
    """The scheduler's per-fire path (epoch milliseconds) and next_fire agree, with
    start_at and end_at to the microsecond, before, on and after them."""
    rng = random.Random(16)
    for _ in range(5000):
        interval = rng.choice([1, 2, 7, 60, 3600, 86400 * 3])
        start = end = None
        if rng.random() < 0.7:
            start = T0 + timedelta(microseconds=rng.randrange(-10**10, 10**10))
        if rng.random() < 0.5:
            base = start or T0
            end = base + timedelta(microseconds=rng.randrange(1, 10**10))
        d = job(type="INTERVAL", interval_seconds=interval, start_at=start, end_at=end)
        pivot = to_epoch_ms(start or T0)
        for after_ms in (pivot - 1, pivot, pivot + 1, pivot + rng.randrange(-10**7, 10**8),
                         to_epoch_ms(end) if end else pivot + interval * 1000):
            fire = next_fire(d, from_epoch_ms(after_ms))
            assert next_interval_fire_ms(interval, start, end, after_ms) == (
                None if fire is None else to_epoch_ms(fire)), (interval, start, end, after_ms)


def test_interval_stays_on_its_utc_grid_across_a_dst_change() -> None:
    d = job(type="INTERVAL", interval_seconds=3600, timezone="America/New_York")
    fires = upcoming(d, datetime(2026, 3, 8, 4, 30, tzinfo=UTC), 6)
    assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(fires))
    assert all(f.minute == 0 and f.second == 0 for f in fires)


def test_cron_respects_start_and_end() -> None:
    d = job(type="CRON", schedule="0 * * * *", start_at=T0 + timedelta(hours=2),
            end_at=T0 + timedelta(hours=4))
    assert upcoming(d, T0, 10) == [T0 + timedelta(hours=h) for h in (2, 3, 4)]


def test_one_time_fires_once() -> None:
    d = job(type="ONE_TIME", run_at=T0)
    assert next_fire(d, T0 - timedelta(seconds=1)) == T0
    assert next_fire(d, T0) is None
    assert first_fire(d, T0 + timedelta(hours=1), None) == T0, "a past run_at still fires (late)"
    assert first_fire(d, T0 + timedelta(hours=1), T0) is None, "but only once"
    later = job(type="ONE_TIME", run_at=T0 + timedelta(days=1))
    assert first_fire(later, T0 + timedelta(hours=1), T0) == T0 + timedelta(days=1)


def test_new_job_fires_from_its_publication_and_an_update_continues_after_its_last_fire() -> None:
    d = job(type="INTERVAL", interval_seconds=60)
    published = T0 + timedelta(seconds=10)
    assert first_fire(d, published, None) == T0 + timedelta(minutes=1)
    assert first_fire(d, T0, None) == T0, "a fire at the publication instant counts"
    assert first_fire(d, published, T0 + timedelta(minutes=5)) == T0 + timedelta(minutes=6)


def test_dependent_jobs_never_fire_on_a_clock() -> None:
    d = job(type="DEPENDENT", depends_on=["a"])
    assert next_fire(d, T0) is None and first_fire(d, T0, None) is None
