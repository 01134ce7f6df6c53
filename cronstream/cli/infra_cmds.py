"""`infra up|down|status` and `init`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click

from cronstream.cli.common import CliState, pass_state
from cronstream.cli.output import emit
from cronstream.infra import Infra
from cronstream.shared import db_roles
from cronstream.shared.db import apply_migrations, connect
from cronstream.shared.kafka.admin import ensure_topics, partition_counts
from cronstream.shared.settings import Settings
from cronstream.shared.topics import Topics


@click.group()
def infra() -> None:
    """A local Kafka broker and PostgreSQL for development and tests."""


@infra.command()
@click.option("--record", type=click.Path(dir_okay=False),
              help="Write the names of the servers this call started to this file.")
@pass_state
def up(state: CliState, record: str | None) -> None:
    """Start Kafka and PostgreSQL unless something answers at their addresses; wait
    until both accept connections."""
    started = Infra.from_settings(state.settings()).up(emit)
    if record:
        Path(record).write_text("\n".join(started))


@infra.command()
@click.option("--recorded", type=click.Path(dir_okay=False),
              help="Stop only the servers named in this file (written by `up --record`).")
@pass_state
def down(state: CliState, recorded: str | None) -> None:
    """Stop what `infra up` started (and nothing else)."""
    only = None
    if recorded:
        path = Path(recorded)
        only = path.read_text().split() if path.exists() else []
    Infra.from_settings(state.settings()).down(emit, only=only)


@infra.command()
@pass_state
def status(state: CliState) -> None:
    """Whether each server answers and whether cronstream started it."""
    emit(json.dumps(Infra.from_settings(state.settings()).status(), indent=2))


def initialise(settings: Settings, echo: bool = True, roles: dict[str, str] | None = None,
               topics: bool = True) -> None:
    """Topics and migrations; with `roles` (role -> password, maybe empty), first the
    roles of least privilege, and the migrations as their owner (shared/db_roles.py)."""
    if topics:
        t = settings.topics
        clock_topics = [t.job_definitions, t.scheduler_state, t.retries]
        existing = partition_counts(settings, clock_topics)
        # The clock's shards are the partitions job-definitions has: a job's shard is fixed
        # by them (shared/shards.py), so init never changes them, and creates the state and
        # retries topics to match.
        shards = existing.get(t.job_definitions, settings.scheduler_shards)
        created = ensure_topics(settings, Topics(t.prefix, t.partitions, shards).specs())
        if echo:
            emit(f"topics: {len(created)} created" + (f" ({', '.join(created)})" if created
                                                            else ", all present"))
            if t.job_definitions in existing and shards != settings.scheduler_shards:
                emit(f"scheduler shards: {shards}, as {t.job_definitions} has {shards} partition(s); "
                     f"not {settings.scheduler_shards}: a job's shard never changes once the "
                     "topics exist (a new deployment, with new topics, takes another count)")
            else:
                emit(f"scheduler shards: {shards}")
        counts = partition_counts(settings, clock_topics)
        if len(set(counts.values())) > 1:
            raise click.ClickException(
                "the clock's topics disagree on their partitions ("
                + ", ".join(f"{name}: {n}" for name, n in counts.items())
                + "): they must have as many as job-definitions; recreate the smaller ones")

    async def migrate() -> list[str]:
        conn = await connect(settings.database_url)
        try:
            if roles is None:
                return await apply_migrations(conn)
            made = await db_roles.create_roles(conn, roles)
            if echo:
                emit(f"roles: {', '.join(made) + ' created' if made else 'all present'}"
                           + (f"; passwords set for {', '.join(sorted(roles))}" if roles else ""))
            return await db_roles.migrate_as_owner(conn)
        finally:
            await conn.close()

    applied = asyncio.run(migrate())
    if echo:
        emit(f"migrations: {', '.join(applied) if applied else 'up to date'}")


@click.command()
@click.option("--partitions", type=click.IntRange(1, 1000),
              help="Partitions of job-due, execution-events and the work topics (default 6).")
@click.option("--replication-factor", type=click.IntRange(-1, 32),
              help="Replication factor of new topics (default: the broker's; 3 in production).")
@click.option("--min-insync-replicas", type=click.IntRange(1, 32),
              help="min.insync.replicas of new topics (default: the broker's; 2 in production).")
@click.option("--scheduler-shards", type=click.IntRange(1, 1024),
              help="Shards of the clock, for new topics: the partitions of job-definitions, "
                   "scheduler-state and retries (default 16) [CRONSTREAM_SCHEDULER_SHARDS]. Fixed "
                   "once the topics exist.")
@click.option("--roles", is_flag=True,
              help="First create the PostgreSQL roles cronstream_owner, cronstream_writer and "
                   "cronstream_reader (needs an administrator's database URL) and migrate as the owner.")
@click.option("--owner-password", envvar="CRONSTREAM_DB_OWNER_PASSWORD", metavar="PASSWORD",
              help="With --roles: cronstream_owner's password (prefer the variable).")
@click.option("--writer-password", envvar="CRONSTREAM_DB_WRITER_PASSWORD", metavar="PASSWORD",
              help="With --roles: cronstream_writer's password (prefer the variable).")
@click.option("--reader-password", envvar="CRONSTREAM_DB_READER_PASSWORD", metavar="PASSWORD",
              help="With --roles: cronstream_reader's password (prefer the variable).")
@click.option("--no-topics", is_flag=True, help="Leave Kafka alone (PostgreSQL only).")
@pass_state
def init(state: CliState, partitions: int | None, replication_factor: int | None,
         min_insync_replicas: int | None, scheduler_shards: int | None, roles: bool,
         owner_password: str | None, writer_password: str | None, reader_password: str | None,
         no_topics: bool) -> None:
    """Create the topics and apply the PostgreSQL migrations (idempotent).

    Existing topics are left as they are (their partition count and replication factor are
    not changed: the clock's shards are fixed once job-definitions exists, and init says
    so). With --roles, once, by an administrator: the three roles of least privilege (a
    role's password is set when given; a role without one logs in only where pg_hba.conf
    trusts it)."""
    passwords = {role: password for role, password in zip(
        db_roles.ROLES, (owner_password, writer_password, reader_password), strict=True) if password}
    if passwords and not roles:
        raise click.UsageError("role passwords are set by `init --roles`")
    try:
        initialise(state.settings(topic_partitions=partitions, scheduler_shards=scheduler_shards,
                                  topic_replication_factor=replication_factor,
                                  topic_min_insync_replicas=min_insync_replicas),
                   roles=passwords if roles else None, topics=not no_topics)
    except db_roles.RoleError as exc:
        raise click.UsageError(str(exc)) from None


COMMANDS = [infra, init]
