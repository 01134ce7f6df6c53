"""Live views: one renderer per view for every watching browser, woken by PostgreSQL.

The views: the Runs page (`runs`), and the log of each execution someone watches
(`log:<execution_id>`, the execution page). The monitor's writes to `job_executions`
notify the channel `cronstream_executions` (a statement trigger, migration 0006), its
writes to `execution_logs` the channel `cronstream_logs` (migration 0007). The hub
LISTENs on one connection of its own; a notification marks the views that follow its
channel dirty, and the hub re-reads and re-renders each of them once — at most every
`min_interval` seconds, however many rows changed and however many browsers watch — and
only while at least one browser watches it. When nothing runs, nothing is notified and
nothing is read. If the LISTEN connection is lost, the hub falls back to re-reading every
`fallback_interval` seconds (again only views someone watches) until it is back.

A browser that connects gets the view every watcher of it has, when nothing changed
since it was rendered; otherwise it waits for the next render, shared with everyone who
joined meanwhile. So a reconnect storm (a proxy restarted, a deploy) costs at most one render
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
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from cronstream.shared import metrics
from cronstream.shared.logs import log

logger = logging.getLogger(__name__)

CHANNEL = "cronstream_executions"
LOG_CHANNEL = "cronstream_logs"
CHANNELS = (CHANNEL, LOG_CHANNEL)
RUNS = "runs"
Render = Callable[[], Awaitable[str]]
# A refused stream is asked to come back after this many seconds, plus up to as many again
# at random: reconnects after a storm spread out instead of arriving together.
RETRY_AFTER_SECONDS = 10


@dataclass
class _View:
    """One live view: how it is rendered, the channels that change it, who watches it."""

    render: Render
    channels: frozenset[str]
    event: str
    subscribers: set[asyncio.Queue[str]] = field(default_factory=set)
    changes: int = 0  # notifications of its channels
    dirty: bool = False
    latest: str | None = None
    latest_as_of: int = -1  # `changes` when `latest` was read


class LiveHub:
    def __init__(self, dsn: str, render: Render,
                 min_interval: float = 0.5, fallback_interval: float = 5.0, *,
                 max_streams: int = 500, max_streams_per_client: int = 8) -> None:
        self.dsn = dsn
        self._views: dict[str, _View] = {RUNS: _View(render, frozenset({CHANNEL}), "runs")}
        self.min_interval = min_interval
        self.fallback_interval = fallback_interval
        self.max_streams = max_streams
        self.max_streams_per_client = max_streams_per_client
        self.renders = 0        # times the view was read, for every watcher at once
        self.notifications = 0  # changes PostgreSQL announced
        self.refused = 0        # streams refused by a cap
        self._clients: Counter[str] = Counter()
        self._dirty = asyncio.Event()
        self._closing = asyncio.Event()
        self._listening = False
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def subscribers(self) -> int:
        return sum(len(view.subscribers) for view in self._views.values())

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

    def _current(self, view: _View) -> str | None:
        """The rendered view, if nothing changed since (as far as a LISTEN can tell)."""
        if self._listening and view.latest_as_of == view.changes:
            return view.latest
        return None

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._listen(), name="ui-listen"),
                       asyncio.create_task(self._publish(), name="ui-publish")]

    def close(self) -> None:
        """Ends every stream (so that the server can shut down) and the hub's tasks."""
        self._closing.set()
        for view in list(self._views.values()):
            for queue in list(view.subscribers):
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait("")
        for task in self._tasks:
            task.cancel()

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    def _notified(self, _conn: Any, _pid: int, channel: str, _payload: Any) -> None:
        self.notifications += 1
        for view in self._views.values():
            if channel in view.channels:
                view.changes += 1
                view.dirty = True
        self._dirty.set()

    def _everything_changed(self) -> None:
        for view in self._views.values():
            view.dirty = True
            view.latest_as_of = -1  # rendered before this LISTEN: may be stale
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
                for channel in CHANNELS:
                    await conn.add_listener(channel, self._notified)
                self._listening, backoff = True, 1.0
                log(logger, "live_listening", channels=",".join(CHANNELS))
                self._everything_changed()  # whatever changed while not listening
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
            self._dirty.clear()
            if not self._listening:
                self._everything_changed()
                self._dirty.clear()
            watched = False
            for key, view in list(self._views.items()):
                if not view.subscribers:
                    # Nobody watches: forget the change; a new subscriber gets a fresh render.
                    view.dirty = False
                    if key != RUNS:
                        del self._views[key]
                    continue
                watched = True
                if view.dirty:
                    await self._render(view)
            if not watched and not self._listening:
                await asyncio.sleep(self.fallback_interval)
            elif watched:
                await asyncio.sleep(self.min_interval)  # coalesce bursts of notifications

    async def _render(self, view: _View) -> None:
        view.dirty = False
        as_of = view.changes
        try:
            payload = await view.render()
        except Exception as exc:  # the database went away: try again at the next change
            log(logger, "live_render_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
            view.dirty = True
            await asyncio.sleep(self.fallback_interval)
            return
        self.renders += 1
        metrics.UI_LIVE_RENDERS.inc()
        view.latest, view.latest_as_of = payload, as_of
        for queue in list(view.subscribers):
            _offer(queue, payload)

    async def stream(self, keepalive: float = 15.0, key: str = RUNS, render: Render | None = None,
                     channels: tuple[str, ...] = CHANNELS, event: str = "runs") -> AsyncGenerator[str, None]:
        """Server-sent events for one browser: the current view `key` (made with `render`
        when nobody watches it yet), then each re-render."""
        view = self._views.get(key)
        if view is None:
            if render is None:
                raise KeyError(key)
            view = self._views[key] = _View(render, frozenset(channels), event)
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=1)
        view.subscribers.add(queue)
        try:
            yield "retry: 3000\n\n"
            current = self._current(view)
            if current is not None:
                yield _event(view.event, current)
            else:
                view.dirty = True  # one render, for everyone who joins before it
                self._dirty.set()
            while not self._closing.is_set():
                try:
                    payload = await asyncio.wait_for(queue.get(), keepalive)
                except TimeoutError:
                    yield ": keepalive\n\n"  # keeps proxies from closing an idle stream
                    continue
                if self._closing.is_set():
                    break
                yield _event(view.event, payload)
        finally:
            view.subscribers.discard(queue)


def _offer(queue: asyncio.Queue[str], payload: str) -> None:
    """Only the newest view matters to a slow browser: replace what it has not read."""
    with contextlib.suppress(asyncio.QueueEmpty):
        queue.get_nowait()
    with contextlib.suppress(asyncio.QueueFull):
        queue.put_nowait(payload)


def _event(name: str, payload: str) -> str:
    lines = "".join(f"data: {line}\n" for line in payload.splitlines() or [""])
    return f"event: {name}\n{lines}\n"


class LiveResponse(Response):
    """A live stream for one client (`/runs/live`, `/executions/<id>/log/live`): admitted
    by the hub's caps or refused with 503 and Retry-After, and its slot given back however
    the stream ends (the response object is what the server runs, so its `finally` runs
    even for a client gone before the first byte)."""

    def __init__(self, hub: LiveHub, client: str, stream: Callable[[], AsyncIterator[str]] | None = None
                 ) -> None:
        super().__init__()
        self.hub = hub
        self.client = client
        self.events = stream or hub.stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.hub.admit(self.client):
            log(logger, "live_stream_refused", client=self.client, streams=self.hub.streams)
            wait = RETRY_AFTER_SECONDS + random.randint(0, RETRY_AFTER_SECONDS)
            refused = PlainTextResponse("too many live streams: try again later\n", 503,
                                        headers={"Retry-After": str(wait), "Cache-Control": "no-store"})
            await refused(scope, receive, send)
            return
        try:
            streaming = StreamingResponse(self.events(), media_type="text/event-stream",
                                          headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
            await streaming(scope, receive, send)
        finally:
            self.hub.leave(self.client)
