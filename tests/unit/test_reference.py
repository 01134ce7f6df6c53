"""The reference (docs/reference/) says what the code does: its generated parts are what
the code generates now, its hand-written numbers and names are the code's constants, its
links land on a heading, and nothing cites the contract it replaced."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest

from cronstream import refgen
from cronstream.cli.common import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE
from cronstream.handlers import REGISTRY
from cronstream.services.scheduler.leader import FIRE_LIMIT
from cronstream.services.worker import builtins, pool, shell
from cronstream.services.worker.capture import LINE_BYTES, TRACEBACK_BYTES
from cronstream.shared import codec, condition, inbound, logs, records, retry
from cronstream.shared.acls import PRINCIPALS
from cronstream.shared.cron import MACROS
from cronstream.shared.settings import MIN_TOKEN_LENGTH, SERVICE_PORTS, Settings
from cronstream.ui import throttle

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
PAGES = sorted(p.name for p in REFERENCE.glob("*.md"))
# What the tree is read from for citations and links (the symlinks in cronstream/ lead
# to shared/ and services/, read once as themselves).
FOLDERS = ("bench", "cronstream", "deploy", "docs", "examples", "schemas", "services", "shared", "tests")
TOP_FILES = ("README.md", "Makefile", "Dockerfile", "pyproject.toml")
TEXT = (".py", ".md", ".sql", ".yaml", ".yml", ".json", ".toml", ".txt", ".html", ".js", ".css", ".sh")


def page(name: str) -> str:
    return (REFERENCE / name).read_text()


def hand_written(text: str) -> str:
    """`text` without its generated blocks."""
    return re.sub(r"<!-- BEGIN GENERATED .*?<!-- END GENERATED \S+ -->", "", text, flags=re.DOTALL)


def tree() -> Iterator[Path]:
    for name in TOP_FILES:
        yield ROOT / name
    for folder in FOLDERS:
        for parent, dirs, files in os.walk(ROOT / folder):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "node_modules")]
            for file in files:
                path = Path(parent) / file
                if path.suffix in TEXT and not path.is_symlink():
                    yield path


# -- generated parts ----------------------------------------------------------------


@pytest.mark.parametrize("name", list(refgen.BLOCKS))
def test_generated_parts_are_what_the_code_generates(name: str) -> None:
    text = page(name)
    assert refgen.regenerate(name, text) == text, \
        f"docs/reference/{name} is stale: run `make reference` and commit the result"


@pytest.mark.parametrize("name", PAGES)
def test_no_cell_is_left_to_write(name: str) -> None:
    assert refgen.TODO not in page(name), \
        f"docs/reference/{name}: write the cells `make reference` left as {refgen.TODO}"


def test_a_hand_written_cell_survives_regeneration_and_a_new_row_asks_for_one() -> None:
    columns = [refgen.Column("name"), refgen.Column("meaning", by_hand=True)]
    before = refgen.table(columns, [["`a`", None]], "| name | meaning |\n|---|---|\n| `a` | kept |\n")
    assert "| `a` | kept |" in before
    after = refgen.table(columns, [["`a`", None], ["`b`", None]], before)
    assert "| `a` | kept |" in after and f"| `b` | {refgen.TODO} |" in after


def test_the_index_lists_every_page() -> None:
    linked = set(re.findall(r"\]\(([\w-]+\.md)\)", page("README.md")))
    assert linked == set(PAGES) - {"README.md"}


# -- links --------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    found: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#{1,6} (.+)", line)):
            base = slug(heading.group(1))
            name, n = base, 0
            while name in found:
                n += 1
                name = f"{base}-{n}"
            found.add(name)
    return found


def test_every_link_into_the_reference_lands_on_a_page_and_a_heading() -> None:
    targets = {name: anchors(page(name)) for name in PAGES}
    broken = []
    for path in tree():
        text = path.read_text(errors="replace")
        links = [(m.group(1), m.group(2)) for m in
                 re.finditer(r"reference/([\w-]+\.md)(?:#([\w-]+))?", text)]
        if path.parent == REFERENCE:
            links += [(m.group(1) or path.name, m.group(2)) for m in
                      re.finditer(r"\]\((?:([\w-]+\.md))?(?:#([\w-]+))?\)", text)]
        for file, anchor in links:
            if file not in targets or (anchor and anchor not in targets[file]):
                broken.append(f"{path.relative_to(ROOT)}: reference/{file}#{anchor or ''}")
    assert broken == []


def test_no_citation_of_the_old_contract_is_left() -> None:
    """The contract is docs/reference/: point there (`docs/reference/semantics.md#retries`)."""
    cited = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in tree() if path != Path(__file__)
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if re.search(r"\bSPEC\b", line)]
    assert cited == []


# -- hand-written facts -------------------------------------------------------------

UNITS = {"": 1, "s": 1, "ms": 1, "KiB": 1024, "MiB": 1 << 20}


def test_settings_quoted_with_their_default_say_the_default() -> None:
    wrong = []
    for name in PAGES:
        for m in re.finditer(r"`CRONSTREAM_([A-Z_]+)` \((\d[\d,.]*) ?(KiB|MiB|ms|s)?[);]",
                             " ".join(hand_written(page(name)).split())):
            field = m.group(1).lower()
            stated = float(m.group(2).replace(",", "")) * UNITS[m.group(3) or ""]
            if Settings.model_fields[field].default != stated:
                wrong.append(f"{name}: {m.group(0)}")
    assert wrong == []


def stated(text: str, constant: str) -> int:
    """The number a page states right before "(`constant`)", in bytes for KiB and MiB."""
    m = re.search(rf"(\d[\d,]*) ?(KiB|MiB|characters|tokens|levels[\w ]*)?\)?[^|(]*?\(`{constant}`\)", text)
    assert m, f"{constant} is not stated"
    return int(m.group(1).replace(",", "")) * UNITS.get(m.group(2) or "", 1)


def test_the_limits_are_the_code_constants() -> None:
    text = page("limits.md")
    constants = {
        "MAX_PARAMS_BYTES": records.MAX_PARAMS_BYTES, "MAX_RESULT_BYTES": records.MAX_RESULT_BYTES,
        "MAX_DEFINITION_BYTES": records.MAX_DEFINITION_BYTES, "MAX_RECORD_BYTES": codec.MAX_RECORD_BYTES,
        "MAX_MESSAGE_CHARS": records.MAX_MESSAGE_CHARS,
        "MAX_UPSTREAM_RESULTS_BYTES": records.MAX_UPSTREAM_RESULTS_BYTES,
        "MAX_TOKENS": condition.MAX_TOKENS, "MAX_DEPTH": condition.MAX_DEPTH,
        "LINE_BYTES": LINE_BYTES, "TRACEBACK_BYTES": TRACEBACK_BYTES,
        "MAX_DEAD_LETTER_VALUE": inbound.MAX_DEAD_LETTER_VALUE, "OUTPUT_LIMIT": shell.OUTPUT_LIMIT,
        "TEXT_LIMIT": shell.TEXT_LIMIT, "MIN_TOKEN_LENGTH": MIN_TOKEN_LENGTH,
    }
    assert {c: stated(text, c) for c in constants} == constants
    span = f"from {records.EARLIEST:%Y-%m-%dT%H:%M:%SZ} to {records.LATEST:%Y-%m-%dT%H:%M:%SZ}"
    assert span in text
    assert " ".join(shell.CHILD_ENVIRONMENT) in " ".join(text.split())


def test_topics_name_the_headers_the_code_writes() -> None:
    text = page("topics.md")
    headers = [inbound.DLQ_TOPIC, inbound.DLQ_PARTITION, inbound.DLQ_OFFSET, inbound.DLQ_ERROR,
               inbound.DLQ_SERVICE, inbound.DLQ_ORIGINAL_SIZE, inbound.DLQ_TRUNCATED]
    assert all(f"`{h}`" in text for h in headers)
    assert f"`{records.DELETED_BY_HEADER}`" in text
    assert f"the first {inbound.MAX_DEAD_LETTER_VALUE // 1024} KiB" in text


def test_semantics_state_the_code_rules() -> None:
    text = page("semantics.md")
    low, high = retry.JITTER
    assert f"× U({low:g}, {high:g}), max_retry_delay_seconds)" in text
    assert f"{pool.CANCEL_GRACE_SECONDS:g} s later" in text
    assert f"({FIRE_LIMIT:,} per transaction)" in text
    assert f"at most {condition.MAX_TOKENS} tokens and {condition.MAX_DEPTH} levels deep" in text
    assert f"up to {records.MAX_UPSTREAM_RESULTS_BYTES // 1024} KiB together" in text
    assert ", ".join(f"`{m}`" for m in MACROS) in text.replace("\n  ", " ")

    def table_column(title: str) -> list[str]:
        section = text.split(f"| {title}", 1)[1].split("\n\n", 1)[0]
        return re.findall(r"^\| `(\w+)`", section, re.MULTILINE)

    assert table_column("trigger rule") == list(get_args(records.TriggerRule))
    assert table_column("policy") == list(get_args(records.MisfirePolicy))
    assert table_column("`concurrency_policy`") == list(get_args(records.ConcurrencyPolicy))
    defaults = records.JobDefinition.model_fields
    assert f"`misfire_grace_seconds` ({defaults['misfire_grace_seconds'].default:g} by default)" in text
    assert f"`{defaults['trigger_rule'].default}` (default)" in text
    assert f"`{defaults['misfire_policy'].default}` (default)" in text


def test_statuses_list_the_worker_statuses() -> None:
    rows = re.findall(r"^\| `(\w+)` \|", page("statuses.md").split("## Worker statuses", 1)[1],
                      re.MULTILINE)
    assert rows == list(get_args(records.WorkerStatus))


def test_the_cli_page_has_the_exit_codes() -> None:
    rows = re.findall(r"^\| (\d+) \|", page("cli.md"), re.MULTILINE)
    assert rows == [str(c) for c in (EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_NOT_FOUND, 130)]


def test_the_built_in_handlers_are_the_workers() -> None:
    assert callable(builtins.noop)  # imported for what it registers
    section = page("python.md").split("## Built-in handlers", 1)[1]
    listed = re.findall(r"^\| `([\w.]+)` \|", section, re.MULTILINE)
    assert set(listed) - {"shell"} <= set(REGISTRY.names())
    assert {"noop", "sleep", "fail", "shell"} == set(listed)


def test_operations_name_the_ports_parts_kinds_and_bounds_of_the_code() -> None:
    text = page("operations.md").replace("\n", " ")
    services = ", ".join(f"{s} {p}" for s, p in SERVICE_PORTS.items() if s != "ui")
    assert f"{services}, and `cronstream ui` {SERVICE_PORTS['ui']}" in text
    parts = text.split("the parts ", 1)[1].split("; `--apply`", 1)[0]
    assert tuple(re.findall(r"`([\w-]+)`", parts)) == PRINCIPALS
    kinds = re.findall(r"^\| `(\w+)` \| \w+ \|", page("operations.md"), re.MULTILINE)
    assert sorted(kinds) == sorted(get_args(records.AlertKind))
    assert f"{throttle.LIMIT} in {throttle.WINDOW_SECONDS / 60:g} minutes" in text
    assert f"cut at {logs.MAX_VALUE:,} characters and a traceback at {logs.MAX_TRACEBACK:,}" in text


def migrations() -> dict[str, set[str]]:
    """Every table and view the migrations create, with the columns of each table."""
    sql = "\n".join(p.read_text() for p in sorted((ROOT / "shared/sql/migrations").glob("*.sql")))
    found: dict[str, set[str]] = {}
    for name, body in re.findall(r"CREATE TABLE (\w+) \((.*?)\n\);", sql, re.DOTALL):
        found[name] = {line.split()[0] for line in body.splitlines()
                       if line.strip() and not line.strip().startswith(("PRIMARY", "--"))}
    for table, column in re.findall(r"ALTER TABLE (\w+) ADD COLUMN (\w+)", sql):
        found[table].add(column)
    for view in re.findall(r"CREATE (?:OR REPLACE )?VIEW (\w+)", sql):
        found.setdefault(view, set())
    return found


def test_the_projection_page_names_every_table_and_view_and_columns_that_exist() -> None:
    schema = migrations()
    text = page("projection.md")
    tables_part, views_part = text.split("## Tables", 1)[1].split("## Views", 1)
    views_part = views_part.split("\n## ", 1)[0]
    tables = re.findall(r"^\| `(\w+)` \|", tables_part, re.MULTILINE)
    views = re.findall(r"^\| `(\w+)` \|", views_part, re.MULTILINE)
    assert sorted(tables) == sorted(t for t, columns in schema.items() if columns)
    assert sorted(views) == sorted(t for t, columns in schema.items() if not columns)
    unknown = [f"{table}.{column}"
               for table, cells in re.findall(r"^\| `(\w+)` \| [^|]+ \| (.+) \|$", tables_part, re.MULTILINE)
               for column in re.findall(r"`(\w+)`", cells) if column not in schema[table]]
    assert unknown == []
