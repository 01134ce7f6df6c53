"""Built-in handlers every worker has (SPEC §7): noop, sleep, fail (shell is opt-in)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
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


SHELL_OUTPUT_LIMIT = 16 * 1024
# How the handler processes learn the worker's allow-list: they inherit its environment
# (the CLI exports the list it resolved; shared/settings.py: worker_allow_shell).
ALLOW_SHELL_ENV = "CRONSTREAM_WORKER_ALLOW_SHELL"
_allowed: set[str] = set()  # filled in place by enable_shell


def shell(ctx: Context) -> dict[str, Any]:
    """Runs `command` (an argv list, no shell parsing) and captures its output, truncated
    to 16 KiB per stream. Registered only on workers started with `--allow-shell
    EXECUTABLES`, and runs only those: `command[0]` must be one of them exactly as
    written there (a path, or a name looked up on the worker's PATH). Anyone who can
    publish a definition or a JobDue chooses the params (docs/deploy.md, the trust
    boundary): an allow-list of one interpreter (sh, python) would allow anything again."""
    import subprocess

    command = ctx.params.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise NonRetryableError("params.command must be a non-empty list of strings (argv)")
    if command[0] not in _allowed:
        raise NonRetryableError(f"params.command[0] {command[0][:200]!r} is not an executable this "
                                f"worker allows (--allow-shell {','.join(sorted(_allowed))})")
    done = subprocess.run(command, capture_output=True, check=False, stdin=subprocess.DEVNULL)
    out = done.stdout.decode("utf-8", "replace")[-SHELL_OUTPUT_LIMIT:]
    err = done.stderr.decode("utf-8", "replace")[-SHELL_OUTPUT_LIMIT:]
    if done.returncode != 0:
        raise RuntimeError(f"exit status {done.returncode}: {err.strip()[-2000:]}")
    return {"exit_code": done.returncode, "stdout": out, "stderr": err}


def enable_shell(allowed: Sequence[str] | None = None) -> None:
    """Register `shell` for the executables in `allowed` (None: those of the worker's
    environment, in a handler process); an empty list registers nothing."""
    from cronstream.handlers import REGISTRY

    if allowed is None:
        allowed = [e.strip() for e in os.environ.get(ALLOW_SHELL_ENV, "").split(",") if e.strip()]
    _allowed.clear()
    _allowed.update(allowed)
    if _allowed:
        REGISTRY.register("shell", shell)
