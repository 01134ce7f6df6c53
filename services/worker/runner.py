"""What running one execution produces, and the pieces every runner shares.

The registry is the only way from a handler name to code: an unknown name is a
permanent failure before anything runs, whatever the name looks like.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from cronstream.handlers import Context, NonRetryableError, Upstream, UpstreamResult
from cronstream.services.worker.capture import Line, format_traceback
from cronstream.shared.fast_records import DueRecord, FastUpstream
from cronstream.shared.records import MAX_RESULT_BYTES
from cronstream.shared.records import Upstream as UpstreamRecord
from cronstream.shared.statuses import RETRYABLE

OutcomeStatus = Literal["COMPLETED", "FAILED", "TIMED_OUT", "CANCELLED", "PERMANENTLY_FAILED"]
ProgressFn = Callable[[float, str | None], None]
LinesFn = Callable[[list[Line]], None]  # lines of a run's log as they are captured


@dataclass(frozen=True, slots=True)
class Outcome:
    status: OutcomeStatus
    result: Any = None
    error: str | None = None
    traceback: str | None = None  # of the exception a handler raised (capture.py)

    @property
    def retryable(self) -> bool:
        return self.status in RETRYABLE


class CancelSignal:
    """Set once when an execution must stop (cancelled, replaced, or the worker drains);
    readable from handler threads and awaitable on the event loop.

    Its threading.Event is made when someone asks for it (`flag`: a handler's Context),
    not for every execution: most are never cancelled, and a pool run or an inline
    synchronous one never reads it."""

    __slots__ = ("_callbacks", "_flag", "_set", "by", "reason")

    def __init__(self) -> None:
        self.reason = ""
        self.by: str | None = None  # who asked (Command.issued_by), when someone did
        self._set = False
        self._flag: threading.Event | None = None
        self._callbacks: list[tuple[asyncio.AbstractEventLoop, Callable[[], None]]] = []

    def set(self, reason: str, by: str | None = None) -> None:
        if self._set:
            return
        self.reason = reason
        self.by = by
        self._set = True
        if self._flag is not None:
            self._flag.set()
        for loop, callback in self._callbacks:
            loop.call_soon_threadsafe(callback)

    def on_set(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        """Call `callback` on `loop` once set (soon, if it is already). It may be called
        twice when the set races this call: it must be idempotent."""
        self._callbacks.append((loop, callback))
        if self._set:
            loop.call_soon_threadsafe(callback)

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        if self._set:
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not waiter.done():
                waiter.set_result(None)

        self.on_set(loop, wake)
        await waiter

    @property
    def flag(self) -> threading.Event:
        """The signal as a threading.Event (made on first use, on the event loop: before
        the handler that reads it starts)."""
        if self._flag is None:
            self._flag = threading.Event()
            if self._set:
                self._flag.set()
        return self._flag


def encode_result(result: Any) -> tuple[str | None, str | None]:
    """(JSON of the result, None) or (None, why it is not acceptable)."""
    try:
        encoded = json.dumps(result, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        return None, f"result is not JSON: {exc}"
    size = len(encoded.encode())
    if size > MAX_RESULT_BYTES:
        return None, f"result is {size} bytes of JSON; the limit is {MAX_RESULT_BYTES}"
    return encoded, None


def failed(exc: BaseException) -> Outcome:
    """What a handler that raised `exc` ends as: the one mapping from a handler's errors
    to outcomes, in a pool process and inline alike. NonRetryableError is not retried."""
    status: OutcomeStatus = "PERMANENTLY_FAILED" if isinstance(exc, NonRetryableError) else "FAILED"
    return Outcome(status, error=describe_error(exc), traceback=format_traceback(exc))


def returned(result: Any, cancelled: bool) -> tuple[Outcome, str | None]:
    """What a handler that returned `result` ends as, with the result's JSON (None when the
    result is not acceptable: the outcome is then FAILED, and says why). A handler that
    returned after its cancellation ends CANCELLED, keeping what it returned."""
    encoded, problem = encode_result(result)
    if problem is not None:
        return Outcome("FAILED", error=problem), None
    if cancelled:
        return Outcome("CANCELLED", result=result, error="cancelled"), encoded
    return Outcome("COMPLETED", result=result), encoded


def check_result(result: Any) -> Outcome:
    return returned(result, cancelled=False)[0]


def describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:8000]


def make_context(due: DueRecord, progress: ProgressFn, cancel: threading.Event,
                 traceparent: str | None = None) -> Context:
    return Context(
        execution_id=due.execution_id,
        job_id=due.job_id,
        run_id=due.run_id,
        attempt_number=due.attempt_number,
        idempotency_key=due.idempotency_key,
        scheduled_at=due.scheduled_at,
        params=dict(due.job.params),
        traceparent=traceparent,
        _progress=progress,
        _cancel=cancel,
        _upstream=None if due.upstream is None else upstream_view(due.upstream),
    )


def upstream_view(upstream: UpstreamRecord | FastUpstream | None) -> Upstream | None:
    """A DAG step's `ctx.upstream` from its JobDue's view (None for any other execution)."""
    if upstream is None:
        return None
    return Upstream({job_id: UpstreamResult(e.execution_id, e.status, e.result_omitted, e.result)
                     for job_id, e in upstream.executions.items()}, upstream.root_params)
