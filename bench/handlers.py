"""Handlers the benchmarks register (`--import bench.handlers`)."""

from typing import Any

from cronstream import Context, handler


@handler("bench.echo")
def echo(ctx: Context) -> dict[str, Any]:
    """Like noop, but in the process pool: measures what the kill-able runner costs."""
    return ctx.params
