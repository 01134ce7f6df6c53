"""The Python SDK: publish and control jobs, read executions.

    from cronstream import Client

    with Client() as client:
        client.apply([{"job_id": "nightly", "type": "CRON", "schedule": "0 2 * * *",
                       "timezone": "Europe/Berlin", "handler": "reports.daily"}])
        client.pause("nightly")
        client.trigger("nightly", params={"region": "eu"})   # the job's params, overlaid
        for run in client.runs("nightly", limit=5):
            print(run.status, run.completed_at)

    async with AsyncClient() as client:          # the same, for asyncio applications
        await client.trigger("nightly")

`AsyncClient` does the work; `Client` runs one on a private event loop in a thread of its
own, so it is safe to call from any thread, from code that has no event loop and from
code that has one (it never calls `asyncio.run()`; inside a coroutine prefer
`AsyncClient`, which does not block the caller's loop).

Definitions are validated before anything is sent (models or plain mappings; ISO 8601
strings for times; an unknown field is an error naming it): a bad one raises
`DefinitionError` naming the job and the field, and nothing of the batch is published.
Definitions are read from the `job-definitions` topic (the source of truth, Kafka only);
executions from the monitor's PostgreSQL projection. `UnavailableError` means Kafka or
PostgreSQL cannot be reached within `timeout` seconds.

Why one module of this size: the SDK surface is two mirrors, `AsyncClient` and the
thread-safe `Client` that delegates to it, kept side by side so that they cannot drift.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import getpass
import socket
import threading
from collections.abc import AsyncGenerator, Coroutine, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TypeAlias, TypeVar
from uuid import UUID

import asyncpg
from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition
from pydantic import ValidationError

from cronstream.calendar_files import CalendarLike, parse_calendars
from cronstream.definitions import check_calendars, check_dags, load_definitions, parse_definitions
from cronstream.errors import (
    CronstreamError,
    DefinitionError,
    NotFoundError,
    ParamsError,
    UnavailableError,
)
from cronstream.executions import Execution, LogEntry
from cronstream.shared.clients import resolved_topics
from cronstream.shared.codec import MAX_RECORD_BYTES, describe
from cronstream.shared.db import query
from cronstream.shared.kafka.config import producer_config, reader_config
from cronstream.shared.kafka.consumer import ConsumerThread
from cronstream.shared.kafka.errors import NOT_AUTHORIZED_HINT, not_authorized
from cronstream.shared.kafka.reading import read_to_end
from cronstream.shared.producers import OutRecord
from cronstream.shared.records import (
    DELETED_BY_HEADER,
    Calendar,
    Command,
    CommandKind,
    DueReason,
    JobDefinition,
    JobDue,
    run_params,
)
from cronstream.shared.redaction import redact_url
from cronstream.shared.schedule import to_millis
from cronstream.shared.settings import Settings
from cronstream.shared.statuses import TERMINAL
from cronstream.shared.telemetry import new_headers
from cronstream.versions import CalendarVersion, DefinitionVersion

__all__ = [
    "AsyncClient", "Client", "DefinitionError", "NotFoundError", "UnavailableError",
    "load_definitions", "parse_definitions",
]

T = TypeVar("T")
DefinitionLike: TypeAlias = JobDefinition | Mapping[str, Any]
DEFAULT_TIMEOUT = 10.0
LOG_PAGE = 5000  # lines read per query
# Following a log that has ended (AsyncClient.follow_logs): how long to wait for its last
# lines when the handler wrote nothing in its last delivery (they may be a monitor batch
# or two behind the end: ~1 s under load), and for the end of a log that has lines.
LOG_QUIET_END = 2.5
LOG_END_PATIENCE = 10.0


def client_identity() -> str:
    """Who acts, when nobody is named: the local user and host (user@host)."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return str(exc.args[0].str())
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class AsyncClient:
    """The SDK for asyncio code. Not shared between event loops; close it (or use
    `async with`) when done. Every call gives up after `timeout` seconds of an
    unreachable server with `UnavailableError`."""

    def __init__(self, settings: Settings | None = None, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.settings = settings or Settings.from_env()
        self.topics = self.settings.topics
        self.timeout = timeout
        self._producer: Producer | None = None
        self._checked_topics: set[str] = set()
        self._pool: asyncpg.Pool | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Deliver what is still queued, then release the connections."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await asyncio.get_running_loop().run_in_executor(None, producer.flush, self.timeout)
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    # -- definitions (Kafka) --------------------------------------------------------

    async def apply(self, definitions: Iterable[DefinitionLike]) -> list[str]:
        """Validate every definition (DAG shape included), then publish them all; returns
        their job_ids. Raises DefinitionError and sends nothing when any is invalid."""
        parsed = parse_definitions(list(definitions), "apply")
        if any(d.type == "DEPENDENT" for d in parsed):
            check_dags(parsed, await self.definitions())
        if any(d.calendar is not None for d in parsed):
            check_calendars(parsed, await self.calendars())
        now, who = datetime.now(UTC), client_identity()
        stamped = []
        for definition in parsed:
            updates: dict[str, Any] = {}
            if definition.created_by is None:
                updates["created_by"] = who
            if definition.created_at is None:
                updates["created_at"] = now
            stamped.append(definition.model_copy(update=updates) if updates else definition)
        await self._publish_definitions(stamped)
        return [d.job_id for d in stamped]

    async def _publish_definitions(self, definitions: Sequence[JobDefinition]) -> None:
        await self._send([OutRecord(self.topics.job_definitions, d.job_id.encode(), d.to_json(),
                                    new_headers()) for d in definitions])

    async def delete(self, job_id: str, by: str | None = None) -> None:
        """Delete a job: a tombstone on `job-definitions`, naming who deleted it (`by`, by
        default the local user and host) for its history."""
        who = (by or client_identity())[:256].encode()
        await self._send([OutRecord(self.topics.job_definitions, job_id.encode(), None,
                                    [*new_headers(), (DELETED_BY_HEADER, who)])])

    async def definitions(self) -> dict[str, JobDefinition]:
        """Every current definition, read from `job-definitions` to its end."""
        return {job_id: found for job_id, (found, _) in (await self._located()).items()}

    async def _located(self) -> dict[str, tuple[JobDefinition, int]]:
        """Every current definition with its offset on `job-definitions` (which names its
        version: `history`)."""
        found: dict[str, tuple[JobDefinition, int]] = {}
        for job_id, (value, offset) in (await self._latest(self.topics.job_definitions)).items():
            if value is None or len(value) > MAX_RECORD_BYTES:
                continue
            try:
                found[job_id] = (JobDefinition.model_validate_json(value), offset)
            except ValidationError:
                continue  # dead-lettered by the scheduler; the job is suspended
        return found

    async def _latest(self, topic: str) -> dict[str, tuple[bytes | None, int]]:
        """The latest record of each key of the compacted `topic` (every partition), read
        to its end: value (None: a tombstone) and offset."""
        latest: dict[str, tuple[bytes | None, int]] = {}

        def keep(messages: builtins.list[Message]) -> None:
            for msg in messages:
                key = msg.key()
                if key is not None:
                    latest[key.decode("utf-8", "replace")] = (msg.value(), msg.offset() or 0)

        await self._check_topics([topic])
        reader = ConsumerThread(reader_config(self.settings, "cronstream-client"), "client")
        try:
            # Every shard of the clock: a job's definitions are all on its own partition.
            shards = await asyncio.wait_for(reader.partitions(topic), self.timeout) or [0]
            await asyncio.wait_for(read_to_end(reader, [TopicPartition(topic, p) for p in shards], keep),
                                   self.timeout * 6)
        except (KafkaException, TimeoutError) as exc:
            raise UnavailableError(f"cannot read {topic} from Kafka at "
                                   f"{self.settings.kafka_bootstrap_servers}: {_reason(exc)}") from None
        finally:
            await reader.close()
        return latest

    async def list(self) -> list[JobDefinition]:
        """Every current definition, by job_id."""
        found = await self.definitions()
        return [found[k] for k in sorted(found)]

    async def get(self, job_id: str) -> JobDefinition | None:
        """The current definition of `job_id`, or None."""
        return (await self.definitions()).get(job_id)

    async def _require(self, job_id: str) -> JobDefinition:
        return (await self.get_with_offset(job_id))[0]

    async def get_with_offset(self, job_id: str) -> tuple[JobDefinition, int]:
        """The current definition of `job_id` and its `job-definitions` offset, which names
        its version; NotFoundError when there is none."""
        found = (await self._located()).get(job_id)
        if found is None:
            raise NotFoundError(f"no job {job_id!r}")
        return found

    async def set_enabled(self, job_id: str, enabled: bool, by: str | None = None) -> JobDefinition:
        """Publish the current definition with `enabled` changed; `by` (who acts, e.g. the
        dashboard's user; by default the local user and host) becomes its `created_by`:
        the new version's author."""
        current = await self._require(job_id)
        # Re-published as read, fields of a newer version included.
        changes: dict[str, Any] = {"enabled": enabled, "created_by": by or client_identity()}
        updated = current.model_copy(update=changes)
        await self._publish_definitions([updated])
        return updated

    async def pause(self, job_id: str, by: str | None = None) -> JobDefinition:
        """Stop firing `job_id` until `resume` (fires meanwhile are skipped)."""
        return await self.set_enabled(job_id, False, by)

    async def resume(self, job_id: str, by: str | None = None) -> JobDefinition:
        return await self.set_enabled(job_id, True, by)

    # -- calendars (Kafka; their history: PostgreSQL) ----------------------------------

    async def apply_calendars(self, calendars: Iterable[CalendarLike]) -> builtins.list[str]:
        """Validate every calendar (models or mappings), then publish them all; returns their
        calendar_ids. Raises DefinitionError naming the calendar and the field, and sends
        nothing, when any is invalid. The jobs that name a calendar are re-planned by the
        schedulers as soon as they read its new version."""
        parsed = parse_calendars(builtins.list(calendars), "apply_calendars")
        now, who = datetime.now(UTC), client_identity()
        stamped = [c.model_copy(update={"created_by": c.created_by or who,
                                        "created_at": c.created_at or now}) for c in parsed]
        await self._send([OutRecord(self.topics.calendars, c.calendar_id.encode(), c.to_json(),
                                    new_headers()) for c in stamped])
        return [c.calendar_id for c in stamped]

    async def apply_calendar(self, calendar: CalendarLike) -> str:
        """Validate one calendar and publish it (`apply_calendars`)."""
        return (await self.apply_calendars([calendar]))[0]

    async def calendars(self) -> dict[str, Calendar]:
        """Every current calendar, read from `calendars` to its end."""
        found: dict[str, Calendar] = {}
        for calendar_id, (value, _) in (await self._latest(self.topics.calendars)).items():
            if value is None or len(value) > MAX_RECORD_BYTES:
                continue
            try:
                found[calendar_id] = Calendar.model_validate_json(value)
            except ValidationError:
                continue  # dead-lettered by the monitor
        return found

    async def calendar(self, calendar_id: str) -> Calendar:
        """The current calendar `calendar_id`; NotFoundError when there is none."""
        found = (await self.calendars()).get(calendar_id)
        if found is None:
            raise NotFoundError(f"no calendar {calendar_id!r}")
        return found

    async def delete_calendar(self, calendar_id: str, by: str | None = None) -> None:
        """Delete a calendar: a tombstone on `calendars`, naming who deleted it. The jobs
        that name it stop firing until it is applied again."""
        who = (by or client_identity())[:256].encode()
        await self._send([OutRecord(self.topics.calendars, calendar_id.encode(), None,
                                    [*new_headers(), (DELETED_BY_HEADER, who)])])

    async def calendar_history(self, calendar_id: str) -> builtins.list[CalendarVersion]:
        """Every version of a calendar, oldest first (from PostgreSQL); NotFoundError when
        none is kept."""
        versions = [CalendarVersion.from_row(r) for r in await self.fetch("calendar_history", calendar_id)]
        if not versions:
            raise NotFoundError(f"no calendar {calendar_id!r} (no version of it is kept)")
        return versions

    # -- executions -----------------------------------------------------------------

    async def trigger(self, job_id: str, at: datetime | None = None, *,
                      params: Mapping[str, Any] | None = None, by: str | None = None) -> UUID:
        """Run `job_id` now (reason MANUAL), outside its schedule, with the job's params
        overlaid by `params`; returns the execution id. `by` names who asks (recorded as
        the execution's triggered_by; by default the local user and host). ParamsError,
        before anything is sent, when the params are invalid."""
        definition, offset = await self.get_with_offset(job_id)
        return await self.submit(definition, to_millis(at or datetime.now(UTC)), "MANUAL",
                                 params=params, triggered_by=by or client_identity(),
                                 definition_offset=offset)

    async def submit(self, definition: JobDefinition, scheduled_at: datetime, reason: DueReason, *,
                     params: Mapping[str, Any] | None = None, triggered_by: str | None = None,
                     definition_offset: int | None = None) -> UUID:
        """Publish the first attempt of a run of `definition` at `scheduled_at` (MANUAL,
        BACKFILL), with the job's params overlaid by `params`."""
        try:
            due = JobDue.first(definition, scheduled_at, reason, definition_offset=definition_offset,
                               params=run_params(definition, params), triggered_by=triggered_by)
        except (ValueError, ValidationError) as exc:
            text = describe(exc) if isinstance(exc, ValidationError) else str(exc)
            raise ParamsError(f"job {definition.job_id!r}: {text}; nothing was sent") from None
        await self._send([OutRecord(self.topics.job_due, definition.job_id.encode(), due.to_json(),
                                    new_headers())])
        return due.execution_id

    async def command(self, kind: CommandKind, execution_id: UUID, reason: str | None = None,
                      job_id: str | None = None, issued_by: str | None = None) -> Command:
        """Publish an operator command (CANCEL, APPROVE, REJECT) about one execution.

        `issued_by` names who acts (recorded as approved_by / rejected_by / cancelled_by on
        the event the command causes); by default the local user and host."""
        command = Command(command=kind, execution_id=execution_id, job_id=job_id, reason=reason,
                          issued_at=datetime.now(UTC), issued_by=issued_by or client_identity())
        await self._send([OutRecord(self.topics.commands, str(execution_id).encode(),
                                    command.to_json(), new_headers())])
        return command

    async def cancel(self, execution_id: UUID, reason: str | None = None,
                     issued_by: str | None = None, job_id: str | None = None) -> Command:
        """Cancel an execution: skipped by the worker that reaches it if not started yet,
        stopped if running, ended by the monitor if awaiting approval. Only the services
        write the CANCELLED event (docs/architecture.md: who writes what)."""
        return await self.command("CANCEL", execution_id, reason or "cancelled by an operator",
                                  job_id=job_id, issued_by=issued_by)

    async def cancel_pending_retry(self, retry_execution_id: UUID, job_id: str,
                                   reason: str | None = None, issued_by: str | None = None) -> Command:
        """Cancel the attempt a failed execution waits to retry (its execution id is
        deterministic: `shared/retry.retry_execution_id`). The timer is dropped at once (a
        tombstone on `retries`, before the scheduler can fire it) and the CANCEL command lets
        the monitor record that attempt CANCELLED — or its worker skip it, had it fired."""
        await self.cancel_retry(retry_execution_id, job_id)
        return await self.cancel(retry_execution_id, reason, issued_by=issued_by, job_id=job_id)

    async def approve(self, execution_id: UUID, reason: str | None = None,
                      issued_by: str | None = None) -> Command:
        """Release a DAG step waiting in AWAITING_APPROVAL."""
        return await self.command("APPROVE", execution_id, reason, issued_by=issued_by)

    async def reject(self, execution_id: UUID, reason: str | None = None,
                     issued_by: str | None = None) -> Command:
        """Skip a DAG step waiting in AWAITING_APPROVAL (SKIPPED)."""
        return await self.command("REJECT", execution_id, reason, issued_by=issued_by)

    async def cancel_retry(self, retry_execution_id: UUID, job_id: str) -> None:
        """Drop a pending retry timer of `job_id` (a tombstone on `retries`, on the job's
        shard)."""
        topics = await resolved_topics(self.settings)
        await self._send([OutRecord(topics.retries, str(retry_execution_id).encode(), None,
                                    new_headers(), topics.shard(job_id))])

    async def runs(self, job_id: str | None = None, *, status: str | None = None,
                   limit: int = 20) -> builtins.list[Execution]:
        """Recent executions, newest first (from PostgreSQL), of one job or of all."""
        rows = await self.fetch("list_executions", job_id, status, limit)
        return [Execution.from_row(r) for r in rows]

    async def history(self, job_id: str) -> builtins.list[DefinitionVersion]:
        """Every kept version of `job_id`'s definition, oldest first (from PostgreSQL);
        NotFoundError when the job has none."""
        versions = [DefinitionVersion.from_row(r) for r in await self.fetch("definition_history", job_id)]
        if not versions:
            raise NotFoundError(f"no job {job_id!r} (no version of it is kept)")
        return versions

    async def version(self, job_id: str, version: int) -> DefinitionVersion:
        """Version `version` of `job_id`'s definition; NotFoundError when it is not kept."""
        rows = await self.fetch("definition_version", job_id, version)
        if not rows:
            raise NotFoundError(f"no version {version} of job {job_id!r} "
                                "(see `cronstream history` for the versions kept)")
        return DefinitionVersion.from_row(rows[0])

    async def execution(self, execution_id: UUID) -> Execution | None:
        rows = await self.fetch("get_execution", execution_id)
        return Execution.from_row(rows[0]) if rows else None

    async def logs(self, execution_id: UUID, *, attempt: int | None = None
                   ) -> AsyncGenerator[LogEntry, None]:
        """The log of an execution as projected so far (every delivery, in order), or of
        attempt `attempt` of the same job in the same run, line by line: a page of
        LOG_PAGE lines is read when the one before is consumed, so a long log never sits in
        memory whole. NotFoundError (on the first line): no such execution."""
        target = await self._attempt(execution_id, attempt)
        last: LogEntry | None = None
        while True:
            page = await self._lines_after(target, last)
            for line in page:
                yield line
            if len(page) < LOG_PAGE:
                return
            last = page[-1]

    async def follow_logs(self, execution_id: UUID, *, attempt: int | None = None,
                          poll_seconds: float = 1.0) -> AsyncGenerator[LogEntry, None]:
        """The lines of an execution's log as they are projected, from its first, until the
        execution has ended and its log is whole (`cronstream logs -f`). It wakes when the
        monitor writes lines or executions (LISTEN), and at least every `poll_seconds`."""
        target = await self._attempt(execution_id, attempt)
        woken = asyncio.Event()
        listener = await self._listen(("cronstream_logs", "cronstream_executions"), woken.set)
        last: LogEntry | None = None
        ended_since: float | None = None
        try:
            while True:
                woken.clear()
                state = (await self.fetch("log_state", target))[0]
                for line in await self._lines_after(target, last):
                    yield line
                    last = line
                if state["status"] in TERMINAL:
                    now = asyncio.get_running_loop().time()
                    ended_since = ended_since or now
                    # Its end projected with the lines read after it: whole. No line of the
                    # last delivery: the handler wrote nothing, or its lines come in the
                    # next monitor batch or two. Never wait for ever on a worker's end.
                    waited = now - ended_since
                    if state["ended"] or waited >= (LOG_END_PATIENCE if state["lines"]
                                                    else LOG_QUIET_END):
                        for line in await self._lines_after(target, last):
                            yield line
                        return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), poll_seconds)
        finally:
            await listener.close()

    async def _attempt(self, execution_id: UUID, attempt: int | None) -> UUID:
        """`execution_id`, or the execution of its run's attempt `attempt`; NotFoundError."""
        if attempt is None:
            found = await self.fetch("log_state", execution_id)
        else:
            found = await self.fetch("attempt_of", execution_id, attempt)
        if not found:
            raise NotFoundError(f"no execution {execution_id}" + (
                f" with an attempt {attempt}" if attempt is not None else ""))
        return execution_id if attempt is None else UUID(str(found[0]["execution_id"]))

    async def _lines_after(self, execution_id: UUID, last: LogEntry | None) -> builtins.list[LogEntry]:
        after = (last.delivery, last.seq) if last is not None else (0, -1)
        return [LogEntry.from_row(r) for r in await self.fetch("log_lines", execution_id, *after,
                                                                  LOG_PAGE)]

    async def _listen(self, channels: Sequence[str], wake: Any) -> asyncpg.Connection:
        """A connection of its own that calls `wake` on every notification of `channels`."""
        try:
            conn = await asyncpg.connect(self.settings.database_url, timeout=self.timeout,
                                         server_settings={"application_name": "cronstream-follow"})
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise UnavailableError(f"cannot reach PostgreSQL at "
                                   f"{redact_url(self.settings.database_url)}: {_reason(exc)}") from None
        for channel in channels:
            await conn.add_listener(channel, lambda *_: wake())
        return conn

    # -- plumbing -------------------------------------------------------------------

    async def fetch(self, name: str, *args: Any) -> builtins.list[asyncpg.Record]:
        """Run the named read-only query of `queries.sql` against the projection."""
        if self._pool is None:
            self._pool = asyncpg.create_pool(
                self.settings.database_url, min_size=0, max_size=2, timeout=self.timeout,
                # Reads only: safe against any deployment, a read replica included.
                server_settings={"default_transaction_read_only": "on",
                                 "application_name": "cronstream-client"})
            await self._pool
        try:
            conn = await self._pool.acquire(timeout=self.timeout)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise UnavailableError(f"cannot reach PostgreSQL at "
                                   f"{redact_url(self.settings.database_url)}: {_reason(exc)}") from None
        try:
            return await conn.fetch(query(name), *args, timeout=self.timeout * 3)
        except asyncpg.UndefinedTableError as exc:
            raise CronstreamError(f"the database has no cronstream tables ({_reason(exc)}): "
                                  "run `cronstream init`") from None
        finally:
            await self._pool.release(conn)

    def _kafka(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(producer_config(self.settings, "cronstream-client"))
        return self._producer

    async def _check_topics(self, topics: Iterable[str]) -> None:
        """Fail fast and clearly when Kafka does not answer or a topic is missing, instead
        of waiting for a delivery timeout."""
        loop = asyncio.get_running_loop()
        for topic in set(topics) - self._checked_topics:
            try:
                metadata = await loop.run_in_executor(None, self._kafka().list_topics, topic,
                                                      self.timeout)
            except KafkaException as exc:
                raise UnavailableError(f"cannot reach Kafka at {self.settings.kafka_bootstrap_servers}"
                                       f": {_reason(exc)}") from None
            found = metadata.topics.get(topic)
            if found is not None and not_authorized(found.error):
                raise CronstreamError(f"not authorized to use topic {topic} on "
                                      f"{self.settings.kafka_bootstrap_servers} as this principal: "
                                      f"{NOT_AUTHORIZED_HINT}")
            if found is None or found.error is not None:
                raise CronstreamError(f"topic {topic} does not exist on "
                                      f"{self.settings.kafka_bootstrap_servers}: run `cronstream init`")
            self._checked_topics.add(topic)

    async def _send(self, records: Sequence[OutRecord]) -> None:
        """Produce `records` and wait until every one is acknowledged."""
        await self._check_topics(r.topic for r in records)
        producer = self._kafka()
        errors: builtins.list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                errors.append(err)

        for record in records:
            while True:
                try:
                    headers: Any = record.headers  # (name, bytes) pairs, as the stubs allow
                    producer.produce(record.topic, record.value, record.key, headers=headers,
                                     on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
        remaining = await asyncio.get_running_loop().run_in_executor(None, producer.flush,
                                                                      self.timeout * 3)
        if remaining:
            raise UnavailableError(f"cannot reach Kafka at {self.settings.kafka_bootstrap_servers}: "
                                   f"{remaining} record(s) not acknowledged in {self.timeout * 3:.0f}s")
        if errors:
            raise CronstreamError(f"Kafka refused {len(errors)} record(s): {errors[0].str()}")


class Client:
    """The SDK for ordinary (synchronous) code, safe to share between threads.

    It runs an `AsyncClient` on a private event loop in a daemon thread; each call waits
    for its result. Close it (or use `with`) to deliver what is queued and stop the thread.
    """

    def __init__(self, settings: Settings | None = None, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self._async = AsyncClient(settings, timeout=timeout)
        self.settings = self._async.settings
        self.topics = self._async.topics
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cronstream-client",
                                        daemon=True)
        self._thread.start()
        self._closed = False
        self._lock = threading.Lock()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            call.close()  # never started: no "coroutine was never awaited"
            raise CronstreamError("this Client is closed")
        return asyncio.run_coroutine_threadsafe(call, self._loop).result()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                self._run(self._async.close())
            finally:
                self._closed = True
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join()
                self._loop.close()

    def apply(self, definitions: Iterable[DefinitionLike]) -> list[str]:
        """Validate every definition (models or mappings), then publish them all; returns
        their job_ids. Raises DefinitionError and sends nothing when any is invalid."""
        return self._run(self._async.apply(list(definitions)))

    def delete(self, job_id: str, by: str | None = None) -> None:
        self._run(self._async.delete(job_id, by))

    def definitions(self) -> dict[str, JobDefinition]:
        return self._run(self._async.definitions())

    def list(self) -> list[JobDefinition]:
        return self._run(self._async.list())

    def get(self, job_id: str) -> JobDefinition | None:
        return self._run(self._async.get(job_id))

    def set_enabled(self, job_id: str, enabled: bool, by: str | None = None) -> JobDefinition:
        return self._run(self._async.set_enabled(job_id, enabled, by))

    def pause(self, job_id: str, by: str | None = None) -> JobDefinition:
        return self._run(self._async.pause(job_id, by))

    def resume(self, job_id: str, by: str | None = None) -> JobDefinition:
        return self._run(self._async.resume(job_id, by))

    def get_with_offset(self, job_id: str) -> tuple[JobDefinition, int]:
        return self._run(self._async.get_with_offset(job_id))

    def apply_calendars(self, calendars: Iterable[CalendarLike]) -> builtins.list[str]:
        """Validate every calendar, then publish them all (AsyncClient.apply_calendars)."""
        return self._run(self._async.apply_calendars(builtins.list(calendars)))

    def apply_calendar(self, calendar: CalendarLike) -> str:
        return self._run(self._async.apply_calendar(calendar))

    def calendars(self) -> dict[str, Calendar]:
        return self._run(self._async.calendars())

    def calendar(self, calendar_id: str) -> Calendar:
        return self._run(self._async.calendar(calendar_id))

    def delete_calendar(self, calendar_id: str, by: str | None = None) -> None:
        self._run(self._async.delete_calendar(calendar_id, by))

    def calendar_history(self, calendar_id: str) -> builtins.list[CalendarVersion]:
        """Every kept version of a calendar (AsyncClient.calendar_history)."""
        return self._run(self._async.calendar_history(calendar_id))

    def trigger(self, job_id: str, at: datetime | None = None, *,
                params: Mapping[str, Any] | None = None, by: str | None = None) -> UUID:
        """Run `job_id` now with the job's params overlaid by `params` (AsyncClient.trigger)."""
        return self._run(self._async.trigger(job_id, at, params=params, by=by))

    def submit(self, definition: JobDefinition, scheduled_at: datetime, reason: DueReason, *,
               params: Mapping[str, Any] | None = None, triggered_by: str | None = None,
               definition_offset: int | None = None) -> UUID:
        return self._run(self._async.submit(definition, scheduled_at, reason, params=params,
                                            triggered_by=triggered_by,
                                            definition_offset=definition_offset))

    def command(self, kind: CommandKind, execution_id: UUID, reason: str | None = None,
                job_id: str | None = None, issued_by: str | None = None) -> Command:
        return self._run(self._async.command(kind, execution_id, reason, job_id, issued_by))

    def cancel(self, execution_id: UUID, reason: str | None = None,
               issued_by: str | None = None, job_id: str | None = None) -> Command:
        """Cancel an execution (AsyncClient.cancel)."""
        return self._run(self._async.cancel(execution_id, reason, issued_by, job_id))

    def cancel_pending_retry(self, retry_execution_id: UUID, job_id: str,
                             reason: str | None = None, issued_by: str | None = None) -> Command:
        """Cancel a failed execution's pending retry (AsyncClient.cancel_pending_retry)."""
        return self._run(self._async.cancel_pending_retry(retry_execution_id, job_id, reason,
                                                          issued_by))

    def approve(self, execution_id: UUID, reason: str | None = None,
                issued_by: str | None = None) -> Command:
        return self._run(self._async.approve(execution_id, reason, issued_by))

    def reject(self, execution_id: UUID, reason: str | None = None,
               issued_by: str | None = None) -> Command:
        return self._run(self._async.reject(execution_id, reason, issued_by))

    def cancel_retry(self, retry_execution_id: UUID, job_id: str) -> None:
        self._run(self._async.cancel_retry(retry_execution_id, job_id))

    def runs(self, job_id: str | None = None, *, status: str | None = None,
             limit: int = 20) -> builtins.list[Execution]:
        return self._run(self._async.runs(job_id, status=status, limit=limit))

    def history(self, job_id: str) -> builtins.list[DefinitionVersion]:
        """Every kept version of `job_id`'s definition (AsyncClient.history)."""
        return self._run(self._async.history(job_id))

    def version(self, job_id: str, version: int) -> DefinitionVersion:
        """Version `version` of `job_id`'s definition (AsyncClient.version)."""
        return self._run(self._async.version(job_id, version))

    def execution(self, execution_id: UUID) -> Execution | None:
        return self._run(self._async.execution(execution_id))

    def logs(self, execution_id: UUID, *, attempt: int | None = None) -> Iterator[LogEntry]:
        """The log of an execution as projected so far, line by line, a page read as the
        one before is consumed (AsyncClient.logs)."""
        return self._iterate(self._async.logs(execution_id, attempt=attempt))

    def follow_logs(self, execution_id: UUID, *, attempt: int | None = None) -> Iterator[LogEntry]:
        """Its lines as they come, until the execution has ended (AsyncClient.follow_logs)."""
        return self._iterate(self._async.follow_logs(execution_id, attempt=attempt))

    def _iterate(self, lines: AsyncGenerator[LogEntry, None]) -> Iterator[LogEntry]:
        """`lines`, stepped on the client's loop one at a time."""

        async def step() -> LogEntry | None:
            return await anext(lines, None)

        try:
            while (line := self._run(step())) is not None:
                yield line
        finally:
            self._run(lines.aclose())

    def fetch(self, name: str, *args: Any) -> builtins.list[asyncpg.Record]:
        return self._run(self._async.fetch(name, *args))
