"""Handlers the e2e tests register in their workers with `--import`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from cronstream import Context, handler


@handler("test.block")
def block(ctx: Context) -> None:
    time.sleep(120)  # ignores its timeout and cancellation, like a stuck network call


@handler("test.cpu")
def cpu(ctx: Context) -> int:
    n = 0
    while True:  # pure Python, never yields
        n += 1


@handler("test.spin")
def spin(ctx: Context) -> int:
    """Computes for params.seconds of wall time (pure Python), then returns."""
    until, n = time.monotonic() + float(ctx.params.get("seconds", 0.2)), 0
    while time.monotonic() < until:
        n += 1
    return n


@handler("test.exit")
def exit_now(ctx: Context) -> None:
    """Its process dies under it (as a segfault or the OOM killer would end it)."""
    os._exit(3)


@handler("test.write")
def write(ctx: Context) -> dict[str, Any]:
    """Appends its execution id to params.path: lets a test see where and how often it ran."""
    with open(ctx.params["path"], "a") as out:
        out.write(f"{ctx.execution_id} {ctx.attempt_number}\n")
    return {"written": True}


@handler("test.slow-write")
def slow_write(ctx: Context) -> dict[str, Any]:
    started = time.time()
    ctx.wait_cancelled(float(ctx.params.get("seconds", 5)))
    with Path(ctx.params["path"]).open("a") as out:
        out.write(f"{ctx.execution_id} {started} {time.time()}\n")
    return {"cancelled": ctx.cancelled}


@handler("test.wait-for-cancel")
def wait_for_cancel(ctx: Context) -> dict[str, Any]:
    """Says it is waiting (a progress report), then waits up to params.seconds to be cancelled."""
    ctx.report_progress(0, "waiting")
    return {"cancelled": ctx.wait_cancelled(float(ctx.params.get("seconds", 60)))}


@handler("test.context")
def context(ctx: Context) -> dict[str, Any]:
    """Reports progress with params.message, then returns what its Context holds."""
    ctx.report_progress(50, ctx.params.get("message"))
    return {"execution_id": str(ctx.execution_id), "job_id": ctx.job_id, "run_id": str(ctx.run_id),
            "attempt_number": ctx.attempt_number, "idempotency_key": ctx.idempotency_key,
            "scheduled_at": ctx.scheduled_at.isoformat(), "params": ctx.params,
            "traceparent": ctx.traceparent}


@handler("test.upstream")
def upstream(ctx: Context) -> dict[str, Any]:
    """Returns what it saw of its run: each upstream's final execution (a result too large
    to come with the step as "<omitted>", one over 1 KiB as its size), the run's root params
    and its own params; fails the attempts before params.fail_before_attempt."""
    from cronstream.handlers import ResultOmittedError

    if ctx.attempt_number < int(ctx.params.get("fail_before_attempt", 0)):
        raise RuntimeError(f"attempt {ctx.attempt_number} fails on purpose")
    seen: dict[str, Any] = {}
    for job_id, final in ctx.upstream.items():
        try:
            result = final.result
        except ResultOmittedError:
            result = "<omitted>"
        size = len(json.dumps(result))
        if size > 1024:  # what came, not all of it: the step's own result has a limit too
            result = {"bytes": size}
        seen[job_id] = {"status": final.status, "execution_id": str(final.execution_id),
                        "result": result}
    return {"upstream": seen, "root_params": dict(ctx.upstream.root_params),
            "params": ctx.params, "attempt": ctx.attempt_number}


@handler("test.refuse")
def refuse(ctx: Context) -> None:
    from cronstream import NonRetryableError

    raise NonRetryableError("the input can never work")


@handler("test.async-double")
async def async_double(ctx: Context) -> dict[str, Any]:
    import asyncio

    await asyncio.sleep(0.1)
    ctx.report_progress(100, "awaited")
    return {"doubled": 2 * int(ctx.params["n"]), "attempt": ctx.attempt_number}


@handler("test.traced")
def traced(ctx: Context) -> dict[str, Any]:
    """Makes a span of its own, as instrumented user code would, and fails its first attempt."""
    from opentelemetry import trace

    with trace.get_tracer("user-code").start_as_current_span("user.work") as span:
        span.set_attribute("user.attempt", ctx.attempt_number)
        if ctx.attempt_number == 1:
            raise RuntimeError("first attempt fails on purpose")
    return {"trace_id": ctx.trace_id}


@handler("test.chatty-fail")
def chatty_fail(ctx: Context) -> None:
    """Writes to every stream a handler has (print, stderr, a child process, C-level
    writes, logging), then fails with a chained cause."""
    import logging
    import subprocess
    import sys

    print(f"processing {ctx.params.get('region', 'all regions')}")
    print("progress: half", file=sys.stderr)
    os.write(1, b"raw bytes \xff\xfe on fd 1\n")  # not UTF-8: kept as escapes
    subprocess.run(["echo", "from a child process"], check=True)
    logging.getLogger("tests.chatty").warning("retrying the lookup")
    try:
        empty: dict[str, str] = {}
        empty["region"]
    except KeyError as exc:
        raise RuntimeError("lookup failed") from exc


@handler("test.flood")
def flood(ctx: Context) -> dict[str, int]:
    """Writes params.megabytes of output as fast as it can (lines, and one huge line)."""
    import sys

    line = "x" * 1023 + "\n"
    for _ in range(int(ctx.params.get("megabytes", 20)) * 1024):
        sys.stdout.write(line)
    sys.stdout.write("y" * (int(ctx.params.get("long_line", 0))) + "\n")
    print("the end")
    return {"written": True}


@handler("test.print-lines")
def print_lines(ctx: Context) -> int:
    """Prints params.lines lines, params.every seconds apart (the time of each printed)."""
    count, every = int(ctx.params.get("lines", 10)), float(ctx.params.get("every", 0))
    for i in range(count):
        print(f"line {i} at {time.time():.6f}")
        if every:
            time.sleep(every)
    return count


@handler("test.inline-print", inline=True)
def inline_print(ctx: Context) -> str:
    import logging

    print(f"inline {ctx.execution_id}")
    logging.getLogger("tests.inline").warning("inline warning %s", ctx.execution_id)
    return "printed"


@handler("test.print-then-fail")
def print_then_fail(ctx: Context) -> None:
    """Prints params.lines lines params.every seconds apart (one of them markup that must
    stay text), logs a warning, then fails."""
    import logging

    for i in range(int(ctx.params.get("lines", 6))):
        print(f"step {i}" if i != 2 else "<script>window.__injected = 1</script><b>bold?</b>")
        time.sleep(float(ctx.params.get("every", 0.5)))
    logging.getLogger("tests.browser").warning("about to fail")
    raise ValueError(f"region {ctx.params.get('region', 'eu')!r} is not served")


@handler("test.events")
def events(ctx: Context) -> dict[str, Any]:
    """Returns the records of its event trigger's run (ctx.events), in order; fails the
    attempts before params.fail_before_attempt."""
    if ctx.attempt_number < int(ctx.params.get("fail_before_attempt", 0)):
        raise RuntimeError(f"attempt {ctx.attempt_number} fails on purpose")
    return {"events": [{"topic": e.topic, "partition": e.partition, "offset": e.offset,
                        "timestamp": e.timestamp.isoformat(), "key": e.key, "value": e.value,
                        "headers": e.headers} for e in ctx.events],
            "attempt": ctx.attempt_number}
