"""`get` (one object, as data) and `describe` (one object, for people), from PostgreSQL.

`cronstream get job ID -o yaml` prints the definition as it was published, in the form
`apply -f` reads back unchanged (times as RFC 3339 strings, unset optional fields left
out, fields of a newer version kept).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import click

from cronstream._plumbing import Plumbing
from cronstream.cli.common import CliState, pass_state
from cronstream.cli.output import Column, ago, cell_text, emit, plain, plain_table, show, show_one
from cronstream.client import Client
from cronstream.definitions import document
from cronstream.errors import NotFoundError
from cronstream.executions import Execution
from cronstream.shared.calendars import ResolvedCalendar, resolve
from cronstream.shared.records import Calendar, JobDefinition
from cronstream.shared.schedule import first_fire, upcoming


def _definition(client: Client, job_id: str) -> tuple[JobDefinition, Any]:
    rows = Plumbing(client).fetch("get_definition", job_id)
    if not rows:
        raise NotFoundError(f"no job {job_id!r}", job_id=job_id)
    return JobDefinition.model_validate_json(rows[0]["definition"]), rows[0]


def _calendar(client: Client, d: JobDefinition) -> ResolvedCalendar | None:
    """The projected calendar `d` names (None: it names none, or it is not applied)."""
    if d.calendar is None:
        return None
    rows = Plumbing(client).fetch("calendar_documents", [d.calendar])
    return resolve(Calendar.model_validate_json(rows[0]["definition"])) if rows else None


def _timing_fields(d: JobDefinition, calendar: ResolvedCalendar | None) -> None:
    if d.calendar is not None:
        _field("Calendar", f"{d.calendar}, on excluded days {d.on_excluded}"
                           + ("" if calendar is not None else " (not applied: the job does not fire)"))
    if d.jitter_seconds or d.max_runs is not None:
        _field("Timing", ", ".join(
            ([f"jitter < {d.jitter_seconds}s"] if d.jitter_seconds else [])
            + ([f"stops after {d.max_runs} runs"] if d.max_runs is not None else [])))


def _next_fires(d: JobDefinition, count: int, calendar: ResolvedCalendar | None) -> None:
    emit("Next fires:" + ("" if d.enabled else " (paused: none will fire until resumed)"))
    now = datetime.now(UTC)
    if d.type == "ONE_TIME":
        first = first_fire(d, now, None)
        times = [first] if first else []
    elif d.calendar is not None and calendar is None:
        emit(f"  none: its calendar {d.calendar!r} is not applied")
        return
    else:
        times = upcoming(d, now, count, calendar=calendar)
    for fire in times:
        local = fire.astimezone(d.zone)
        emit(f"  {_when(fire)}  {local.isoformat(timespec='seconds')} {local.tzname()}")
    if not times:
        emit("  none")


def _execution(client: Client, execution_id: uuid.UUID) -> Execution:
    found = client.execution(execution_id)
    if found is None:
        raise NotFoundError(f"no execution {execution_id}", execution_id=execution_id)
    return found


@click.group()
def get() -> None:
    """Print one job or execution as data (-o yaml|json)."""


def _get_output(fn: Any) -> Any:
    return click.option("-o", "--output", "fmt", type=click.Choice(["yaml", "json"]),
                        default="yaml", show_default=True)(fn)


@get.command("job")
@click.argument("job_id")
@click.option("--version", "version", type=click.IntRange(1),
              help="A past version of the definition (`cronstream history JOB_ID`).")
@_get_output
@pass_state
def get_job(state: CliState, job_id: str, version: int | None, fmt: str) -> None:
    """The definition of JOB_ID (or its version --version), in the form `apply -f`
    accepts unchanged."""
    with state.client() as client:
        if version is None:
            definition, _ = _definition(client, job_id)
            show_one(document(definition), fmt)
            return
        found = client.version(job_id, version)
    if found.document is None:
        raise click.ClickException(f"version {version} of {job_id} is its deletion "
                                   f"({found.label()}): it has no definition to show")
    show_one(found.document, fmt)


@get.command("execution")
@click.argument("execution_id", type=click.UUID)
@_get_output
@pass_state
def get_execution(state: CliState, execution_id: uuid.UUID, fmt: str) -> None:
    """The current state of EXECUTION_ID."""
    with state.client() as client:
        show_one(_execution(client, execution_id).to_dict(), fmt)


@click.group()
def describe() -> None:
    """Explain one job or execution: state, history, DAG position."""


def _field(name: str, value: Any) -> None:
    emit(f"{name + ':':<16}{cell_text(value)}")


def _when(t: datetime | None) -> str:
    if t is None:
        return "-"
    return f"{t.astimezone(UTC).isoformat(timespec='milliseconds').replace('+00:00', 'Z')} ({ago(t)})"


def _schedule_text(d: JobDefinition) -> str:
    if d.type == "CRON":
        return f"cron {d.schedule!r} in {d.timezone}"
    if d.type == "INTERVAL":
        return f"every {d.interval_seconds}s"
    if d.type == "ONE_TIME":
        return f"once at {_when(d.run_at)}"
    if d.type == "EVENT" and d.event is not None:
        e = d.event
        return (f"records of {e.topic}" + (f" where {e.filter}" if e.filter else "")
                + f", {e.batch.max_events} per run at most, waiting at most "
                  f"{e.batch.max_wait_seconds:g}s (from {e.start})")
    return f"after {', '.join(d.depends_on)} (trigger rule {d.trigger_rule})"


RECENT = [
    Column("execution", lambda r: r["execution_id"]),
    Column("status", lambda r: r["status"]),
    Column("attempt", lambda r: r["attempt_number"]),
    Column("scheduled", lambda r: r["scheduled_at"]),
    Column("worker", lambda r: r["worker_id"]),
    Column("detail", lambda r: r["error_message"] or r["progress_message"]),
]


@describe.command("job")
@click.argument("job_id")
@click.option("--fires", default=5, show_default=True, type=click.IntRange(0, 100),
              help="How many upcoming fires to list.")
@click.option("--runs", "n_runs", default=10, show_default=True, type=click.IntRange(0, 1000),
              help="How many recent executions to list.")
@pass_state
def describe_job(state: CliState, job_id: str, fires: int, n_runs: int) -> None:
    """Definition, next fires, recent runs and DAG position of JOB_ID."""
    with state.client() as client:
        d, row = _definition(client, job_id)
        calendar = _calendar(client, d)
        downstream = [r["downstream_job_id"]
                      for r in Plumbing(client).fetch("job_downstream_ids", job_id)]
        recent = client.runs(job_id, limit=n_runs) if n_runs else []
        trigger = Plumbing(client).trigger_lag(d) if d.type == "EVENT" else None
    _field("Job", d.job_id + (f"  ({d.name})" if d.name else ""))
    _field("Type", f"{d.type}: {_schedule_text(d)}")
    if d.type == "EVENT":
        _field("Trigger", "not accepted by a scheduler yet" if trigger is None else
               f"lag {trigger[0]} records (not yet in a run); positions "
               + (", ".join(f"{p}:{o}" for p, o in sorted(trigger[1].items())) or "none committed"))
    _field("Enabled", "yes" if d.enabled else "no (paused)")
    _field("Handler", f"{d.handler}  queue {d.queue}, priority {d.priority}")
    if d.params:
        _field("Params", json.dumps(d.params, ensure_ascii=False))
    _field("Retries", f"{d.max_retries} (delay {d.retry_delay_seconds:g}s × 2^n, at most "
                      f"{d.max_retry_delay_seconds:g}s)")
    _field("Timeout", f"{d.timeout_seconds:g}s")
    limit = f" (at most {d.max_concurrent_runs} runs at once)" if d.max_concurrent_runs else ""
    _field("Policies", f"concurrency {d.concurrency_policy}{limit}, misfire {d.misfire_policy} "
                       f"(grace {d.misfire_grace_seconds:g}s)")
    if d.start_at or d.end_at:
        _field("Active", f"from {_when(d.start_at)} until {_when(d.end_at)}")
    _timing_fields(d, calendar)
    _flow_fields(d)
    _field("Created", f"{_when(d.created_at)} by {d.created_by or '-'}")
    _field("Updated", _when(row["updated_at"]))
    if row["version"] is not None:
        _field("Version", f"{row['version']} (cronstream history {d.job_id})")
    if d.model_extra:
        _field("Newer fields", ", ".join(sorted(d.model_extra)))
    emit("DAG:")
    emit(f"  upstream:     {', '.join(d.depends_on) or '-'}")
    if d.condition:
        emit(f"  condition:    {d.condition}")
    if d.requires_approval:
        emit("  approval:     required (approve / reject)")
    emit(f"  downstream:   {', '.join(downstream) or '-'}")
    if fires and d.type not in ("DEPENDENT", "EVENT"):
        _next_fires(d, fires, calendar)
    emit("Recent runs:")
    if not recent:
        emit("  none")
    else:
        cells = [[cell_text(c.cell(r)) for c in RECENT]
                 for r in (plain(e.to_dict()) for e in recent)]
        emit("\n".join("  " + line for line in
                       plain_table([c.header.upper() for c in RECENT], cells).splitlines()))


def _flow_fields(d: JobDefinition) -> None:
    """Flow control (decision 0056): what holds the job's executions back, if anything."""
    limits = []
    if d.concurrency is not None:
        per = f"per {d.concurrency.key}" if d.concurrency.key else "for the job"
        limits.append(f"{d.concurrency.max_running} running at once {per}")
    if d.pool is not None:
        limits.append(f"pool {d.pool} ({d.pool_slots} slot{'s' if d.pool_slots != 1 else ''} each)")
    if d.rate_limit is not None:
        limits.append(f"at most {d.rate_limit} starts")
    if limits:
        _field("Flow control", "; ".join(limits))


def _waiting(e: Execution) -> None:
    """Why it waits (a WAITING execution), or why it waited (one admitted since)."""
    if e.waiting_reason:
        _field("Waiting" if e.status == "WAITING" else "Waited", e.waiting_reason)


def _trigger_events_field(records: list[Any]) -> None:
    """Where an event trigger's run's records are (its first 20)."""
    if records:
        shown = ", ".join(f"{r['topic']}[{r['partition']}]@{r['offset']}" for r in records[:20])
        _field("Events", f"{len(records)} record(s): {shown}"
                         + (f", and {len(records) - 20} more" if len(records) > 20 else ""))


@describe.command("execution")
@click.argument("execution_id", type=click.UUID)
@pass_state
def describe_execution(state: CliState, execution_id: uuid.UUID) -> None:
    """State, event timeline, attempts and DAG run of EXECUTION_ID."""
    with state.client() as client:
        e = _execution(client, execution_id)
        reads = Plumbing(client)
        timeline = reads.fetch("execution_timeline", execution_id)
        run = reads.fetch("run_executions", e.run_id)
        log_state = reads.fetch("log_state", execution_id)[0]
        traceback = reads.fetch("last_traceback", execution_id)
        records = reads.fetch("execution_trigger_events", execution_id) if e.reason == "EVENT" else []
    _field("Execution", str(e.execution_id))
    _field("Job", e.job_id)
    _field("Run", str(e.run_id))
    _field("Status", e.status + (f" ({e.progress:.0f}%)" if e.progress is not None and not e.terminal
                                 else ""))
    _field("Attempt", f"{e.attempt_number}" + (f", delivery {e.delivery} (re-queued)"
                                              if e.delivery > 1 else ""))
    _field("Reason", e.reason or "-")
    _waiting(e)
    if e.triggered_by:
        _field("Triggered by", e.triggered_by)
    _field("Definition", f"version {e.definition_version} (cronstream get job {e.job_id} "
                         f"--version {e.definition_version})" if e.definition_version else "-")
    _field("Params", json.dumps(e.params, ensure_ascii=False) if e.params is not None else "-")
    _trigger_events_field(records)
    _field("Worker", e.worker_id or "-")
    _field("Scheduled", _when(e.scheduled_at))
    _field("Queued", _when(e.queued_at))
    _field("Started", _when(e.started_at))
    _field("Completed", _when(e.completed_at))
    if e.duration_seconds is not None:
        _field("Duration", f"{e.duration_seconds:.3f}s")
    for who in ("approved_by", "rejected_by", "cancelled_by"):
        if getattr(e, who):
            _field(who.replace("_", " ").capitalize(), getattr(e, who))
    if e.error_message:
        _field("Error", e.error_message)
    if e.result is not None:
        _field("Result", json.dumps(e.result, ensure_ascii=False))
    _field("Log", f"{log_state['lines']} lines: cronstream logs {e.execution_id}"
                  if log_state["lines"] else "none (the handler wrote nothing)")
    if traceback:
        emit("Traceback:")
        emit("\n".join("  " + line for line in traceback[0]["line"].splitlines()))
    emit("Events:")
    for ev in timeline:
        detail = ev["error_message"] or ev["progress_message"] or (
            f"{ev['progress']:.0f}%" if ev["progress"] is not None else "")
        emit(f"  {_when(ev['occurred_at'])}  {ev['status']:<18} attempt {ev['attempt_number']}"
             f"  {ev['worker_id'] or '-'}  {detail}".rstrip())
    if not timeline:
        emit("  none projected yet")
    attempts = [r for r in run if r["job_id"] == e.job_id]
    emit("Attempts:")
    for r in attempts:
        mark = "  <- this one" if r["execution_id"] == e.execution_id else ""
        emit(f"  #{r['attempt_number']}  {r['execution_id']}  {r['status']}{mark}")
    others = [r for r in run if r["job_id"] != e.job_id]
    emit("DAG run:" + ("" if others else " no other job in this run"))
    for r in others:
        emit(f"  {r['job_id']:<24} {r['status']:<18} attempt {r['attempt_number']}  {r['execution_id']}")


__all__ = ["describe", "get", "show"]

COMMANDS = [get, describe]
