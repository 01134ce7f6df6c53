"""The live Runs view is pushed by PostgreSQL: a change to job_executions wakes the
dashboard, which re-reads once for every watcher; with nobody watching, or nothing
changing, it reads nothing; a watcher who joins gets the view the others have."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

from cronstream.shared.db import connect
from cronstream.ui.live import LiveHub


async def _insert_execution(url: str, status: str = "RUNNING") -> None:
    conn = await connect(url)
    try:
        now = datetime.now(UTC)
        await conn.execute(
            "INSERT INTO job_executions (execution_id, job_id, run_id, status, scheduled_at, "
            "attempt_number, last_event, updated_at) VALUES ($1, 'j', $2, $3, $4, 1, $3, $4)",
            uuid.uuid4(), uuid.uuid4(), status, now)
    finally:
        await conn.close()


async def _touch_workers(url: str) -> None:
    conn = await connect(url)
    try:
        await conn.execute("INSERT INTO workers (worker_id, hostname, status, last_heartbeat, "
                           "capacity, updated_at) VALUES ('w', 'h', 'ACTIVE', now(), 1, now())")
    finally:
        await conn.close()


async def _until(condition: object, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def test_changes_wake_one_render_for_all_watchers_and_nothing_else_does(database_url: str) -> None:
    async def scenario() -> None:
        calls = 0

        async def render() -> str:
            nonlocal calls
            calls += 1
            return f"view {calls}"

        hub = LiveHub(database_url, render, min_interval=0.05)
        hub.start()
        try:
            await _until(lambda: hub._listening)
            # Nobody watches: a change is announced but nothing is read.
            await _insert_execution(database_url)
            await _until(lambda: hub.notifications == 1 and not hub._dirty.is_set())
            assert hub.renders == 0 and calls == 0

            streams = [hub.stream(), hub.stream()]
            for stream in streams:
                assert await anext(stream) == "retry: 3000\n\n"
            snapshots = [asyncio.create_task(anext(stream)) for stream in streams]
            for snapshot in snapshots:  # one read for both: the view every watcher shares
                assert (await asyncio.wait_for(snapshot, 10)) == "event: runs\ndata: view 1\n\n"
            assert hub.renders == 1 and calls == 1
            late = hub.stream()  # nothing changed since: the same view, not another read
            assert await anext(late) == "retry: 3000\n\n"
            assert await anext(late) == "event: runs\ndata: view 1\n\n" and calls == 1
            streams.append(late)
            await _touch_workers(database_url)  # not an execution: no notification
            await _insert_execution(database_url, "QUEUED")
            for stream in streams:
                event = await asyncio.wait_for(anext(stream), 10)
                assert event == "event: runs\ndata: view 2\n\n"
            assert hub.renders == 2 and hub.notifications == 2, "one read for all watchers"
            hub.close()
            for stream in streams:
                await stream.aclose()
        finally:
            hub.close()

    asyncio.run(scenario())
