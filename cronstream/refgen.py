"""Generate the parts of the reference (`docs/reference/`) that the code holds.

    python -m cronstream.refgen docs/reference        # or: make reference

A page of the reference is written by hand, and where it states what a piece of code
defines — the topics and their configs, the records' fields, the statuses, the settings,
the command line, the Python API — it holds a block that this module writes:

    <!-- BEGIN GENERATED settings (`make reference` writes this block from the code) -->
    ...
    <!-- END GENERATED settings -->

A unit test (tests/unit/test_reference.py) fails when a committed block differs from
what the code generates now. Some tables have a column that only a person can write (a
setting's meaning, a record field's purpose): the generator keeps what the page holds in
those cells, row by row, writes `TODO` in a new row's, and drops the rows of what is gone;
the test fails on a `TODO` left in a page.
"""

from __future__ import annotations

import inspect
import re
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel

from cronstream.shared import statuses
from cronstream.shared.records import (
    PRIORITIES,
    Alert,
    Calendar,
    Command,
    Concurrency,
    EventBatch,
    EventTrigger,
    ExecutionEvent,
    Heartbeat,
    HolidaySource,
    JobAlerts,
    JobDefinition,
    JobDue,
    JobSnapshot,
    LogBatch,
    LogLine,
    Pool,
    RetryRequest,
    TriggerEvent,
    Upstream,
    UpstreamExecution,
)
from cronstream.shared.settings import ENV_PREFIX, KAFKA_PASSTHROUGH_PREFIX, Settings
from cronstream.shared.statuses import Status
from cronstream.shared.topics import Topics

TODO = "TODO"
_BEGIN = re.compile(r"^<!-- BEGIN GENERATED (\S+) [^\n]*-->\n", re.MULTILINE)
_CELL_SPLIT = re.compile(r"(?<!\\)\|")


def begin_marker(name: str) -> str:
    return f"<!-- BEGIN GENERATED {name} (`make reference` writes this block from the code) -->\n"


def end_marker(name: str) -> str:
    return f"<!-- END GENERATED {name} -->\n"


# -- tables -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Column:
    title: str
    by_hand: bool = False  # a person writes these cells; the generator keeps them


def cell(text: object) -> str:
    """`text` as one Markdown table cell: one line, its pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def code(text: object) -> str:
    return f"`{text}`"


def _rows(previous: str) -> list[list[str]]:
    rows = []
    for line in previous.splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|[\s|:-]+\|", line):
            rows.append([c.strip() for c in _CELL_SPLIT.split(line.strip())[1:-1]])
    return rows[1:]  # the header's


def table(columns: Sequence[Column], rows: Iterable[Sequence[str | None]], previous: str = "") -> str:
    """A Markdown table of `rows` (the generated cells; None where a person writes, as in
    every cell of a `by_hand` column), with the hand-written cells of `previous` kept for
    the rows whose first cell is the same."""
    kept = {row[0]: row for row in _rows(previous) if len(row) == len(columns)}
    lines = ["| " + " | ".join(c.title for c in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        old = kept.get(row[0] or "")
        cells = [(old[i] if old and old[i] else TODO) if column.by_hand or value is None else value
                 for i, (column, value) in enumerate(zip(columns, row, strict=True))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# -- JSON Schema, read for people ---------------------------------------------------


def _number(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:g}"


def _bounds(prop: Mapping[str, Any]) -> str:
    if "minimum" in prop and "maximum" in prop:
        return f"from {_number(prop['minimum'])} to {_number(prop['maximum'])}"
    parts = []
    if "minimum" in prop:
        parts.append(f"≥ {_number(prop['minimum'])}")
    if "exclusiveMinimum" in prop:
        parts.append(f"> {_number(prop['exclusiveMinimum'])}")
    if "maximum" in prop:
        parts.append(f"≤ {_number(prop['maximum'])}")
    return ", ".join(parts)


def _text_rules(prop: Mapping[str, Any]) -> str:
    parts = []
    if "pattern" in prop:
        parts.append(f"matching {code(prop['pattern'])}")
    if prop.get("minLength", 0) > 0 and "maxLength" in prop:
        parts.append(f"of {prop['minLength']} to {prop['maxLength']:,} characters")
    elif "maxLength" in prop:
        parts.append(f"of at most {prop['maxLength']:,} characters")
    return ", ".join(parts)


_FORMATS = {"date-time": "time (RFC 3339)", "date": "date (YYYY-MM-DD)", "uuid": "UUID",
            "password": "secret text"}


def _text(prop: Mapping[str, Any]) -> str:
    if prop.get("format") in _FORMATS:
        return _FORMATS[prop["format"]]
    rules = _text_rules(prop)
    return f"text {rules}" if rules else "text"


def _number_type(prop: Mapping[str, Any]) -> str:
    bounds = _bounds(prop)
    word = "integer" if prop["type"] == "integer" else "number"
    return f"{word} {bounds}" if bounds else word


def _array(prop: Mapping[str, Any]) -> str:
    text = f"list of {describe_type(prop.get('items', {}))}"
    return f"{text}, ≤ {prop['maxItems']:,} items" if "maxItems" in prop else text


def _object(prop: Mapping[str, Any]) -> str:
    values = prop.get("additionalProperties")
    by_pattern = prop.get("patternProperties", {})
    if not (isinstance(values, dict) or by_pattern):
        return "JSON object"
    pattern = ""
    if by_pattern:
        (pattern, values), = by_pattern.items()
    assert isinstance(values, dict)
    keys = f"keys matching {code(pattern)}, " if pattern else ""
    limit = f", ≤ {prop['maxProperties']:,} entries" if "maxProperties" in prop else ""
    return f"object ({keys}values {describe_type(values)}){limit}"


_KINDS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "string": _text, "integer": _number_type, "number": _number_type,
    "boolean": lambda _prop: "boolean", "array": _array, "object": _object,
}


def describe_type(prop: Mapping[str, Any], settings: bool = False) -> str:
    """A JSON Schema property in words: its type and the rules the schema states (for a
    setting, null is being unset: not said)."""
    if "anyOf" in prop:
        options = [o for o in prop["anyOf"] if o.get("type") != "null"]
        nullable = len(options) < len(prop["anyOf"])
        text = " or ".join(describe_type(o, settings) for o in options)
        return f"{text}, or null" if nullable and not settings else text
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "const" in prop:
        return code(prop["const"])
    if "enum" in prop:
        return "one of " + ", ".join(code(v) for v in prop["enum"])
    render = _KINDS.get(prop.get("type", ""))
    return render(prop) if render else "any JSON value"


def _default(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return code(str(value).lower())
    if isinstance(value, str):
        return code(value) if value else '`""`'
    if isinstance(value, float | int):
        return code(_number(value).replace(",", ""))
    if isinstance(value, list | dict) and not value:
        return code("[]" if isinstance(value, list) else "{}")
    return code(value)


# -- topics -------------------------------------------------------------------------


def _duration(ms: int) -> str:
    for unit, size in (("day", 86_400_000), ("hour", 3_600_000), ("minute", 60_000)):
        if ms % size == 0:
            n = ms // size
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return f"{ms} ms"


def _kept_for(config: Mapping[str, str]) -> str:
    if config.get("cleanup.policy") == "compact":
        return "compacted"
    return _duration(int(config["retention.ms"])) if "retention.ms" in config else "the broker's default"


def topics_block(previous: str) -> str:
    """Every topic `cronstream init` creates, from `Topics.specs` (names without the prefix)."""
    default = Settings.model_fields["topic_partitions"].default
    one, other = Topics("", 2).specs(queues=()), Topics("", 3).specs(queues=())
    rows = []
    for a, b in zip(one, other, strict=True):
        partitions = (f"`CRONSTREAM_TOPIC_PARTITIONS` ({default})" if a.partitions != b.partitions
                      else str(a.partitions))
        configs = ", ".join(f"`{k}={v}`" for k, v in sorted(a.config.items()))
        rows.append([code(a.name), partitions, _kept_for(a.config), configs, "", ""])
    work = Topics("", 2).work_specs(["<queue>"])
    assert len({tuple(sorted(s.config.items())) for s in work}) == 1, "work topics differ"
    configs = ", ".join(f"`{k}={v}`" for k, v in sorted(work[0].config.items()))
    rows.append([code("work.<priority>.<queue>"), f"`CRONSTREAM_TOPIC_PARTITIONS` ({default})",
                 _kept_for(work[0].config), configs, "", ""])
    columns = [Column("topic"), Column("partitions"), Column("kept"), Column("configs `init` sets"),
               Column("key", by_hand=True), Column("value", by_hand=True)]
    return (table(columns, rows, previous)
            + f"\nPriorities, highest first: {', '.join(code(p) for p in PRIORITIES)}.\n")


# -- statuses -----------------------------------------------------------------------


def named_sets() -> dict[str, frozenset[str]]:
    """The named sets of statuses in shared/statuses.py, in their order there."""
    words = {s.value for s in Status}
    return {name: value for name, value in vars(statuses).items()
            if isinstance(value, frozenset) and value and value <= words}


def statuses_block(previous: str) -> str:
    """Each status with who moves an execution out of it (`Status`), and the named sets."""
    sets = named_sets()
    rows = []
    for status in Status:
        member_of = ", ".join(code(name) for name, members in sets.items() if status in members)
        rows.append([code(status.value), member_of or "—", cell(status.__doc__ or "")])
    first = table([Column("status"), Column("in"), Column("meaning, and who moves an execution out of it")],
                  rows)
    set_rows = [[code(name), ", ".join(code(s.value) for s in Status if s in members), ""]
                for name, members in sets.items()]
    second = table([Column("set"), Column("statuses"), Column("used for", by_hand=True)], set_rows,
                   previous.split("\n\n", 1)[1] if "\n\n" in previous else "")
    return f"{first}\n{second}"


# -- settings -----------------------------------------------------------------------


def _setting_default(name: str) -> str:
    field = Settings.model_fields[name]
    if field.default_factory is not None:
        if getattr(field.default_factory, "__name__", "") == "default_worker_id":
            return "hostname-pid"
        if getattr(field.default_factory, "__name__", "") == "default_scheduler_data_dir":
            return code("$TMPDIR/cronstream-<uid>/scheduler")
        value = field.default_factory()  # type: ignore[call-arg]
        return ", ".join(code(v) for v in value) if value else "none"
    return "unset" if field.default is None else _default(field.default)


def settings_block(previous: str) -> str:
    """Every `CRONSTREAM_*` setting of `Settings`, its default and what it accepts."""
    schema = Settings.model_json_schema(mode="validation")["properties"]
    rows = []
    for name in Settings.model_fields:
        if name == "kafka_config":
            continue
        accepts = describe_type(schema[name], settings=True)
        if schema[name].get("type") == "array" or any(
                o.get("type") == "array" for o in schema[name].get("anyOf", [])):
            accepts += " (one per line)" if name == "worker_allow_shell" else " (comma-separated)"
        rows.append([code(ENV_PREFIX + name.upper()), _setting_default(name), accepts, "", ""])
    rows.append([code(KAFKA_PASSTHROUGH_PREFIX + "<PROPERTY>"), "none",
                 "any librdkafka property, its dots written as underscores", "", ""])
    columns = [Column("variable"), Column("default"), Column("accepts"),
               Column("own flag", by_hand=True), Column("meaning", by_hand=True)]
    return table(columns, rows, previous)


# -- records ------------------------------------------------------------------------

# The records of the public topics and what they contain, in the order of records.md.
RECORDS: dict[str, type[BaseModel]] = {
    "JobDefinition": JobDefinition, "JobAlerts": JobAlerts, "EventTrigger": EventTrigger,
    "EventBatch": EventBatch, "Concurrency": Concurrency, "JobDue": JobDue, "TriggerEvent": TriggerEvent,
    "JobSnapshot": JobSnapshot, "Upstream": Upstream, "UpstreamExecution": UpstreamExecution,
    "RetryRequest": RetryRequest, "ExecutionEvent": ExecutionEvent, "Heartbeat": Heartbeat,
    "Command": Command, "Alert": Alert, "LogBatch": LogBatch, "LogLine": LogLine,
    "Calendar": Calendar, "HolidaySource": HolidaySource, "Pool": Pool,
}


def record_fields(model: type[BaseModel]) -> list[str]:
    """The fields `model` adds to its base record (all of them for a first-level record),
    without `schema_version`, which every record has."""
    inherited: set[str] = set()
    for base in model.__mro__[1:]:
        if base in RECORDS.values() and issubclass(base, BaseModel):
            inherited = set(base.model_fields)
            break
    return [n for n in model.model_fields if n not in inherited and n != "schema_version"]


def record_block(name: str) -> Callable[[str], str]:
    def render(previous: str) -> str:
        model = RECORDS[name]
        schema = model.model_json_schema(mode="validation")
        required = set(schema.get("required", []))
        rows = []
        for field in record_fields(model):
            prop = schema["properties"][field]
            if field in required:
                default = "required"
            elif "default" in prop:
                default = _default(prop["default"])
            else:
                info = model.model_fields[field]
                factory = info.default_factory
                default = _default(factory()) if factory is not None else "null"  # type: ignore[call-arg]
            rows.append([code(field), cell(describe_type(prop)), default, ""])
        columns = [Column("field"), Column("type"), Column("default"), Column("meaning", by_hand=True)]
        return table(columns, rows, previous)

    return render


# -- the command line ---------------------------------------------------------------


def _no_default(value: Any) -> bool:
    return value is None or value is False or value == () or type(value).__name__ == "Sentinel"


def _option_row(param: click.Option, ctx: click.Context) -> list[str]:
    names = ", ".join(code(o) for o in [*param.opts, *param.secondary_opts])
    if not param.is_flag:
        names += " " + code(param.make_metavar(ctx))
    text = textwrap.dedent(param.help or "").strip()
    default = param.get_default(ctx, call=False)
    if not _no_default(default) and not param.is_flag and "default" not in text.lower():
        text = f"{text} Default: {code(default)}.".strip()
    if param.multiple and "repeatable" not in text.lower():
        text = f"{text} Repeatable.".strip()
    return [cell(names), cell(text) or "—"]


def _help(command: click.Command) -> str:
    return inspect.cleandoc(command.help or "").replace("\b\n", "")


def _command_section(command: click.Command, path: list[str], parent: click.Context | None) -> list[str]:
    # A fixed width: what click wraps must not depend on the terminal that generates it.
    ctx = click.Context(command, info_name=path[-1], parent=parent, terminal_width=100,
                        max_content_width=100)
    out = [f"### `{' '.join(path)}`", "", "```", command.get_usage(ctx).removeprefix("Usage: "), "```",
           "", _help(command), ""]
    options = [p for p in command.params if isinstance(p, click.Option) and not p.hidden
               and p.name not in ("help",)]
    if options:
        out += [table([Column("option"), Column("meaning")], [_option_row(p, ctx) for p in options])]
    if isinstance(command, click.Group):
        for name in sorted(command.commands):
            out += _command_section(command.commands[name], [*path, name], ctx)
    return out


def cli_block(_previous: str) -> str:
    """Every command of `cronstream`, its usage and options, from the click command tree."""
    from cronstream.cli import cli

    return "\n".join(_command_section(cli, ["cronstream"], None)).rstrip("\n") + "\n"


# -- the Python API -----------------------------------------------------------------


def _summary(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return cell(doc.split("\n\n", 1)[0])


def _signature(fn: Callable[..., Any]) -> str:
    sig = inspect.signature(fn)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()
              if p.name != "self"]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def python_block(previous: str) -> str:
    """The public names of `cronstream` and the methods of `Client`, with their docstrings."""
    import cronstream
    from cronstream.client import AsyncClient, Client
    from cronstream.handlers import Context

    names = table([Column("name"), Column("what it is")],
                  [[code(name), _summary(getattr(cronstream, name))] for name in sorted(cronstream.__all__)])
    methods = []
    for name, fn in inspect.getmembers(Client, inspect.isfunction):
        if name.startswith("_"):
            continue
        # The facade's docstrings often point at the coroutine's, which says more.
        doc = _summary(getattr(AsyncClient, name, None)) or _summary(fn)
        methods.append([code(f"{name}{_signature(fn)}"), doc or None])
    # The dataclass fields of Context have no docstrings: their meaning is written by hand.
    context: list[list[str | None]] = [
        [code(f.name), None] for f in Context.__dataclass_fields__.values() if not f.name.startswith("_")]
    context += [[code(name), _summary(member)] for name, member in vars(Context).items()
                if not name.startswith("_") and (isinstance(member, property) or inspect.isfunction(member))]
    parts = previous.split("#### `Context`", 1)
    return (f"{names}\n#### `Client` methods\n\n`AsyncClient` has the same methods, as coroutines.\n\n"
            + table([Column("method"), Column("what it does")], methods, parts[0])
            + "\n#### `Context`\n\n"
            + table([Column("attribute"), Column("what it is")], context, parts[-1]))


# -- pages --------------------------------------------------------------------------

BLOCKS: dict[str, dict[str, Callable[[str], str]]] = {
    "topics.md": {"topics": topics_block},
    "statuses.md": {"statuses": statuses_block},
    "settings.md": {"settings": settings_block},
    "records.md": {f"records:{name}": record_block(name) for name in RECORDS},
    "cli.md": {"cli": cli_block},
    "python.md": {"python": python_block},
}


class PageError(ValueError):
    """A page lacks a block it must hold, or holds one nobody generates."""


def regenerate(page: str, text: str) -> str:
    """`text` (the page `page` of the reference) with every generated block written anew."""
    blocks = BLOCKS.get(page, {})
    found = _BEGIN.findall(text)
    if sorted(found) != sorted(blocks):
        raise PageError(f"{page}: generated blocks {sorted(found)}, expected {sorted(blocks)}")
    for name, render in blocks.items():
        start = re.search(rf"^<!-- BEGIN GENERATED {re.escape(name)} [^\n]*-->\n", text, re.MULTILINE)
        end_text = end_marker(name)
        assert start is not None
        end = text.find(end_text, start.end())
        if end < 0:
            raise PageError(f"{page}: no end marker for {name}")
        previous = text[start.end():end]
        text = (text[:start.start()] + begin_marker(name) + render(previous) + end_text
                + text[end + len(end_text):])
    return text


def write(folder: Path) -> list[Path]:
    """Regenerate every page of `folder` that has generated blocks; return the changed."""
    changed = []
    for page in BLOCKS:
        path = folder / page
        old = path.read_text()
        new = regenerate(page, old)
        if new != old:
            path.write_text(new)
            changed.append(path)
    return changed


if __name__ == "__main__":
    for path in write(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/reference")):
        print(f"wrote {path}")
