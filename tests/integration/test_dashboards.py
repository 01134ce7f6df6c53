"""Every SQL panel of the Grafana dashboards on a realistic volume: a migrated database
with 1,000 jobs and 1,000,000 executions over 60 days. Each panel's SQL, expanded as
Grafana expands it, returns the columns its panel reads, and its plan reads the large
tables through an index (asserted on EXPLAIN, never on a time: the times are in
`bench/dashboards.py`). Retention's statements are held to the same rule."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from cronstream.shared.db import query
from deploy.grafana import generate
from tests.conftest import TEMPLATE_DB, _with_db
from tests.seed import seed
from tests.support import sql

LARGE = {"job_executions", "execution_events", "alerts"}
INDEX_NODES = {"Index Scan", "Index Only Scan", "Bitmap Index Scan"}
NOW = datetime.now(UTC)


@pytest.fixture(scope="module")
def seeded(template_db: str) -> Iterator[str]:
    name = f"t_dash_{uuid.uuid4().hex[:8]}"

    async def create() -> None:
        admin = await asyncpg.connect(_with_db(template_db, "postgres"))
        try:
            await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE_DB}"')
        finally:
            await admin.close()
        conn = await asyncpg.connect(_with_db(template_db, name))
        try:
            # Events for one execution in ten: enough for the planner to see a large table.
            await seed(conn, jobs=1000, executions=1_000_000, days=60, events_every=10)
        finally:
            await conn.close()

    async def drop() -> None:
        admin = await asyncpg.connect(_with_db(template_db, "postgres"))
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()

    asyncio.run(create())
    yield _with_db(template_db, name)
    asyncio.run(drop())


def variables(url: str) -> dict[str, str]:
    """Values a person would pick: a job, a DAG root (it has dependents) and its latest run."""
    root = sql(url, generate.sql_blocks()["var_roots"])[0]["job_id"]
    run = sql(url, generate.expand(generate.sql_blocks()["var_runs"], NOW, NOW, 60,
                                   {"root": root}))[0]["run_id"]
    return {"job": "job-0042", "root": root, "run": run}


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def explain(url: str, statement: str, *args: Any) -> list[dict[str, Any]]:
    rows = sql(url, f"EXPLAIN (FORMAT JSON) {statement}", *args)
    document = rows[0][0]
    return list(plan_nodes((json.loads(document) if isinstance(document, str) else document)[0]["Plan"]))


def assert_indexed(nodes: list[dict[str, Any]], what: str) -> None:
    scans = [(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes]
    assert any(kind in INDEX_NODES for kind, _, _ in scans), f"{what}: no index used: {scans}"
    seq = [rel for kind, rel, _ in scans if kind == "Seq Scan" and rel in LARGE]
    assert not seq, f"{what}: scans {seq} sequentially: {scans}"


PANELS = generate.sql_panels()


@pytest.mark.parametrize(("dashboard", "panel"), PANELS, ids=[f"{d.uid}:{p.query}" for d, p in PANELS])
def test_each_sql_panel_returns_its_columns_through_an_index(
    seeded: str, dashboard: generate.Dashboard, panel: generate.Sql,
) -> None:
    start, end = generate.default_range(dashboard, NOW)
    statement = generate.expand(generate.sql_blocks()[panel.query], start, end, 300, variables(seeded))

    async def columns_and_rows() -> tuple[list[str], list[asyncpg.Record]]:
        conn = await asyncpg.connect(seeded)
        try:
            prepared = await conn.prepare(statement)
            return [a.name for a in prepared.get_attributes()], await prepared.fetch()
        finally:
            await conn.close()

    columns, rows = asyncio.run(columns_and_rows())
    assert tuple(columns) == panel.columns
    assert rows, f"{panel.query} returned nothing on the seeded database"
    assert_indexed(explain(seeded, statement), panel.query)


def test_every_variable_query_answers(seeded: str) -> None:
    chosen = variables(seeded)
    assert chosen["root"].startswith("job-") and uuid.UUID(chosen["run"])
    jobs = sql(seeded, generate.sql_blocks()["var_jobs"])
    assert len(jobs) == 1000


def test_retention_finds_what_is_old_through_the_time_indexes(seeded: str) -> None:
    cutoff = NOW - timedelta(days=30)
    for name in ("prune_executions", "prune_alerts", "prune_dag_evaluations"):
        statement = query(name, "retention.sql")
        # EXPLAIN without ANALYZE: nothing is deleted.
        assert_indexed(explain(seeded, statement, cutoff, 1000), name)
    executions = explain(seeded, query("prune_executions", "retention.sql"), cutoff, 1000)
    used = {n.get("Index Name") for n in executions}
    assert "job_executions_scheduled" in used and "execution_events_execution" in used
