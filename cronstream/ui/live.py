"""Live runs: one renderer for every watching browser, woken by PostgreSQL.

The monitor's writes to `job_executions` notify the channel `cronstream_executions`
(a statement trigger, migration 0006). The hub LISTENs on one connection of its own;
a notification marks the view dirty, and the hub re-reads and re-renders the Runs view
once — at most every `min_interval` seconds, however many executions changed and
however many browsers watch — and only while at least one browser watches. When
nothing runs, nothing is notified and nothing is read. If the LISTEN connection is
lost, the hub falls back to re-reading every `fallback_interval` seconds (again only
while someone watches) until it is back.

A browser that connects gets the view every watcher has, when nothing changed since it
was rendered; otherwise it waits for the next render, shared with everyone who joined
meanwhile. So a reconnect storm (a proxy restarted, a deploy) costs at most one render
per tick, never one per connection. Streams are capped per process and per client
address (`admit`); beyond a cap the endpoint answers 503 with Retry-After, and the
dashboard's script tries again later (docs/decisions/0041).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from cronstream.shared import metrics
from cronstream.shared.logs import log

logger = logging.getLogger(__name__)

CHANNEL = "cronstream_executions"
# A refused stream is asked to come back after this many seconds, plus up to as many again
# at random: reconnects after a storm spread out instead of arriving together.
RETRY_AFTER_SECONDS = 10


class LiveHub:
    def __init__(self, dsn: str, render: Callable[[], Awaitable[str]],
                 min_interval: float = 0.5, fallback_interval: float = 5.0, *,
                 max_streams: int = 500, max_streams_per_client: int = 8) -> None:
        self.dsn = dsn
        self.render = render
        self.min_interval = min_interval
        self.fallback_interval = fallback_interval
        self.max_streams = max_streams
        self.max_streams_per_client = max_streams_per_client
        self.renders = 0        # times the view was read, for every watcher at once
        self.notifications = 0  # changes PostgreSQL announced
        self.refused = 0        # streams refused by a cap
        self._latest: str | None = None
        self._latest_as_of = -1  # self.notifications when _latest was read
        self._clients: Counter[str] = Counter()
        self._subscribers: set[asyncio.Queue[str]] = set()
        self._dirty = asyncio.Event()
        self._closing = asyncio.Event()
        self._listening = False
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    @property
    def streams(self) -> int:
        """Streams admitted and not yet ended."""
        return sum(self._clients.values())

    def admit(self, client: str) -> bool:
        """Take a stream slot for `client` (release it with `leave`); False beyond a cap."""
        if self.streams >= self.max_streams or self._clients[client] >= self.max_streams_per_client:
            self.refused += 1
            metrics.UI_LIVE_REFUSED.inc()
            return False
        self._clients[client] += 1
        metrics.UI_LIVE_STREAMS.inc()
        return True

    def leave(self, client: str) -> None:
        metrics.UI_LIVE_STREAMS.dec()
        self._clients[client] -= 1
        if self._clients[client] <= 0:
            del self._clients[client]

    def _current(self) -> str | None:
        """The rendered view, if nothing changed since (as far as a LISTEN can tell)."""
        if self._listening and self._latest_as_of == self.notifications:
            return self._latest
        return None

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
                self._latest_as_of = -1  # rendered before this LISTEN: may be stale
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
            as_of = self.notifications
            try:
                payload = await self.render()
            except Exception as exc:  # the database went away: try again at the next change
                log(logger, "live_render_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(self.fallback_interval)
                continue
            self.renders += 1
            metrics.UI_LIVE_RENDERS.inc()
            self._latest, self._latest_as_of = payload, as_of
            for queue in list(self._subscribers):
                _offer(queue, payload)
            await asyncio.sleep(self.min_interval)  # coalesce bursts of notifications

    async def stream(self, keepalive: float = 15.0) -> AsyncIterator[str]:
        """Server-sent events for one browser: the current view, then each re-render."""
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=1)
        self._subscribers.add(queue)
        try:
            yield "retry: 3000\n\n"
            current = self._current()
            if current is not None:
                yield _event(current)
            else:
                self._dirty.set()  # one render, for everyone who joins before it
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


class LiveResponse(Response):
    """`/runs/live` for one client: admitted by the hub's caps or refused with 503 and
    Retry-After, and its slot given back however the stream ends (the response object
    is what the server runs, so its `finally` runs even for a client gone before the
    first byte)."""

    def __init__(self, hub: LiveHub, client: str) -> None:
        super().__init__()
        self.hub = hub
        self.client = client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.hub.admit(self.client):
            log(logger, "live_stream_refused", client=self.client, streams=self.hub.streams)
            wait = RETRY_AFTER_SECONDS + random.randint(0, RETRY_AFTER_SECONDS)
            refused = PlainTextResponse("too many live streams: try again later\n", 503,
                                        headers={"Retry-After": str(wait), "Cache-Control": "no-store"})
            await refused(scope, receive, send)
            return
        try:
            streaming = StreamingResponse(self.hub.stream(), media_type="text/event-stream",
                                          headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
            await streaming(scope, receive, send)
        finally:
            self.hub.leave(self.client)
