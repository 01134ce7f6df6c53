"""The monitor applies CRONSTREAM_RETENTION_DAYS on its own schedule, and keeps projecting
while it does."""

from __future__ import annotations

import asyncio

import asyncpg

from cronstream.shared.settings import Settings
from tests.conftest import Processes
from tests.seed import seed
from tests.support import eventually, produce_json, sql


def test_the_monitor_prunes_what_is_older_than_retention_days_while_it_projects(
    processes: Processes, topics: Settings,
) -> None:
    url = topics.database_url

    async def seeded() -> None:
        conn = await asyncpg.connect(url)
        try:
            await seed(conn, jobs=20, executions=10_000, days=60, events_every=1, unlogged=False)
        finally:
            await conn.close()

    asyncio.run(seeded())
    old = "SELECT count(*) AS n FROM job_executions WHERE scheduled_at < now() - interval '30 days'"
    recent = "SELECT count(*) AS n FROM job_executions WHERE scheduled_at >= now() - interval '30 days'"
    kept = sql(url, recent)[0]["n"]
    assert sql(url, old)[0]["n"] > 4000
    monitor = processes.start("monitor", extra_env={"CRONSTREAM_RETENTION_DAYS": "30",
                                                    "CRONSTREAM_RETENTION_BATCH": "500"})
    produce_json(topics, topics.topics.job_definitions, "fresh", {
        "job_id": "fresh", "type": "INTERVAL", "interval_seconds": 60, "handler": "noop"})
    monitor.wait_for_log("action=retention_pruned")
    assert "complete=True" in monitor.log() and "batches=" in monitor.log()
    assert sql(url, old)[0]["n"] == 0
    assert sql(url, recent)[0]["n"] == kept
    assert sql(url, "SELECT count(*) AS n FROM execution_events e WHERE NOT EXISTS "
                    "(SELECT 1 FROM job_executions j WHERE j.execution_id = e.execution_id)")[0]["n"] == 0
    eventually(lambda: sql(url, "SELECT 1 FROM job_definitions WHERE job_id = 'fresh'"), 30,
               message="the projection goes on")
