"""`job_definitions.next_execution_at`, kept current by the monitor's housekeeping from the
row's timing columns: the same instant the scheduler fires at, computed from the whole
definition (schedule.next_fire), for every kind of schedule."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from cronstream.services.monitor.decoding import DefinitionRecord
from cronstream.shared.records import JobDefinition, now_utc
from cronstream.shared.schedule import next_fire
from cronstream.shared.settings import Settings
from tests.support import sql, standalone_housekeeping

DEFINITIONS: list[dict[str, Any]] = [
    {"job_id": "cron-dst", "type": "CRON", "schedule": "*/7 * * * * *", "timezone": "Europe/Berlin"},
    {"job_id": "cron-daily", "type": "CRON", "schedule": "30 2 * * *", "timezone": "America/New_York"},
    {"job_id": "interval-anchored", "type": "INTERVAL", "interval_seconds": 13,
     "start_at": "2026-01-01T00:00:00.123456Z"},
    {"job_id": "interval-epoch", "type": "INTERVAL", "interval_seconds": 3600},
    {"job_id": "interval-ended", "type": "INTERVAL", "interval_seconds": 5,
     "start_at": "2026-01-01T00:00:00Z", "end_at": "2026-01-02T00:00:00Z"},
    {"job_id": "interval-not-started", "type": "INTERVAL", "interval_seconds": 60,
     "start_at": "2999-01-01T00:00:00.5+02:00"},
    {"job_id": "one-time-ahead", "type": "ONE_TIME", "run_at": "2999-06-01T12:00:00.250+05:30"},
    {"job_id": "one-time-past", "type": "ONE_TIME", "run_at": "2026-01-01T00:00:00Z"},
]


def test_next_runs_refreshed_from_the_stored_columns_equal_the_scheduler_s(topics: Settings) -> None:
    definitions = [JobDefinition.from_dict({"handler": "noop", **d}) for d in DEFINITIONS]

    async def scenario() -> datetime:
        pool = await asyncpg.create_pool(topics.database_url, min_size=1, max_size=2)
        housekeeping = standalone_housekeeping(topics, pool)
        try:
            async with pool.acquire() as conn:
                for offset, d in enumerate(definitions):
                    await housekeeping.store._definition(
                        conn, DefinitionRecord(d.job_id, d, now_utc(), 0, offset), sanitize=False)
                # Every next run in the past: the refresh recomputes all of them.
                await conn.execute("UPDATE job_definitions SET next_execution_at = now() - interval '1 day'")
            before = now_utc()
            await housekeeping.refresh_next_executions()
            return before
        finally:
            await housekeeping.close()
            await pool.close()

    before = asyncio.run(scenario())
    stored = {r["job_id"]: r["next_execution_at"] for r in sql(
        topics.database_url, "SELECT job_id, next_execution_at FROM job_definitions")}
    for d in definitions:
        # The refresh computed "after now" a moment after `before`: the same fire, unless a
        # fire fell inside that moment (a 7-second cron), then the one after it.
        expected = next_fire(d, before)
        assert stored[d.job_id] in (expected, expected and next_fire(d, expected)), d.job_id
    assert stored["interval-ended"] is None and stored["one-time-past"] is None
    assert stored["one-time-ahead"] == datetime.fromisoformat("2999-06-01T06:30:00.250+00:00")
    assert stored["interval-not-started"] == datetime.fromisoformat("2998-12-31T22:00:00.500+00:00")
    anchored = stored["interval-anchored"]  # on the grid of start_at in whole milliseconds
    anchor = datetime.fromisoformat("2026-01-01T00:00:00.123+00:00")
    assert anchored is not None and (anchored - anchor) % timedelta(seconds=13) == timedelta(0)
