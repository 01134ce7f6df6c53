"""Handlers the benchmarks register (`--import bench.handlers`)."""

from typing import Any

from cronstream import Context, handler


@handler("bench.echo")
def echo(ctx: Context) -> dict[str, Any]:
    """Like noop, but in the process pool: measures what the kill-able runner costs."""
    return ctx.params


@handler("bench.print10")
def print10(ctx: Context) -> dict[str, Any]:
    """Like bench.echo, writing ten lines of ~60 bytes to stdout (its log: bench.e2e_throughput)."""
    for i in range(10):
        print(f"line {i} of execution {ctx.execution_id}")
    return ctx.params


@handler("bench.sleep20")
def sleep20(ctx: Context) -> dict[str, Any]:
    """Sleeps 20 ms in a call (I/O-bound work): a worker's rate is at most its slots / 20 ms."""
    import time

    time.sleep(0.02)
    return ctx.params
