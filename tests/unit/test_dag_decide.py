"""DAG steps: trigger rules, conditions and approval, decided from upstream outcomes."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import pytest

from cronstream.services.monitor.dag import decide, trigger_rule_holds, upstream_view


def definition(**fields: Any) -> dict[str, Any]:
    return {"depends_on": ["a", "b"], "trigger_rule": "ALL_SUCCESS", **fields}


def up(a: str, b: str, result: Any = None) -> dict[str, dict[str, Any]]:
    return {"a": {"status": a, "result": result}, "b": {"status": b, "result": None}}


@pytest.mark.parametrize(("rule", "statuses", "holds"), [
    ("ALL_SUCCESS", ["COMPLETED", "COMPLETED"], True),
    ("ALL_SUCCESS", ["COMPLETED", "SKIPPED"], False),
    ("ALL_DONE", ["PERMANENTLY_FAILED", "CANCELLED"], True),
    ("ONE_SUCCESS", ["PERMANENTLY_FAILED", "COMPLETED"], True),
    ("ONE_SUCCESS", ["SKIPPED", "CANCELLED"], False),
    ("ONE_FAILED", ["COMPLETED", "PERMANENTLY_FAILED"], True),
    ("ONE_FAILED", ["COMPLETED", "SKIPPED"], False),
    ("NONE_FAILED", ["COMPLETED", "SKIPPED"], True),
    ("NONE_FAILED", ["CANCELLED", "PERMANENTLY_FAILED"], False),
])
def test_trigger_rules(rule: str, statuses: list[str], holds: bool) -> None:
    assert trigger_rule_holds(rule, statuses) is holds


def test_all_upstreams_completed_runs() -> None:
    verdict = decide(definition(), up("COMPLETED", "COMPLETED"))
    assert verdict.decision == "RUN"


def test_a_rule_that_does_not_hold_skips_and_says_why() -> None:
    verdict = decide(definition(), up("COMPLETED", "PERMANENTLY_FAILED"))
    assert verdict.decision == "SKIP"
    assert "ALL_SUCCESS" in verdict.detail and "b=PERMANENTLY_FAILED" in verdict.detail


def test_a_false_condition_skips_with_the_condition() -> None:
    verdict = decide(definition(condition="a.result.rows > 10"), up("COMPLETED", "COMPLETED", {"rows": 3}))
    assert verdict.decision == "SKIP" and "a.result.rows > 10" in verdict.detail
    assert decide(definition(condition="a.result.rows > 1"),
                  up("COMPLETED", "COMPLETED", {"rows": 3})).decision == "RUN"


def test_approval_parks_only_when_the_step_would_run() -> None:
    assert decide(definition(requires_approval=True), up("COMPLETED", "COMPLETED")).decision \
        == "AWAIT_APPROVAL"
    assert decide(definition(requires_approval=True), up("SKIPPED", "COMPLETED")).decision == "SKIP"


def test_upstream_view_reads_json_results() -> None:
    a, b = uuid4(), uuid4()
    view = upstream_view([{"job_id": "a", "execution_id": a, "status": "COMPLETED",
                           "result": '{"rows": 2}'},
                          {"job_id": "b", "execution_id": b, "status": "SKIPPED", "result": None}])
    assert view == {"a": {"status": "COMPLETED", "execution_id": a, "result": {"rows": 2}},
                    "b": {"status": "SKIPPED", "execution_id": b, "result": None}}
