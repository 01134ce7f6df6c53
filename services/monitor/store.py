"""The fenced PostgreSQL projection: one transaction per batch, with its offsets.

Each batch is written in one transaction together with the batch's next offsets
(`consumer_offsets`), so a crash at any point neither loses nor doubles a row: on
assignment the monitor resumes from the offsets in PostgreSQL, not Kafka's.

The fence (docs/decisions/0005): the offset rows of the batch's partitions are locked
first, in a fixed order, and whatever lies below the stored offset was projected already
(around a rebalance two monitors can hold records of one partition) and is left out.

PostgreSQL text cannot hold NUL characters, which JSON can carry ("\\u0000"): a batch
refused for its characters is written again with them replaced (U+FFFD), rather than
stopping the projection for good.

Log lines are kept within their delivery's bounds (log_bounds.py): what each delivery
holds is read once per batch, and written back once per delivery, in the same transaction.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import asyncpg
from confluent_kafka import Message

from cronstream.services.monitor.decoding import (
    CalendarRecord,
    ConsumedLog,
    DefinitionRecord,
    MonitorBatch,
)
from cronstream.services.monitor.log_bounds import (
    DEFAULT_LIMIT,
    Admitted,
    DeliveryLog,
    ExecutionState,
    Key,
    admit,
)
from cronstream.services.monitor.projection import (
    ExecutionPatch,
    alert_arrays,
    event_rows,
    fold,
    heartbeat_arrays,
    patch_rows,
)
from cronstream.shared.calendars import ResolvedCalendar, resolve
from cronstream.shared.db import query
from cronstream.shared.fast_records import EventRecord
from cronstream.shared.logs import log
from cronstream.shared.records import Alert, Calendar, Command, Heartbeat, LogBatch, now_utc
from cronstream.shared.schedule import next_fire
from cronstream.shared.statuses import TERMINAL
from cronstream.shared.topics import Topics

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RefusedLog:
    """A log record some of whose lines were not kept: dead-lettered with `reason`, its
    refused lines counted by why (`lines`) once the batch commits."""

    message: Message
    reason: str
    lines: dict[str, int]


@dataclass
class Fresh:
    """The part of a batch not projected yet, inside its open transaction."""

    conn: Any
    events: list[tuple[EventRecord, int, int]] = field(default_factory=list)
    beats: list[Heartbeat] = field(default_factory=list)
    definitions: list[DefinitionRecord] = field(default_factory=list)
    calendars: list[CalendarRecord] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    alerts: list[tuple[Alert, int, int]] = field(default_factory=list)
    logs: list[ConsumedLog] = field(default_factory=list)
    dead: list[Any] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    traces: dict[Any, str] = field(default_factory=dict)  # event_id -> traceparent
    refused: list[RefusedLog] = field(default_factory=list)  # log records with lines not kept

    @property
    def count(self) -> int:
        return len(self.events) + len(self.beats) + len(self.definitions) + len(self.commands) \
            + len(self.alerts) + len(self.logs) + len(self.calendars)


def clean(value: Any) -> Any:
    """A value PostgreSQL text and jsonb accept: NUL replaced by U+FFFD."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd").replace("\\u0000", "\\ufffd")
    return value


def cleaned(columns: list[list[Any]]) -> list[list[Any]]:
    return [[clean(v) for v in column] for column in columns]


def sanitized(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [tuple([clean(v) for v in row]) for row in rows]


async def create_staging(conn: asyncpg.Connection) -> None:
    """The connection's staging tables (once per connection, before its first batch)."""
    await conn.execute(query("create_staging"))


async def stage(conn: Any, table: str, rows: list[tuple[Any, ...]], sanitize: bool = False) -> None:
    """COPY `rows` into the staging `table`, in the open transaction (they are gone at
    its end: ON COMMIT DELETE ROWS)."""
    await conn.copy_records_to_table(table, records=sanitized(rows) if sanitize else rows)


# execution_events' columns in `event_rows`' order (recorded_at takes its default).
_EVENT_COLUMNS = (
    "event_id", "execution_id", "job_id", "run_id", "status", "attempt_number", "delivery",
    "scheduled_at", "occurred_at", "worker_id", "started_at", "completed_at", "error_message",
    "result", "progress", "progress_message", "kafka_partition", "kafka_offset", "trace_id",
)


# execution_logs' columns in `log_rows`' order (projected_at takes its default).
_LOG_COLUMNS = ("execution_id", "delivery", "seq", "job_id", "attempt_number", "at", "stream",
                "level", "line", "worker_id", "trace_id")


async def append(conn: Any, table: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]], *,
                 staged: str, insert: str) -> None:
    """Append `rows` to `table`, in the open transaction: COPYed straight into the table:
    PostgreSQL then writes each row once, not twice through the staging table. A key the
    table holds already (an event published twice: the log is at-least-once for whoever
    writes it from outside; a batch projected again) refuses that COPY, in a savepoint so
    that the batch's transaction goes on; the rows then go through the `staged` table,
    whose `insert` skips the repeats (docs/decisions/0015)."""
    try:
        async with conn.transaction():
            await conn.copy_records_to_table(table, records=rows, columns=columns)
        return
    except asyncpg.UniqueViolationError:
        log(logger, "repeated_rows_skipped", table=table, rows=len(rows),
            reason="a key of the batch is projected already")
    await stage(conn, staged, rows)
    await conn.execute(query(insert))


async def insert_events(conn: Any, rows: list[tuple[Any, ...]], sanitize: bool = False) -> None:
    """Append `rows` to `execution_events` (`append`)."""
    await append(conn, "execution_events", _EVENT_COLUMNS, sanitized(rows) if sanitize else rows,
                 staged="staged_events", insert="insert_events")


def log_rows(admitted: list[Admitted]) -> list[tuple[Any, ...]]:
    """Rows of `execution_logs` (in _LOG_COLUMNS' order): the lines kept of each batch."""
    return [(b.execution_id, b.delivery, line.seq, b.job_id, b.attempt_number, line.at,
             line.stream, line.level, line.text, b.worker_id, b.trace_id)
            for a in admitted for b in (a.batch,) for line in a.lines]


def without_nul(batch: LogBatch) -> LogBatch:
    """`batch` with NUL characters replaced (U+FFFD): a worker escapes them, a record
    written by hand may not."""
    return batch.model_copy(update={"lines": [line.model_copy(update={
        "text": line.text.replace("\x00", "\ufffd"),
        "level": None if line.level is None else line.level.replace("\x00", "\ufffd")})
        for line in batch.lines]})


async def delivery_logs(conn: Any, batches: list[LogBatch]
                        ) -> tuple[dict[Key, DeliveryLog], dict[UUID, ExecutionState],
                                   set[tuple[UUID, int, int]]]:
    """What the deliveries of `batches` hold where they are kept, their executions, and
    which of the batches' lines below a delivery's next_seq the log holds already (asked
    only when there are such lines: a batch sent twice, not the common case)."""
    keys = list(dict.fromkeys((b.execution_id, b.delivery) for b in batches))
    deliveries: dict[Key, DeliveryLog] = {}
    executions: dict[UUID, ExecutionState] = {}
    for r in await conn.fetch(query("log_states"), [k[0] for k in keys], [k[1] for k in keys],
                              list(TERMINAL)):
        key = (r["execution_id"], r["delivery"])
        deliveries[key] = DeliveryLog(
            r["handler_bytes"] or 0, r["note_bytes"] or 0, r["next_seq"] or 0, bool(r["cut"]),
            r["end_lines"])
        executions[key[0]] = ExecutionState(r["terminal"], r["execution_delivery"],
                                            r["execution_ended"])
    below = [(b.execution_id, b.delivery, line.seq) for b in batches
             for line in b.lines if line.seq < deliveries[b.execution_id, b.delivery].next_seq]
    repeats: set[tuple[UUID, int, int]] = set()
    if below:
        repeats = {(r["execution_id"], r["delivery"], r["seq"]) for r in await conn.fetch(
            query("kept_log_seqs"), [x[0] for x in below], [x[1] for x in below],
            [x[2] for x in below])}
    return deliveries, executions, repeats


async def insert_logs(conn: Any, batches: list[LogBatch], limit: int = DEFAULT_LIMIT,
                      sanitize: bool = False) -> list[Admitted]:
    """The lines of `batches` that their deliveries' bounds admit (log_bounds.py), with
    what each delivery then holds, and the end of each delivery whose final batch is
    among them; returns each batch's outcome, in order. `sanitize`: the batch is written
    again after PostgreSQL refused its characters (NUL replaced, as in the rest of it)."""
    if sanitize:
        batches = [without_nul(b) for b in batches]
    deliveries, executions, repeats = await delivery_logs(conn, batches)
    admitted = admit(batches, deliveries, executions, repeats, limit)
    rows = log_rows(admitted)
    if rows:
        await append(conn, "execution_logs", _LOG_COLUMNS, rows, staged="staged_log_lines",
                     insert="insert_log_lines")
    changed = [(k, d) for k, d in deliveries.items() if d.changed]
    if changed:
        await conn.execute(query("upsert_log_sizes"), [k[0] for k, _ in changed],
                           [k[1] for k, _ in changed], [d.handler_bytes for _, d in changed],
                           [d.note_bytes for _, d in changed], [d.next_seq for _, d in changed],
                           [d.cut for _, d in changed])
    ends = [a for a in admitted if a.end is not None]
    if ends:
        await conn.execute(query("insert_log_ends"), [a.batch.execution_id for a in ends],
                           [a.batch.delivery for a in ends], [a.end for a in ends],
                           [a.batch.lines[-1].at if a.batch.lines else now_utc() for a in ends])
    return admitted


async def upsert_patches(conn: Any, patches: list[ExecutionPatch], sanitize: bool = False) -> None:
    """Apply the patches to `job_executions` through the transition guard, in the open
    transaction."""
    await stage(conn, "staged_executions", patch_rows(patches), sanitize)
    await conn.execute(query("upsert_executions"))


def unprojected(conn: Any, batch: MonitorBatch, stored: dict[tuple[str, int], int],
                topics: Topics) -> Fresh:
    """The part of `batch` at or past the `stored` offsets of its partitions, to write on
    `conn`: what lies below was projected already (the fence). The offsets to store
    after it never move back."""
    t = topics

    def new(topic: str, partition: int, offset: int) -> bool:
        return offset >= stored.get((topic, partition), 0)

    return Fresh(
        conn,
        events=[e for e in batch.events if new(t.execution_events, e[1], e[2])],
        beats=[b for b, p, o in batch.beats if new(t.heartbeats, p, o)],
        definitions=[d for d in batch.definitions
                     if new(t.job_definitions, d.partition, d.offset)],
        calendars=[c for c in batch.calendars if new(t.calendars, c.partition, c.offset)],
        commands=[c for c, p, o in batch.commands if new(t.commands, p, o)],
        alerts=[a for a in batch.alerts if new(t.alerts, a[1], a[2])],
        logs=[c for c in batch.logs if new(t.execution_logs, c.partition, c.offset)],
        dead=[r for r, topic, p, o in batch.dead if new(topic, p, o)],
        offsets={k: max(v, stored.get(k, 0)) for k, v in batch.offsets.items()},
        traces=batch.traces,
    )


class ProjectionStore:
    def __init__(self, pool: asyncpg.Pool, group: str, topics: Topics, *,
                 log_limit: int = DEFAULT_LIMIT) -> None:
        self.pool = pool
        self.group = group
        self.topics = topics
        self.log_limit = log_limit  # bytes of an attempt's log (log_bounds.py)

    async def stored_offsets(self) -> dict[tuple[str, int], int]:
        rows = await self.pool.fetch(query("load_offsets"), self.group)
        return {(r["topic"], r["partition"]): r["next_offset"] for r in rows}

    @asynccontextmanager
    async def transaction(self, batch: MonitorBatch) -> AsyncIterator[Fresh]:
        """Open the batch's transaction, fence it, yield its fresh part; on a clean exit
        store the batch's offsets and commit."""
        async with self.pool.acquire() as conn, conn.transaction():
            stored = await self._fence(conn, batch)
            fresh = unprojected(conn, batch, stored, self.topics)
            yield fresh
            await conn.execute(
                query("store_offsets"), self.group, [k[0] for k in fresh.offsets],
                [k[1] for k in fresh.offsets], list(fresh.offsets.values()))

    async def _fence(self, conn: Any, batch: MonitorBatch) -> dict[tuple[str, int], int]:
        """Lock the offset rows of the batch's partitions (in a fixed order) and return
        them."""
        keys = sorted(batch.starts)
        topics, partitions = [t for t, _ in keys], [p for _, p in keys]
        await conn.execute(query("ensure_offsets"), self.group, topics, partitions,
                           [batch.starts[k] for k in keys])
        stored = {(r["topic"], r["partition"]): r["next_offset"]
                  for r in await conn.fetch(query("lock_offsets"), self.group, topics, partitions)}
        overlap = [k for k in keys if stored.get(k, 0) > batch.starts[k]]
        if overlap:
            log(logger, "projected_records_skipped", partitions=len(overlap),
                reason="already projected (a rebalance moved the partition)")
        return stored

    async def write(self, fresh: Fresh, sanitize: bool = False) -> list[ExecutionPatch]:
        """Project the fresh records; returns the execution patches written."""
        conn = fresh.conn
        tidy = cleaned if sanitize else (lambda columns: columns)
        patches: list[ExecutionPatch] = []
        # Calendars first, then definitions: a definition's next run reads its calendar, and
        # an execution of a definition projected in the same batch names its version at once.
        for calendar in fresh.calendars:
            await self._calendar(conn, calendar, sanitize)
        for record in fresh.definitions:
            await self._definition(conn, record, sanitize)
        if fresh.events:
            await insert_events(conn, event_rows(fresh.events, fresh.traces), sanitize)
            patches = sorted(fold([e for e, _, _ in fresh.events], fresh.traces).values(),
                             key=lambda p: p.execution_id)
            await upsert_patches(conn, patches, sanitize)
        if fresh.beats:
            await conn.execute(query("upsert_workers"), *tidy(heartbeat_arrays(fresh.beats)))
        if fresh.alerts:
            await conn.execute(query("upsert_alerts"), *tidy(alert_arrays(fresh.alerts)))
        if fresh.logs:
            admitted = await insert_logs(conn, [c.batch for c in fresh.logs], self.log_limit,
                                         sanitize)
            fresh.refused = [RefusedLog(c.message, a.reason(self.log_limit), dict(a.refused))
                             for c, a in zip(fresh.logs, admitted, strict=True) if a.refused]
        return patches

    async def _definition(self, conn: Any, record: DefinitionRecord, sanitize: bool) -> None:
        """A definition (or a delete) of `job-definitions`: the job's row, its DAG edges and
        its next version (history), with the executions that ran it and were projected
        before it (another monitor's batch) given that version."""
        job_id, d, seen_at = record.job_id, record.definition, record.recorded_at
        document = None if d is None else d.model_dump_json()
        if sanitize and document is not None:
            document = clean(document)
        version = await conn.fetchval(
            query("insert_definition_version"), job_id, document,
            d.created_by if d is not None else record.deleted_by, seen_at, record.offset)
        if version is not None:
            await conn.execute(query("resolve_version_of_executions"), job_id, record.offset, version)
        if d is None:
            await conn.execute(query("delete_definition"), job_id, seen_at, version)
            await conn.execute(query("delete_dependencies"), job_id)
            return
        upcoming = None
        if d.enabled and d.type != "DEPENDENT":
            try:
                calendar = None if d.calendar is None else (
                    await calendars_of(conn, [d.calendar])).get(d.calendar)
                upcoming = next_fire(d, max(now_utc(), seen_at), calendar=calendar)
            except Exception as exc:  # the scheduler suspends such a job; show no next run
                log(logger, "next_fire_unknown", logging.WARNING, job_id=job_id, error=str(exc)[:300])
        args: list[Any] = [
            d.job_id, d.name, d.type, d.schedule, d.interval_seconds, d.run_at, d.timezone,
            d.start_at, d.end_at, list(d.depends_on), d.trigger_rule, d.condition,
            d.requires_approval, d.handler, json.dumps(d.params), d.max_retries,
            d.retry_delay_seconds, d.max_retry_delay_seconds, d.timeout_seconds, d.priority,
            d.queue, d.concurrency_policy, d.misfire_policy, d.misfire_grace_seconds, d.enabled,
            d.created_by, d.created_at, upcoming, seen_at, document, version, record.offset,
            d.calendar, d.on_excluded, d.jitter_seconds, d.max_runs,
        ]
        if sanitize:
            args = [clean(a) for a in args]
        await conn.execute(query("upsert_definition"), *args)
        await conn.execute(query("delete_dependencies"), job_id)
        if d.depends_on:
            await conn.execute(query("insert_dependencies"), job_id, list(d.depends_on))

    async def _calendar(self, conn: Any, record: CalendarRecord, sanitize: bool) -> None:
        """A calendar (or a delete) of `calendars`: its next version (history), its current
        form, and the jobs that name it due for a new next run (housekeeping)."""
        c = record.calendar
        document = None if c is None else c.model_dump_json()
        if sanitize and document is not None:
            document = clean(document)
        who = c.created_by if c is not None else record.deleted_by
        version = await conn.fetchval(query("insert_calendar_version"), record.calendar_id, document,
                                      who, record.recorded_at, record.offset)
        if version is None:
            return  # a delete of nothing, or a record projected already
        await conn.execute(query("upsert_calendar"), record.calendar_id,
                           None if c is None else c.timezone, document, version, who,
                           record.recorded_at)
        await conn.execute(query("replan_calendar_jobs"), record.calendar_id)


async def calendars_of(conn: Any, ids: list[str]) -> dict[str, ResolvedCalendar]:
    """The current calendars of `ids` as projected, resolved (each version built once:
    shared/calendars.py); a calendar that is missing or does not read is left out."""
    found: dict[str, ResolvedCalendar] = {}
    for row in await conn.fetch(query("calendar_documents"), ids):
        try:
            found[row["calendar_id"]] = resolve(Calendar.model_validate_json(row["definition"]))
        except ValueError as exc:
            log(logger, "calendar_unreadable", logging.WARNING, calendar_id=row["calendar_id"],
                error=str(exc)[:300])
    return found
