"""Commands that change jobs: `apply`, `delete`, `pause`, `resume`, `trigger`, `preview`."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import click

from cronstream._plumbing import Plumbing, client_identity
from cronstream.calendar_files import load_calendar_sources
from cronstream.cli.common import CliState, pass_state
from cronstream.cli.output import dump_json, emit, output_option
from cronstream.cli.previews import preview_of
from cronstream.cli.run_params import given_params, params_options
from cronstream.cli.view_cmds import fetch
from cronstream.client import Client
from cronstream.definitions import check_dags, document, load_sources, without_stamps
from cronstream.errors import CronstreamError, DefinitionError, ParamsError
from cronstream.shared.calendars import ResolvedCalendar, resolve
from cronstream.shared.ids import retry_execution_id
from cronstream.shared.records import Calendar, JobDefinition
from cronstream.shared.schedule import upcoming
from cronstream.shared.statuses import RETRYABLE, TERMINAL
from cronstream.versions import document_diff


def _load(paths: tuple[str, ...]) -> list[JobDefinition]:
    try:
        return load_sources(paths)
    except DefinitionError as exc:
        raise click.ClickException(f"nothing was sent:\n{exc}") from None


def _files_option(fn: Any) -> Any:
    return click.option(
        "-f", "--file", "paths", required=True, multiple=True, type=click.Path(allow_dash=True),
        help="YAML or JSON file, a directory (recursive, .yaml/.yml/.json) or - for stdin; "
             "repeatable.")(fn)


@click.command()
@_files_option
@click.option("--dry-run", is_flag=True,
              help="Validate, and show the difference with what is live; send nothing.")
@pass_state
def apply(state: CliState, paths: tuple[str, ...], dry_run: bool) -> None:
    """Validate every definition, then publish them (all or none)."""
    definitions = _load(paths)
    with state.client() as client:
        if dry_run:
            _diff(definitions, client.definitions())
            return
        try:
            ids = client.apply(definitions)
        except DefinitionError as exc:
            raise click.ClickException(f"nothing was sent:\n{exc}") from None
    for job_id in ids:
        emit(f"applied {job_id}")


def _diff(definitions: list[JobDefinition], live: dict[str, JobDefinition]) -> None:
    """What `apply` would change, as a unified diff of the YAML forms per job. The fields
    `apply` stamps (created_by, created_at) count only where the file sets them."""
    try:
        check_dags(definitions, live)
    except DefinitionError as exc:
        raise click.ClickException(f"would be refused:\n{exc}") from None
    counts = {"create": 0, "change": 0, "unchanged": 0}
    for definition in definitions:
        new = document(definition)
        current = live.get(definition.job_id)
        old = without_stamps(document(current), unless_in=new) if current is not None else None
        if old == new:
            counts["unchanged"] += 1
            emit(f"{definition.job_id}: unchanged")
            continue
        counts["create" if old is None else "change"] += 1
        emit(f"{definition.job_id}: " + ("would be created" if old is None else "would change"))
        for line in document_diff(old, new, f"live/{definition.job_id}",
                                  f"applied/{definition.job_id}"):
            emit(line)
    emit(f"dry run: {counts['create']} to create, {counts['change']} to change, "
               f"{counts['unchanged']} unchanged; nothing sent")


@click.command()
@click.argument("job_id")
@pass_state
def delete(state: CliState, job_id: str) -> None:
    """Delete a job (a tombstone on job-definitions)."""
    with Client(state.settings()) as client:
        client.delete(job_id)
    emit(f"deleted {job_id}")


@click.command()
@click.argument("job_id")
@pass_state
def pause(state: CliState, job_id: str) -> None:
    """Stop firing a job until `resume` (fires meanwhile are skipped, not caught up)."""
    with state.client() as client:
        client.pause(job_id)
    emit(f"paused {job_id}")


@click.command()
@click.argument("job_id")
@pass_state
def resume(state: CliState, job_id: str) -> None:
    """Fire a paused job again, from now on."""
    with state.client() as client:
        client.resume(job_id)
    emit(f"resumed {job_id}")


@click.command()
@click.argument("job_id")
@params_options
@pass_state
def trigger(state: CliState, job_id: str, params: tuple[str, ...], params_file: str | None) -> None:
    """Run a job now, outside its schedule (reason MANUAL), with its params overlaid by
    --param / --params-file for this run only."""
    overrides = given_params(params, params_file)
    with state.client() as client:
        try:
            execution = client.trigger(job_id, params=overrides)
        except ParamsError as exc:
            raise click.BadParameter(str(exc), param_hint="'--param' / '--params-file'") from None
    emit(f"triggered {job_id}: execution {execution}")


def _parse_time(value: str | None) -> datetime:
    if value is None:
        return datetime.now(UTC)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"not an ISO 8601 time: {value!r}") from None
    if parsed.tzinfo is None:
        raise click.BadParameter(f"{value!r} has no timezone (add Z or +HH:MM)")
    return parsed.astimezone(UTC)


@click.command()
@_files_option
@click.option("--from", "start", help="Start time, ISO 8601 with offset (default now).")
@click.option("--count", default=5, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--calendar-file", "calendar_files", multiple=True, type=click.Path(allow_dash=True),
              help="Calendars to preview with (as `calendar apply -f` reads them); a calendar a "
                   "definition names that no such file holds is read from Kafka. Repeatable.")
@output_option(default="text", choices=("text", "json"))
@pass_state
def preview(state: CliState, paths: tuple[str, ...], start: str | None, count: int,
            calendar_files: tuple[str, ...], fmt: str) -> None:
    """The next fire times of each definition, in UTC and in its own timezone, computed
    by the scheduler's own code: its calendar applied (the instants it excludes listed with
    the reason), its jitter added, at most its max_runs."""
    after = _parse_time(start)
    definitions = _load(paths)
    calendars = _calendars_for(state, definitions, calendar_files)
    previews = [preview_of(d, after, count, calendars) for d in definitions]
    if fmt == "json":
        emit(dump_json([p.as_json() for p in previews]))
        return
    for p in previews:
        for line in p.lines():
            emit(line)


def _calendars_for(state: CliState, definitions: list[JobDefinition],
                   files: tuple[str, ...]) -> dict[str, ResolvedCalendar]:
    """The calendars the definitions name: from `files` first, else from Kafka."""
    named = {d.calendar for d in definitions if d.calendar is not None}
    if not named:
        return {}
    given: dict[str, Calendar] = {}
    if files:
        try:
            given = {c.calendar_id: c for c in load_calendar_sources(files)}
        except DefinitionError as exc:
            raise click.ClickException(f"--calendar-file:\n{exc}") from None
    if named - set(given):
        try:
            with state.client() as client:
                live = client.calendars()
        except CronstreamError as exc:
            raise click.ClickException(
                f"{exc}\n(the calendars {', '.join(sorted(named - set(given)))} are read from "
                "Kafka; give them with --calendar-file to preview offline)") from None
        given = {**live, **given}
    missing = sorted(named - set(given))
    if missing:
        users = sorted(d.job_id for d in definitions if d.calendar in missing)
        raise click.ClickException(f"calendar: no calendar {', '.join(map(repr, missing))} (named by "
                                   f"{', '.join(users)}); apply it, or give it with --calendar-file")
    return {calendar_id: resolve(given[calendar_id]) for calendar_id in named}


@click.command()
@click.argument("job_id")
@click.option("--from", "start", required=True, help="First instant, ISO 8601 with offset.")
@click.option("--to", "end", required=True, help="Last instant (inclusive), ISO 8601 with offset.")
@click.option("--max", "limit", default=1000, show_default=True, type=click.IntRange(1, 100_000),
              help="Refuse a range with more fires than this.")
@click.option("--dry-run", is_flag=True, help="List what would run; send nothing.")
@params_options
@pass_state
def backfill(state: CliState, job_id: str, start: str, end: str, limit: int, dry_run: bool,
             params: tuple[str, ...], params_file: str | None) -> None:
    """Run the fires of JOB_ID's schedule between --from and --to that have no execution
    yet (reason BACKFILL), with its params overlaid by --param / --params-file. Each gets
    the execution_id its scheduled fire would have had, so a backfill never duplicates a
    run and running it twice changes nothing."""
    first, last = _parse_time(start), _parse_time(end)
    if last < first:
        raise click.BadParameter("--to is before --from")
    overrides = given_params(params, params_file)
    settings = state.settings()
    with Client(settings) as client:
        plumbing = Plumbing(client)
        definition, offset = plumbing.get_with_offset(job_id)
        if definition.type == "DEPENDENT":
            raise click.ClickException(f"{job_id} is DEPENDENT: it runs with its upstreams")
        # The fires its schedule had: its calendar applied (max_runs is not a backfill's).
        calendar = None if definition.calendar is None else resolve(client.calendar(definition.calendar))
        fires = [f for f in upcoming(definition, first - timedelta(milliseconds=1), limit + 1,
                                     calendar=calendar) if f <= last]
        if len(fires) > limit:
            raise click.ClickException(f"more than {limit} fires in that range; narrow it or "
                                       f"raise --max")
        existing = {r["scheduled_at"] for r in fetch(settings, "executions_at", job_id, fires)}
        missing = [f for f in fires if f not in existing]
        emit(f"{job_id}: {len(fires)} fire(s) in range, {len(existing)} already ran, "
                   f"{len(missing)} to backfill" + (" (dry run)" if dry_run else ""))
        who = client_identity()
        for fire in missing:
            if dry_run:
                emit(f"  would run {fire.isoformat()}")
                continue
            try:
                execution = plumbing.submit(definition, fire, "BACKFILL", params=overrides,
                                            triggered_by=who, definition_offset=offset)
            except ParamsError as exc:
                raise click.BadParameter(str(exc), param_hint="'--param' / '--params-file'") from None
            emit(f"  {fire.isoformat()}  execution {execution}")


@click.command()
@click.argument("execution_id", type=click.UUID)
@click.option("--reason", help="Why; recorded with the CANCELLED event.")
@pass_state
def cancel(state: CliState, execution_id: uuid.UUID, reason: str | None) -> None:
    """Cancel a queued, running or awaiting execution, or a failed one's pending retry.

    Sends a CANCEL command; the service that owns the execution's state ends it CANCELLED
    (docs/architecture.md: who writes what): the worker that reaches a queued execution's
    work record skips it, the worker running it stops it, the monitor cancels one that
    awaits approval or a retry that has not fired yet."""
    settings = state.settings()
    rows = fetch(settings, "execution_by_id", execution_id)
    row = rows[0] if rows else None
    reason = reason or "cancelled by an operator"
    target, job_id = execution_id, row["job_id"] if row is not None else None
    if row is not None and row["status"] in RETRYABLE:
        # Its next attempt has a deterministic id: cancel that one.
        attempt = row["attempt_number"] + 1
        target = retry_execution_id(row["job_id"], row["run_id"], attempt)
        with Client(settings) as client:
            Plumbing(client).cancel_pending_retry(target, job_id=row["job_id"], reason=reason)
        emit(f"cancelled the pending retry (attempt {attempt}, execution {target}) "
                   f"of {execution_id}")
        return
    if row is not None and row["status"] in TERMINAL:
        raise click.ClickException(f"execution {execution_id} already ended: {row['status']}")
    with Client(settings) as client:
        client.cancel(target, reason, job_id=job_id)
    state_text = row["status"] if row is not None else "not yet projected"
    emit(f"cancel sent for {execution_id} (was {state_text})")


@click.command()
@click.argument("execution_id", type=click.UUID)
@click.option("--reason", help="Recorded with the decision.")
@pass_state
def approve(state: CliState, execution_id: uuid.UUID, reason: str | None) -> None:
    """Release a DAG step waiting in AWAITING_APPROVAL."""
    _decide(state, "APPROVE", execution_id, reason)


@click.command()
@click.argument("execution_id", type=click.UUID)
@click.option("--reason", help="Recorded with the SKIPPED event.")
@pass_state
def reject(state: CliState, execution_id: uuid.UUID, reason: str | None) -> None:
    """Skip a DAG step waiting in AWAITING_APPROVAL (SKIPPED)."""
    _decide(state, "REJECT", execution_id, reason)


def _decide(state: CliState, kind: Literal["APPROVE", "REJECT"], execution_id: uuid.UUID,
            reason: str | None) -> None:
    with Client(state.settings()) as client:
        if kind == "APPROVE":
            client.approve(execution_id, reason)
        else:
            client.reject(execution_id, reason)
    emit(f"{kind.lower()} sent for {execution_id}")


COMMANDS = [apply, delete, pause, resume, trigger, preview, backfill, cancel, approve, reject]
