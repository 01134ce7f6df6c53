"""`cronstream prune --older-than 30d`: retention on demand (the monitor also applies
`CRONSTREAM_RETENTION_DAYS` on its own schedule; services/monitor/retention.py)."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta

import asyncpg
import click

from cronstream.cli.common import CliState, pass_state
from cronstream.cli.output import emit
from cronstream.services.monitor import retention

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class Unreachable(click.ClickException):
    exit_code = 3  # docs/reference/cli.md#exit-codes: cannot reach Kafka or PostgreSQL


def parse_age(text: str) -> timedelta:
    """'30d', '12h', '90m', '3600s', '2w' -> timedelta; ValueError naming what is wrong."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration: use a number and a unit s, m, h, d or w "
                         "(e.g. 30d, 12h)")
    seconds = float(match[1]) * _UNITS[match[2]]
    if seconds <= 0:
        raise ValueError(f"{text!r} must be longer than zero")
    return timedelta(seconds=seconds)


class _Age(click.ParamType):  # type: ignore[type-arg]
    name = "DURATION"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        try:
            return parse_age(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@click.command()
@click.option("--older-than", "older_than", type=_Age(), required=True,
              help="Delete what is older than this: 30d, 12h, 90m, 2w.")
@click.option("--batch", type=click.IntRange(1, 1_000_000), default=None,
              help="Rows per transaction [CRONSTREAM_RETENTION_BATCH, default 1000].")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@pass_state
def prune(state: CliState, older_than: timedelta, batch: int | None, dry_run: bool) -> None:
    """Delete finished executions (with their events), closed alerts, DAG evaluations,
    offline workers and replaced definition versions older than --older-than, in bounded
    batches that never block the monitor's projection."""
    settings = state.settings(retention_batch=batch)
    cutoff = retention.cutoff_for(older_than)

    async def run() -> dict[str, int]:
        try:
            conn = await asyncpg.connect(settings.database_url, timeout=10)
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            raise Unreachable(f"cannot reach PostgreSQL: {exc}") from None
        try:
            if dry_run:
                return await retention.count_prunable(conn, cutoff)
            done = await retention.prune(conn, cutoff, settings.retention_batch)
            return done.counts
        finally:
            await conn.close()

    counts = asyncio.run(run())
    verb = "would delete" if dry_run else "deleted"
    shown = ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in counts.items())
    emit(f"{verb} (older than {cutoff.isoformat(timespec='seconds')}): {shown}")


COMMANDS = [prune]
