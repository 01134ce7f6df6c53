"""A realistic projection, seeded set-based (tests/seed.sql): 1,000 jobs and 1,000,000
executions in well under a minute, for the dashboard test and the dashboard and retention
benchmarks."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import asyncpg

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
SQL = Path(__file__).resolve().parent / "seed.sql"


def blocks() -> dict[str, str]:
    parts = _NAME.split(SQL.read_text())
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts), 2)}


async def seed(conn: asyncpg.Connection, jobs: int = 1000, executions: int = 1_000_000,
               days: int = 60, events_every: int = 0, unlogged: bool = True) -> dict[str, Any]:
    """Seed a migrated, empty database; returns what it took (seconds per step).

    `events_every`: three execution events for one execution in N (0: no events).

    `unlogged`: load job_executions (and execution_events) without WAL. Query plans do not
    depend on it; it makes the load three times faster on a small machine. The benchmark
    of retention keeps the tables logged, as in production.
    """
    q = blocks()
    took: dict[str, Any] = {}
    await conn.execute("SET synchronous_commit = off")
    await conn.execute("SET maintenance_work_mem = '256MB'")
    tables = ["job_executions", *(["execution_events"] if events_every else [])]
    dropped: list[asyncpg.Record] = []
    for table in tables:
        if unlogged:
            await conn.execute(f"ALTER TABLE {table} SET UNLOGGED")
        found = await conn.fetch(q["secondary_indexes"], table)
        for index in found:
            await conn.execute(f"DROP INDEX {index['indexname']}")
        dropped += found

    async def step(name: str, *args: Any) -> None:
        started = time.monotonic()
        await conn.execute(q[name], *args)
        took[name] = round(time.monotonic() - started, 2)

    await step("seed_definitions", jobs)
    await step("seed_dependencies")
    await step("seed_executions", jobs, executions, days)
    if events_every:
        await step("seed_events", events_every)
    started = time.monotonic()
    for index in dropped:  # exactly the migrations' indexes, built once over the data
        await conn.execute(index["indexdef"])
    took["indexes"] = round(time.monotonic() - started, 2)
    await step("seed_logs")
    await step("seed_dag_evaluations")
    await step("seed_alerts", jobs, days)
    await step("seed_workers")
    await step("analyze")
    return took
