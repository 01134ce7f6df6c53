"""Calendars as the monitor projects them, on the real broker and database: every accepted
record of `calendars` is a numbered version (a change, a delete, a re-create), the current
one is what `cronstream calendars` lists, one that does not validate is dead-lettered, and a
change re-plans the next run of every job that names the calendar (docs/decisions/0055)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import asyncpg

from cronstream._plumbing import Plumbing
from cronstream.client import Client
from cronstream.services.monitor.decoding import Decoder, DefinitionRecord
from cronstream.services.monitor.store import ProjectionStore, calendars_of, create_staging
from cronstream.shared.calendars import resolve
from cronstream.shared.inbound import DLQ_ERROR, Inbound
from cronstream.shared.records import DELETED_BY_HEADER, Calendar, JobDefinition, now_utc
from cronstream.shared.schedule import next_fire
from cronstream.shared.settings import Settings
from tests.support import header, produce, produce_json, read_all, sql, standalone_housekeeping

WEEKENDS = {"calendar_id": "ops", "timezone": "Europe/Berlin", "exclude_weekdays": ["SAT", "SUN"],
            "created_by": "alice@host"}
HOLIDAYS = {**WEEKENDS, "holidays": {"country": "DE", "subdivision": "BY"}, "created_by": "bob@host"}


def test_calendars_are_projected_versioned_and_their_jobs_replanned(topics: Settings) -> None:
    t = topics.topics
    produce_json(topics, t.calendars, "ops", WEEKENDS)
    produce_json(topics, t.calendars, "ops", HOLIDAYS)
    produce_json(topics, t.calendars, "ops", {**HOLIDAYS, "holidays": {"country": "XX"}})  # invalid
    produce(topics, t.calendars, b"ops", None, headers=[(DELETED_BY_HEADER, b"carol@host")])
    produce(topics, t.calendars, b"never-was", None)  # a delete of nothing: no version
    produce_json(topics, t.calendars, "ops", HOLIDAYS)
    messages = read_all(topics, t.calendars)
    assert len(messages) == 6
    job = JobDefinition.from_dict({"job_id": "report", "type": "CRON", "schedule": "0 9 * * *",
                                   "timezone": "Europe/Berlin", "handler": "noop", "calendar": "ops"})

    async def scenario() -> None:
        pool = await asyncpg.create_pool(topics.database_url, min_size=1, max_size=2, init=create_staging)
        store = ProjectionStore(pool, "test", t)
        housekeeping = standalone_housekeeping(topics, pool)
        try:
            # The job first, before its calendar exists: no next run to show.
            async with pool.acquire() as conn:
                await store._definition(conn, DefinitionRecord("report", job, now_utc(), 0, 0), sanitize=False)
            assert await pool.fetchval("SELECT next_execution_at FROM job_definitions") is None
            batch = Decoder(Inbound("monitor", t), t).decode(messages)
            assert [c.offset for c in batch.calendars] == [0, 1, 3, 4, 5]
            [(dead, topic, _, offset)] = batch.dead
            assert (topic, offset) == (t.calendars, 2)
            assert "holidays: country: 'XX' is not a country" in (header_of(dead.headers, DLQ_ERROR) or "")
            async with store.transaction(batch) as fresh:
                await store.write(fresh)
            # The calendar's change made the job due for a new next run; housekeeping computes it.
            await housekeeping.refresh_next_executions()
            async with pool.acquire() as conn:
                found = await calendars_of(conn, ["ops", "never-was"])
            assert list(found) == ["ops"] and found["ops"].excluded(datetime(2026, 1, 6).date()) \
                == "holiday: Epiphany (DE-BY)"
            # Projected again (a crash before the Kafka commit): the fence leaves it out.
            async with store.transaction(batch) as fresh:
                assert fresh.calendars == []
        finally:
            await housekeeping.close()
            await pool.close()

    asyncio.run(scenario())
    assert_projected(topics, job)


def assert_projected(topics: Settings, job: JobDefinition) -> None:
    """Four versions, the current calendar, the job's next run with it, and what the CLI reads."""
    versions = sql(topics.database_url, "SELECT calendar_id, version, definition IS NULL AS deleted, created_by, "
                   "kafka_offset FROM calendar_versions ORDER BY calendar_id, version")
    assert [tuple(r) for r in versions] == [
        ("ops", 1, False, "alice@host", 0), ("ops", 2, False, "bob@host", 1),
        ("ops", 3, True, "carol@host", 3), ("ops", 4, False, "bob@host", 5)]
    [row] = sql(topics.database_url, "SELECT calendar_id, timezone, version, deleted_at, definition::text "
                "FROM calendars")
    assert (row["calendar_id"], row["timezone"], row["version"], row["deleted_at"]) == ("ops", "Europe/Berlin", 4, None)
    assert json.loads(row["definition"])["holidays"] == {"country": "DE", "subdivision": "BY"}
    # The next run is the scheduler's, with the calendar: never on a weekend or a holiday.
    [(upcoming,)] = sql(topics.database_url, "SELECT next_execution_at FROM job_definitions")
    expected = next_fire(job, now_utc(), calendar=resolve(Calendar.from_dict(HOLIDAYS)))
    assert upcoming is not None and expected is not None and abs((upcoming - expected).total_seconds()) < 86400 * 7
    assert upcoming.astimezone(job.zone).weekday() < 5
    # What `cronstream calendars` and `calendar history` read.
    with Client(topics) as client:
        [listed] = Plumbing(client).fetch("calendars_list", False)
        assert (listed["calendar_id"], listed["jobs"], listed["version"]) == ("ops", 1, 4)
        history = client.calendar_history("ops")
        assert [(v.version, v.created_by, v.document is None) for v in history] == [
            (1, "alice@host", False), (2, "bob@host", False), (3, "carol@host", True), (4, "bob@host", False)]
        assert history[0].recorded_at <= history[-1].recorded_at <= datetime.now(UTC)


def header_of(headers: list[tuple[str, bytes]] | None, name: str) -> str | None:
    for key, value in headers or []:
        if key == name:
            return value.decode()
    return None


def test_the_sdk_applies_reads_and_deletes_calendars_and_refuses_a_job_naming_a_missing_one(
    topics: Settings,
) -> None:
    with Client(topics) as client:
        assert client.apply_calendars([WEEKENDS, {"calendar_id": "us", "holidays": {"country": "US"}}]) == [
            "ops", "us"]
        found = client.calendars()
        assert sorted(found) == ["ops", "us"] and found["ops"].created_by == "alice@host"
        assert found["us"].created_by and found["us"].created_at is not None, "stamped"
        client.delete_calendar("us", by="dan@host")
        assert sorted(client.calendars()) == ["ops"]
        try:
            client.apply([{"job_id": "j", "type": "CRON", "schedule": "0 9 * * *", "handler": "noop",
                           "calendar": "us"}])
            raise AssertionError("a job naming a deleted calendar was sent")
        except ValueError as exc:
            assert "job_id 'j': calendar: no calendar 'us'" in str(exc)
        try:
            client.apply([{"job_id": "j", "type": "CRON", "schedule": "0 9 * * *", "handler": "noop",
                           "calendar": "ops", "on_excluded": "NEXT_DAY"}])
            raise AssertionError("a job moving fires in another timezone was sent")
        except ValueError as exc:
            assert "on_excluded: NEXT_DAY" in str(exc) and "(UTC) must be its calendar's (Europe/Berlin)" in str(exc)
        assert client.apply([{"job_id": "j", "type": "CRON", "schedule": "0 9 * * *", "handler": "noop",
                              "timezone": "Europe/Berlin", "calendar": "ops", "on_excluded": "NEXT_DAY"}]) == ["j"]
    deletes = [m for m in read_all(topics, topics.topics.calendars) if m.value() is None]
    assert [header(m, DELETED_BY_HEADER) for m in deletes] == ["dan@host"]
