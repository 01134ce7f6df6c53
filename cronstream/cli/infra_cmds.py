"""`infra up|down|status` and `init`."""

from __future__ import annotations

import asyncio
import json

import click

from cronstream.cli.common import CliState, pass_state
from cronstream.infra import Infra
from cronstream.shared.db import apply_migrations, connect
from cronstream.shared.kafka import ensure_topics
from cronstream.shared.settings import Settings


@click.group()
def infra() -> None:
    """A local Kafka broker and PostgreSQL for development and tests."""


@infra.command()
@pass_state
def up(state: CliState) -> None:
    """Start Kafka and PostgreSQL unless something answers at their addresses; wait
    until both accept connections."""
    Infra.from_settings(state.settings()).up(click.echo)


@infra.command()
@pass_state
def down(state: CliState) -> None:
    """Stop what `infra up` started (and nothing else)."""
    Infra.from_settings(state.settings()).down(click.echo)


@infra.command()
@pass_state
def status(state: CliState) -> None:
    """Whether each server answers and whether cronstream started it."""
    click.echo(json.dumps(Infra.from_settings(state.settings()).status(), indent=2))


def initialise(settings: Settings, echo: bool = True) -> None:
    created = ensure_topics(settings, settings.topics.specs())
    if echo:
        click.echo(f"topics: {len(created)} created" + (f" ({', '.join(created)})" if created
                                                        else ", all present"))

    async def migrate() -> list[str]:
        conn = await connect(settings.database_url)
        try:
            return await apply_migrations(conn)
        finally:
            await conn.close()

    applied = asyncio.run(migrate())
    if echo:
        click.echo(f"migrations: {', '.join(applied) if applied else 'up to date'}")


@click.command()
@pass_state
def init(state: CliState) -> None:
    """Create the topics and apply the PostgreSQL migrations (idempotent)."""
    initialise(state.settings())


COMMANDS = [infra, init]
