"""A job's definition history: `history` (its numbered versions) and `diff` (between two).

    cronstream history nightly-export           # VERSION  RECORDED  BY  CHANGE
    cronstream diff nightly-export 3 4          # what version 4 changed from 3
    cronstream get job nightly-export --version 3

Versions are read from PostgreSQL (the monitor keeps them: cronstream/versions.py).
"""

from __future__ import annotations

from typing import Any

import click

from cronstream.cli.common import CliState, pass_state
from cronstream.cli.output import Column, emit, output_option, show
from cronstream.versions import DefinitionVersion, with_changes, yaml_diff

HISTORY_COLUMNS = [
    Column("version", lambda r: r["version"]),
    Column("recorded", lambda r: r["recorded_at"]),
    Column("by", lambda r: r["created_by"]),
    Column("change", lambda r: r["change"]),
    Column("offset", lambda r: r["kafka_offset"], wide_only=True),
]


def history_rows(versions: list[DefinitionVersion]) -> list[dict[str, Any]]:
    """Each version as data, with what it changed from the version before it."""
    return [{**version.to_dict(), "change": change} for version, change in with_changes(versions)]


@click.command()
@click.argument("job_id")
@output_option()
@pass_state
def history(state: CliState, job_id: str, fmt: str) -> None:
    """Every kept version of JOB_ID's definition: who published it, when, and what changed
    (a pause, a delete and a re-create are versions too)."""
    with state.client() as client:
        versions = client.history(job_id)
    show(history_rows(versions), HISTORY_COLUMNS, fmt, f"history of {job_id}")


@click.command()
@click.argument("job_id")
@click.argument("from_version", type=click.IntRange(1))
@click.argument("to_version", type=click.IntRange(1), required=False)
@pass_state
def diff(state: CliState, job_id: str, from_version: int, to_version: int | None) -> None:
    """What changed in JOB_ID's definition from FROM_VERSION to TO_VERSION (default: its
    latest version), as a unified diff of their YAML (who and when in the header lines)."""
    with state.client() as client:
        before = client.version(job_id, from_version)
        after = client.version(job_id, to_version) if to_version is not None \
            else client.history(job_id)[-1]
    lines = yaml_diff(before, after)
    if not lines:
        emit(f"{job_id}: no difference between v{before.version} and v{after.version} "
             "(apart from who published them, and when)")
        return
    for line in lines:
        emit(line)


COMMANDS = [history, diff]
