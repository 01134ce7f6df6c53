"""What a DAG step sees of its run (`ctx.upstream`), read from the projection.

A step's JobDue carries its view: the final execution of each upstream in the run, and
the params the run's root ran with (a trigger's overlay included). It is built when the
step is decided (advance.py), from the executions that made it due, whose ids the
evaluation keeps (`dag_evaluations.upstream_executions`); an approval and a requeue build
it again from those same executions, which are final and do not change. Results beyond
what the record can carry are left out and marked (records.Upstream.of, decision 0035).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

from cronstream.shared.db import query
from cronstream.shared.ids import run_id as run_id_of
from cronstream.shared.records import Upstream


async def root_params(conn: Any, run: UUID) -> dict[str, Any]:
    """The params the root of `run` ran with: of the first attempt whose job and
    scheduled_at derive the run's id ({} when it is not projected)."""
    for row in await conn.fetch(query("run_first_attempts"), run):
        if run_id_of(row["job_id"], row["scheduled_at"]) == run:
            params = json.loads(row["params"]) if row["params"] else {}
            return params if isinstance(params, dict) else {}
    return {}


async def decided_view(conn: Any, run: UUID, depends_on: Sequence[str],
                       finals: Mapping[str, Mapping[str, Any]]) -> Upstream:
    """The view of a step decided now: `finals[job_id]` holds each upstream's final
    execution (execution_id, status, result), taken in `depends_on` order."""
    return Upstream.of(await root_params(conn, run), [
        (job_id, finals[job_id]["execution_id"], finals[job_id]["status"],
         finals[job_id]["result"]) for job_id in depends_on])


async def step_upstream(conn: Any, run: UUID, job_id: str) -> Upstream | None:
    """The view of the step `job_id` of `run` as it was decided, or None when it is not a
    DAG step (or was decided before views were kept)."""
    rows = await conn.fetch(query("step_upstream"), run, job_id)
    if not rows:
        return None
    return Upstream.of(await root_params(conn, run), [
        (r["job_id"], r["execution_id"], r["status"],
         None if r["result"] is None else json.loads(r["result"])) for r in rows])
