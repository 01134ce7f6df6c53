"""How commands print what they read: `-o table|wide|json|yaml`, and `--watch`.

- `table` / `wide` (more columns): on a terminal a rich table; otherwise plain columns
  separated by two spaces, never cut or ellipsised, one row per line, so that
  `cronstream jobs | grep my-long-job-id` and `awk` work.
- `json`: one JSON array of objects (a single object for `get`); `yaml`: the same as YAML.
  Values are data, not display text: RFC 3339 times, numbers, ids.
- With `--watch`, a list is read again every `--interval` seconds: on a terminal the table
  is redrawn in place; otherwise each row that is new or changed is printed again (JSON
  lines for `-o json`, YAML documents for `-o yaml`), like `kubectl get -w`.

Everything a command prints goes through `emit` or `show` here: text a handler or a record
controls (an error message, a job's name, `created_by`, a log line) is data, and never
drives the terminal it is read on: its control characters are written as escapes
(shared/escaping.py), and table cells reach Rich as text, never as markup
(tests/security/test_terminal_output.py).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import FrameType
from typing import Any
from uuid import UUID

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cronstream.shared.escaping import escaped, json_escaped
from cronstream.versions import to_yaml

FORMATS = ("table", "wide", "json", "yaml")
Row = dict[str, Any]

STATUS_STYLE = {
    "COMPLETED": "green", "RUNNING": "cyan", "QUEUED": "blue", "FAILED": "red",
    "PERMANENTLY_FAILED": "bold red", "TIMED_OUT": "magenta", "CANCELLED": "yellow",
    "SKIPPED": "dim", "AWAITING_APPROVAL": "bold yellow", "FIRING": "bold red",
    "RESOLVED": "green", "OFFLINE": "dim", "DRAINING": "yellow", "ACTIVE": "green",
}


def cell(value: Any, style: str | None = None) -> Text:
    """A value for a Rich table: escaped text, never read as markup (`[link=...]`)."""
    return Text(cell_text(value), style=style or "")


def output_option(default: str = "table", choices: Sequence[str] = FORMATS) -> Callable[..., Any]:
    return click.option("-o", "--output", "fmt", type=click.Choice(list(choices)), default=default,
                        show_default=True, help="Output format.")


def watch_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--interval", type=click.FloatRange(0.2, 3600), default=2.0, show_default=True,
                      help="Seconds between reads with --watch.")(fn)
    return click.option("-w", "--watch", is_flag=True,
                        help="Keep reading; print what changes (read-only polling).")(fn)


def plain(value: Any) -> Any:
    """A JSON- and YAML-compatible form of a value read from PostgreSQL or a record."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def ago(value: Any) -> str:
    """`12s ago`, `in 3m` — for tables only."""
    if value is None:
        return "-"
    t = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    if t.year <= 1 or t.year >= 9999:  # PostgreSQL's ±infinity: not known yet
        return "-"
    seconds = (datetime.now(UTC) - t).total_seconds()
    ahead = seconds < 0
    seconds = abs(seconds)
    if seconds < 120:
        text = f"{seconds:.0f}s"
    elif seconds < 7200:
        text = f"{seconds / 60:.0f}m"
    elif seconds < 172_800:
        text = f"{seconds / 3600:.0f}h"
    else:
        text = f"{seconds / 86_400:.0f}d"
    return f"in {text}" if ahead else f"{text} ago"


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[Row], Any]
    wide_only: bool = False
    style_by_value: bool = False


def cell_text(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return escaped(str(value), one_line=True)


def emit(text: str, *, err: bool = False) -> None:
    """The one way a command prints a line: escaped (tabs and newlines kept)."""
    click.echo(escaped(text), err=err)


def dump_json(data: Any, *, lines: bool = False) -> str:
    """JSON whose strings carry their control characters as `\\u` escapes: the same data,
    and nothing in it a terminal acts on."""
    text = json.dumps(plain(data), separators=(",", ":") if lines else None,
                      indent=None if lines else 2, ensure_ascii=False, default=str)
    return json_escaped(text)


def dump_yaml(data: Any) -> str:
    return to_yaml(plain(data))


def is_terminal() -> bool:
    return sys.stdout.isatty()


def table(rows: Sequence[Row], columns: Sequence[Column], fmt: str, title: str | None = None,
          ) -> Table | str:
    shown = [c for c in columns if fmt == "wide" or not c.wide_only]
    cells = [[cell_text(c.cell(r)) for c in shown] for r in rows]
    if not is_terminal():
        return plain_table([c.header.upper() for c in shown], cells)
    out = Table(title=None if title is None else Text(escaped(title, one_line=True)))
    for column in shown:
        out.add_column(column.header, overflow="fold")
    for row in cells:
        out.add_row(*(Text(v, style=STATUS_STYLE[v] if c.style_by_value and v in STATUS_STYLE else "")
                      for c, v in zip(shown, row, strict=True)))
    return out


def plain_table(headers: Sequence[str], cells: Sequence[Sequence[str]], header: bool = True) -> str:
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = [list(headers)] if header else []
    lines += [list(r) for r in cells]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


def show(rows: Sequence[Row], columns: Sequence[Column], fmt: str, title: str | None = None) -> None:
    """Print a list in the chosen format."""
    if fmt == "json":
        emit(dump_json(list(rows)))
    elif fmt == "yaml":
        emit(dump_yaml(list(rows)).rstrip("\n"))
    else:
        rendered = table(rows, columns, fmt, title)
        if isinstance(rendered, str):
            if rendered:
                emit(rendered)
        else:
            Console().print(rendered)


def show_one(data: Row, fmt: str) -> None:
    emit(dump_json(data) if fmt == "json" else dump_yaml(data).rstrip("\n"))


class _Stop(Exception):
    pass


def _raise_stop(_signum: int, _frame: FrameType | None) -> None:
    raise _Stop


def watch(read: Callable[[], list[Row]], key: Callable[[Row], Any], columns: Sequence[Column],
          fmt: str, interval: float, title: str | None = None) -> None:
    """Read and print until Ctrl-C or SIGTERM (both end it with exit code 0)."""
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        if fmt in ("table", "wide") and is_terminal():
            _watch_live(read, columns, fmt, interval, title)
        else:
            _watch_changes(read, key, columns, fmt, interval)
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


def _watch_live(read: Callable[[], list[Row]], columns: Sequence[Column], fmt: str,
                interval: float, title: str | None) -> None:
    from rich.live import Live

    with Live(auto_refresh=False) as live:
        while True:
            rendered = table(read(), columns, fmt, title)
            live.update(rendered, refresh=True)
            time.sleep(interval)


def _watch_changes(read: Callable[[], list[Row]], key: Callable[[Row], Any],
                   columns: Sequence[Column], fmt: str, interval: float) -> None:
    seen: dict[Any, Any] = {}
    shown = [c for c in columns if fmt == "wide" or not c.wide_only]
    widths: list[int] | None = None
    while True:
        changed = []
        for row in read():
            data = plain(row)
            if seen.get(key(row)) != data:
                seen[key(row)] = data
                changed.append(row)
        if changed and fmt == "json":
            emit("\n".join(dump_json(r, lines=True) for r in changed))
        elif changed and fmt == "yaml":
            emit("\n".join("---\n" + dump_yaml(r).rstrip("\n") for r in changed))
        elif changed:
            cells = [[cell_text(c.cell(r)) for c in shown] for r in changed]
            headers = [c.header.upper() for c in shown]
            if widths is None:  # the first listing sets the column widths, like kubectl -w
                widths = [max([len(h), *(len(r[i]) for r in cells)]) + 2 for i, h in enumerate(headers)]
                emit("".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
            emit("\n".join("".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
                           for r in cells))
        sys.stdout.flush()
        time.sleep(interval)
