"""`init` is idempotent, and the projection's SQL guard holds in a real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

from confluent_kafka.admin import AdminClient

from cronstream.services.monitor.projection import event_rows, fold
from cronstream.services.monitor.store import create_staging, insert_events, upsert_patches
from cronstream.shared.db import apply_migrations, connect, fast_timestamps, migrations, query
from cronstream.shared.kafka.admin import ensure_topics
from cronstream.shared.records import ExecutionEvent, ExecutionStatus
from cronstream.shared.settings import Settings
from tests.support import sql

T0 = datetime(2026, 6, 1, 12, tzinfo=UTC)


def test_topics_are_created_once_with_documented_partitions_and_configs(settings: Settings) -> None:
    specs = settings.topics.specs()
    assert {s.name for s in specs} == set(ensure_topics(settings, specs))
    assert ensure_topics(settings, specs) == [], "a second init creates nothing"
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers})
    metadata = admin.list_topics(timeout=10).topics
    t = settings.topics
    for clock in (t.job_definitions, t.scheduler_state, t.retries):  # one partition per shard
        assert len(metadata[clock].partitions) == settings.scheduler_shards
    assert len(metadata[settings.topics.job_due].partitions) == settings.topic_partitions
    assert len(metadata[settings.topics.execution_events].partitions) == settings.topic_partitions


def test_migrations_apply_once(database_url: str) -> None:
    async def run() -> list[str]:
        conn = await connect(database_url)
        try:
            return await apply_migrations(conn)
        finally:
            await conn.close()

    assert asyncio.run(run()) == [], "the template already holds every migration"
    versions = [r["version"] for r in sql(database_url, "SELECT version FROM schema_migrations")]
    assert versions == [m.version for m in migrations()]
    columns = {r["column_name"] for r in sql(
        database_url, "SELECT column_name FROM information_schema.columns "
                      "WHERE table_name = 'job_executions'")}
    assert {"execution_id", "job_id", "run_id", "status", "scheduled_at", "queued_at", "started_at",
            "completed_at", "worker_id", "attempt_number", "error_message", "result", "progress",
            "progress_message"} <= columns


def event(execution: uuid.UUID, status: ExecutionStatus, second: int, **fields: Any) -> ExecutionEvent:
    return ExecutionEvent(event_id=uuid.uuid4(), execution_id=execution, job_id="j",
                          run_id=uuid.uuid4(), status=status, attempt_number=1, scheduled_at=T0,
                          occurred_at=T0 + timedelta(seconds=second), **fields)


def upsert(url: str, events: list[ExecutionEvent]) -> None:
    async def run() -> None:
        conn = await connect(url)
        try:
            await create_staging(conn)
            async with conn.transaction():
                await upsert_patches(conn, list(fold(events).values()))
        finally:
            await conn.close()

    asyncio.run(run())


def row(url: str, execution: uuid.UUID) -> Any:
    return sql(url, "SELECT * FROM job_executions WHERE execution_id = $1", execution)[0]


def test_guard_terminal_rows_are_never_overwritten(database_url: str) -> None:
    e = uuid.uuid4()
    upsert(database_url, [event(e, "RUNNING", 1, worker_id="w1")])
    upsert(database_url, [event(e, "COMPLETED", 2, worker_id="w1", result={"n": 1})])
    upsert(database_url, [event(e, "FAILED", 3, worker_id="w1", error_message="late")])
    r = row(database_url, e)
    assert (r["status"], r["error_message"]) == ("COMPLETED", None)


def test_guard_stale_deliveries_are_ignored_and_newer_ones_reset_the_run(database_url: str) -> None:
    e = uuid.uuid4()
    upsert(database_url, [event(e, "RUNNING", 1, worker_id="w1"),
                          event(e, "PROGRESS", 2, worker_id="w1", progress=50)])
    upsert(database_url, [event(e, "REQUEUED", 3, delivery=2)])
    r = row(database_url, e)
    assert (r["status"], r["worker_id"], r["progress"], r["delivery"]) == ("QUEUED", None, None, 2)
    upsert(database_url, [event(e, "COMPLETED", 4, worker_id="w1", delivery=1)])
    assert row(database_url, e)["status"] == "QUEUED", "the dead worker's report is stale"
    upsert(database_url, [event(e, "RUNNING", 5, worker_id="w2", delivery=2),
                          event(e, "COMPLETED", 6, worker_id="w2", delivery=2)])
    r = row(database_url, e)
    assert (r["status"], r["worker_id"], r["delivery"]) == ("COMPLETED", "w2", 2)


def test_a_repeated_event_id_is_projected_once_and_the_rest_of_its_batch_lands(
        database_url: str) -> None:
    """Events are COPYed straight into execution_events; one whose id is there already (the
    same event published twice) must neither stop the batch nor be stored twice, and the
    batch's transaction must go on (its patches and offsets are written after)."""
    e = uuid.uuid4()
    queued, running, completed = (event(e, "QUEUED", 1), event(e, "RUNNING", 2, worker_id="w1"),
                                  event(e, "COMPLETED", 3, worker_id="w1"))

    async def run() -> None:
        conn = await connect(database_url)
        try:
            await create_staging(conn)
            async with conn.transaction():
                await insert_events(conn, event_rows([(queued, 0, 10)]))
            async with conn.transaction():
                batch = [queued, running, completed]
                await insert_events(conn, event_rows([(ev, 0, 10 + i) for i, ev in enumerate(batch)]))
                await upsert_patches(conn, list(fold(batch).values()))
        finally:
            await conn.close()

    asyncio.run(run())
    stored = sql(database_url, "SELECT event_id, status, kafka_offset FROM execution_events "
                               "WHERE execution_id = $1 ORDER BY kafka_offset", e)
    assert [(r["event_id"], r["status"], r["kafka_offset"]) for r in stored] == [
        (queued.event_id, "QUEUED", 10), (running.event_id, "RUNNING", 11),
        (completed.event_id, "COMPLETED", 12)]
    assert row(database_url, e)["status"] == "COMPLETED"


def test_a_log_batch_projected_twice_adds_nothing_and_its_end_is_recorded_once(
        database_url: str) -> None:
    """A batch of log lines sent twice (a re-sent final batch, a batch projected again
    after a crash) keeps each line once, in order, the rest of the batch landing."""
    from cronstream.services.monitor.store import insert_logs
    from cronstream.shared.records import JobDefinition, JobDue, LogBatch, render_log_batch

    due = JobDue.first(JobDefinition(job_id="j", type="INTERVAL", interval_seconds=60, handler="h"),
                       T0, "MANUAL")
    lines: list[tuple[float, str, str | None, str]] = [
        (T0.timestamp() + i, "stdout", None, f"line {i}") for i in range(4)]

    def batch(first: int, upto: int, final: bool) -> LogBatch:
        return LogBatch.model_validate_json(render_log_batch(
            due, worker_id="w1", trace_id=None, first_seq=first, lines=lines[first:upto],
            final=final))

    async def run() -> None:
        conn = await connect(database_url)
        try:
            await create_staging(conn)
            async with conn.transaction():
                await insert_logs(conn, [batch(0, 2, False)])
            async with conn.transaction():  # the first again, then the rest and the end
                await insert_logs(conn, [batch(0, 2, False), batch(2, 4, True)])
            async with conn.transaction():
                await insert_logs(conn, [batch(2, 4, True)])
        finally:
            await conn.close()

    asyncio.run(run())
    stored = sql(database_url, "SELECT seq, line FROM execution_logs WHERE execution_id = $1 "
                               "ORDER BY delivery, seq", due.execution_id)
    assert [(r["seq"], r["line"]) for r in stored] == [(i, f"line {i}") for i in range(4)]
    ends = sql(database_url, "SELECT lines FROM execution_log_ends WHERE execution_id = $1",
               due.execution_id)
    assert [r["lines"] for r in ends] == [4]


def test_the_fast_timestamptz_codec_agrees_with_asyncpgs_own(database_url: str) -> None:
    """The monitor's connections encode and decode timestamptz themselves: every value
    asyncpg takes must be stored as asyncpg stores it, and read back as asyncpg reads it."""
    values: list[Any] = [
        datetime(2026, 12, 3, 16, 30, 1, 123456, tzinfo=UTC), datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 3, 29, 1, 30, tzinfo=timezone(timedelta(hours=-5, minutes=-30))),
        datetime(2026, 7, 1, 12, 0, 0, 1), date(2026, 2, 28), datetime.max, datetime.min,
        datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ]

    async def run() -> tuple[list[Any], list[Any], list[Any]]:
        plain, fast = await connect(database_url), await connect(database_url)
        try:
            await fast_timestamps(fast)
            await plain.execute("CREATE TABLE codec_check (i int, by text, t timestamptz)")
            for by, conn in (("plain", plain), ("fast", fast)):
                await conn.copy_records_to_table(
                    "codec_check", records=[(i, by, v) for i, v in enumerate(values)])
            stored = await plain.fetch("SELECT i, by, t::text AS t FROM codec_check ORDER BY by, i")
            read_plain = [r["t"] for r in await plain.fetch(
                "SELECT t FROM codec_check WHERE by = 'plain' ORDER BY i")]
            read_fast = [r["t"] for r in await fast.fetch(
                "SELECT t FROM codec_check WHERE by = 'plain' ORDER BY i")]
            return [r["t"] for r in stored], read_plain, read_fast
        finally:
            await plain.close()
            await fast.close()

    stored, read_plain, read_fast = asyncio.run(run())
    fast_text, plain_text = stored[:len(values)], stored[len(values):]
    assert fast_text == plain_text
    assert "infinity" in plain_text and "-infinity" in plain_text
    assert read_fast == read_plain
    assert [type(v) for v in read_fast] == [type(v) for v in read_plain]
    assert all(v.tzinfo is not None for v in read_fast if v not in (datetime.max, datetime.min))


def test_the_success_rate_is_per_run_in_every_jobs_overview(database_url: str) -> None:
    sql(database_url, """
        INSERT INTO job_definitions (job_id, type, interval_seconds, timezone, trigger_rule, handler,
            max_retries, retry_delay_seconds, max_retry_delay_seconds, timeout_seconds, priority,
            queue, concurrency_policy, misfire_policy, misfire_grace_seconds, enabled, updated_at,
            definition)
        VALUES ('j', 'INTERVAL', 60, 'UTC', 'ALL_SUCCESS', 'noop', 2, 1, 60, 60, 'normal',
                'default', 'ALLOW', 'FIRE_ONCE', 60, true, now(), '{}')""")
    now = datetime.now(UTC).replace(microsecond=0)

    def attempt(run: int, number: int, status: ExecutionStatus) -> list[ExecutionEvent]:
        execution = uuid.uuid5(uuid.NAMESPACE_OID, f"{run}|{number}")
        at = now - timedelta(minutes=10 - run)
        fields: dict[str, Any] = {"execution_id": execution, "job_id": "j",
                                  "run_id": uuid.uuid5(uuid.NAMESPACE_OID, str(run)),
                                  "attempt_number": number, "scheduled_at": at}
        return [ExecutionEvent(event_id=uuid.uuid4(), status="RUNNING", occurred_at=at,
                               started_at=at, **fields),
                ExecutionEvent(event_id=uuid.uuid4(), status=status, started_at=at,
                               occurred_at=at + timedelta(seconds=1),
                               completed_at=at + timedelta(seconds=1), **fields)]

    upsert(database_url, [
        *attempt(1, 1, "FAILED"), *attempt(1, 2, "TIMED_OUT"), *attempt(1, 3, "COMPLETED"),  # one success
        *attempt(2, 1, "PERMANENTLY_FAILED"),                                                   # one failure
        *attempt(3, 1, "COMPLETED"),                                                            # one success
        *attempt(4, 1, "FAILED"),                       # its retry is pending: not ended yet
        *attempt(5, 1, "CANCELLED")])                   # a decision, not an outcome
    overview = sql(database_url, "SELECT finished_24h, succeeded_24h FROM job_overview")
    assert [tuple(r) for r in overview] == [(3, 2)]
    stats = sql(database_url, "SELECT finished, succeeded, success_rate_percent FROM job_stats_24h")[0]
    assert (stats["finished"], stats["succeeded"], float(stats["success_rate_percent"])) == (3, 2, 66.67)
    # `cronstream jobs`, the dashboard's Jobs page and Grafana's job list read the view.
    listed = sql(database_url, query("jobs_list"))[0]
    assert (listed["finished_24h"], listed["succeeded_24h"]) == (3, 2)
    shown = sql(database_url, query("jobs_rows", "ui.sql"), ["j"])[0]
    assert (shown["finished"], shown["succeeded"]) == (3, 2)


def test_a_waiting_execution_keeps_its_reason_and_every_reader_shows_it(database_url: str) -> None:
    e = uuid.uuid4()
    reason = "pool etl: 2 of 2 slots in use"
    upsert(database_url, [event(e, "WAITING", 1, waiting_reason=reason)])
    assert (row(database_url, e)["status"], row(database_url, e)["waiting_reason"]) == ("WAITING", reason)
    assert [r["waiting_reason"] for r in sql(database_url, query("active", "ui.sql"), "WAITING", 10)] == [reason]
    assert sql(database_url, query("execution", "ui.sql"), e, 100)[0]["waiting_reason"] == reason
    assert sql(database_url, query("get_execution"), e)[0]["waiting_reason"] == reason
    assert {r["status"]: r["n"] for r in sql(database_url, query("active_counts", "ui.sql"))} == {"WAITING": 1}
    assert sql(database_url, query("pool_executions", "ui.sql"), 10) == []  # no pool in its snapshot
    upsert(database_url, [event(e, "QUEUED", 2)])
    r = row(database_url, e)
    assert (r["status"], r["waiting_reason"]) == ("QUEUED", reason), "why it started late, kept"
