"""`cronstream prune --older-than`: deletes what is old, whole executions with their events,
and nothing that is recent or still open."""

from __future__ import annotations

import asyncio
import re

import asyncpg

from cronstream.shared.settings import Settings
from tests.seed import seed
from tests.support import cli, sql

COUNTS = {
    "old": "SELECT count(*) AS n FROM job_executions WHERE scheduled_at < now() - interval '30 days'",
    "recent": "SELECT count(*) AS n FROM job_executions WHERE scheduled_at >= now() - interval '30 days'",
    "orphans": "SELECT count(*) AS n FROM execution_events e WHERE NOT EXISTS "
               "(SELECT 1 FROM job_executions j WHERE j.execution_id = e.execution_id)",
    "events": "SELECT count(*) AS n FROM execution_events",
    "logs": "SELECT count(*) AS n FROM execution_logs",
    "old_logs": "SELECT count(*) AS n FROM execution_logs l JOIN job_executions j USING (execution_id) "
                "WHERE j.scheduled_at < now() - interval '30 days'",
    "log_orphans": "SELECT count(*) AS n FROM execution_logs l WHERE NOT EXISTS "
                   "(SELECT 1 FROM job_executions j WHERE j.execution_id = l.execution_id)",
    "old_alerts": "SELECT count(*) AS n FROM alerts WHERE fired_at < now() - interval '30 days'",
    "old_firing": "SELECT count(*) AS n FROM alerts WHERE fired_at < now() - interval '30 days' "
                  "AND state = 'FIRING' AND kind <> 'EXECUTION_PERMANENTLY_FAILED'",
    "old_evaluations": "SELECT count(*) AS n FROM dag_evaluations WHERE decided_at < now() - interval '30 days'",
    "offline": "SELECT count(*) AS n FROM workers WHERE status = 'OFFLINE'",
    "active": "SELECT count(*) AS n FROM workers WHERE status = 'ACTIVE'",
}


def counts(url: str) -> dict[str, int]:
    return {name: sql(url, statement)[0]["n"] for name, statement in COUNTS.items()}


def seeded(url: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(url)
        try:
            await seed(conn, jobs=50, executions=20_000, days=60, events_every=1, unlogged=False)
            # Old but still running (a long job): it is not finished, so it stays.
            await conn.execute(
                "INSERT INTO job_executions (execution_id, job_id, run_id, status, scheduled_at, "
                "attempt_number, last_event, updated_at) VALUES (gen_random_uuid(), 'job-0001', "
                "gen_random_uuid(), 'RUNNING', now() - interval '40 days', 1, 'RUNNING', now())")
        finally:
            await conn.close()

    asyncio.run(run())


def test_prune_deletes_old_executions_with_their_events_and_keeps_the_rest(settings: Settings) -> None:
    url = settings.database_url
    seeded(url)
    before = counts(url)
    assert before["old"] > 9000 and before["events"] == 3 * (before["old"] + before["recent"] - 1)
    assert before["old_logs"] > 0 and before["logs"] > before["old_logs"]  # failures' logs

    dry = cli(settings, "prune", "--older-than", "30d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    would = int(re.search(r"(\d+) executions", dry.stdout)[1])  # type: ignore[index]
    assert would == before["old"] - 1  # all the old ones but the running one
    assert counts(url) == before  # a dry run deletes nothing

    done = cli(settings, "prune", "--older-than", "30d", "--batch", "700")
    assert done.returncode == 0, done.stderr
    assert f"{would} executions" in done.stdout and f"{3 * would} events" in done.stdout
    after = counts(url)
    assert after["old"] == 1  # the one still running
    assert after["recent"] == before["recent"]
    assert after["orphans"] == 0 and after["events"] == before["events"] - 3 * would
    # An execution's log goes with it, and only then.
    assert after["old_logs"] == 0 and after["log_orphans"] == 0
    assert after["logs"] == before["logs"] - before["old_logs"]
    assert after["old_alerts"] == after["old_firing"] > 0  # open episodes stay
    assert after["old_evaluations"] == 0
    assert after["active"] == before["active"] and after["offline"] < before["offline"]

    again = cli(settings, "prune", "--older-than", "30d")
    assert again.returncode == 0 and "deleted" in again.stdout and " 0 executions" in again.stdout


def test_prune_refuses_a_bad_duration_naming_it(settings: Settings) -> None:
    result = cli(settings, "prune", "--older-than", "thirty days")
    assert result.returncode == 2
    assert "--older-than" in result.stderr and "'thirty days' is not a duration" in result.stderr


def test_prune_says_when_postgresql_cannot_be_reached(settings: Settings) -> None:
    unreachable = settings.model_copy(update={"database_url": "postgresql://postgres@127.0.0.1:1/x"})
    result = cli(unreachable, "prune", "--older-than", "30d")
    assert result.returncode == 3 and "cannot reach PostgreSQL" in result.stderr
