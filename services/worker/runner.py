"""What invoking a handler produces, and the one body that invokes it.

A handler runs through one function, `invoke`, wherever it runs: on the worker's event
loop (inline.py) and in a pool process (child.py) alike. For one invocation it
1. takes the handler's spec, found by name once by its caller (`registry.get`: the only
   way from a name to code; an unknown name is PERMANENTLY_FAILED before anything runs,
   `unknown_handler`);
2. captures what the handler writes, as an attempt's log (capture.py), and makes the
   trace headers the invocation carries current;
3. builds the handler's Context from the Invocation, the one structure a Context is made
   of, under the handler's span;
4. calls the handler (awaits it, if it is async);
5. maps what it raised (`failed`) or returned (`returned`) to one Outcome;
6. hands what is left of its log to `lines`.
`invoke` is a coroutine for both kinds of handler: one of a synchronous handler never
waits, and runs to its end at its first step, without an event loop (`at_once`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import msgspec

from cronstream.handlers import Context, HandlerSpec, NonRetryableError, Upstream, UpstreamResult
from cronstream.services.worker.capture import Capture, InvocationLog, Line, format_traceback
from cronstream.shared import telemetry
from cronstream.shared.fast_records import (
    DueRecord,
    FastTriggerEvent,
    FastUpstream,
    events_of,
    upstream_of,
)
from cronstream.shared.records import MAX_RESULT_BYTES
from cronstream.shared.statuses import RETRYABLE
from cronstream.shared.telemetry import Headers

OutcomeStatus = Literal["COMPLETED", "FAILED", "TIMED_OUT", "CANCELLED", "PERMANENTLY_FAILED"]
ProgressFn = Callable[[float, str | None], None]
LinesFn = Callable[[list[Line]], None]  # lines of an invocation's log as they are captured


@dataclass(frozen=True, slots=True)
class Outcome:
    status: OutcomeStatus
    result: Any = None
    error: str | None = None
    traceback: str | None = None  # of the exception a handler raised (capture.py)
    # The result's JSON as `encode_result` wrote it, where the handler ran: a pool process
    # sends it on as it is (child.py), never encoded twice.
    result_json: str | None = field(default=None, compare=False, repr=False)

    @property
    def retryable(self) -> bool:
        return self.status in RETRYABLE


class CancelSignal:
    """Set once when an execution must stop (cancelled, replaced, or the worker drains);
    readable from handler threads and awaitable on the event loop.

    Its threading.Event is made when someone asks for it (`flag`: a handler's Context),
    not for every execution: most are never cancelled, and a pool invocation or an
    inline synchronous one never reads it."""

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


def unknown_handler(name: str) -> Outcome:
    """What an execution whose handler is not registered ends as: it is never retried."""
    return Outcome("PERMANENTLY_FAILED", error=f"unknown handler {name!r}")


def failed(exc: BaseException) -> Outcome:
    """What a handler that raised `exc` ends as. NonRetryableError is not retried."""
    status: OutcomeStatus = "PERMANENTLY_FAILED" if isinstance(exc, NonRetryableError) else "FAILED"
    return Outcome(status, error=describe_error(exc), traceback=format_traceback(exc))


def returned(result: Any, cancelled: bool) -> Outcome:
    """What a handler that returned `result` ends as, with the result's JSON; FAILED, saying
    why, when the result is not acceptable. A handler that returned after its cancellation
    ends CANCELLED, keeping what it returned."""
    encoded, problem = encode_result(result)
    if problem is not None:
        return Outcome("FAILED", error=problem)
    if cancelled:
        return Outcome("CANCELLED", result=result, error="cancelled", result_json=encoded)
    return Outcome("COMPLETED", result=result, result_json=encoded)


def describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:8000]


def upstream_view(upstream: FastUpstream | None) -> Upstream | None:
    """A DAG step's `ctx.upstream` from its JobDue's view (None for any other execution)."""
    if upstream is None:
        return None
    return Upstream({job_id: UpstreamResult(e.execution_id, e.status, e.result_omitted, e.result)
                     for job_id, e in upstream.executions.items()}, upstream.root_params)


class Invocation(msgspec.Struct, array_like=True, frozen=True):
    """One call of a handler: the handler's name, what its Context is made of (`context`),
    taken from the JobDue the worker validated, and the trace headers it runs under.

    Also the line that sends it to a pool process (child.py), a JSON array in this order:
    msgspec decodes it there straight into the Context's types (UUIDs, an aware datetime,
    the headers' bytes), and the child never decodes the JobDue again. A field added to
    Context is added here, in `of` and in `context`."""

    handler: str
    execution_id: UUID
    job_id: str
    run_id: UUID  # the DAG run (or the lone run) this execution belongs to
    attempt_number: int
    idempotency_key: str
    scheduled_at: datetime
    params: dict[str, Any]
    trace: Sequence[tuple[str, bytes | None]]  # a header's value may be None (Kafka's)
    upstream: FastUpstream | None = None  # a DAG step's view of its run (decision 0035)
    events: list[FastTriggerEvent] | None = None  # an event trigger's records (decision 0057)

    @classmethod
    def of(cls, due: DueRecord, trace: Headers | None = None) -> Invocation:
        return cls(due.job.handler, due.execution_id, due.job_id, due.run_id, due.attempt_number,
                   due.idempotency_key, due.scheduled_at, due.job.params, trace or [],
                   upstream_of(due), events_of(due))

    def context(self, progress: ProgressFn, cancel: threading.Event,
                traceparent: str | None) -> Context:
        """The handler's Context (its own copy of the params: the JobDue's stay as they were
        for the records built from it afterwards, a retry's included)."""
        return Context(
            execution_id=self.execution_id, job_id=self.job_id, run_id=self.run_id,
            attempt_number=self.attempt_number, idempotency_key=self.idempotency_key,
            scheduled_at=self.scheduled_at, params=dict(self.params), traceparent=traceparent,
            _progress=progress, _cancel=cancel, _upstream=upstream_view(self.upstream),
            _events=self.events)


_NO_TRACE = contextlib.nullcontext()  # no trace headers: the current context stays


async def invoke(spec: HandlerSpec, invocation: Invocation, progress: ProgressFn,
                 cancel: threading.Event, *, capture: Capture, lines: LinesFn | None = None,
                 log_limit: int = 1 << 20, timeout: float | None = None) -> Outcome:
    """Call the handler `spec` for `invocation` (module docstring) and tell how it ended.

    `cancel` is the Context's flag. What the handler writes is captured through `capture`
    into a log of at most `log_limit` bytes, handed to `lines` when it ends (nothing is
    captured without `lines`). `timeout`: an inline invocation's cooperative timeout (an
    async handler is cancelled at it, and a TimeoutError ends it TIMED_OUT); a pool
    process has none, its parent kills it (pool.py)."""
    trace = invocation.trace
    log = InvocationLog(log_limit) if lines is not None else None
    begun = capture.begin(log) if log is not None else None
    try:
        try:
            with telemetry.attached(trace) if trace else _NO_TRACE, telemetry.handler_span(
                    spec.name, telemetry.lone_traceparent(trace) if trace else None,
                    job_id=invocation.job_id, execution_id=invocation.execution_id) as traceparent:
                ctx = invocation.context(progress, cancel, traceparent)
                if not spec.is_async:
                    result = spec.func(ctx)
                elif timeout is None:
                    result = await spec.func(ctx)
                else:
                    result = await asyncio.wait_for(spec.func(ctx), timeout)
        except Exception as exc:
            if timeout is not None and isinstance(exc, TimeoutError):
                outcome = Outcome("TIMED_OUT", error=f"timed out after {timeout:g}s")
            else:
                outcome = failed(exc)
        else:
            outcome = returned(result, cancel.is_set())
    finally:
        if log is not None:
            capture.end(begun)
    if log is not None and lines is not None:
        rest = log.take()
        summary = log.summary()
        if summary is not None:
            rest.append(summary)
        if rest:
            lines(rest)
    return outcome


def at_once(invoking: Coroutine[Any, Any, Outcome]) -> Outcome:
    """The outcome of the invocation of a synchronous handler, which never waits: run to its
    end in one step, on no event loop."""
    try:
        invoking.send(None)
    except StopIteration as done:
        outcome: Outcome = done.value
        return outcome
    invoking.close()
    raise RuntimeError("the invocation of a synchronous handler waited")
