"""Retention: delete what is older than `retention_days`, in bounded batches.

`job_executions`, `execution_events` and `execution_logs` would otherwise grow forever;
so would the definition history (`job_definition_versions`), kept as long as the runs
that used each version: a version goes once a later one has been current for
`retention_days`, and a job's latest version never does (decision 0036).
Every batch is one short transaction of its own (`shared/sql/retention.sql`): at most
`retention_batch` executions with their events and logs, oldest first through the
`scheduled_at` index, skipping rows the projection holds (SKIP LOCKED). So the
projection never waits on the sweep for longer than one batch, and a sweep that is
stopped halfway has still deleted whole executions (never an execution without its
events or logs, or the reverse). Why batches rather
than time partitions: docs/decisions/0021-retention-by-bounded-batches.md.

Used by the monitor (`retention_loop`, every `retention_interval_seconds`, one monitor
at a time through an advisory lock) and by `cronstream prune --older-than 30d`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from cronstream.shared.db import SESSION_LOST, query
from cronstream.shared.lifecycle import wait_or_stop
from cronstream.shared.logs import log
from cronstream.shared.settings import Settings

logger = logging.getLogger(__name__)

SQL = "retention.sql"
_LOCK_KEY = 0x7072756E  # "prun"
# What a sweep deletes, in this order: executions (with their events) first, so that a
# stopped sweep leaves the oldest data, never orphans.
TABLES = ("executions", "alerts", "dag_evaluations", "workers", "definition_versions")
# Between batches the sweep sleeps as long as the batch took (at least PAUSE_SECONDS): it
# takes at most half of the database's time, however busy it is, and the projection's
# transactions get through. Retention is never urgent.
PAUSE_SECONDS = 0.01
YIELD_RATIO = 1.0


@dataclass
class Pruned:
    """What one sweep deleted."""

    cutoff: datetime
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys((*TABLES, "events", "log_lines"), 0))
    batches: int = 0
    seconds: float = 0.0
    complete: bool = True


def cutoff_for(older_than: timedelta, now: datetime | None = None) -> datetime:
    return (now or datetime.now(UTC)) - older_than


async def count_prunable(conn: Any, cutoff: datetime) -> dict[str, int]:
    row = await conn.fetchrow(query("count_prunable", SQL), cutoff)
    assert row is not None
    return {name: int(row[name]) for name in TABLES}


async def prune(conn: Any, cutoff: datetime, batch: int,
                stopping: asyncio.Event | None = None) -> Pruned:
    """Delete everything older than `cutoff`, `batch` rows per transaction, until nothing
    is left (or `stopping` is set: `complete` is then False)."""
    result = Pruned(cutoff)
    started = time.monotonic()
    for table in TABLES:
        while True:
            batch_started = time.monotonic()
            if stopping is not None and stopping.is_set():
                result.complete = False
                result.seconds = time.monotonic() - started
                return result
            if table == "executions":
                row = await conn.fetchrow(query("prune_executions", SQL), cutoff, batch)
                assert row is not None
                deleted = int(row["executions"])
                result.counts["events"] += int(row["events"])
                result.counts["log_lines"] += int(row["log_lines"])
            else:
                status = await conn.execute(query(f"prune_{table}", SQL), cutoff, batch)
                deleted = int(status.split()[-1])  # "DELETE n"
            result.counts[table] += deleted
            result.batches += 1
            if deleted < batch:
                break
            await asyncio.sleep(max(PAUSE_SECONDS, (time.monotonic() - batch_started) * YIELD_RATIO))
    result.seconds = time.monotonic() - started
    return result


async def sweep(pool: asyncpg.Pool, settings: Settings, stopping: asyncio.Event) -> Pruned | None:
    """One sweep by whichever monitor takes the lock; None when another one holds it."""
    async with pool.acquire() as conn:
        if not await conn.fetchval(query("try_retention_lock", SQL), _LOCK_KEY):
            return None
        try:
            cutoff = cutoff_for(timedelta(days=settings.retention_days))
            return await prune(conn, cutoff, settings.retention_batch, stopping)
        finally:
            await conn.execute(query("retention_unlock", SQL), _LOCK_KEY)


# A sweep that fails is tried again at the next one: the database away, or any error of its.
SWEEP_FAILED: tuple[type[Exception], ...] = (asyncpg.PostgresError, *SESSION_LOST, OSError)


async def retention_loop(pool: asyncpg.Pool, settings: Settings, stopping: asyncio.Event) -> None:
    """The monitor's schedule: a sweep at start, then every `retention_interval_seconds`.
    A failed sweep is logged and tried again next time (retention is never urgent)."""
    if settings.retention_days <= 0:
        log(logger, "retention_disabled")
        return
    while not stopping.is_set():
        try:
            pruned = await sweep(pool, settings, stopping)
        except SWEEP_FAILED as exc:
            log(logger, "retention_failed", logging.WARNING, error=str(exc))
        else:
            if pruned is not None:
                log(logger, "retention_pruned", cutoff=pruned.cutoff.isoformat(),
                    batches=pruned.batches, seconds=round(pruned.seconds, 3),
                    complete=pruned.complete, **pruned.counts)
        if await wait_or_stop(stopping, settings.retention_interval_seconds):
            return
