"""The seams that keep the code single, pinned (issue 45): no service imports another and
`shared/` imports no service; every set of statuses comes from `shared/statuses.py`, in
Python and in SQL; every consumer reads through the one inbound path; each record kind has
one constructor."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from cronstream.shared import statuses
from cronstream.shared.statuses import Status

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"
SHARED = ROOT / "shared"
PACKAGES = [ROOT / "cronstream", SHARED, SERVICES]
WORDS = {s.value for s in Status}
# Every named set of statuses.py: what SQL and code may spell out.
NAMED = {name: frozenset(value) for name, value in vars(statuses).items()
         if isinstance(value, frozenset) and value and value <= WORDS}
SQL_FILES = [*sorted((SHARED / "sql").rglob("*.sql")), ROOT / "deploy" / "grafana" / "panels.sql"]
# Applied migrations are history: a list one of them holds may be a set since replaced.
REPLACED = {("0002_dags_requeues_metrics.sql",
             frozenset({"COMPLETED", "FAILED", "TIMED_OUT", "PERMANENTLY_FAILED"})):
            "job_stats_24h per attempt, replaced by 0010 (per run)",
            ("0001_initial.sql", frozenset({"QUEUED", "RUNNING", "AWAITING_APPROVAL"})):
            "job_executions_active before WAITING, replaced by 0014"}


def modules(*folders: Path) -> Iterator[tuple[Path, ast.Module]]:
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            if path.is_symlink() or any(p.is_symlink() for p in path.parents if ROOT in p.parents):
                continue
            yield path, ast.parse(path.read_text(), str(path))


def imported(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_no_service_imports_another_and_shared_imports_no_service() -> None:
    wrong = []
    for path, tree in modules(SERVICES, SHARED):
        own = path.relative_to(ROOT).parts
        for name in imported(tree):
            if not name.startswith("cronstream.services."):
                continue
            service = name.split(".")[2]
            if own[0] == "shared" or service != own[1]:
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert wrong == []
    assert len(list(modules(SERVICES))) > 30, "the services' modules were read"


def status_literals(tree: ast.Module) -> Iterator[tuple[int, frozenset[str]]]:
    """Collections of two or more status words, outside a `Literal[...]` type."""
    typed = {id(n) for node in ast.walk(tree) if isinstance(node, ast.Subscript)
             for n in ast.walk(node.slice)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Set | ast.Tuple | ast.List) and id(node) not in typed \
                and len(node.elts) >= 2:
            words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len(words) == len(node.elts) and set(words) <= WORDS:
                yield node.lineno, frozenset(words)


def test_no_module_spells_out_a_set_of_statuses_but_statuses_py() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {sorted(words)}"
             for path, tree in modules(*PACKAGES) if path != SHARED / "statuses.py"
             for line, words in status_literals(tree)]
    assert found == [], "use a set of shared/statuses.py (or build one from Status members)"


def sql_status_lists() -> Iterator[tuple[Path, int, frozenset[str]]]:
    literal = re.compile(r"IN\s*\(\s*('[A-Z_]+'(?:\s*,\s*'[A-Z_]+')*)\s*\)", re.IGNORECASE)
    for path in SQL_FILES:
        text = path.read_text()
        for match in literal.finditer(text):
            words = frozenset(re.findall(r"'([A-Z_]+)'", match[1]))
            if words <= WORDS and len(words) >= 2:
                yield path, text.count("\n", 0, match.start()) + 1, words


def test_every_list_of_statuses_in_sql_is_a_set_of_statuses_py() -> None:
    lists = list(sql_status_lists())
    assert len(lists) >= 8, "the SQL's status lists were found"
    unnamed = [f"{path.relative_to(ROOT)}:{line}: {sorted(words)}" for path, line, words in lists
               if words not in NAMED.values() and (path.name, words) not in REPLACED]
    assert unnamed == []


# Where a record may be built field by field: its constructors in records.py, and the
# monitor restoring a stored execution's JobDue from the projection's columns.
BUILT_HERE = {SHARED / "records.py": {"JobDue", "RetryRequest", "ExecutionEvent"},
              SERVICES / "monitor" / "outbound.py": {"JobDue"}}


def test_each_record_kind_is_built_by_its_own_constructors() -> None:
    kinds = {"JobDue", "RetryRequest", "ExecutionEvent"}
    found = []
    for path, tree in modules(*PACKAGES):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in kinds \
                    and node.func.id not in BUILT_HERE.get(path, set()):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.func.id}(...)")
    assert found == [], ("use JobDue.first / .step / .next_attempt / .next_delivery, "
                         "RetryRequest.of, ExecutionEvent.for_due")


# Readers that look at messages' errors themselves, and why that is not a consumer's path.
OWN_ERRORS = {
    SERVICES / "monitor" / "housekeeping.py": "a probe: whether anything is left to project",
    SERVICES / "worker" / "commands.py": "CANCEL commands, which the monitor dead-letters; "
                                         "the worker ignores what it cannot read",
    SERVICES / "scheduler" / "sources.py": "an event trigger's source topic, written by anyone: "
                                           "every record is one (its filter judges it), none is "
                                           "dead-lettered",
}


def test_every_consumer_reads_through_the_one_inbound_path() -> None:
    found = []
    for path, tree in modules(SERVICES):
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name)):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if name == "dead_letter" or (name == "error" and not node.args and path not in OWN_ERRORS):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}(...)")
    assert found == [], "read through shared/inbound.py: Inbound.batch, Batch.decode / read / reject"


def test_every_cli_command_prints_through_output_so_untrusted_text_is_escaped() -> None:
    """`click.echo`, `print` and a Rich `Console().print` of a string would carry a record's
    escape sequences to the terminal raw (issue 53): only cli/output.py writes."""
    wrong = []
    for path, tree in modules(ROOT / "cronstream" / "cli"):
        if path.name == "output.py":
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = (func.id if isinstance(func, ast.Name)
                    else f"{ast.unparse(func.value)}.{func.attr}" if isinstance(func, ast.Attribute)
                    else "")
            if name in ("print", "click.echo", "click.secho", "sys.stdout.write", "sys.stderr.write"):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert wrong == []


def test_no_service_touches_the_librdkafka_consumer_outside_the_kafka_seam() -> None:
    """Services read Kafka through shared/kafka's ConsumerThread and its verbs (issue 54):
    none imports confluent-kafka's Consumer or reaches for a wrapper's inner consumer, so
    the in-memory bus of the unit tests fakes our interface, not librdkafka's."""
    wrong = []
    for path, tree in modules(SERVICES, SHARED):
        if path.relative_to(ROOT).parts[:2] == ("shared", "kafka"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "confluent_kafka" and \
                    any(alias.name in ("Consumer", "DeserializingConsumer") for alias in node.names):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} imports Consumer")
            elif isinstance(node, ast.Attribute) and (
                    (node.attr == "consumer" and not ast.unparse(node.value).endswith("kafka"))
                    or (node.attr == "_consumer" and ast.unparse(node.value) != "self")):
                # `.consumer` is the client factory (KafkaClients.consumer) and nothing else.
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert wrong == []
