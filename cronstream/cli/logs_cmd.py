"""`cronstream logs EXECUTION_ID [--attempt N] [-f] [-o text|json]`: an execution's log.

Plain output is the lines as the handler wrote them, nothing added; `-o json` is one JSON
object per line (JSON lines) with its time, stream, level, attempt, delivery and seq.
`-f` follows an execution that runs and ends when it has ended, its log whole. Control
characters a handler wrote (a terminal's escape sequences among them) are shown escaped:
a log is data, and never drives the terminal it is read on.
"""

from __future__ import annotations

import signal
import uuid
from typing import Any

import click

from cronstream.cli.common import CliState, pass_state
from cronstream.cli.output import dump_json, emit
from cronstream.executions import LogEntry


def render(line: LogEntry, fmt: str) -> str:
    if fmt == "json":
        data = line.to_dict()
        return dump_json({"at": data["at"], "stream": line.stream, "level": line.level,
                          "attempt": line.attempt_number, "delivery": line.delivery,
                          "seq": line.seq, "text": line.text, "worker_id": line.worker_id,
                          "trace_id": line.trace_id}, lines=True)
    return line.text


class _Stop(Exception):
    pass


def _stop(_signum: int, _frame: Any) -> None:
    raise _Stop


@click.command()
@click.argument("execution_id", type=click.UUID)
@click.option("--attempt", type=click.IntRange(1, 1000),
              help="Attempt N of the same job in the same run (a retry has its own id).")
@click.option("-f", "--follow", is_flag=True,
              help="Keep printing lines as they come; end when the execution has ended.")
@click.option("-o", "--output", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="text: the lines; json: one object per line.")
@pass_state
def logs(state: CliState, execution_id: uuid.UUID, attempt: int | None, follow: bool,
         fmt: str) -> None:
    """What EXECUTION_ID's handler wrote: stdout, stderr, logging and its traceback."""
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        with state.client() as client:
            lines = (client.follow_logs(execution_id, attempt=attempt) if follow
                     else client.logs(execution_id, attempt=attempt))
            for line in lines:
                emit(render(line, fmt))
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


COMMANDS = [logs]
