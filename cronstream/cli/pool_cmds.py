"""Pools of slots shared by jobs: `pool set|delete` and `pools` (docs/decisions/0056).

Pools live on the compacted `pools` topic: `set` publishes one, `delete` a tombstone, and
`pools` reads them back with the jobs that name each (from `job-definitions`).
"""

from __future__ import annotations

from typing import Any

import click

from cronstream._plumbing import Plumbing
from cronstream.cli.common import CliState, pass_state
from cronstream.cli.output import Column, emit, output_option, show
from cronstream.definitions import pool_record
from cronstream.errors import DefinitionError


@click.group()
def pool() -> None:
    """Pools of slots: at most that many slots of their jobs' executions are held at once."""


@pool.command("set")
@click.argument("name")
@click.option("--slots", type=int, required=True, help="How many slots (0 holds every execution back).")
@click.option("--description", default=None, help="What the pool guards, for people.")
@pass_state
def set_pool(state: CliState, name: str, slots: int, description: str | None) -> None:
    """Create a pool or change its slots. Fewer slots stop nothing that runs: new
    executions wait until enough of the running ones end."""
    try:
        pool_record(name, slots, description, "cli")  # refused here, before any connection
    except DefinitionError as exc:
        raise click.ClickException(f"nothing was sent: {exc}") from None
    with state.client() as client:
        client.set_pool(name, slots, description)
    emit(f"pool {name}: {slots} slot{'s' if slots != 1 else ''}")


@pool.command("delete")
@click.argument("name")
@click.option("--force", is_flag=True, help="Delete it even though jobs name it (their runs wait).")
@pass_state
def delete_pool(state: CliState, name: str, force: bool) -> None:
    """Delete a pool (a tombstone on `pools`). Refused while jobs name it (their
    executions would wait until it is back), unless --force."""
    with state.client() as client:
        if name not in client.pools():
            raise click.ClickException(f"no pool {name!r}")
        users = sorted(d.job_id for d in client.definitions().values() if d.pool == name)
        if users and not force:
            shown = ", ".join(users[:10]) + (f" and {len(users) - 10} more" if len(users) > 10 else "")
            raise click.ClickException(f"pool {name!r} is named by {len(users)} job(s): {shown}; "
                                       "their executions would wait (--force to delete anyway)")
        client.delete_pool(name)
    emit(f"deleted pool {name}")


POOL_COLUMNS = [
    Column("pool", lambda r: r["pool"]),
    Column("slots", lambda r: r["slots"]),
    Column("in use", lambda r: r["in_use"]),
    Column("waiting", lambda r: r["waiting"]),
    Column("jobs", lambda r: len(r["jobs"])),
    Column("description", lambda r: r["description"]),
    Column("by", lambda r: r["created_by"], wide_only=True),
    Column("updated", lambda r: r["created_at"], wide_only=True),
]


@click.command()
@output_option()
@pass_state
def pools(state: CliState, fmt: str) -> None:
    """Pools: their slots, the slots in use and the executions waiting (as the monitor
    projected them), the jobs that name each. JSON: a list of objects with `pool`, `slots`,
    `in_use`, `waiting`, `description`, `jobs` (job_ids), `created_by`, `created_at`."""
    with state.client() as client:
        found = client.pools()
        definitions = client.definitions()
        usage = {r["pool"]: r for r in Plumbing(client).fetch("pool_usage")}
    rows: list[dict[str, Any]] = [
        {**p.model_dump(mode="json", exclude={"schema_version"}),
         "in_use": usage[name]["in_use"] if name in usage else 0,
         "waiting": usage[name]["waiting"] if name in usage else 0,
         "jobs": sorted(d.job_id for d in definitions.values() if d.pool == name)}
        for name, p in sorted(found.items())]
    show(rows, POOL_COLUMNS, fmt, "pools")


COMMANDS = [pool, pools]
