"""Read-only views: `jobs`, `runs`, `workers`, `alerts` (from PostgreSQL) and `tail`
(from Kafka). Every list takes `-o table|wide|json|yaml` and `--watch` (output.py)."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import asyncpg
import click
from rich.progress_bar import ProgressBar
from rich.table import Table

from cronstream._plumbing import Plumbing
from cronstream.cli.common import CliState, pass_state
from cronstream.cli.output import (
    STATUS_STYLE,
    Column,
    Row,
    ago,
    cell,
    dump_json,
    emit,
    output_option,
    plain,
    show,
    watch,
    watch_options,
)
from cronstream.client import Client
from cronstream.errors import UnavailableError
from cronstream.shared.db import query
from cronstream.shared.records import ExecutionStatus
from cronstream.shared.redaction import redact_url
from cronstream.shared.settings import Settings

EXECUTION_STATUSES: tuple[str, ...] = ExecutionStatus.__args__  # type: ignore[attr-defined]


def fetch(settings: Settings, name: str, *args: Any, timeout: float = 10.0) -> list[asyncpg.Record]:
    """One named query on a connection of its own (for commands that read once)."""
    async def run() -> list[asyncpg.Record]:
        try:
            conn = await asyncpg.connect(settings.database_url, timeout=timeout)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            url = redact_url(settings.database_url)
            raise UnavailableError(f"cannot reach PostgreSQL at {url}: {reason}",
                                   service="postgresql", server=url) from None
        try:
            return await conn.fetch(query(name), *args)
        finally:
            await conn.close()

    return asyncio.run(run())


def runs_table(rows: Sequence[Any]) -> Table:
    """The live view of `cronstream dev`: progress bars for running executions."""
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
            cell(r["job_id"]), cell(status, STATUS_STYLE.get(status)), str(r["attempt_number"]),
            r["scheduled_at"].strftime("%H:%M:%S.%f")[:-3], cell(r["worker_id"]), progress,
            cell(detail[:80]),
        )
    return table


def _list(state: CliState, read: Callable[[Client], list[Row]], key: Callable[[Row], Any],
          columns: list[Column], fmt: str, watching: bool, interval: float, title: str) -> None:
    with state.client() as client:
        if watching:
            watch(lambda: read(client), key, columns, fmt, interval, title)
        else:
            show(read(client), columns, fmt, title)


def _time(value: Any) -> str:
    if value is None:
        return "-"
    t = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# -- jobs -----------------------------------------------------------------------------

JOB_COLUMNS = [
    Column("job", lambda r: r["job_id"]),
    Column("type", lambda r: r["type"]),
    Column("schedule", lambda r: r["schedule"]),
    Column("timezone", lambda r: r["timezone"], wide_only=True),
    Column("handler", lambda r: r["handler"], wide_only=True),
    Column("queue", lambda r: f"{r['queue']}/{r['priority']}", wide_only=True),
    Column("enabled", lambda r: r["enabled"]),
    Column("last status", lambda r: r["last_status"], style_by_value=True),
    Column("next run", lambda r: ago(r["next_execution_at"]) if r["enabled"] else "paused"),
    Column("24h success", lambda r: (f"{100 * r['succeeded_24h'] / r['finished_24h']:.0f}% of "
                                     f"{r['finished_24h']}") if r["finished_24h"] else "-"),
]


def read_jobs(client: Client) -> list[Row]:
    return [{
        "job_id": r["job_id"], "type": r["type"], "schedule": r["schedule"],
        "timezone": r["timezone"], "handler": r["handler"], "queue": r["queue"],
        "priority": r["priority"], "enabled": r["enabled"],
        "next_execution_at": r["next_execution_at"], "last_status": r["last_status"],
        "last_scheduled_at": r["last_scheduled_at"], "finished_24h": r["finished_24h"],
        "succeeded_24h": r["succeeded_24h"], "updated_at": r["updated_at"],
    } for r in Plumbing(client).fetch("jobs_list")]


@click.command()
@output_option()
@watch_options
@pass_state
def jobs(state: CliState, fmt: str, watch: bool, interval: float) -> None:
    """Jobs with their last status, next run and 24 h success rate."""
    _list(state, read_jobs, lambda r: r["job_id"], JOB_COLUMNS, fmt, watch, interval, "jobs")


# -- runs -----------------------------------------------------------------------------

def _progress(r: Row) -> str:
    if r["progress"] is None:
        return "-"
    return f"{r['progress']:.0f}%"


RUN_COLUMNS = [
    Column("execution", lambda r: r["execution_id"], wide_only=True),
    Column("job", lambda r: r["job_id"]),
    Column("status", lambda r: r["status"], style_by_value=True),
    Column("attempt", lambda r: r["attempt_number"]),
    Column("scheduled", lambda r: _time(r["scheduled_at"])),
    Column("worker", lambda r: r["worker_id"]),
    Column("progress", _progress),
    Column("duration", lambda r: (f"{(r['completed_at'] - r['started_at']).total_seconds():.3f}s"
                                  if r["completed_at"] and r["started_at"] else "-"), wide_only=True),
    Column("queue", lambda r: r["queue"], wide_only=True),
    Column("detail", lambda r: (r.get("waiting_reason") if r["status"] == "WAITING" else None)
           or r["error_message"] or r["progress_message"]),
]


def read_runs(client: Client, job_id: str | None, status: str | None, limit: int) -> list[Row]:
    return [dict(e.to_dict(), scheduled_at=e.scheduled_at, started_at=e.started_at,
                 completed_at=e.completed_at)
            for e in client.runs(job_id, status=status, limit=limit)]


@click.command()
@click.option("--job", "job_id", help="Only this job.")
@click.option("--status", type=click.Choice(EXECUTION_STATUSES), help="Only this status.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 10_000))
@output_option()
@watch_options
@pass_state
def runs(state: CliState, job_id: str | None, status: str | None, limit: int, fmt: str,
         watch: bool, interval: float) -> None:
    """Recent executions, newest first."""
    _list(state, lambda c: read_runs(c, job_id, status, limit), lambda r: r["execution_id"],
          RUN_COLUMNS, fmt, watch, interval, "executions")


# -- workers --------------------------------------------------------------------------

WORKER_COLUMNS = [
    Column("worker", lambda r: r["worker_id"]),
    Column("host", lambda r: r["hostname"]),
    Column("status", lambda r: r["status"], style_by_value=True),
    Column("running", lambda r: r["running"]),
    Column("capacity", lambda r: r["capacity"]),
    Column("queues", lambda r: ",".join(r["queues"])),
    Column("last heartbeat", lambda r: ago(r["last_heartbeat"])),
]


def read_workers(client: Client) -> list[Row]:
    return [dict(r) | {"queues": list(r["queues"])}
            for r in Plumbing(client).fetch("workers_overview")]


@click.command()
@output_option()
@watch_options
@pass_state
def workers(state: CliState, fmt: str, watch: bool, interval: float) -> None:
    """Workers, their status, load and last heartbeat."""
    _list(state, read_workers, lambda r: r["worker_id"], WORKER_COLUMNS, fmt, watch, interval,
          "workers")


# -- alerts ---------------------------------------------------------------------------

ALERT_COLUMNS = [
    Column("alert", lambda r: r["alert_id"], wide_only=True),
    Column("fired", lambda r: _time(r["fired_at"])),
    Column("state", lambda r: r["state"], style_by_value=True),
    Column("severity", lambda r: r["severity"]),
    Column("kind", lambda r: r["kind"]),
    Column("job", lambda r: r["job_id"] or (f"queue:{r['queue']}" if r["queue"] else None)),
    Column("execution", lambda r: r["execution_id"], wide_only=True),
    Column("resolved", lambda r: _time(r["resolved_at"]) if r["resolved_at"] else "-",
           wide_only=True),
    Column("summary", lambda r: r["summary"] or r["error_message"]),
]


def read_alerts(client: Client, state_filter: str | None, job_id: str | None,
                limit: int) -> list[Row]:
    return [dict(r) | {"evidence": json.loads(r["evidence"]) if r["evidence"] else {}}
            for r in Plumbing(client).fetch("alerts_list", state_filter, job_id, limit)]


@click.command()
@click.option("--state", "state_filter", type=click.Choice(["FIRING", "RESOLVED"]),
              help="Only alerts in this state.")
@click.option("--job", "job_id", help="Only this job's alerts.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@output_option()
@watch_options
@pass_state
def alerts(state: CliState, state_filter: str | None, job_id: str | None, limit: int, fmt: str,
           watch: bool, interval: float) -> None:
    """Alerts (FIRING until RESOLVED), newest first."""
    _list(state, lambda c: read_alerts(c, state_filter, job_id, limit), lambda r: r["alert_id"],
          ALERT_COLUMNS, fmt, watch, interval, "alerts")


# -- tail -----------------------------------------------------------------------------

class _Stop(Exception):
    pass


def _stop(_signum: int, _frame: Any) -> None:
    raise _Stop


@click.command()
@click.option("--job", "job_id", help="Only this job's events.")
@click.option("--from-beginning", is_flag=True, help="Start at the oldest retained event.")
@click.option("--count", type=int, help="Exit after this many events.")
@click.option("-o", "--output", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="text, or json: one event per line (JSON lines).")
@click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as -o json.")
@pass_state
def tail(state: CliState, job_id: str | None, from_beginning: bool, count: int | None,
         fmt: str, as_json: bool) -> None:
    """Follow execution-events live (group-less: commits nothing)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    from cronstream.shared.kafka.config import reader_config
    from cronstream.shared.records import ExecutionEvent

    settings = state.settings()
    topic = settings.topics.execution_events
    conf = reader_config(settings, "cronstream-tail")
    conf["enable.partition.eof"] = False
    consumer = Consumer(conf)
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        try:
            metadata = consumer.list_topics(topic, timeout=state.timeout).topics.get(topic)
        except KafkaException as exc:
            raise UnavailableError(f"cannot reach Kafka at {settings.kafka_bootstrap_servers}: "
                                   f"{exc.args[0].str() if exc.args else exc}", service="kafka",
                                   server=settings.kafka_bootstrap_servers) from None
        if metadata is None or metadata.error is not None:
            raise click.ClickException(f"topic {topic} does not exist: run `cronstream init`")
        start = -2 if from_beginning else -1
        consumer.assign([TopicPartition(topic, p, start) for p in metadata.partitions])
        seen = 0
        while count is None or seen < count:
            for msg in consumer.consume(500, 0.5):
                if msg.error() is not None:
                    continue
                try:
                    event = ExecutionEvent.model_validate_json(msg.value() or b"")
                except ValueError:
                    if fmt == "text" and not as_json:
                        emit(f"(undecodable record at {msg.partition()}:{msg.offset()})")
                    continue
                if job_id and event.job_id != job_id:
                    continue
                seen += 1
                if fmt == "json" or as_json:
                    emit(dump_json(json.loads(event.to_json()), lines=True))
                else:
                    extra = event.error_message or (
                        f"{event.progress:.0f}%" if event.progress is not None else "")
                    emit(f"{event.occurred_at:%H:%M:%S.%f}"[:-3] + f" {event.job_id} "
                               f"{event.status} attempt={event.attempt_number} "
                               f"execution={event.execution_id} {extra}".rstrip())
                if count is not None and seen >= count:
                    break
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        consumer.close()


__all__ = ["fetch", "plain", "runs_table"]

COMMANDS = [jobs, runs, workers, alerts, tail]
