"""Named calendars: `calendar apply|preview|delete|history` and `calendars` (docs/decisions/0055).

Calendars live on the `calendars` topic (what `apply` publishes and `preview` reads); their
versions, and how many jobs name each, are the monitor's projection (what `calendars` and
`calendar history` read), like job definitions and their history.
"""

from __future__ import annotations

import json
from datetime import date, timedelta
from typing import Any

import click

from cronstream._plumbing import Plumbing
from cronstream.calendar_files import load_calendar_sources
from cronstream.cli.common import CliState, pass_state
from cronstream.cli.output import Column, emit, output_option, show
from cronstream.errors import DefinitionError
from cronstream.shared.calendars import resolve
from cronstream.shared.records import WEEKDAYS, Calendar

MAX_PREVIEW_DAYS = 3660


def _files_option(fn: Any) -> Any:
    return click.option(
        "-f", "--file", "paths", multiple=True, type=click.Path(allow_dash=True),
        help="YAML or JSON file, a directory (recursive) or - for stdin; repeatable.")(fn)


def _load(paths: tuple[str, ...]) -> list[Calendar]:
    try:
        return load_calendar_sources(paths)
    except DefinitionError as exc:
        raise click.ClickException(f"nothing was sent:\n{exc}") from None


@click.group()
def calendar() -> None:
    """Named calendars: the days on which the jobs that name one do not fire."""


@calendar.command("apply")
@_files_option
@pass_state
def apply_calendar(state: CliState, paths: tuple[str, ...]) -> None:
    """Validate every calendar, then publish them (all or none). The jobs that name a
    calendar are re-planned as soon as the schedulers read its new version."""
    if not paths:
        raise click.UsageError("give the calendars with -f FILE")
    calendars = _load(paths)
    with state.client() as client:
        ids = client.apply_calendars(calendars)
    for calendar_id in ids:
        emit(f"applied calendar {calendar_id}")


def _day(value: str, option: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"not an ISO date (YYYY-MM-DD): {value!r}", param_hint=option) from None


def day_rows(calendar: Calendar, first: date, last: date) -> list[dict[str, Any]]:
    """Each day of [first, last]: included or excluded, and why."""
    resolved = resolve(calendar)
    rows = []
    day = first
    while day <= last:
        reason = resolved.excluded(day)
        rows.append({"date": day.isoformat(), "weekday": WEEKDAYS[day.weekday()],
                     "included": reason is None, "reason": reason})
        day += timedelta(days=1)
    return rows


DAY_COLUMNS = [
    Column("date", lambda r: r["date"]),
    Column("day", lambda r: r["weekday"]),
    Column("included", lambda r: r["included"]),
    Column("reason", lambda r: r["reason"]),
]


@calendar.command("preview")
@click.argument("calendar_id")
@click.option("--from", "start", required=True, help="First date, YYYY-MM-DD.")
@click.option("--to", "end", required=True, help="Last date (inclusive), YYYY-MM-DD.")
@_files_option
@click.option("--excluded-only", is_flag=True, help="List only the excluded days.")
@output_option()
@pass_state
def preview_calendar(state: CliState, calendar_id: str, start: str, end: str, paths: tuple[str, ...],
                     excluded_only: bool, fmt: str) -> None:
    """Each day from --from to --to: included, or excluded and why. The calendar is the
    live one on `calendars`, or the one of that id in -f FILE (before applying it)."""
    first, last = _day(start, "--from"), _day(end, "--to")
    if last < first:
        raise click.BadParameter("--to is before --from")
    if (last - first).days >= MAX_PREVIEW_DAYS:
        raise click.BadParameter(f"at most {MAX_PREVIEW_DAYS} days at once", param_hint="--to")
    if paths:
        found = {c.calendar_id: c for c in _load(paths)}
        if calendar_id not in found:
            raise click.ClickException(f"no calendar {calendar_id!r} in {', '.join(paths)}")
        chosen = found[calendar_id]
    else:
        with state.client() as client:
            chosen = client.calendar(calendar_id)
    rows = day_rows(chosen, first, last)
    if excluded_only:
        rows = [r for r in rows if not r["included"]]
    if fmt in ("table", "wide"):
        excluded = sum(1 for r in day_rows(chosen, first, last) if not r["included"])
        emit(f"{calendar_id} ({chosen.timezone}): {excluded} of {(last - first).days + 1} days excluded")
    show(rows, DAY_COLUMNS, fmt, f"calendar {calendar_id}")


@calendar.command("delete")
@click.argument("calendar_id")
@click.option("--force", is_flag=True, help="Delete it even though live jobs name it (they stop firing).")
@pass_state
def delete_calendar(state: CliState, calendar_id: str, force: bool) -> None:
    """Delete a calendar (a tombstone on `calendars`). Refused while live jobs name it
    (they would stop firing until it is back), unless --force."""
    with state.client() as client:
        users = sorted(d.job_id for d in client.definitions().values() if d.calendar == calendar_id)
        if users and not force:
            shown = ", ".join(users[:10]) + (f" and {len(users) - 10} more" if len(users) > 10 else "")
            raise click.ClickException(f"calendar {calendar_id!r} is named by {len(users)} job(s): "
                                       f"{shown}; they would stop firing (--force to delete anyway)")
        client.delete_calendar(calendar_id)
    emit(f"deleted calendar {calendar_id}")


HISTORY_COLUMNS = [
    Column("version", lambda r: r["version"]),
    Column("recorded", lambda r: r["recorded_at"]),
    Column("by", lambda r: r["created_by"]),
    Column("deleted", lambda r: r["deleted"]),
    Column("offset", lambda r: r["kafka_offset"], wide_only=True),
]


@calendar.command("history")
@click.argument("calendar_id")
@output_option()
@pass_state
def calendar_history(state: CliState, calendar_id: str, fmt: str) -> None:
    """Every kept version of a calendar: who published it, and when."""
    with state.client() as client:
        versions = client.calendar_history(calendar_id)
    show([v.to_dict() for v in versions], HISTORY_COLUMNS, fmt, f"history of calendar {calendar_id}")


def _excludes(document: dict[str, Any] | None) -> str:
    """What a calendar excludes, in a few words."""
    if document is None:
        return "-"
    parts = []
    source = document.get("holidays")
    if source:
        parts.append("holidays " + source["country"] + (f"-{source['subdivision']}"
                                                        if source.get("subdivision") else ""))
    if document.get("exclude_weekdays"):
        parts.append(",".join(document["exclude_weekdays"]))
    if document.get("exclude_dates"):
        parts.append(f"{len(document['exclude_dates'])} date(s)")
    if document.get("include_dates"):
        parts.append(f"{len(document['include_dates'])} included date(s)")
    return "; ".join(parts) or "nothing"


CALENDAR_COLUMNS = [
    Column("calendar", lambda r: r["calendar_id"]),
    Column("timezone", lambda r: r["timezone"]),
    Column("excludes", lambda r: _excludes(r["calendar"])),
    Column("jobs", lambda r: r["jobs"]),
    Column("version", lambda r: r["version"]),
    Column("updated", lambda r: r["updated_at"], wide_only=True),
    Column("by", lambda r: r["created_by"], wide_only=True),
    Column("deleted", lambda r: r["deleted_at"], wide_only=True),
]


@click.command()
@click.option("--deleted", is_flag=True, help="Include deleted calendars.")
@output_option()
@pass_state
def calendars(state: CliState, deleted: bool, fmt: str) -> None:
    """Calendars (as the monitor projected them): what each excludes, how many live jobs
    name it, its version."""
    with state.client() as client:
        rows = [{"calendar_id": r["calendar_id"], "timezone": r["timezone"],
                 "calendar": None if r["definition"] is None else json.loads(r["definition"]),
                 "jobs": r["jobs"], "version": r["version"], "created_by": r["created_by"],
                 "updated_at": r["updated_at"], "deleted_at": r["deleted_at"]}
                for r in Plumbing(client).fetch("calendars_list", deleted)]
    show(rows, CALENDAR_COLUMNS, fmt, "calendars")


COMMANDS = [calendar, calendars]
