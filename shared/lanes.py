"""Blocking calls with a deadline of our own, on threads that may be abandoned.

confluent-kafka's calls block, and some of them can block for good: after a broker
restart, `send_offsets_to_transaction()` and `commit_transaction()` ignore their timeout
(librdkafka #5456; #5511 when the group coordinator went away — docs/decisions/0007). A
`ThreadPoolExecutor` cannot help: its threads are joined when the interpreter exits, so one
stuck call keeps a stopped service alive and deaf to SIGTERM.

A `Lane` is one daemon thread that runs the calls given to it in order (librdkafka objects
are used from one thread at a time). `await lane.call(fn, ..., deadline=s)` gives up after
`deadline` seconds with `CallTimedOut`; the owner then abandons the lane together with the
client it was calling, and builds new ones (a new transactional producer fences the old
one). Abandoned lanes are counted, so that the process exits with `os._exit` instead of
waiting at interpreter shutdown for a thread that may never return (lifecycle.py).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_abandoned = {"count": 0}


class CallTimedOut(TimeoutError):
    """A blocking call did not return within its deadline; its lane must be abandoned."""


def abandoned_lanes() -> int:
    return _abandoned["count"]


class Lane:
    """A daemon thread running blocking calls one after another."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = (
            queue.SimpleQueue())
        self._closed = False
        self._given_up = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        if self._closed:
            raise RuntimeError(f"lane {self.name} is closed")
        future: Future[T] = Future()
        self._queue.put((future, fn, args))
        return future

    async def call(self, fn: Callable[..., T], *args: Any, deadline: float | None = None) -> T:
        """Run `fn(*args)` on the lane; raise CallTimedOut after `deadline` seconds."""
        future = self.submit(fn, *args)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), deadline)
        except TimeoutError:
            name = getattr(fn, "__name__", repr(fn))
            raise CallTimedOut(f"{self.name}: {name} did not return within {deadline:g}s") from None

    def run(self, fn: Callable[..., T], *args: Any, deadline: float | None = None) -> T:
        """The same from a thread that is not the event loop's."""
        future = self.submit(fn, *args)
        try:
            return future.result(deadline)
        except TimeoutError:
            name = getattr(fn, "__name__", repr(fn))
            raise CallTimedOut(f"{self.name}: {name} did not return within {deadline:g}s") from None

    def close(self, wait: float = 0.0) -> bool:
        """Stop after the calls queued so far. With `wait`, wait that long for the thread
        to end and count the lane as abandoned if it did not (its call is stuck)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        if wait <= 0:
            return True
        self._thread.join(wait)
        if self._thread.is_alive():
            self.abandon()
            return False
        return True

    def abandon(self) -> None:
        """Give up on the lane (its current call may never return)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        if not self._given_up and self._thread.is_alive():
            self._given_up = True
            _abandoned["count"] += 1
