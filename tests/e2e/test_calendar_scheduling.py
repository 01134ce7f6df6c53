"""Calendar-bound jobs against a real broker, only schedulers running (docs/decisions/0055):
a job fires on the days its calendar allows; editing the calendar to exclude today while
the scheduler runs stops it at once (the re-plan), including today again resumes it; a
job naming a calendar nobody applied waits and fires once it is; a jittered calendar job
survives a failover without a duplicate and with the same jitter. The test reads
`job-due` directly; a job without a calendar, firing every second beside them, is the
clock the waits are measured on (no sleeps)."""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from typing import Any

from cronstream.shared.schedule import jitter_ms
from cronstream.shared.settings import Settings
from tests.conftest import Processes
from tests.e2e.test_scheduler import first_attempts, interval_job, leader_of
from tests.support import eventually, produce, produce_json


def calendar(calendar_id: str, **fields: Any) -> dict[str, Any]:
    return {"calendar_id": calendar_id, "timezone": "UTC", **fields}


def days(*found: date) -> list[str]:
    return [d.isoformat() for d in found]


def since(settings: Settings, job_id: str, after: datetime) -> list[datetime]:
    return [t for t in first_attempts(settings, job_id) if t > after]


def ticks_after(settings: Settings, after: datetime, count: int = 3) -> None:
    """Wait until the control job (no calendar) has fired `count` times after `after`."""
    eventually(lambda: len(since(settings, "control", after)) >= count, 30,
               message=f"the control job fires {count} times after {after}")


def test_editing_a_calendar_while_the_scheduler_runs_replans_its_job(
    processes: Processes, topics: Settings,
) -> None:
    scheduler = processes.start("scheduler", name="scheduler")
    scheduler.wait_for_log("action=scheduler_ready")
    today = datetime.now(UTC).date()
    cal = topics.topics.calendars
    # Allowed today (only a day long past is excluded): it fires every second.
    produce_json(topics, cal, "ops", calendar("ops", exclude_dates=days(today - timedelta(days=400))))
    produce_json(topics, topics.topics.job_definitions, "control", interval_job("control"))
    produce_json(topics, topics.topics.job_definitions, "bound", interval_job("bound", calendar="ops"))
    # A job naming a calendar nobody applied: it waits (not suspended).
    produce_json(topics, topics.topics.job_definitions, "waiter", interval_job("waiter", calendar="later"))
    eventually(lambda: len(first_attempts(topics, "bound")) >= 3, 30, message="the bound job fires")
    scheduler.wait_for_log("action=job_waiting_for_calendar")
    assert "action=job_suspended" not in scheduler.log()

    # Today (and tomorrow: the test may cross midnight) excluded from now on.
    produce_json(topics, cal, "ops", calendar("ops", exclude_dates=days(today, today + timedelta(days=1))))
    scheduler.wait_for_log("calendar_id=ops jobs=1 offset=1")
    # A fire may have been committed ahead of its time (by scheduler_fire_ahead_ms).
    replanned = datetime.now(UTC) + timedelta(milliseconds=500)
    ticks_after(topics, replanned)
    late = since(topics, "bound", replanned)
    assert late == [], f"fired on a day its calendar now excludes: {late}"

    # Included again: it fires on, from the change on (nothing missed is made up).
    produce_json(topics, cal, "ops", calendar("ops", include_dates=days(today, today + timedelta(days=1)),
                                              exclude_weekdays=["MON", "TUE", "WED", "THU", "FRI",
                                                                "SAT", "SUN"]))
    scheduler.wait_for_log("calendar_id=ops jobs=1 offset=2")
    included = datetime.now(UTC)
    eventually(lambda: len(since(topics, "bound", included)) >= 3, 30, message="fires again")
    assert not [t for t in first_attempts(topics, "bound") if replanned < t < included - timedelta(seconds=1)]

    # The calendar the waiting job names comes: it fires. Deleted again: it stops.
    assert first_attempts(topics, "waiter") == []
    produce_json(topics, cal, "later", calendar("later"))
    eventually(lambda: len(first_attempts(topics, "waiter")) >= 2, 30, message="the waiting job fires")
    produce(topics, cal, b"later", None)
    scheduler.wait_for_log("calendar_id=later jobs=1 offset=deleted")
    deleted = datetime.now(UTC) + timedelta(milliseconds=500)
    ticks_after(topics, deleted)
    assert since(topics, "waiter", deleted) == []
    # Nothing fired twice.
    for job_id in ("control", "bound", "waiter"):
        repeated = [t for t, n in Counter(first_attempts(topics, job_id)).items() if n > 1]
        assert repeated == [], f"{job_id} fired twice at {repeated}"


def test_a_jittered_calendar_job_survives_a_failover_exactly_once(
    processes: Processes, topics: Settings,
) -> None:
    schedulers = [processes.start("scheduler", "--instance-id", f"s{i}", name=f"scheduler-{i}")
                  for i in range(2)]
    leader = leader_of(schedulers, topics, "jittered")
    today = datetime.now(UTC).date()
    produce_json(topics, topics.topics.calendars, "ops",
                 calendar("ops", exclude_dates=days(today - timedelta(days=400))))
    produce_json(topics, topics.topics.job_definitions, "jittered",
                 interval_job("jittered", 2, calendar="ops", jitter_seconds=1))
    produce_json(topics, topics.topics.job_definitions, "control", interval_job("control"))
    eventually(lambda: len(first_attempts(topics, "jittered")) >= 3, 30, message="fires before the kill")
    leader.kill()
    leader_of(schedulers, topics, "jittered", exclude={leader.pid})
    killed = datetime.now(UTC)
    eventually(lambda: len(since(topics, "jittered", killed)) >= 3, 60, message="fires after the failover")
    fires = first_attempts(topics, "jittered")
    repeated = [t for t, n in Counter(fires).items() if n > 1]
    assert repeated == [], f"fired twice: {repeated}"
    # Every fire is its nominal 2-second instant plus that instant's jitter, whoever fired it,
    # and no nominal instant is missing between the first fire and the last.
    nominal = [t.replace(microsecond=0) - timedelta(seconds=t.second % 2) for t in fires]
    for fire, instant in zip(fires, nominal, strict=True):
        assert fire == instant + timedelta(milliseconds=jitter_ms("jittered", instant, 1)), fire
    gaps = [b - a for a, b in itertools.pairwise(sorted(nominal))]
    assert gaps == [timedelta(seconds=2)] * len(gaps), "no nominal instant missed"
