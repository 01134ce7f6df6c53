"""The live DST test pattern (a travelled clock) for one calendar-bound job (issue 58,
docs/decisions/0055): the real scheduler, against the real broker, fires a CRON job
whose Saturday fire its calendar moves (`on_excluded: NEXT_DAY`) onto a DST-change
Sunday in Europe/Berlin, at the instants `cronstream preview`'s code path computes
(shared/schedule.planned with the resolved calendar) and the DST rule
(docs/reference/semantics.md#dst) says:

- spring forward (2026-03-29, 02:00 CET → 03:00 CEST): Saturday's `30 2` moves to a
  wall-clock time Sunday does not have, so it fires at the first instant after the gap,
  03:00 CEST (01:00Z), once;
- fall back (2026-10-25, 03:00 CEST → 02:00 CET): Sunday has 02:30 twice; it fires at the
  first occurrence, 02:30 CEST (00:30Z), and not at the second, 02:30 CET (01:30Z).

The clock is travelled with `time-machine`, which patches Python's clocks only, so the
scheduler runs in this process (a SchedulerService with real Kafka clients, in a thread
with its own event loop): its wall clock (`time.time_ns`, `datetime.now`) is the
travelled one, while `time.monotonic` — asyncio's timers and the pauses between rounds —
and librdkafka keep real time. libfaketime, which would travel a service process, breaks
librdkafka. The broker stamps records with its producers' real time unless told
otherwise, and a new job fires from its definition record's Kafka timestamp, so the
definitions and the calendar are published with the travelled time as their timestamp
(the broker keeps a producer's timestamp; one in the past is accepted, while Kafka 4
refuses one over an hour ahead, log.message.timestamp.after.max.ms: the changes travelled
to are past ones).

Each case travels to a minute before its first expected fire, starts the scheduler, jumps (with
nothing scheduled yet) to 5 s before the first expected fire, publishes the calendar and
the job, and reads `job-due` until a job without a calendar firing every second — the
clock the waits are measured on, no sleeps — is past the instants looked at (for fall
back, it then jumps an hour on, with nothing of the job due in between, to 5 s before the
repeated 02:30). It asserts that the scheduler's fires up to there are preview's, that
they are the DST rule's, that the fire is Saturday's moved by the calendar, and that it
was committed when the travelled clock read its instant (not before its fire-ahead, not
late)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import time_machine
from confluent_kafka import Producer

from cronstream.services.scheduler.service import SchedulerService
from cronstream.shared.calendars import resolve
from cronstream.shared.records import Calendar, JobDefinition
from cronstream.shared.schedule import planned
from cronstream.shared.settings import Settings
from tests.e2e.test_scheduler import dues, first_attempts, interval_job
from tests.support import eventually

BERLIN = ZoneInfo("Europe/Berlin")
LEAD = timedelta(seconds=5)  # travelled time between publishing the job and its first fire


def publish(settings: Settings, topic: str, key: str, value: dict[str, Any], at: datetime) -> None:
    """One record, stamped with the travelled time `at` (librdkafka stamps real time)."""
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                         "enable.idempotence": True, "partitioner": "murmur2_random"})
    producer.produce(topic, json.dumps(value).encode(), key.encode(),
                     timestamp=int(at.timestamp() * 1000))
    assert producer.flush(30) == 0


@contextlib.contextmanager
def scheduler_in_process(settings: Settings) -> Iterator[SchedulerService]:
    """A SchedulerService with real Kafka clients on an event loop of its own thread,
    ready (its shards led) when this yields; stopped, and what stopped it raised, after."""
    service = SchedulerService(settings, "s1")
    loop = asyncio.new_event_loop()
    stopping = asyncio.Event()
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(service.run(stopping))
        except BaseException as exc:  # reported in the test's thread
            failure.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="scheduler", daemon=True)
    thread.start()
    try:
        eventually(lambda: failure or service.health.ready()[0], 60, message="the scheduler is ready")
        assert not failure, f"the scheduler stopped: {failure[0]!r}"
        yield service
    finally:
        loop.call_soon_threadsafe(stopping.set)
        thread.join(40)
        assert not thread.is_alive(), "the scheduler did not stop"
    assert not failure, f"the scheduler failed: {failure[0]!r}"


def past(settings: Settings, instant: datetime) -> bool:
    """The control job (no calendar, every second) has fired after `instant`: the
    scheduler's clock is past it, so what the bound job fires up to it is on job-due."""
    return any(t > instant for t in first_attempts(settings, "control"))


@dataclass(frozen=True)
class Change:
    """A DST change in Berlin, the Saturday before it (excluded), the fire the job's
    Saturday 02:30 moves to on the Sunday, and a repeated 02:30 it must not fire at."""

    excluded: date
    first: datetime
    not_at: datetime | None = None


# The job's `30 2 * * 6` (02:30 on Saturdays): Saturday excluded, it moves to the Sunday.
CASES = {
    # 02:30 does not exist on 2026-03-29: the first instant after the gap, 03:00 CEST.
    "spring_forward": Change(date(2026, 3, 28), datetime(2026, 3, 29, 1, 0, tzinfo=UTC)),
    # 02:30 exists twice on 2026-10-25: the first occurrence (CEST), not the second (CET).
    "fall_back": Change(date(2026, 10, 24), datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
                        not_at=datetime(2026, 10, 25, 1, 30, tzinfo=UTC)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_calendar_moved_fire_crosses_a_dst_change_on_the_travelled_clock(
    topics: Settings, case: str,
) -> None:
    excluded, first, not_at = CASES[case].excluded, CASES[case].first, CASES[case].not_at
    # What the test expects is what the DST rule says (a check of the vectors themselves).
    local = first.astimezone(BERLIN)
    assert local.date() == excluded + timedelta(days=1)
    if not_at is None:
        assert local.time().isoformat() == "03:00:00"  # 02:30 falls in the gap
    else:
        assert local.time().isoformat() == "02:30:00" and local.fold == 0
        repeated = not_at.astimezone(BERLIN)
        assert repeated.time() == local.time() and repeated.fold == 1  # the same wall time again
    calendar = {"calendar_id": "berlin", "timezone": "Europe/Berlin",
                "exclude_dates": [excluded.isoformat()]}
    job = {"job_id": "bound", "type": "CRON", "schedule": "30 2 * * 6", "timezone": "Europe/Berlin",
           "handler": "noop", "calendar": "berlin", "on_excluded": "NEXT_DAY"}

    with (time_machine.travel(first - timedelta(minutes=1), tick=True) as traveller,
          scheduler_in_process(topics)):
        # Ready, with nothing scheduled yet: on to just before the first fire.
        traveller.move_to(first - LEAD)
        published = datetime.now(UTC)
        # Travelled minus real time, from here on (tick=True: both advance alike).
        shift = published - datetime.fromtimestamp(time_machine.escape_hatch.time.time(), UTC)
        publish(topics, topics.topics.calendars, "berlin", calendar, published)
        publish(topics, topics.topics.job_definitions, "control", interval_job("control"), published)
        publish(topics, topics.topics.job_definitions, "bound", job, published)
        until = first + timedelta(seconds=2)
        eventually(lambda: past(topics, until), 30, message=f"the scheduler's clock passes {until}")
        fired = first_attempts(topics, "bound")
        records = dues(topics, "bound")
        if not_at is not None:
            # An hour on (nothing of the bound job is due in between): the repeated 02:30.
            traveller.move_to(not_at - LEAD)
            until = not_at + timedelta(seconds=2)
            eventually(lambda: past(topics, until), 30, message=f"the scheduler's clock passes {until}")
            fired = first_attempts(topics, "bound")

    # preview's code path (cli/previews.py): the fires after the job's publication (as
    # first_fire computes them), its calendar resolved.
    definition = JobDefinition.model_validate_json(json.dumps(job))
    previewed = planned(definition, published - timedelta(milliseconds=1), 3, fired=0,
                        calendar=resolve(Calendar.model_validate_json(json.dumps(calendar))))
    window = [f.at for f in previewed if f.at <= until]
    assert fired == window, f"the scheduler fired {fired}, preview says {window} up to {until}"
    assert window == [first], f"preview and the scheduler say {window}; the DST rule says {[first]}"
    # It is Saturday's fire, moved by the calendar (the job has no Sunday of its own).
    saturday = datetime.combine(excluded, time(2, 30), BERLIN).astimezone(UTC)
    assert (previewed[0].moved_from, previewed[0].moved_because) == (saturday, "excluded date")
    # ...on its clock's time: committed when the travelled clock read the instant (at most
    # scheduler_fire_ahead_ms before it, the workers start it at scheduled_at), not late.
    [(due, stamped_ms)] = records
    committed = datetime.fromtimestamp(stamped_ms / 1000, UTC) + shift
    ahead = timedelta(milliseconds=topics.scheduler_fire_ahead_ms + 100)
    assert first - ahead <= committed <= first + timedelta(seconds=2), (
        f"fired for {due.scheduled_at} when the travelled clock read {committed}")
