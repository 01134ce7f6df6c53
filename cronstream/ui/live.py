"""Live runs: one renderer for every watching browser, woken by PostgreSQL.

The monitor's writes to `job_executions` notify the channel `cronstream_executions`
(a statement trigger, migration 0006). The hub LISTENs on one connection of its own;
a notification marks the view dirty, and the hub re-reads and re-renders the Runs view
once — at most every `min_interval` seconds, however many executions changed and
however many browsers watch — and only while at least one browser watches. When
nothing runs, nothing is notified and nothing is read. If the LISTEN connection is
lost, the hub falls back to re-reading every `fallback_interval` seconds (again only
while someone watches) until it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg

from cronstream.shared.logs import log

logger = logging.getLogger(__name__)

CHANNEL = "cronstream_executions"


class LiveHub:
    def __init__(self, dsn: str, render: Callable[[], Awaitable[str]],
                 min_interval: float = 0.5, fallback_interval: float = 5.0) -> None:
        self.dsn = dsn
        self.render = render
        self.min_interval = min_interval
        self.fallback_interval = fallback_interval
        self.renders = 0        # times the view was re-read for the watchers
        self.notifications = 0  # changes PostgreSQL announced
        self._subscribers: set[asyncio.Queue[str]] = set()
        self._dirty = asyncio.Event()
        self._closing = asyncio.Event()
        self._listening = False
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._listen(), name="ui-listen"),
                       asyncio.create_task(self._publish(), name="ui-publish")]

    def close(self) -> None:
        """Ends every stream (so that the server can shut down) and the hub's tasks."""
        self._closing.set()
        for queue in list(self._subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait("")
        for task in self._tasks:
            task.cancel()

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    def _notified(self, *_: Any) -> None:
        self.notifications += 1
        self._dirty.set()

    async def _listen(self) -> None:
        """Hold the LISTEN connection; reconnect with a backoff when it is lost."""
        backoff = 1.0
        while not self._closing.is_set():
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(self.dsn, timeout=5)
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())  # type: ignore[misc]
                await conn.add_listener(CHANNEL, self._notified)
                self._listening, backoff = True, 1.0
                log(logger, "live_listening", channel=CHANNEL)
                self._dirty.set()  # whatever changed while not listening
                await lost.wait()
            except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
                log(logger, "live_listen_failed", logging.WARNING, error=str(exc))
            finally:
                self._listening = False
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=2)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), backoff)
            backoff = min(backoff * 2, 30.0)

    async def _publish(self) -> None:
        while not self._closing.is_set():
            timeout = None if self._listening else self.fallback_interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), timeout)
            if not self._subscribers:
                # Nobody watches: forget the change; a new subscriber gets a fresh render.
                self._dirty.clear()
                if not self._listening:
                    await asyncio.sleep(self.fallback_interval)
                continue
            self._dirty.clear()
            try:
                payload = await self.render()
            except Exception as exc:  # the database went away: try again at the next change
                log(logger, "live_render_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(self.fallback_interval)
                continue
            self.renders += 1
            for queue in list(self._subscribers):
                _offer(queue, payload)
            await asyncio.sleep(self.min_interval)  # coalesce bursts of notifications

    async def stream(self, keepalive: float = 15.0) -> AsyncIterator[str]:
        """Server-sent events for one browser: a snapshot, then each re-render."""
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=1)
        self._subscribers.add(queue)
        try:
            yield "retry: 3000\n\n"
            snapshot = await self.render()
            yield _event(snapshot)
            while not self._closing.is_set():
                try:
                    payload = await asyncio.wait_for(queue.get(), keepalive)
                except TimeoutError:
                    yield ": keepalive\n\n"  # keeps proxies from closing an idle stream
                    continue
                if self._closing.is_set():
                    break
                yield _event(payload)
        finally:
            self._subscribers.discard(queue)


def _offer(queue: asyncio.Queue[str], payload: str) -> None:
    """Only the newest view matters to a slow browser: replace what it has not read."""
    with contextlib.suppress(asyncio.QueueEmpty):
        queue.get_nowait()
    with contextlib.suppress(asyncio.QueueFull):
        queue.put_nowait(payload)


def _event(payload: str) -> str:
    lines = "".join(f"data: {line}\n" for line in payload.splitlines() or [""])
    return f"event: runs\n{lines}\n"
