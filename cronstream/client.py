"""The Python SDK: publish, pause, resume, delete and trigger jobs.

    from cronstream import Client, JobDefinition

    with Client() as client:
        client.apply([JobDefinition(job_id="nightly", type="CRON", schedule="0 2 * * *",
                                    timezone="Europe/Berlin", handler="reports.daily")])

Everything is validated before anything is sent: a bad definition raises
`DefinitionError` naming the job and the field, and nothing of the batch is published.
"""

from __future__ import annotations

import getpass
import json
import socket
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any
from uuid import UUID

import yaml
from confluent_kafka import TopicPartition
from pydantic import ValidationError

from cronstream.shared.codec import MAX_RECORD_BYTES, describe
from cronstream.shared.dag import dag_problem
from cronstream.shared.ids import execution_id, idempotency_key, run_id
from cronstream.shared.kafka import (
    ConsumerThread,
    IdempotentProducer,
    OutRecord,
    producer_config,
    reader_config,
)
from cronstream.shared.records import (
    MAX_DEFINITION_BYTES,
    Command,
    CommandKind,
    ExecutionEvent,
    JobDefinition,
    JobDue,
    JobSnapshot,
)
from cronstream.shared.schedule import to_millis
from cronstream.shared.settings import Settings
from cronstream.shared.telemetry import new_traceparent, trace_headers

__all__ = ["Client", "DefinitionError", "load_definitions", "parse_definitions"]


class DefinitionError(ValueError):
    """One or more definitions are invalid; the message says which job, field and why."""


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


def parse_definitions(documents: list[Any], source: str = "input") -> list[JobDefinition]:
    """Validate raw definitions (dicts, as loaded from YAML or JSON) strictly, as the
    services validate them from Kafka. Raises DefinitionError listing every problem."""
    items: list[Any] = []
    for document in documents:
        if document is None:
            continue
        doc = document["jobs"] if isinstance(document, dict) and set(document) == {"jobs"} else document
        items.extend(doc if isinstance(doc, list) else [doc])
    problems: list[str] = []
    definitions: list[JobDefinition] = []
    for index, item in enumerate(items, start=1):
        job = item.get("job_id") if isinstance(item, dict) else None
        where = f"{source}: definition #{index}" + (f" (job_id {job!r})" if job else "")
        if not isinstance(item, dict):
            problems.append(f"{where}: expected a mapping of fields, got {type(item).__name__}")
            continue
        try:
            raw = json.dumps(item, default=_json_default).encode()
        except TypeError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if len(raw) > MAX_DEFINITION_BYTES:
            problems.append(f"{where}: definition is {len(raw)} bytes; the limit is "
                            f"{MAX_DEFINITION_BYTES}")
            continue
        try:
            definitions.append(JobDefinition.model_validate_json(raw))
        except ValidationError as exc:
            problems.append(f"{where}: {describe(exc)}")
    seen: set[str] = set()
    for definition in definitions:
        if definition.job_id in seen:
            problems.append(f"{source}: job_id {definition.job_id!r} is defined more than once")
        seen.add(definition.job_id)
    if problems:
        raise DefinitionError("\n".join(problems))
    if not definitions:
        raise DefinitionError(f"{source}: no definitions found")
    return definitions


def load_definitions(path: str | Path) -> list[JobDefinition]:
    """Read one or many definitions from a YAML (multi-document allowed) or JSON file."""
    path = Path(path)
    text = path.read_text()
    try:
        documents = [json.loads(text)] if path.suffix == ".json" else list(yaml.safe_load_all(text))
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise DefinitionError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                              f"{exc}") from None
    return parse_definitions(documents, str(path))


def check_dags(new: list[JobDefinition], existing: dict[str, JobDefinition]) -> None:
    """Refuse cycles and DEPENDENT jobs with more than one scheduled root (SPEC §5.6)."""
    merged = {**existing, **{d.job_id: d for d in new}}

    def lookup(job_id: str) -> tuple[str, list[str]] | None:
        found = merged.get(job_id)
        return None if found is None else (found.type, list(found.depends_on))

    def downstream(job_id: str) -> list[str]:
        return [d.job_id for d in merged.values() if job_id in d.depends_on]

    problems = [f"job_id {d.job_id!r}: {problem}" for d in new
                if (problem := dag_problem(d.job_id, lookup, downstream)) is not None]
    if problems:
        raise DefinitionError("\n".join(problems))


class Client:
    """Publishes to cronstream's topics. Thread-unsafe; one per thread."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings.from_env()
        self.topics = self.settings.topics
        self._producer = IdempotentProducer(producer_config(self.settings, "cronstream-client"))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: tuple[type[BaseException], BaseException, TracebackType]) -> None:
        self.close()

    def close(self) -> None:
        self._producer.flush()

    # -- definitions ----------------------------------------------------------------

    def apply(self, definitions: Iterable[JobDefinition]) -> list[str]:
        """Publish definitions (all validated first, DAG shape included); returns their
        job_ids. Raises DefinitionError and sends nothing when any is invalid."""
        definitions = list(definitions)
        if any(d.type == "DEPENDENT" for d in definitions):
            check_dags(definitions, self.definitions())
        stamped = []
        who = f"{getpass.getuser()}@{socket.gethostname()}"
        for definition in definitions:
            updates: dict[str, Any] = {}
            if definition.created_by is None:
                updates["created_by"] = who
            if definition.created_at is None:
                updates["created_at"] = datetime.now(UTC)
            stamped.append(definition.model_copy(update=updates) if updates else definition)
        for definition in stamped:
            self._producer.produce(OutRecord(
                self.topics.job_definitions, definition.job_id.encode(), definition.to_json(),
                trace_headers(new_traceparent()),
            ))
        self._producer.flush()
        return [d.job_id for d in stamped]

    def delete(self, job_id: str) -> None:
        self._producer.produce(OutRecord(self.topics.job_definitions, job_id.encode(), None))
        self._producer.flush()

    def get(self, job_id: str) -> JobDefinition | None:
        """The current definition of `job_id`, read from the compacted topic."""
        return self.definitions().get(job_id)

    def definitions(self) -> dict[str, JobDefinition]:
        """Every current definition, read from `job-definitions` to its end."""
        import asyncio

        from cronstream.shared.kafka import read_to_end

        latest: dict[str, bytes | None] = {}

        def keep(messages: list[Any]) -> None:
            for msg in messages:
                if msg.key() is not None:
                    latest[msg.key().decode("utf-8", "replace")] = msg.value()

        async def scan() -> None:
            reader = ConsumerThread(reader_config(self.settings, "cronstream-client"), "client")
            try:
                await read_to_end(reader, [TopicPartition(self.topics.job_definitions, 0)], keep)
            finally:
                await reader.close()

        asyncio.run(scan())
        found: dict[str, JobDefinition] = {}
        for job_id, value in latest.items():
            if value is None or len(value) > MAX_RECORD_BYTES:
                continue
            try:
                found[job_id] = JobDefinition.model_validate_json(value)
            except ValidationError:
                continue
        return found

    def set_enabled(self, job_id: str, enabled: bool, by: str | None = None) -> JobDefinition:
        """Publish the current definition with `enabled` changed; `by` (who acts, e.g. the
        dashboard's user) becomes its `created_by`."""
        current = self.get(job_id)
        if current is None:
            raise DefinitionError(f"no job {job_id!r}")
        changes: dict[str, Any] = {"enabled": enabled}
        if by is not None:
            changes["created_by"] = by
        updated = current.model_copy(update=changes)
        self.apply([updated])
        return updated

    def pause(self, job_id: str, by: str | None = None) -> JobDefinition:
        return self.set_enabled(job_id, False, by)

    def resume(self, job_id: str, by: str | None = None) -> JobDefinition:
        return self.set_enabled(job_id, True, by)

    # -- executions -----------------------------------------------------------------

    def trigger(self, job_id: str, at: datetime | None = None) -> UUID:
        """Run `job_id` now (reason MANUAL), outside its schedule; returns the execution id."""
        definition = self.get(job_id)
        if definition is None:
            raise DefinitionError(f"no job {job_id!r}")
        return self.submit(definition, to_millis(at or datetime.now(UTC)), "MANUAL")

    def command(self, kind: CommandKind, execution_id: UUID, reason: str | None = None,
                job_id: str | None = None, issued_by: str | None = None) -> Command:
        """Publish an operator command (CANCEL, APPROVE, REJECT) about one execution.

        `issued_by` names who acts (recorded as approved_by / rejected_by / cancelled_by on
        the event the command causes); by default the local user and host."""
        command = Command(command=kind, execution_id=execution_id, job_id=job_id, reason=reason,
                          issued_at=datetime.now(UTC),
                          issued_by=issued_by or f"{getpass.getuser()}@{socket.gethostname()}")
        self._producer.produce(OutRecord(self.topics.commands, str(execution_id).encode(),
                                         command.to_json(), trace_headers(new_traceparent())))
        self._producer.flush()
        return command

    def publish_event(self, event: ExecutionEvent) -> None:
        self._producer.produce(OutRecord(self.topics.execution_events, event.job_id.encode(),
                                         event.to_json(), trace_headers(new_traceparent())))
        self._producer.flush()

    def cancel_retry(self, retry_execution_id: UUID) -> None:
        """Drop a pending retry timer (a tombstone on `retries`)."""
        self._producer.produce(OutRecord(self.topics.retries, str(retry_execution_id).encode(), None))
        self._producer.flush()

    def cancel(self, execution_id: UUID, reason: str | None = None,
               issued_by: str | None = None) -> Command:
        """Cancel an execution: skipped if not started yet, stopped if running."""
        return self.command("CANCEL", execution_id, reason or "cancelled by an operator",
                            issued_by=issued_by)

    def submit(self, definition: JobDefinition, scheduled_at: datetime, reason: str) -> UUID:
        due = JobDue(
            execution_id=execution_id(definition.job_id, scheduled_at, 1),
            job_id=definition.job_id,
            run_id=run_id(definition.job_id, scheduled_at),
            scheduled_at=scheduled_at,
            attempt_number=1,
            reason=reason,  # type: ignore[arg-type]
            idempotency_key=idempotency_key(definition.job_id, scheduled_at, definition.params),
            job=JobSnapshot.of(definition),
        )
        self._producer.produce(OutRecord(self.topics.job_due, definition.job_id.encode(),
                                         due.to_json(), trace_headers(new_traceparent())))
        self._producer.flush()
        return due.execution_id
