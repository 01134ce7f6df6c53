"""A delivery's log bounds in a real PostgreSQL (services/monitor/store.py, log_bounds.py):
what a delivery holds is read from the database in each transaction — a new connection, a
restarted monitor, goes on from it — a record sent again counts once, a rolled-back batch
not at all, and migration 11 counts the logs kept before it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from cronstream.services.monitor.log_bounds import ENDED, LIMIT
from cronstream.services.monitor.store import create_staging, insert_logs
from cronstream.shared.db import connect, fast_timestamps, migrations
from cronstream.shared.records import JobDefinition, JobDue, LogBatch, render_log_batch
from tests.support import sql

T0 = datetime(2026, 6, 1, 12, tzinfo=UTC)
LIMIT_BYTES = 4096
DUE = JobDue.first(JobDefinition(job_id="j", type="INTERVAL", interval_seconds=60, handler="h"),
                   T0, "MANUAL")


def batch(first_seq: int, texts: list[str], stream: str = "stdout", final: bool = False) -> LogBatch:
    return LogBatch.model_validate_json(render_log_batch(
        DUE, worker_id="w1", trace_id=None, first_seq=first_seq,
        lines=[(T0.timestamp(), stream, None, text) for text in texts], final=final))


async def transaction(url: str, batches: list[LogBatch], fail: bool = False) -> list[dict[str, int]]:
    """`batches` in one transaction of a connection of their own (a monitor, restarted
    every time); the lines refused by reason."""
    conn = await connect(url)
    try:
        await fast_timestamps(conn)
        await create_staging(conn)
        async with conn.transaction():
            admitted = await insert_logs(conn, batches, LIMIT_BYTES)
            if fail:
                raise RuntimeError("the batch's transaction aborts")
        return [dict(a.refused) for a in admitted]
    finally:
        await conn.close()


def stored(url: str) -> list[tuple[int, str, str]]:
    return [(r["seq"], r["stream"], r["line"][:9]) for r in sql(
        url, "SELECT seq, stream, line FROM execution_logs WHERE execution_id = $1 "
             "ORDER BY delivery, seq", DUE.execution_id)]


def size(url: str) -> Any:
    [row] = sql(url, "SELECT handler_bytes, note_bytes, next_seq, cut FROM execution_log_sizes "
                     "WHERE execution_id = $1", DUE.execution_id)
    return tuple(row.values())


def test_a_deliverys_bounds_hold_across_connections_and_a_record_sent_again_counts_once(
        database_url: str) -> None:
    url, kb = database_url, "k" * 1000
    assert asyncio.run(transaction(url, [batch(0, [kb] * 3)])) == [{}]
    with pytest.raises(RuntimeError):
        asyncio.run(transaction(url, [batch(3, [kb] * 3)], fail=True))
    assert size(url) == (3000, 0, 3, False)  # the aborted batch counted nothing
    # The first record again (a worker's retry), then more: 1,000 bytes fit, the next cut.
    assert asyncio.run(transaction(url, [batch(0, [kb] * 3), batch(3, [kb] * 2)])) == \
        [{}, {LIMIT: 1}]
    assert size(url) == (4000, 0, 5, True)
    assert asyncio.run(transaction(url, [batch(5, ["Traceback"], "traceback", final=True),
                                         batch(5, ["Traceback"], "traceback", final=True)])) == [{}, {}]
    assert asyncio.run(transaction(url, [batch(6, ["late"]), batch(4, [kb])])) == \
        [{ENDED: 1}, {}]  # seq 4 is where the log was cut: held already
    assert stored(url) == [(0, "stdout", "k" * 9), (1, "stdout", "k" * 9), (2, "stdout", "k" * 9),
                           (3, "stdout", "k" * 9), (4, "cronstream", "[log cut]"),
                           (5, "traceback", "Traceback")]
    assert size(url) == (4000, 9, 6, True)
    assert [r["lines"] for r in sql(url, "SELECT lines FROM execution_log_ends")] == [6]


def test_migration_11_counts_the_logs_kept_before_it(database_url: str) -> None:
    url = database_url
    asyncio.run(transaction(url, [batch(0, ["é" * 100, "plain"]),
                                  batch(2, ["Traceback"], "traceback", final=True)]))
    sql(url, "DROP TABLE execution_log_sizes")
    [migration] = [m for m in migrations() if m.version == 11]

    async def migrate() -> None:
        conn = await connect(url)
        try:
            await conn.execute(migration.sql)
        finally:
            await conn.close()

    asyncio.run(migrate())
    assert size(url) == (205, 9, 3, False)
