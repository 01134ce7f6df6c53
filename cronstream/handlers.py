"""Handlers: the code a worker runs, registered by name (SPEC §6, §7).

    from cronstream import Context, handler

    @handler("reports.daily")
    def daily(ctx: Context) -> dict:
        ctx.report_progress(50, "halfway")
        return {"rows": 42}

A handler is sync or async, takes one `Context` and returns a JSON value (at most
64 KiB). Workers run only handlers registered in modules named by `--import`; a record
names a handler, and the name is looked up in this registry — it is never imported,
evaluated or resolved as a path.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

__all__ = ["REGISTRY", "Context", "HandlerSpec", "NonRetryableError", "handler"]

_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


class NonRetryableError(Exception):
    """Raise from a handler to fail the execution for good: it is not retried."""


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    name: str
    func: Callable[..., Any]
    is_async: bool
    # Runs on the worker's event loop instead of a pool process: only for handlers that
    # never block (their timeout can then only be cooperative). The built-in noop is one.
    inline: bool = False


class HandlerRegistry:
    def __init__(self) -> None:
        self._handlers: dict[str, HandlerSpec] = {}
        self._lock = threading.Lock()

    def register(self, name: str, func: Callable[..., Any], inline: bool = False) -> HandlerSpec:
        if not _NAME.match(name):
            raise ValueError(f"handler name {name!r} must match {_NAME.pattern}")
        spec = HandlerSpec(name, func, inspect.iscoroutinefunction(func), inline)
        with self._lock:
            existing = self._handlers.get(name)
            if existing is not None and existing.func is not func:
                raise ValueError(f"handler {name!r} is already registered by "
                                 f"{existing.func.__module__}.{existing.func.__qualname__}")
            self._handlers[name] = spec
        return spec

    def get(self, name: str) -> HandlerSpec | None:
        return self._handlers.get(name)

    def names(self) -> list[str]:
        return sorted(self._handlers)


REGISTRY = HandlerRegistry()


def handler(name: str, *, inline: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the handler called `name`.

    Handlers run in a pool of worker processes, where a timeout or a cancellation can
    stop any code for real. `inline=True` runs a handler on the worker's event loop
    instead — cheaper, but only for code that never blocks.
    """

    def register(func: Callable[..., Any]) -> Callable[..., Any]:
        REGISTRY.register(name, func, inline)
        return func

    return register


@dataclass
class Context:
    """What a handler knows about its execution, and how it talks back."""

    execution_id: UUID
    job_id: str
    run_id: UUID
    attempt_number: int
    idempotency_key: str
    scheduled_at: datetime
    params: dict[str, Any]
    # The W3C trace context of the execution's run (the handler's own span while it runs):
    # user code instrumented with OpenTelemetry joins the execution's trace by itself,
    # because this context is current while the handler runs; `traceparent` is there for
    # anything that propagates it by hand (an HTTP header to a service that is not).
    traceparent: str | None = None
    _progress: Callable[[float, str | None], None] = field(repr=False, default=lambda p, m: None)
    _cancel: threading.Event = field(repr=False, default_factory=threading.Event)

    def report_progress(self, percent: float, message: str | None = None) -> None:
        """Report how far along the execution is (0–100); rate-limited by the worker."""
        if not 0 <= percent <= 100:
            raise ValueError(f"percent must be within 0-100, got {percent}")
        self._progress(float(percent), None if message is None else str(message)[:1024])

    @property
    def trace_id(self) -> str | None:
        """The execution's trace id (32 hex digits), as stored in job_executions.trace_id."""
        tp = self.traceparent
        return tp[3:35] if tp and len(tp) == 55 else None

    @property
    def cancelled(self) -> bool:
        """True once the execution was cancelled or timed out: stop as soon as you can."""
        return self._cancel.is_set()

    def wait_cancelled(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds, waking early on cancellation; returns cancelled."""
        return self._cancel.wait(timeout)
