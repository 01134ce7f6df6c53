"""`cronstream ui`: the web dashboard (docs/reference/operations.md#the-dashboard)."""

from __future__ import annotations

import sys

import click

from cronstream.cli.common import CliState, pass_state
from cronstream.shared.settings import SERVICE_PORTS


@click.command()
@click.option("--http-port", type=click.IntRange(0, 65535),
              help=f"Port to serve on (default {SERVICE_PORTS['ui']}; 0: any free port).")
@click.option("--bind", help="Address to listen on (default 127.0.0.1: this machine only).")
@click.option("--protect-reads", is_flag=True, default=None,
              help="Require a login for the read-only pages too.")
@pass_state
def ui(state: CliState, http_port: int | None, bind: str | None, protect_reads: bool | None) -> None:
    """Serve the web dashboard: jobs, live runs, DAG runs, timeline, workers, alerts.

    Actions (trigger, pause, resume, cancel, approve, reject) are off unless
    CRONSTREAM_UI_TOKEN (log in, or `Authorization: Bearer`) or
    CRONSTREAM_UI_IDENTITY_HEADER (a trusted proxy's user header) is set.
    """
    from cronstream.ui.server import serve

    settings = state.settings(http_port=http_port, ui_bind=bind, ui_protect_reads=protect_reads)
    sys.exit(serve(settings))


COMMANDS = [ui]
