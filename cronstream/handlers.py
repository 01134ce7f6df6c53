"""Handlers: the code a worker runs, registered by name (docs/reference/python.md#handlers).

    from cronstream import Context, handler

    @handler("reports.daily")
    def daily(ctx: Context) -> dict:
        ctx.report_progress(50, "halfway")
        return {"rows": 42}

A handler is sync or async, takes one `Context` and returns a JSON value (at most
64 KiB). A DAG step sees what its upstreams returned in this run:

    @handler("reports.load")
    def load(ctx: Context) -> dict:
        rows = ctx.upstream["extract"].result["rows"]     # extract's final execution
        region = ctx.upstream.root_params.get("region")  # what the run was started with
        return {"loaded": rows}
 Workers run only handlers registered in modules named by `--import`; a record
names a handler, and the name is looked up in this registry — it is never imported,
evaluated or resolved as a path.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any
from uuid import UUID

from cronstream.errors import CronstreamError

__all__ = ["REGISTRY", "Context", "HandlerSpec", "NonRetryableError", "ResultOmittedError",
           "Upstream", "UpstreamResult", "handler"]

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


class ResultOmittedError(CronstreamError, LookupError):
    """The upstream's result was not carried with this step: its upstreams' results together
    were larger than the step's record may carry (128 KiB). The upstream's execution holds
    it: `Client().execution(ctx.upstream[job_id].execution_id).result`; `execution_id` is
    that execution."""

    def __init__(self, message: str, *, execution_id: UUID | None = None) -> None:
        super().__init__(message)
        self.execution_id = execution_id


@dataclass(frozen=True, slots=True)
class UpstreamResult:
    """The final execution of one upstream job in this run."""

    execution_id: UUID
    status: str  # COMPLETED, PERMANENTLY_FAILED, CANCELLED or SKIPPED (see the trigger rule)
    result_omitted: bool
    _result: Any = field(repr=False, default=None)

    @property
    def result(self) -> Any:
        """What the upstream's handler returned (None when it returned nothing or did not
        run); ResultOmittedError when it was too large to come with this step."""
        if self.result_omitted:
            raise ResultOmittedError(
                f"the result of execution {self.execution_id} was not carried with this step "
                "(its upstreams' results together pass 128 KiB): read it with "
                f"Client().execution(UUID('{self.execution_id}')).result",
                execution_id=self.execution_id)
        return self._result


class Upstream(Mapping[str, UpstreamResult]):
    """`ctx.upstream`: a read-only mapping from each upstream job_id of a DAG step to its
    final execution in this run, and `root_params`, the params the run's root ran with (a
    trigger's included). Empty for an execution that is not a DAG step, whose
    `root_params` are its own params."""

    __slots__ = ("_executions", "root_params")

    def __init__(self, executions: Mapping[str, UpstreamResult], root_params: Mapping[str, Any]) -> None:
        self._executions = dict(executions)
        self.root_params: Mapping[str, Any] = MappingProxyType(dict(root_params))

    def __getitem__(self, job_id: str) -> UpstreamResult:
        try:
            return self._executions[job_id]
        except KeyError:
            raise KeyError(f"{job_id!r} is not an upstream of this step "
                           f"(upstreams: {', '.join(self._executions) or 'none'})") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._executions)

    def __len__(self) -> int:
        return len(self._executions)

    def __repr__(self) -> str:
        return f"Upstream({self._executions!r}, root_params={dict(self.root_params)!r})"


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
    _upstream: Upstream | None = field(repr=False, default=None)
    _events: Sequence[Any] | None = field(repr=False, default=None)

    @property
    def events(self) -> list[Any]:
        """An event trigger's run: its records, each with `.topic`, `.partition`,
        `.offset`, `.timestamp` (aware UTC), `.key` (text), `.value` (JSON when it parsed,
        else text), `.headers` (text by name) and `.value_omitted`; empty for any other
        execution (docs/reference/semantics.md#event-triggers)."""
        return list(self._events or ())

    @property
    def upstream(self) -> Upstream:
        """A DAG step's upstreams in this run, each with its `.status`, `.result` and
        `.execution_id`, and the run's `root_params` (Upstream)."""
        if self._upstream is None:  # not a DAG step: made only when asked for
            self._upstream = Upstream({}, self.params)
        return self._upstream

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
