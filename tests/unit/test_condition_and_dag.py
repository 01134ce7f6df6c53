"""DAG conditions (a safe expression language) and the DAG shape rules."""

from __future__ import annotations

from typing import Any

import pytest

from cronstream.shared.condition import ConditionError, parse_condition
from cronstream.shared.dag import dag_problem

UP: dict[str, dict[str, Any]] = {"extract": {"status": "COMPLETED", "result": {"rows": 12, "regions": ["eu", "us"],
                                                    "items": [{"ok": True}]}},
      "validate": {"status": "COMPLETED", "result": {"warnings": []}},
      "etl.v2": {"status": "PERMANENTLY_FAILED", "result": None}}


@pytest.mark.parametrize(("text", "expected"), [
    ("extract.result.rows > 0 and not validate.result.warnings", True),
    ("extract.result.rows > 100 or validate.result.warnings", False),
    ('"eu" in extract.result.regions', True),
    ("'asia' not in extract.result.regions", True),
    ('extract.status == "COMPLETED" and etl.v2.status != "COMPLETED"', True),
    ("extract.result.items[0].ok == true", True),
    ("extract.result.missing.deeper == null", True),
    ("extract.result.rows > 'a'", False),
    ("not (extract.result.rows >= 12)", False),
    ("extract.result.rows in [1, 2, 12]", True),
    ("etl.v2.result", False),
    ("extract.result.rows == 12.0", True),
    ("true == 1", False),
])
def test_evaluation(text: str, expected: bool) -> None:
    assert parse_condition(text, ["extract", "validate", "etl.v2"]).evaluate(UP) is expected


@pytest.mark.parametrize(("text", "needle"), [
    ("", "empty condition"),
    ("extract.result.rows >", "unexpected end"),
    ("extract.result.rows > 0 and", "unexpected end"),
    ("other.result.x", "does not start with an upstream job id"),
    ("extract.rows > 1", "comes .result or .status"),
    ("extract.status.code", "status has no fields"),
    ("__import__('os')", "does not start with an upstream"),
    ("extract.result.rows ; 1", "unexpected character ';'"),
    ("(extract.result.rows > 1", "expected ')'"),
])
def test_parse_errors_say_where(text: str, needle: str) -> None:
    with pytest.raises(ConditionError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        parse_condition(text, ["extract", "validate"])


def graph(edges: dict[str, Any]) -> tuple[Any, Any]:
    def lookup(job_id: str) -> tuple[str, list[str]] | None:
        if job_id not in edges:
            return None
        ups = edges[job_id]
        return ("CRON", []) if ups is None else ("DEPENDENT", list(ups))

    def downstream(job_id: str) -> list[str]:
        return [j for j, ups in edges.items() if ups and job_id in ups]

    return lookup, downstream


def test_a_diamond_with_one_root_is_fine() -> None:
    lookup, down = graph({"root": None, "a": ["root"], "b": ["root"], "join": ["a", "b"]})
    assert dag_problem("join", lookup, down) is None


def test_cycles_and_second_roots_are_refused() -> None:
    lookup, down = graph({"root": None, "a": ["root", "c"], "b": ["a"], "c": ["b"]})
    assert "cycle a -> c -> b -> a" in (dag_problem("a", lookup, down) or "")
    lookup, down = graph({"r1": None, "r2": None, "a": ["r1"], "join": ["a", "r2"]})
    assert "more than one scheduled root" in (dag_problem("join", lookup, down) or "")
    # Changing `a` to depend on r2 gives its downstream `join` a second root.
    lookup, down = graph({"r1": None, "r2": None, "a": ["r2"], "join": ["a", "r1"]})
    assert "through downstream job 'join'" in (dag_problem("a", lookup, down) or "")
