"""The monitor's side of run inputs against the real database (and broker): a DAG step
re-queued from a dead worker, or released by an approval, gets the same view of its
upstreams it was decided with; an execution projected before its definition's version
(another monitor's batch) is given it when the version comes; retention keeps each job's
latest version, and older ones as long as the runs that used them."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from cronstream.services.monitor.advance import Decisions
from cronstream.services.monitor.decoding import DefinitionRecord, MonitorBatch
from cronstream.services.monitor.outbound import Outbound
from cronstream.services.monitor.retention import prune
from cronstream.services.monitor.store import ProjectionStore, create_staging
from cronstream.shared.ids import run_id
from cronstream.shared.records import (
    Command,
    ExecutionEvent,
    JobDefinition,
    JobDue,
    JobSnapshot,
)
from cronstream.shared.settings import Settings
from tests.integration.test_dead_worker_requeue import (
    WORKER,
    _produce_at,
    _running_event,
    requeue_dead,
)
from tests.support import read_all, sql, standalone_housekeeping

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


async def _row(conn: PoolConnectionProxy[asyncpg.Record], execution_id: uuid.UUID, job_id: str, run: uuid.UUID,
               status: str, **columns: Any) -> None:
    values: dict[str, Any] = {
        "execution_id": execution_id, "job_id": job_id, "run_id": run, "status": status,
        "scheduled_at": T0, "attempt_number": 1, "delivery": 1, "last_event": status,
        "updated_at": datetime.now(UTC), **columns}
    names = ", ".join(values)
    marks = ", ".join(f"${i}" + ("::jsonb" if name in ("job", "result") else "")
                      for i, name in enumerate(values, start=1))
    await conn.execute(f"INSERT INTO job_executions ({names}) VALUES ({marks})", *values.values())


async def _a_decided_step(conn: PoolConnectionProxy[asyncpg.Record], step: uuid.UUID, status: str, **columns: Any
                          ) -> tuple[uuid.UUID, dict[str, Any]]:
    """A run of `root` (triggered with params) whose `extract` completed, and its step `load`
    (`status`) decided on it; returns the run and the view the step must get."""
    run = run_id("root", T0)
    extract = uuid.uuid4()
    await _row(conn, uuid.uuid4(), "root", run, "COMPLETED", reason="MANUAL",
               job=JobSnapshot(handler="noop", params={"region": "eu"}).model_dump_json())
    await _row(conn, extract, "extract", run, "COMPLETED", reason="DEPENDENCY",
               result=json.dumps({"rows": 3}))
    await _row(conn, step, "load", run, status, reason="DEPENDENCY", idempotency_key="k",
               job=JobSnapshot(handler="noop").model_dump_json(), **columns)
    await conn.execute("INSERT INTO dag_evaluations (run_id, job_id, execution_id, decision, "
                       "upstream_executions) VALUES ($1, 'load', $2, 'RUN', $3)", run, step, [extract])
    view = {"root_params": {"region": "eu"}, "executions": {"extract": {
        "execution_id": str(extract), "status": "COMPLETED", "result": {"rows": 3},
        "result_omitted": False}}}
    return run, view


def test_a_requeued_or_approved_dag_step_gets_the_view_it_was_decided_with(topics: Settings) -> None:
    requeued, awaiting = uuid.uuid4(), uuid.uuid4()

    async def scenario() -> tuple[dict[str, Any], list[Any]]:
        pool = await asyncpg.create_pool(topics.database_url, min_size=1, max_size=2)
        try:
            async with pool.acquire() as conn:
                await conn.execute(
                    "INSERT INTO workers (worker_id, hostname, status, last_heartbeat, capacity, "
                    "updated_at) VALUES ($1, 'host', 'ACTIVE', $2, 4, $2)",
                    WORKER, datetime.now(UTC) - timedelta(minutes=5))
                _, view = await _a_decided_step(conn, requeued, "RUNNING", worker_id=WORKER,
                                                started_at=T0, triggered_by="alice@host")
                await _running_event(conn, requeued, _produce_at(
                    topics, topics.topics.execution_events, b'{"started":"before"}'))


            async def caught_up(ends: list[int], patience: float = 0) -> bool:
                return True

            await requeue_dead(standalone_housekeeping(topics, pool), caught_up)
            async with pool.acquire() as conn:
                await conn.execute("DELETE FROM dag_evaluations; DELETE FROM job_executions")
                await _a_decided_step(conn, awaiting, "AWAITING_APPROVAL")
                command = Command(command="APPROVE", execution_id=awaiting, issued_at=T0,
                                  issued_by="bob@host")
                released = await Decisions(Outbound(topics.topics)).apply(conn, command)
            return view, released
        finally:
            await pool.close()

    view, released = asyncio.run(scenario())
    dues = [JobDue.model_validate_json(m.value() or b"") for m in read_all(topics, topics.topics.job_due)]
    assert [(d.execution_id, d.delivery, d.triggered_by) for d in dues] == [(requeued, 2, "alice@host")]
    assert json.loads(dues[0].upstream.model_dump_json()) == view  # type: ignore[union-attr]
    approved = JobDue.model_validate_json(released[0].value)
    assert (approved.execution_id, approved.approved_by) == (awaiting, "bob@host")
    assert approved.upstream is not None
    assert approved.upstream.executions["extract"].result == {"rows": 3}
    assert approved.upstream.root_params == {"region": "eu"}


def _queued(job_id: str, offset: int) -> ExecutionEvent:
    due = JobDue(execution_id=uuid.uuid4(), job_id=job_id, run_id=uuid.uuid4(), scheduled_at=T0,
                 reason="MANUAL", idempotency_key="k", triggered_by="carol@host",
                 job=JobSnapshot(handler="noop", definition_offset=offset))
    return ExecutionEvent.for_due(due, "QUEUED", job=due.job, reason="MANUAL",
                                  triggered_by=due.triggered_by)


def _definition(job_id: str, offset: int, params: dict[str, Any] | None) -> DefinitionRecord:
    document = None if params is None else JobDefinition(
        job_id=job_id, type="INTERVAL", interval_seconds=60, handler="noop", params=params,
        created_by="dave@host")
    return DefinitionRecord(job_id, document, T0 + timedelta(seconds=offset), 0, offset,
                            deleted_by="erin@host" if params is None else None)


def test_an_execution_projected_before_its_definition_gets_its_version_when_it_comes(
    topics: Settings,
) -> None:
    t = topics.topics

    async def project(store: ProjectionStore, batch: MonitorBatch) -> None:
        async with store.transaction(batch) as fresh:
            await store.write(fresh)

    async def scenario() -> None:
        pool = await asyncpg.create_pool(topics.database_url, min_size=1, max_size=2,
                                         init=create_staging)
        store = ProjectionStore(pool, "test", t)
        try:
            # One batch: versions 1 and 2, and an execution of version 2 (projected first).
            batch = MonitorBatch(definitions=[_definition("job", 3, {"n": 1}), _definition("job", 5, {"n": 2})])
            early = _queued("job", 5)
            batch.events = [(early, 0, 0)]
            for topic, partition, offset in ((t.job_definitions, 0, 3), (t.job_definitions, 0, 5),
                                             (t.execution_events, 0, 0)):
                batch.seen(topic, partition, offset)
            await project(store, batch)
            # An execution of a definition another monitor has not projected yet...
            late = _queued("job", 9)
            batch = MonitorBatch(events=[(late, 0, 1)])
            batch.seen(t.execution_events, 0, 1)
            await project(store, batch)
            assert await pool.fetchval("SELECT definition_version FROM job_executions "
                                       "WHERE execution_id = $1", late.execution_id) is None
            # ...named when it comes: a delete (version 3), then the re-create (version 4).
            batch = MonitorBatch(definitions=[_definition("job", 7, None), _definition("job", 9, {"n": 3})])
            batch.seen(t.job_definitions, 0, 7)
            batch.seen(t.job_definitions, 0, 9)
            await project(store, batch)
        finally:
            await pool.close()

    asyncio.run(scenario())
    url = topics.database_url
    assert [(r["version"], r["created_by"], r["definition"] is None, r["kafka_offset"])
            for r in sql(url, "SELECT * FROM job_definition_versions ORDER BY version")] == [
        (1, "dave@host", False, 3), (2, "dave@host", False, 5), (3, "erin@host", True, 7),
        (4, "dave@host", False, 9)]
    assert sorted((r["definition_version"], r["triggered_by"]) for r in sql(
        url, "SELECT * FROM job_executions")) == [(2, "carol@host"), (4, "carol@host")]
    current = sql(url, "SELECT version, definition_offset, deleted_at FROM job_definitions")[0]
    assert (current["version"], current["definition_offset"], current["deleted_at"]) == (4, 9, None)


def test_retention_keeps_each_jobs_latest_version_and_those_current_within_it(
    settings: Settings,
) -> None:
    now = datetime.now(UTC)
    ages = {"changed": [100, 90, 10], "untouched": [400], "deleted": [200, 150]}

    async def scenario() -> None:
        conn = await asyncpg.connect(settings.database_url)
        try:
            for job_id, days in ages.items():
                for n, age in enumerate(days, start=1):
                    deleted = job_id == "deleted" and n == len(days)
                    await conn.execute(
                        "INSERT INTO job_definition_versions (job_id, version, definition, "
                        "recorded_at, kafka_offset) VALUES ($1, $2, $3::jsonb, $4, $5)",
                        job_id, n, None if deleted else '{"handler": "noop"}',
                        now - timedelta(days=age), n)
            await prune(conn, now - timedelta(days=30), 1)
        finally:
            await conn.close()

    asyncio.run(scenario())
    kept = [(r["job_id"], r["version"]) for r in sql(
        settings.database_url, "SELECT job_id, version FROM job_definition_versions ORDER BY 1, 2")]
    # changed v1 was replaced 90 days ago: gone; v2 was current until 10 days ago: kept.
    assert kept == [("changed", 2), ("changed", 3), ("deleted", 2), ("untouched", 1)]
