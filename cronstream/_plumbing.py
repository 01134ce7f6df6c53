"""The SDK's plumbing: a client's connections and the records its verbs write. Not public.

`AsyncPlumbing` is what an `AsyncClient` does its verbs with:

1. its settings (`client_settings`: plain arguments over `CRONSTREAM_*`) and `timeout`;
2. one Kafka producer, each topic checked once before the first record to it, and every
   record acknowledged before a call returns (`send`);
3. one small read-only PostgreSQL pool for the named queries of `queries.sql` (`fetch`),
   and a connection of its own to LISTEN on (`listen`);
4. the records the verbs publish: definitions, runs (`submit`), operator commands
   (`command`), a pending retry's tombstone (`cancel_retry`).

`Plumbing` is the same on a `Client`'s loop, for the CLI and the dashboard, which need
more than the verbs: raw rows by query name, a definition with its offset, a run at a
given time (a backfill), a pending retry's cancellation. It changes with them; scripts
use the verbs.
"""

from __future__ import annotations

import asyncio
import builtins
import getpass
import json
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

import asyncpg
from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition
from pydantic import ValidationError

from cronstream.errors import (
    ConfigurationError,
    CronstreamError,
    NotFoundError,
    ParamsError,
    UnavailableError,
)
from cronstream.shared.clients import resolved_topics
from cronstream.shared.codec import MAX_RECORD_BYTES, describe
from cronstream.shared.db import query
from cronstream.shared.kafka.config import producer_config, reader_config
from cronstream.shared.kafka.consumer import ConsumerThread
from cronstream.shared.kafka.errors import NOT_AUTHORIZED_HINT, not_authorized
from cronstream.shared.kafka.reading import read_to_end
from cronstream.shared.producers import OutRecord
from cronstream.shared.records import (
    Calendar,
    Command,
    CommandKind,
    DueReason,
    JobDefinition,
    JobDue,
    Pool,
    run_params,
)
from cronstream.shared.redaction import redact_url
from cronstream.shared.settings import Settings, SettingsError
from cronstream.shared.telemetry import new_headers

if TYPE_CHECKING:
    from cronstream.client import Client

__all__ = ["CANCEL_REASON", "AsyncPlumbing", "Plumbing", "client_identity", "client_settings",
           "first_line"]

# A record of a compacted topic read by key (calendars, pools).
_Keyed = TypeVar("_Keyed", Calendar, Pool)

DEFAULT_TIMEOUT = 10.0
CANCEL_REASON = "cancelled by an operator"


def client_identity() -> str:
    """Who acts, when nobody is named: the local user and host (user@host)."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


def client_settings(settings: Settings | None = None, *, bootstrap_servers: str | None = None,
                    database_url: str | None = None, topic_prefix: str | None = None,
                    kafka_config: Mapping[str, str] | None = None) -> Settings:
    """What a client connects with: `settings` (by default read from `CRONSTREAM_*`) with
    the plain arguments given over them; `kafka_config` adds librdkafka properties to
    those already set. ConfigurationError names each setting at fault."""
    given: dict[str, Any] = {name: value for name, value in (
        ("kafka_bootstrap_servers", bootstrap_servers), ("database_url", database_url),
        ("topic_prefix", topic_prefix)) if value is not None}
    if kafka_config is not None:
        given["kafka_config"] = dict(kafka_config)
    if given:
        try:
            # The arguments alone first, so that a bad one is named as the caller wrote it.
            Settings.model_validate(given)
        except ValidationError as exc:
            names = dict.fromkeys(str(e["loc"][0]) for e in exc.errors() if e["loc"])
            raise ConfigurationError(f"invalid client configuration: {describe(exc)}", names) from None
    if settings is None:
        try:
            return Settings.from_env(given)
        except SettingsError as exc:
            raise ConfigurationError(str(exc), exc.names) from None
    if "kafka_config" in given:
        given["kafka_config"] = {**settings.kafka_config, **given["kafka_config"]}
    return settings.model_copy(update=given) if given else settings


def first_line(exc: BaseException) -> str:
    """The first line of what went wrong (librdkafka's own text for a Kafka error)."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return str(exc.args[0].str())
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class AsyncPlumbing:
    """A client's connections and writes (the module's steps 1-4), on one event loop."""

    def __init__(self, settings: Settings, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.settings = settings
        self.topics = settings.topics
        self.timeout = timeout
        self._producer: Producer | None = None
        self._checked_topics: set[str] = set()
        self._pool: asyncpg.Pool | None = None

    async def close(self) -> None:
        """Deliver what is still queued, then release the connections."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await asyncio.get_running_loop().run_in_executor(None, producer.flush, self.timeout)
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    def _kafka_unavailable(self, text: str) -> UnavailableError:
        servers = self.settings.kafka_bootstrap_servers
        return UnavailableError(f"cannot reach Kafka at {servers}: {text}", service="kafka",
                                server=servers)

    def _postgresql_unavailable(self, exc: BaseException) -> UnavailableError:
        url = redact_url(self.settings.database_url)
        return UnavailableError(f"cannot reach PostgreSQL at {url}: {first_line(exc)}",
                                service="postgresql", server=url)

    # -- PostgreSQL -----------------------------------------------------------------

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
            raise self._postgresql_unavailable(exc) from None
        try:
            return await conn.fetch(query(name), *args, timeout=self.timeout * 3)
        except asyncpg.UndefinedTableError as exc:
            raise CronstreamError(f"the database has no cronstream tables ({first_line(exc)}): "
                                  "run `cronstream init`") from None
        finally:
            await self._pool.release(conn)

    async def listen(self, channels: Sequence[str], wake: Callable[[], Any]) -> asyncpg.Connection:
        """A connection of its own that calls `wake` on every notification of `channels`."""
        try:
            conn = await asyncpg.connect(self.settings.database_url, timeout=self.timeout,
                                         server_settings={"application_name": "cronstream-follow"})
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise self._postgresql_unavailable(exc) from None
        for channel in channels:
            await conn.add_listener(channel, lambda *_: wake())
        return conn

    # -- Kafka ----------------------------------------------------------------------

    def _kafka(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(producer_config(self.settings, "cronstream-client"))
        return self._producer

    async def check_topics(self, topics: Iterable[str]) -> None:
        """Fail fast and clearly when Kafka does not answer or a topic is missing, instead
        of waiting for a delivery timeout."""
        loop = asyncio.get_running_loop()
        servers = self.settings.kafka_bootstrap_servers
        for topic in set(topics) - self._checked_topics:
            try:
                metadata = await loop.run_in_executor(None, self._kafka().list_topics, topic,
                                                      self.timeout)
            except KafkaException as exc:
                raise self._kafka_unavailable(first_line(exc)) from None
            found = metadata.topics.get(topic)
            if found is not None and not_authorized(found.error):
                raise CronstreamError(f"not authorized to use topic {topic} on {servers} as this "
                                      f"principal: {NOT_AUTHORIZED_HINT}")
            if found is None or found.error is not None:
                raise CronstreamError(f"topic {topic} does not exist on {servers}: "
                                      "run `cronstream init`")
            self._checked_topics.add(topic)

    async def send(self, records: Sequence[OutRecord]) -> None:
        """Produce `records` and wait until every one is acknowledged."""
        await self.check_topics(r.topic for r in records)
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
            raise self._kafka_unavailable(f"{remaining} record(s) not acknowledged in "
                                          f"{self.timeout * 3:.0f}s")
        if errors:
            raise CronstreamError(f"Kafka refused {len(errors)} record(s): {errors[0].str()}")

    # -- definitions ----------------------------------------------------------------

    async def located(self) -> dict[str, tuple[JobDefinition, int]]:
        """Every current definition with its offset on `job-definitions` (which names its
        version: `history`), read from the topic to its end."""
        found: dict[str, tuple[JobDefinition, int]] = {}
        for job_id, (value, offset) in (await self.latest(self.topics.job_definitions)).items():
            if value is None or len(value) > MAX_RECORD_BYTES:
                continue
            try:
                found[job_id] = (JobDefinition.model_validate_json(value), offset)
            except ValidationError:
                continue  # dead-lettered by the scheduler; the job is suspended
        return found

    async def calendars(self) -> dict[str, Calendar]:
        """Every current calendar, read from `calendars` to its end (an invalid one is
        dead-lettered by the monitor: left out)."""
        return await self._current(self.topics.calendars, Calendar)

    async def pools(self) -> dict[str, Pool]:
        """Every current pool, read from `pools` to its end (an invalid one is ignored by
        the dispatchers too: left out)."""
        return await self._current(self.topics.pools, Pool)

    async def _current(self, topic: str, model: type[_Keyed]) -> dict[str, _Keyed]:
        """The latest valid record of each key of a compacted topic, by key."""
        found: dict[str, _Keyed] = {}
        for key, (value, _) in (await self.latest(topic)).items():
            if value is None or len(value) > MAX_RECORD_BYTES:
                continue
            try:
                found[key] = model.model_validate_json(value)
            except ValidationError:
                continue
        return found

    async def latest(self, topic: str) -> dict[str, tuple[bytes | None, int]]:
        """The latest record of each key of the compacted `topic` (every partition), read
        to its end: value (None: a tombstone) and offset."""
        latest: dict[str, tuple[bytes | None, int]] = {}

        def keep(messages: builtins.list[Message]) -> None:
            for msg in messages:
                key = msg.key()
                if key is not None:
                    latest[key.decode("utf-8", "replace")] = (msg.value(), msg.offset() or 0)

        await self.check_topics([topic])
        reader = ConsumerThread(reader_config(self.settings, "cronstream-client"), "client")
        try:
            # Every shard of the clock: a job's definitions are all on its own partition.
            shards = await asyncio.wait_for(reader.partitions(topic), self.timeout) or [0]
            await asyncio.wait_for(read_to_end(reader, [TopicPartition(topic, p) for p in shards], keep),
                                   self.timeout * 6)
        except (KafkaException, TimeoutError) as exc:
            servers = self.settings.kafka_bootstrap_servers
            raise UnavailableError(f"cannot read {topic} from Kafka at {servers}: {first_line(exc)}",
                                   service="kafka", server=servers) from None
        finally:
            await reader.close()
        return latest

    async def trigger_lag(self, definition: JobDefinition) -> tuple[int, dict[int, int]] | None:
        """An EVENT job's trigger: how many records of its topic are not yet in a committed
        run nor passed over, and the positions its trigger committed (by partition); None
        before the scheduler accepted the job (decision 0057)."""
        if definition.event is None:
            return None
        raw = (await self.latest(self.topics.trigger_state)).get(definition.job_id, (None, 0))[0]
        try:
            state = json.loads(raw) if raw is not None else None
            positions = {int(p): int(o) for p, o in state["positions"].items()} if state else None
            start_ms = int(state["start_ms"]) if state else 0
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            return None
        if positions is None:
            return None
        topic = definition.event.topic
        reader = ConsumerThread(reader_config(self.settings, "cronstream-client"), "client")
        try:
            partitions = await asyncio.wait_for(reader.partitions(topic), self.timeout) or []
            behind = 0
            for p in partitions:
                low, high = await asyncio.wait_for(reader.watermarks(TopicPartition(topic, p)), self.timeout)
                start = positions.get(p)
                if start is None and definition.event.start == "latest":
                    found = await asyncio.wait_for(
                        reader.offsets_for_times([TopicPartition(topic, p, start_ms)]), self.timeout)
                    start = found[0].offset if found and found[0].offset >= 0 else high
                behind += max(0, high - (low if start is None else start))
        except (KafkaException, TimeoutError) as exc:
            servers = self.settings.kafka_bootstrap_servers
            raise UnavailableError(f"cannot read {topic} from Kafka at {servers}: {first_line(exc)}",
                                   service="kafka", server=servers) from None
        finally:
            await reader.close()
        return behind, positions

    async def get_with_offset(self, job_id: str) -> tuple[JobDefinition, int]:
        """The current definition of `job_id` and its `job-definitions` offset, which names
        its version; NotFoundError when there is none."""
        found = (await self.located()).get(job_id)
        if found is None:
            raise NotFoundError(f"no job {job_id!r}", job_id=job_id)
        return found

    async def publish_definitions(self, definitions: Sequence[JobDefinition]) -> None:
        await self.send([OutRecord(self.topics.job_definitions, d.job_id.encode(), d.to_json(),
                                   new_headers()) for d in definitions])

    # -- runs and commands ----------------------------------------------------------

    async def submit(self, definition: JobDefinition, scheduled_at: datetime, reason: DueReason, *,
                     params: Mapping[str, Any] | None = None, triggered_by: str | None = None,
                     definition_offset: int | None = None) -> UUID:
        """Publish the first attempt of a run of `definition` at `scheduled_at` (MANUAL,
        BACKFILL), with the job's params overlaid by `params`; ParamsError, before
        anything is sent, when they are invalid."""
        try:
            due = JobDue.first(definition, scheduled_at, reason, definition_offset=definition_offset,
                               params=run_params(definition, params), triggered_by=triggered_by)
        except (ValueError, ValidationError) as exc:
            text = describe(exc) if isinstance(exc, ValidationError) else str(exc)
            raise ParamsError(f"job {definition.job_id!r}: {text}; nothing was sent",
                              job_id=definition.job_id, key=_key_at_fault(params)) from None
        await self.send([OutRecord(self.topics.job_due, definition.job_id.encode(), due.to_json(),
                                   new_headers())])
        return due.execution_id

    async def command(self, kind: CommandKind, execution_id: UUID, reason: str | None = None,
                      job_id: str | None = None, issued_by: str | None = None) -> Command:
        """Publish an operator command (CANCEL, APPROVE, REJECT) about one execution.

        `issued_by` names who acts (recorded as approved_by / rejected_by / cancelled_by on
        the event the command causes); by default the local user and host."""
        command = Command(command=kind, execution_id=execution_id, job_id=job_id, reason=reason,
                          issued_at=datetime.now(UTC), issued_by=issued_by or client_identity())
        await self.send([OutRecord(self.topics.commands, str(execution_id).encode(),
                                   command.to_json(), new_headers())])
        return command

    async def cancel_retry(self, retry_execution_id: UUID, job_id: str) -> None:
        """Drop a pending retry timer of `job_id` (a tombstone on `retries`, on the job's
        shard)."""
        topics = await resolved_topics(self.settings)
        await self.send([OutRecord(topics.retries, str(retry_execution_id).encode(), None,
                                   new_headers(), topics.shard(job_id))])

    async def cancel_pending_retry(self, retry_execution_id: UUID, job_id: str,
                                   reason: str | None = None, issued_by: str | None = None) -> Command:
        """Cancel the attempt a failed execution waits to retry (its execution id is
        deterministic: `shared/ids.retry_execution_id`). The timer is dropped at once (a
        tombstone on `retries`, before the scheduler can fire it) and the CANCEL command lets
        the monitor record that attempt CANCELLED — or its worker skip it, had it fired."""
        await self.cancel_retry(retry_execution_id, job_id)
        return await self.command("CANCEL", retry_execution_id, reason or CANCEL_REASON,
                                  job_id=job_id, issued_by=issued_by)


def _key_at_fault(params: Mapping[str, Any] | None) -> str | None:
    """The first param of `params` that is not JSON data, or None (the params as a whole
    are at fault: not a mapping with string keys, or too large)."""
    if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
        return None
    for key, value in params.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            return str(key)
    return None


class Plumbing:
    """What the CLI and the dashboard need beside a `Client`'s verbs, on that client's
    loop and connections (close the client to close them):

        with Client(settings) as client:
            rows = Plumbing(client).fetch("jobs_list")
    """

    def __init__(self, client: Client) -> None:
        self._run = client._run
        self._async = client._async._plumbing

    @property
    def settings(self) -> Settings:
        return self._async.settings

    def fetch(self, name: str, *args: Any) -> builtins.list[asyncpg.Record]:
        """The rows of the named read-only query of `queries.sql` (AsyncPlumbing.fetch)."""
        return self._run(self._async.fetch(name, *args))

    def get_with_offset(self, job_id: str) -> tuple[JobDefinition, int]:
        """The current definition of `job_id` and its offset; NotFoundError."""
        return self._run(self._async.get_with_offset(job_id))

    def submit(self, definition: JobDefinition, scheduled_at: datetime, reason: DueReason, *,
               params: Mapping[str, Any] | None = None, triggered_by: str | None = None,
               definition_offset: int | None = None) -> UUID:
        """A run of `definition` at `scheduled_at` (AsyncPlumbing.submit)."""
        return self._run(self._async.submit(definition, scheduled_at, reason, params=params,
                                            triggered_by=triggered_by,
                                            definition_offset=definition_offset))

    def command(self, kind: CommandKind, execution_id: UUID, reason: str | None = None,
                job_id: str | None = None, issued_by: str | None = None) -> Command:
        """An operator command about one execution (AsyncPlumbing.command)."""
        return self._run(self._async.command(kind, execution_id, reason, job_id, issued_by))

    def cancel_pending_retry(self, retry_execution_id: UUID, job_id: str,
                             reason: str | None = None, issued_by: str | None = None) -> Command:
        """Cancel a failed execution's pending retry (AsyncPlumbing.cancel_pending_retry)."""
        return self._run(self._async.cancel_pending_retry(retry_execution_id, job_id, reason,
                                                          issued_by))

    def trigger_lag(self, definition: JobDefinition) -> tuple[int, dict[int, int]] | None:
        """An EVENT job's trigger lag and committed positions (AsyncPlumbing.trigger_lag)."""
        return self._run(self._async.trigger_lag(definition))
