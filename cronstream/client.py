"""The Python SDK: publish and control jobs, read executions.

    from cronstream import Client

    with Client() as client:                     # configured by CRONSTREAM_* (or defaults)
        client.apply([{"job_id": "nightly", "type": "CRON", "schedule": "0 2 * * *",
                       "timezone": "Europe/Berlin", "handler": "reports.daily"}])
        client.pause("nightly")
        client.trigger("nightly", params={"region": "eu"})   # the job's params, overlaid
        for run in client.runs("nightly", limit=5):
            print(run.status, run.completed_at)

    client = Client(bootstrap_servers="kafka-1:9092", database_url="postgresql://...",
                    topic_prefix="prod.", kafka_config={"security.protocol": "SSL"})

    async with AsyncClient() as client:          # the same, for asyncio applications
        await client.trigger("nightly")

The plain arguments win over the environment; what is not given comes from
`CRONSTREAM_*`, then the defaults (docs/reference/settings.md). `kafka_config` adds
librdkafka properties to those of the environment.

`AsyncClient` does the work; `Client` runs one on a private event loop in a thread of its
own, so it is safe to call from any thread, from code that has no event loop and from
code that has one (it never calls `asyncio.run()`; inside a coroutine prefer
`AsyncClient`, which does not block the caller's loop).

Definitions are validated before anything is sent (models or plain mappings; ISO 8601
strings for times; an unknown field is an error naming it): a bad one raises
`DefinitionError` naming the job and the field, and nothing of the batch is published.
Definitions are read from the `job-definitions` topic (the source of truth, Kafka only);
executions from the monitor's PostgreSQL projection. `UnavailableError` means Kafka or
PostgreSQL cannot be reached within `timeout` seconds. Every error is a
`CronstreamError` with its data as attributes (errors.py).

The clients hold the verbs; their connections and the records they write are
`_plumbing.AsyncPlumbing`, which the CLI and the dashboard also reach (through
`_plumbing.Plumbing`) for what no script needs. Why one module for both clients: they
are two mirrors, `AsyncClient` and the thread-safe `Client` that delegates to it, kept
side by side so that they cannot drift.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import threading
from collections.abc import AsyncGenerator, Coroutine, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TypeAlias, TypeVar
from uuid import UUID

from cronstream._plumbing import (
    CANCEL_REASON,
    DEFAULT_TIMEOUT,
    AsyncPlumbing,
    client_identity,
    client_settings,
)
from cronstream.calendar_files import CalendarLike, parse_calendars
from cronstream.definitions import check_calendars, check_dags, check_pools, parse_definitions, pool_record
from cronstream.errors import CronstreamError, NotFoundError
from cronstream.executions import Execution, LogEntry
from cronstream.shared.producers import OutRecord
from cronstream.shared.records import DELETED_BY_HEADER, Calendar, Command, JobDefinition, Pool
from cronstream.shared.schedule import to_millis
from cronstream.shared.settings import Settings
from cronstream.shared.statuses import TERMINAL
from cronstream.shared.telemetry import new_headers
from cronstream.versions import CalendarVersion, DefinitionVersion

__all__ = ["AsyncClient", "Client"]

T = TypeVar("T")
DefinitionLike: TypeAlias = JobDefinition | Mapping[str, Any]
LOG_PAGE = 5000  # lines read per query
# Following a log that has ended (AsyncClient.follow_logs): how long to wait for its last
# lines when the handler wrote nothing in its last delivery (they may be a monitor batch
# or two behind the end: ~1 s under load), and for the end of a log that has lines.
LOG_QUIET_END = 2.5
LOG_END_PATIENCE = 10.0


class AsyncClient:
    """The SDK for asyncio code. Not shared between event loops; close it (or use
    `async with`) when done. Every call gives up after `timeout` seconds of an
    unreachable server with `UnavailableError`.

    Configured by plain arguments (`bootstrap_servers`, `database_url`, `topic_prefix`,
    `kafka_config`: librdkafka properties), over `CRONSTREAM_*` and the defaults; or by
    the services' `settings`, with the arguments over them. ConfigurationError names a
    setting at fault."""

    def __init__(self, settings: Settings | None = None, *, bootstrap_servers: str | None = None,
                 database_url: str | None = None, topic_prefix: str | None = None,
                 kafka_config: Mapping[str, str] | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self._plumbing = AsyncPlumbing(client_settings(
            settings, bootstrap_servers=bootstrap_servers, database_url=database_url,
            topic_prefix=topic_prefix, kafka_config=kafka_config), timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Deliver what is still queued, then release the connections."""
        await self._plumbing.close()

    # -- definitions (Kafka) --------------------------------------------------------

    async def apply(self, definitions: Iterable[DefinitionLike]) -> list[str]:
        """Validate every definition (DAG shape included), then publish them all; returns
        their job_ids. Raises DefinitionError and sends nothing when any is invalid."""
        parsed = parse_definitions(list(definitions), "apply")
        if any(d.type == "DEPENDENT" for d in parsed):
            check_dags(parsed, await self.definitions())
        if any(d.calendar is not None for d in parsed):
            check_calendars(parsed, await self.calendars())
        if any(d.pool is not None for d in parsed):
            check_pools(parsed, await self.pools())
        now, who = datetime.now(UTC), client_identity()
        stamped = []
        for definition in parsed:
            updates: dict[str, Any] = {}
            if definition.created_by is None:
                updates["created_by"] = who
            if definition.created_at is None:
                updates["created_at"] = now
            stamped.append(definition.model_copy(update=updates) if updates else definition)
        await self._plumbing.publish_definitions(stamped)
        return [d.job_id for d in stamped]

    async def delete(self, job_id: str, by: str | None = None) -> None:
        """Delete a job: a tombstone on `job-definitions`, naming who deleted it (`by`, by
        default the local user and host) for its history."""
        who = (by or client_identity())[:256].encode()
        await self._plumbing.send([OutRecord(self._plumbing.topics.job_definitions, job_id.encode(),
                                             None, [*new_headers(), (DELETED_BY_HEADER, who)])])

    async def definitions(self) -> dict[str, JobDefinition]:
        """Every current definition by job_id, read from `job-definitions` to its end."""
        return {job_id: found for job_id, (found, _) in (await self._plumbing.located()).items()}

    async def list(self) -> list[JobDefinition]:
        """Every current definition, by job_id."""
        found = await self.definitions()
        return [found[k] for k in sorted(found)]

    async def get(self, job_id: str) -> JobDefinition | None:
        """The current definition of `job_id`, or None."""
        return (await self.definitions()).get(job_id)

    async def _set_enabled(self, job_id: str, enabled: bool, by: str | None) -> JobDefinition:
        """Publish the current definition with `enabled` changed; `by` (who acts, e.g. the
        dashboard's user; by default the local user and host) becomes its `created_by`:
        the new version's author."""
        current, _ = await self._plumbing.get_with_offset(job_id)
        # Re-published as read, fields of a newer version included.
        changes: dict[str, Any] = {"enabled": enabled, "created_by": by or client_identity()}
        updated = current.model_copy(update=changes)
        await self._plumbing.publish_definitions([updated])
        return updated

    async def pause(self, job_id: str, by: str | None = None) -> JobDefinition:
        """Stop firing `job_id` until `resume` (fires meanwhile are skipped); returns the
        definition as published. `by` names who acts (the new version's `created_by`; by
        default the local user and host). NotFoundError when there is no such job."""
        return await self._set_enabled(job_id, False, by)

    async def resume(self, job_id: str, by: str | None = None) -> JobDefinition:
        """Fire `job_id` again, from now on (the fires missed while it was paused are not
        caught up); returns the definition as published. NotFoundError when there is no
        such job."""
        return await self._set_enabled(job_id, True, by)

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
        topic = self._plumbing.topics.calendars
        await self._plumbing.send([OutRecord(topic, c.calendar_id.encode(), c.to_json(), new_headers())
                                   for c in stamped])
        return [c.calendar_id for c in stamped]

    async def apply_calendar(self, calendar: CalendarLike) -> str:
        """Validate one calendar and publish it (`apply_calendars`); returns its calendar_id."""
        return (await self.apply_calendars([calendar]))[0]

    async def calendars(self) -> dict[str, Calendar]:
        """Every current calendar by calendar_id, read from `calendars` to its end."""
        return await self._plumbing.calendars()

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
        await self._plumbing.send([OutRecord(self._plumbing.topics.calendars, calendar_id.encode(),
                                             None, [*new_headers(), (DELETED_BY_HEADER, who)])])

    async def calendar_history(self, calendar_id: str) -> builtins.list[CalendarVersion]:
        """Every version of a calendar, oldest first (from PostgreSQL); NotFoundError when
        none is kept."""
        rows = await self._plumbing.fetch("calendar_history", calendar_id)
        versions = [CalendarVersion.from_row(r) for r in rows]
        if not versions:
            raise NotFoundError(f"no calendar {calendar_id!r} (no version of it is kept)")
        return versions

    # -- pools (Kafka) ----------------------------------------------------------------

    async def set_pool(self, pool: str, slots: int, description: str | None = None,
                       by: str | None = None) -> Pool:
        """Create or resize a pool of slots shared by the jobs that name it; returns it as
        published. DefinitionError naming the field when it is invalid (nothing is sent).
        Shrinking a pool stops no running execution: new ones wait until enough end."""
        record = pool_record(pool, slots, description, by or client_identity())
        await self._plumbing.send([OutRecord(self._plumbing.topics.pools, record.pool.encode(),
                                             record.to_json(), new_headers())])
        return record

    async def pools(self) -> dict[str, Pool]:
        """Every current pool by name, read from `pools` to its end."""
        return await self._plumbing.pools()

    async def delete_pool(self, pool: str, by: str | None = None) -> None:
        """Delete a pool: a tombstone on `pools`. The executions of jobs that still name it
        wait until it is set again."""
        who = (by or client_identity())[:256].encode()
        await self._plumbing.send([OutRecord(self._plumbing.topics.pools, pool.encode(), None,
                                             [*new_headers(), (DELETED_BY_HEADER, who)])])

    # -- executions -----------------------------------------------------------------

    async def trigger(self, job_id: str, at: datetime | None = None, *,
                      params: Mapping[str, Any] | None = None, by: str | None = None) -> UUID:
        """Run `job_id` now (reason MANUAL), outside its schedule, with the job's params
        overlaid by `params`; returns the execution id. `by` names who asks (recorded as
        the execution's triggered_by; by default the local user and host). ParamsError,
        before anything is sent, when the params are invalid."""
        definition, offset = await self._plumbing.get_with_offset(job_id)
        return await self._plumbing.submit(definition, to_millis(at or datetime.now(UTC)), "MANUAL",
                                           params=params, triggered_by=by or client_identity(),
                                           definition_offset=offset)

    async def cancel(self, execution_id: UUID, reason: str | None = None,
                     issued_by: str | None = None, job_id: str | None = None) -> Command:
        """Cancel an execution: skipped by the worker that reaches it if not started yet,
        stopped if running, ended by the monitor if awaiting approval. Only the services
        write the CANCELLED event (docs/architecture.md: who writes what)."""
        return await self._plumbing.command("CANCEL", execution_id, reason or CANCEL_REASON,
                                            job_id=job_id, issued_by=issued_by)

    async def approve(self, execution_id: UUID, reason: str | None = None,
                      issued_by: str | None = None, job_id: str | None = None) -> Command:
        """Release a DAG step waiting in AWAITING_APPROVAL."""
        return await self._plumbing.command("APPROVE", execution_id, reason, job_id=job_id,
                                            issued_by=issued_by)

    async def reject(self, execution_id: UUID, reason: str | None = None,
                     issued_by: str | None = None, job_id: str | None = None) -> Command:
        """Skip a DAG step waiting in AWAITING_APPROVAL (SKIPPED)."""
        return await self._plumbing.command("REJECT", execution_id, reason, job_id=job_id,
                                            issued_by=issued_by)

    async def runs(self, job_id: str | None = None, *, status: str | None = None,
                   limit: int = 20) -> builtins.list[Execution]:
        """Recent executions, newest first (from PostgreSQL), of one job or of all."""
        rows = await self._plumbing.fetch("list_executions", job_id, status, limit)
        return [Execution.from_row(r) for r in rows]

    async def history(self, job_id: str) -> builtins.list[DefinitionVersion]:
        """Every kept version of `job_id`'s definition, oldest first (from PostgreSQL);
        NotFoundError when the job has none."""
        versions = [DefinitionVersion.from_row(r)
                    for r in await self._plumbing.fetch("definition_history", job_id)]
        if not versions:
            raise NotFoundError(f"no job {job_id!r} (no version of it is kept)", job_id=job_id)
        return versions

    async def version(self, job_id: str, version: int) -> DefinitionVersion:
        """Version `version` of `job_id`'s definition; NotFoundError when it is not kept."""
        rows = await self._plumbing.fetch("definition_version", job_id, version)
        if not rows:
            raise NotFoundError(f"no version {version} of job {job_id!r} "
                                "(see `cronstream history` for the versions kept)",
                                job_id=job_id, version=version)
        return DefinitionVersion.from_row(rows[0])

    async def execution(self, execution_id: UUID) -> Execution | None:
        """The current state of one execution (from PostgreSQL), or None."""
        rows = await self._plumbing.fetch("get_execution", execution_id)
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
        listener = await self._plumbing.listen(("cronstream_logs", "cronstream_executions"),
                                               woken.set)
        last: LogEntry | None = None
        ended_since: float | None = None
        try:
            while True:
                woken.clear()
                state = (await self._plumbing.fetch("log_state", target))[0]
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
            found = await self._plumbing.fetch("log_state", execution_id)
        else:
            found = await self._plumbing.fetch("attempt_of", execution_id, attempt)
        if not found:
            raise NotFoundError(f"no execution {execution_id}" + (
                f" with an attempt {attempt}" if attempt is not None else ""),
                execution_id=execution_id, attempt=attempt)
        return execution_id if attempt is None else UUID(str(found[0]["execution_id"]))

    async def _lines_after(self, execution_id: UUID, last: LogEntry | None) -> builtins.list[LogEntry]:
        after = (last.delivery, last.seq) if last is not None else (0, -1)
        return [LogEntry.from_row(r)
                for r in await self._plumbing.fetch("log_lines", execution_id, *after, LOG_PAGE)]


class Client:
    """The SDK for ordinary (synchronous) code, safe to share between threads.

    It runs an `AsyncClient` on a private event loop in a daemon thread; each call waits
    for its result. Close it (or use `with`) to deliver what is queued and stop the thread.
    It is configured as `AsyncClient` is: `Client()` from `CRONSTREAM_*`, or
    `Client(bootstrap_servers=..., database_url=..., topic_prefix=..., kafka_config=...,
    timeout=...)`.
    """

    def __init__(self, settings: Settings | None = None, *, bootstrap_servers: str | None = None,
                 database_url: str | None = None, topic_prefix: str | None = None,
                 kafka_config: Mapping[str, str] | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        # Built first: a configuration error leaves no thread behind.
        self._async = AsyncClient(settings, bootstrap_servers=bootstrap_servers,
                                  database_url=database_url, topic_prefix=topic_prefix,
                                  kafka_config=kafka_config, timeout=timeout)
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
        """Deliver what is still queued, release the connections and stop the client's
        thread; safe to call twice."""
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
        """Delete a job, naming who deleted it (AsyncClient.delete)."""
        self._run(self._async.delete(job_id, by))

    def definitions(self) -> dict[str, JobDefinition]:
        """Every current definition by job_id (AsyncClient.definitions)."""
        return self._run(self._async.definitions())

    def list(self) -> list[JobDefinition]:
        """Every current definition, by job_id."""
        return self._run(self._async.list())

    def get(self, job_id: str) -> JobDefinition | None:
        """The current definition of `job_id`, or None."""
        return self._run(self._async.get(job_id))

    def pause(self, job_id: str, by: str | None = None) -> JobDefinition:
        """Stop firing `job_id` until `resume` (AsyncClient.pause)."""
        return self._run(self._async.pause(job_id, by))

    def resume(self, job_id: str, by: str | None = None) -> JobDefinition:
        """Fire `job_id` again, from now on (AsyncClient.resume)."""
        return self._run(self._async.resume(job_id, by))

    def apply_calendars(self, calendars: Iterable[CalendarLike]) -> builtins.list[str]:
        """Validate every calendar, then publish them all (AsyncClient.apply_calendars)."""
        return self._run(self._async.apply_calendars(builtins.list(calendars)))

    def apply_calendar(self, calendar: CalendarLike) -> str:
        """Validate one calendar and publish it (AsyncClient.apply_calendar)."""
        return self._run(self._async.apply_calendar(calendar))

    def calendars(self) -> dict[str, Calendar]:
        """Every current calendar by calendar_id (AsyncClient.calendars)."""
        return self._run(self._async.calendars())

    def calendar(self, calendar_id: str) -> Calendar:
        """The current calendar `calendar_id` (AsyncClient.calendar)."""
        return self._run(self._async.calendar(calendar_id))

    def delete_calendar(self, calendar_id: str, by: str | None = None) -> None:
        """Delete a calendar (AsyncClient.delete_calendar)."""
        self._run(self._async.delete_calendar(calendar_id, by))

    def calendar_history(self, calendar_id: str) -> builtins.list[CalendarVersion]:
        """Every kept version of a calendar (AsyncClient.calendar_history)."""
        return self._run(self._async.calendar_history(calendar_id))

    def set_pool(self, pool: str, slots: int, description: str | None = None,
                 by: str | None = None) -> Pool:
        """Create or resize a pool (AsyncClient.set_pool)."""
        return self._run(self._async.set_pool(pool, slots, description, by))

    def pools(self) -> dict[str, Pool]:
        """Every current pool by name (AsyncClient.pools)."""
        return self._run(self._async.pools())

    def delete_pool(self, pool: str, by: str | None = None) -> None:
        """Delete a pool (AsyncClient.delete_pool)."""
        self._run(self._async.delete_pool(pool, by))

    def trigger(self, job_id: str, at: datetime | None = None, *,
                params: Mapping[str, Any] | None = None, by: str | None = None) -> UUID:
        """Run `job_id` now with the job's params overlaid by `params` (AsyncClient.trigger)."""
        return self._run(self._async.trigger(job_id, at, params=params, by=by))

    def cancel(self, execution_id: UUID, reason: str | None = None,
               issued_by: str | None = None, job_id: str | None = None) -> Command:
        """Cancel an execution (AsyncClient.cancel)."""
        return self._run(self._async.cancel(execution_id, reason, issued_by, job_id))

    def approve(self, execution_id: UUID, reason: str | None = None,
                issued_by: str | None = None, job_id: str | None = None) -> Command:
        """Release a DAG step waiting in AWAITING_APPROVAL."""
        return self._run(self._async.approve(execution_id, reason, issued_by, job_id))

    def reject(self, execution_id: UUID, reason: str | None = None,
               issued_by: str | None = None, job_id: str | None = None) -> Command:
        """Skip a DAG step waiting in AWAITING_APPROVAL (SKIPPED)."""
        return self._run(self._async.reject(execution_id, reason, issued_by, job_id))

    def runs(self, job_id: str | None = None, *, status: str | None = None,
             limit: int = 20) -> builtins.list[Execution]:
        """Recent executions, newest first, of one job or of all (AsyncClient.runs)."""
        return self._run(self._async.runs(job_id, status=status, limit=limit))

    def history(self, job_id: str) -> builtins.list[DefinitionVersion]:
        """Every kept version of `job_id`'s definition (AsyncClient.history)."""
        return self._run(self._async.history(job_id))

    def version(self, job_id: str, version: int) -> DefinitionVersion:
        """Version `version` of `job_id`'s definition (AsyncClient.version)."""
        return self._run(self._async.version(job_id, version))

    def execution(self, execution_id: UUID) -> Execution | None:
        """The current state of one execution, or None (AsyncClient.execution)."""
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
