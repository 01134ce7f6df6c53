"""`cronstream alerts`: the alert episodes projected from the alerts topic (raised by the
monitor and by `cronstream analytics`), newest first."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click
import yaml
from rich.console import Console
from rich.table import Table

from cronstream.cli.common import CliState, pass_state
from cronstream.cli.view_cmds import _ago, fetch

STATE_STYLE = {"FIRING": "bold red", "RESOLVED": "green"}


def _row(r: Any) -> dict[str, Any]:
    evidence = r["evidence"]
    return {
        "alert_id": str(r["alert_id"]), "kind": r["kind"], "severity": r["severity"],
        "state": r["state"], "job_id": r["job_id"], "queue": r["queue"],
        "execution_id": str(r["execution_id"]) if r["execution_id"] else None,
        "summary": r["summary"] or r["error_message"],
        "evidence": json.loads(evidence) if isinstance(evidence, str) else evidence,
        "fired_at": r["fired_at"].isoformat(),
        "resolved_at": r["resolved_at"].isoformat() if r["resolved_at"] else None,
    }


@click.command()
@click.option("--state", "state_filter", type=click.Choice(["FIRING", "RESOLVED"]),
              help="Only alerts in this state.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("-o", "--output", type=click.Choice(["table", "wide", "json", "yaml"]), default="table",
              show_default=True)
@pass_state
def alerts(state: CliState, state_filter: str | None, limit: int, output: str) -> None:
    """Alerts, newest first: what fired, for which job or queue, and whether it resolved."""
    rows = [_row(r) for r in fetch(state.settings(), "recent_alerts", state_filter, limit)]
    if output == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    if output == "yaml":
        click.echo(yaml.safe_dump(rows, sort_keys=False), nl=False)
        return
    table = Table(title="alerts")
    columns = ["fired", "state", "kind", "subject", "summary"]
    if output == "wide":
        columns += ["severity", "alert_id", "resolved"]
    for column in columns:
        table.add_column(column, overflow="fold")
    for r in rows:
        subject = r["job_id"] or (f"queue {r['queue']}" if r["queue"] else "-")
        cells = [_ago(datetime.fromisoformat(r["fired_at"])),
                 f"[{STATE_STYLE.get(r['state'], '')}]{r['state']}[/]", r["kind"], subject,
                 (r["summary"] or "")[:120]]
        if output == "wide":
            cells += [r["severity"], r["alert_id"], r["resolved_at"] or "-"]
        table.add_row(*cells)
    Console(width=200 if output == "wide" else None).print(table)


COMMANDS = [alerts]
