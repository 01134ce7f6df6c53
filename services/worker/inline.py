"""Handlers registered `inline=True`: invoked on the worker's event loop, not in a pool
process.

Only for code that never blocks: nothing can kill it, so its timeout can only be
cooperative (an async handler is cancelled at `timeout_seconds`; a synchronous one holds
the loop from its start to its end, so nothing can interrupt it at all). The built-in
noop is one: its whole invocation is a function call. Both ways go through the one body
of every invocation (runner.invoke); what the handler writes is captured as far as Python
allows in the worker's own process (capture.INLINE).
"""

from __future__ import annotations

import threading

from cronstream.handlers import HandlerSpec
from cronstream.services.worker.capture import INLINE
from cronstream.services.worker.runner import (
    CancelSignal,
    Invocation,
    LinesFn,
    Outcome,
    ProgressFn,
    at_once,
    invoke,
)


class _NeverCancelled(threading.Event):
    """The cancellation flag of an inline synchronous invocation: it holds the event loop
    from its start to its end, so nothing can cancel it meanwhile. One for all of them."""

    def set(self) -> None:
        raise RuntimeError("an inline synchronous invocation cannot be cancelled")


_NEVER_CANCELLED = _NeverCancelled()


def invoke_now(spec: HandlerSpec, invocation: Invocation, progress: ProgressFn, *,
               lines: LinesFn | None = None, log_limit: int = 1 << 20) -> Outcome:
    """An inline synchronous handler, called here and now; what it writes goes to `lines`."""
    return at_once(invoke(spec, invocation, progress, _NEVER_CANCELLED, capture=INLINE,
                          lines=lines, log_limit=log_limit))


async def invoke_awaited(spec: HandlerSpec, invocation: Invocation, timeout: float,
                         progress: ProgressFn, cancel: CancelSignal, *,
                         lines: LinesFn | None = None, log_limit: int = 1 << 20) -> Outcome:
    """An inline handler awaited (in a task of its own): an async one is cancelled at its
    `timeout`. What it writes goes to `lines` when it ends (an inline invocation is short,
    or it would be in the pool)."""
    outcome = await invoke(spec, invocation, progress, cancel.flag, capture=INLINE, lines=lines,
                           log_limit=log_limit, timeout=timeout)
    if outcome.status == "TIMED_OUT":
        cancel.set("timeout")
    return outcome
