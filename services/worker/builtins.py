"""Built-in handlers every worker has (docs/reference/python.md#built-in-handlers): noop, sleep,
fail (`shell`, opt-in, is shell.py's)."""

from __future__ import annotations

import time
from typing import Any

from cronstream.handlers import Context, NonRetryableError, handler


@handler("noop", inline=True)
def noop(ctx: Context) -> dict[str, Any]:
    """Returns its params (inline: it cannot block)."""
    return ctx.params


@handler("sleep")
def sleep(ctx: Context) -> dict[str, Any]:
    """Sleeps `seconds`, reporting progress; `blocking: true` sleeps in one piece without
    checking for cancellation, like CPU-bound or blocking code that ignores it."""
    seconds = ctx.params.get("seconds", 1)
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds < 0:
        raise NonRetryableError(f"params.seconds must be a non-negative number, got {seconds!r}")
    if ctx.params.get("blocking"):
        time.sleep(seconds)
        ctx.report_progress(100, "done")
        return {"slept": seconds}
    steps = max(1, min(100, int(seconds * 2)))
    for step in range(1, steps + 1):
        if ctx.wait_cancelled(seconds / steps):
            return {"slept": seconds * (step - 1) / steps, "cancelled": True}
        ctx.report_progress(100 * step / steps, f"slept {seconds * step / steps:.1f}s of {seconds}s")
    return {"slept": seconds}


@handler("fail")
def fail(ctx: Context) -> dict[str, Any]:
    """Fails with `message`; with `succeed_on_attempt: n` it succeeds from attempt n."""
    succeed_on = ctx.params.get("succeed_on_attempt")
    if isinstance(succeed_on, int) and not isinstance(succeed_on, bool) \
            and ctx.attempt_number >= succeed_on:
        return {"succeeded_on_attempt": ctx.attempt_number}
    raise RuntimeError(str(ctx.params.get("message", "failed on purpose")))
