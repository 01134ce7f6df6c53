"""Read-only views: `jobs`, `runs`, `workers` (from PostgreSQL) and `tail` (from Kafka)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import asyncpg
import click
from rich.console import Console
from rich.progress_bar import ProgressBar
from rich.table import Table

from cronstream.cli.common import CliState, pass_state
from cronstream.shared.db import query
from cronstream.shared.settings import Settings

STATUS_STYLE = {
    "COMPLETED": "green", "RUNNING": "cyan", "QUEUED": "blue", "FAILED": "red",
    "PERMANENTLY_FAILED": "bold red", "TIMED_OUT": "magenta", "CANCELLED": "yellow",
    "SKIPPED": "dim", "AWAITING_APPROVAL": "bold yellow",
}


def fetch(settings: Settings, name: str, *args: Any) -> list[asyncpg.Record]:
    async def run() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(settings.database_url)
        try:
            return await conn.fetch(query(name), *args)
        finally:
            await conn.close()

    return asyncio.run(run())


def _ago(t: datetime | None) -> str:
    if t is None:
        return "-"
    seconds = (datetime.now(UTC) - t).total_seconds()
    if seconds < 0:
        seconds = -seconds
        return f"in {seconds:.0f}s" if seconds < 120 else f"in {seconds / 60:.0f}m"
    return f"{seconds:.0f}s ago" if seconds < 120 else f"{seconds / 60:.0f}m ago"


def runs_table(rows: list[asyncpg.Record]) -> Table:
    table = Table(title="executions", expand=True)
    for column in ("job", "status", "attempt", "scheduled", "worker", "progress", "detail"):
        table.add_column(column, overflow="fold")
    for r in rows:
        status = r["status"]
        progress: Any = "-"
        if status == "RUNNING":
            progress = ProgressBar(total=100, completed=r["progress"] or 0, width=20)
        elif r["progress"] is not None:
            progress = f"{r['progress']:.0f}%"
        detail = r["error_message"] or r["progress_message"] or ""
        table.add_row(
            r["job_id"], f"[{STATUS_STYLE.get(status, '')}]{status}[/]", str(r["attempt_number"]),
            r["scheduled_at"].strftime("%H:%M:%S.%f")[:-3], r["worker_id"] or "-", progress,
            detail[:80],
        )
    return table


@click.command()
@pass_state
def jobs(state: CliState) -> None:
    """Jobs with their last status, next run and 24 h success rate."""
    rows = fetch(state.settings(), "jobs_overview")
    table = Table(title="jobs")
    for column in ("job", "type", "schedule", "enabled", "last status", "next run", "24h success"):
        table.add_column(column)
    for r in rows:
        rate = f"{100 * r['succeeded'] / r['total']:.0f}% of {r['total']}" if r["total"] else "-"
        last = r["last_status"] or "-"
        table.add_row(r["job_id"], r["type"], str(r["schedule"]), "yes" if r["enabled"] else "no",
                      f"[{STATUS_STYLE.get(last, '')}]{last}[/]", _ago(r["next_execution_at"]), rate)
    Console().print(table)


@click.command()
@click.option("--job", "job_id", help="Only this job.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 10_000))
@pass_state
def runs(state: CliState, job_id: str | None, limit: int) -> None:
    """Recent executions, with progress bars for running ones."""
    Console().print(runs_table(fetch(state.settings(), "recent_executions", job_id, limit)))


@click.command()
@pass_state
def workers(state: CliState) -> None:
    """Workers, their status, load and last heartbeat."""
    table = Table(title="workers")
    for column in ("worker", "host", "status", "running", "capacity", "queues", "last heartbeat"):
        table.add_column(column)
    for r in fetch(state.settings(), "workers_overview"):
        table.add_row(r["worker_id"], r["hostname"], r["status"], str(r["running"]),
                      str(r["capacity"]), ",".join(r["queues"]), _ago(r["last_heartbeat"]))
    Console().print(table)


@click.command()
@click.option("--job", "job_id", help="Only this job's events.")
@click.option("--from-beginning", is_flag=True, help="Start at the oldest retained event.")
@click.option("--count", type=int, help="Exit after this many events.")
@click.option("--json", "as_json", is_flag=True, help="Print each event as JSON.")
@pass_state
def tail(state: CliState, job_id: str | None, from_beginning: bool, count: int | None,
         as_json: bool) -> None:
    """Follow execution-events live."""
    from confluent_kafka import Consumer, TopicPartition

    from cronstream.shared.kafka import reader_config
    from cronstream.shared.records import ExecutionEvent

    settings = state.settings()
    topic = settings.topics.execution_events
    conf = reader_config(settings, "cronstream-tail")
    conf["enable.partition.eof"] = False
    consumer = Consumer(conf)
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    start = -2 if from_beginning else -1
    consumer.assign([TopicPartition(topic, p, start) for p in partitions])
    seen = 0
    try:
        while count is None or seen < count:
            for msg in consumer.consume(500, 0.5):
                if msg.error() is not None:
                    continue
                try:
                    event = ExecutionEvent.model_validate_json(msg.value() or b"")
                except ValueError:
                    click.echo(f"(undecodable record at {msg.partition()}:{msg.offset()})")
                    continue
                if job_id and event.job_id != job_id:
                    continue
                seen += 1
                if as_json:
                    click.echo(json.dumps(json.loads(event.to_json())))
                else:
                    extra = event.error_message or (
                        f"{event.progress:.0f}%" if event.progress is not None else "")
                    click.echo(f"{event.occurred_at:%H:%M:%S.%f}"[:-3] + f" {event.job_id} "
                               f"{event.status} attempt={event.attempt_number} "
                               f"execution={event.execution_id} {extra}".rstrip())
                if count is not None and seen >= count:
                    break
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()


COMMANDS = [jobs, runs, workers, tail]
