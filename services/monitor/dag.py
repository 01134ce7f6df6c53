"""DAG advancement: what a DEPENDENT job does once its upstreams are final in a run.

A scheduled job's fire starts a run (its `run_id`). When an execution of that run
becomes *final* — its latest attempt COMPLETED, PERMANENTLY_FAILED, CANCELLED or SKIPPED
(a FAILED attempt with a retry pending is not final) — every DEPENDENT job downstream of
it whose upstreams are all final is evaluated, once per run (a `dag_evaluations` row,
written in the projection's transaction, makes it once):

1. `trigger_rule` over the upstream outcomes
   - ALL_SUCCESS: every upstream COMPLETED        - ALL_DONE: always
   - ONE_SUCCESS: at least one COMPLETED          - ONE_FAILED: at least one PERMANENTLY_FAILED
   - NONE_FAILED: none PERMANENTLY_FAILED (SKIPPED and CANCELLED are not failures)
2. `condition` (shared/condition.py) over the upstreams' status and result;
3. `requires_approval`: park in AWAITING_APPROVAL until `approve` / `reject`.
What does not run is recorded SKIPPED with the reason. The step's execution_id is
derived from (job_id, run_id), so a repeated evaluation re-issues the same execution.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from cronstream.shared.condition import parse_condition
from cronstream.shared.statuses import FINAL

DAG_FINAL = FINAL  # terminal, and no retry will follow

Decision = Literal["RUN", "SKIP", "AWAIT_APPROVAL"]


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Decision
    detail: str


def trigger_rule_holds(rule: str, statuses: list[str]) -> bool:
    if rule == "ALL_SUCCESS":
        return all(s == "COMPLETED" for s in statuses)
    if rule == "ALL_DONE":
        return True
    if rule == "ONE_SUCCESS":
        return any(s == "COMPLETED" for s in statuses)
    if rule == "ONE_FAILED":
        return any(s == "PERMANENTLY_FAILED" for s in statuses)
    if rule == "NONE_FAILED":
        return not any(s == "PERMANENTLY_FAILED" for s in statuses)
    raise ValueError(f"unknown trigger rule {rule!r}")


def decide(definition: Mapping[str, Any], upstream: Mapping[str, Mapping[str, Any]]) -> Verdict:
    """`upstream[job_id]` = {"status": final status, "result": result} for every upstream."""
    statuses = [upstream[j]["status"] for j in definition["depends_on"]]
    rule = definition.get("trigger_rule") or "ALL_SUCCESS"
    if not trigger_rule_holds(rule, statuses):
        summary = ", ".join(f"{j}={upstream[j]['status']}" for j in definition["depends_on"])
        return Verdict("SKIP", f"skipped: trigger rule {rule} does not hold ({summary})")
    condition = definition.get("condition")
    if condition and not parse_condition(condition, definition["depends_on"]).evaluate(upstream):
        return Verdict("SKIP", f"skipped: condition is false: {condition}")
    if definition.get("requires_approval"):
        return Verdict("AWAIT_APPROVAL", "waiting for approval (cronstream approve / reject)")
    return Verdict("RUN", f"upstreams final; trigger rule {rule} holds")


def upstream_view(rows: list[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """From the latest attempt of each upstream in the run: its status, result and
    execution_id."""
    view: dict[str, dict[str, Any]] = {}
    for row in rows:
        result = row["result"]
        view[row["job_id"]] = {"status": row["status"], "execution_id": row.get("execution_id"),
                               "result": json.loads(result) if isinstance(result, str) else result}
    return view
