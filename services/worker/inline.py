"""Handlers registered `inline=True`: run on the worker's event loop, not in a pool process.

Only for code that never blocks: nothing can kill it, so its timeout can only be
cooperative (an async handler is cancelled at `timeout_seconds`; a synchronous one holds
the loop from its start to its end, so nothing can interrupt it at all). The built-in
noop is one: its whole run is a function call.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from cronstream.services.worker.capture import RunLog, inline_run
from cronstream.services.worker.runner import (
    CancelSignal,
    LinesFn,
    Outcome,
    ProgressFn,
    failed,
    make_context,
    returned,
)
from cronstream.shared import telemetry
from cronstream.shared.fast_records import DueRecord


class _NeverCancelled(threading.Event):
    """The cancellation flag of an inline synchronous run: it holds the event loop from its
    start to its end, so nothing can cancel it meanwhile. One for all of them."""

    def set(self) -> None:
        raise RuntimeError("an inline synchronous run cannot be cancelled")


_NEVER_CANCELLED = _NeverCancelled()


def run_now(func: Any, due: DueRecord, progress: ProgressFn, traceparent: str | None, *,
            lines: LinesFn | None = None, log_limit: int = 1 << 20) -> Outcome:
    """An inline synchronous handler, called here and now; what it writes goes to `lines`."""
    log = RunLog(log_limit) if lines is not None else None
    try:
        with inline_run(log), telemetry.handler_span(
                due.job.handler, traceparent, job_id=due.job_id,
                execution_id=due.execution_id) as current:
            result = func(make_context(due, progress, _NEVER_CANCELLED, current))
    except Exception as exc:
        outcome = failed(exc)
    else:
        outcome = returned(result, cancelled=False)[0]
    _hand_over(log, lines)
    return outcome


async def run(func: Any, is_async: bool, due: DueRecord, progress: ProgressFn,
              cancel: CancelSignal, *, lines: LinesFn | None = None, log_limit: int = 1 << 20
              ) -> Outcome:
    """An inline handler as a task: an async one is cancelled at its timeout. What it writes
    goes to `lines` when it ends (an inline run is short, or it would be in the pool)."""
    log = RunLog(log_limit) if lines is not None else None
    try:
        with inline_run(log), telemetry.handler_span(
                due.job.handler, job_id=due.job_id, execution_id=due.execution_id) as traceparent:
            ctx = make_context(due, progress, cancel.flag, traceparent)
            if is_async:
                result = await asyncio.wait_for(func(ctx), due.job.timeout_seconds)
            else:
                result = func(ctx)
    except TimeoutError:
        cancel.set("timeout")
        outcome = Outcome("TIMED_OUT", error=f"timed out after {due.job.timeout_seconds:g}s")
    except Exception as exc:
        outcome = failed(exc)
    else:
        outcome = returned(result, cancel.is_set())[0]
    _hand_over(log, lines)
    return outcome


def _hand_over(log: RunLog | None, lines: LinesFn | None) -> None:
    if log is None or lines is None:
        return
    taken = log.take()
    summary = log.summary()
    if summary is not None:
        taken.append(summary)
    if taken:
        lines(taken)
