"""Faster decoders for the execution events and the JobDue records every execution goes
through, which never accept what the model refuses (docs/decisions/0018).

The monitor decodes three events per execution (QUEUED, RUNNING, COMPLETED); validating
them with the pydantic models was a fifth of its CPU. `decode_event` reads them with
msgspec into `FastEvent` — the same fields, types, defaults and limits as
`records.ExecutionEvent`, checked in C — and hands everything it cannot take whole to
`codec.decode`, the model's own path, which then accepts or refuses it with the usual
reason. The fast path only ever *narrows* what is accepted:

- unknown fields (a newer minor version) and any other offset than UTC go to the model,
  which keeps the first and moves the second;
- so do records large enough that a `result` or `params` could pass a size limit (the
  model re-encodes those to measure them), and every status but the four that every
  execution has (the others are rare and some of them are published onwards: the model
  gives them all its methods);
- patterns are anchored with `\\Z`, not `$` (which would also match before a final
  newline, where the model's regex does not);
- instants outside [1970, 2999] go to the model (which refuses them with its reason), and
  so does a record with a time of more than six decimals anywhere (msgspec rounds the
  seventh, the model truncates).

`decode_due` reads a JobDue the same way into `FastDue`, for the dispatcher and the workers
(every reason takes the fast path; the checks above all apply); `as_model` turns one into
the model where a rare path copies or re-encodes it.

`tests/unit/test_fast_records.py` holds each pair together: the same fields and
defaults, and over valid records and thousands of mutated ones, a fast accept only where
the model accepts, with equal values.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal
from uuid import UUID

import msgspec

from cronstream.shared.codec import DecodeError, decode
from cronstream.shared.records import (
    EARLIEST,
    LATEST,
    MAX_MESSAGE_CHARS,
    MAX_PARAMS_BYTES,
    MAX_RESULT_BYTES,
    REENCODE_GROWTH,
    ConcurrencyPolicy,
    DueReason,
    ExecutionEvent,
    ExecutionStatus,
    JobDue,
    Priority,
)
from cronstream.shared.statuses import TERMINAL, Status

__all__ = ["FAST_STATUSES", "DueRecord", "EventRecord", "FastDue", "FastEvent", "FastSnapshot",
           "FastTriggerEvent", "FastUpstream", "FastUpstreamExecution", "as_model", "decode_due",
           "decode_event", "events_of", "upstream_of"]

_ZERO = timedelta(0)
# Larger than this, a `result` or `params` could be over its limit: the model measures.
FAST_MAX_BYTES = min(MAX_RESULT_BYTES, MAX_PARAMS_BYTES) // REENCODE_GROWTH
FAST_STATUSES = frozenset({Status.QUEUED, Status.RUNNING, Status.PROGRESS, Status.COMPLETED})


def _pattern(chars: str, most: int) -> msgspec.Meta:
    return msgspec.Meta(pattern=f"^[{chars}]{{1,{most}}}\\Z")


JobId = Annotated[str, _pattern("A-Za-z0-9_.-", 128)]
HandlerName = Annotated[str, _pattern("A-Za-z0-9_.:-", 128)]
QueueName = Annotated[str, _pattern("A-Za-z0-9_-", 64)]
WorkerId = Annotated[str, _pattern("A-Za-z0-9_.:@-", 128)]
Instant = Annotated[datetime, msgspec.Meta(tz=True)]
Text = Annotated[str, msgspec.Meta(max_length=MAX_MESSAGE_CHARS)]
Actor = Annotated[str, msgspec.Meta(max_length=256)]


class FastConcurrency(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """records.Concurrency, field for field (a key is parsed by the model: `_plain`)."""

    key: Annotated[str, msgspec.Meta(min_length=1, max_length=512)] | None = None
    max_running: Annotated[int, msgspec.Meta(ge=1, le=10_000)]


class FastSnapshot(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """records.JobSnapshot, field for field, in its order."""

    schema_version: Literal[1] = 1
    handler: HandlerName
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=7 * 86400)] = 3600
    max_retries: Annotated[int, msgspec.Meta(ge=0, le=100)] = 0
    retry_delay_seconds: Annotated[float, msgspec.Meta(ge=0, le=30 * 86400)] = 10
    max_retry_delay_seconds: Annotated[float, msgspec.Meta(ge=0, le=30 * 86400)] = 3600
    priority: Priority = "normal"
    queue: QueueName = "default"
    concurrency_policy: ConcurrencyPolicy = "ALLOW"
    max_concurrent_runs: Annotated[int, msgspec.Meta(ge=1, le=10_000)] | None = None
    concurrency: FastConcurrency | None = None
    pool: Annotated[str, _pattern("A-Za-z0-9_.-", 128)] | None = None
    pool_slots: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 1
    rate_limit: Annotated[str, msgspec.Meta(pattern=r"^[1-9][0-9]{0,8}/[smh]\Z")] | None = None
    definition_offset: Annotated[int, msgspec.Meta(ge=0)] | None = None
    # An event trigger's records: a record whose snapshot carries them is read through the
    # model (`decode_due`, `decode_event`), so the fast record only ever has None here.
    events: Any = None

    def model_dump_json(self) -> str:
        """The snapshot's JSON, as JobSnapshot.model_dump_json writes it."""
        return msgspec.json.encode(self).decode()

    def to_json(self) -> bytes:
        """The same as bytes, as JobSnapshot.to_json writes it."""
        return msgspec.json.encode(self)


class FastUpstreamExecution(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """records.UpstreamExecution, field for field, in its order."""

    execution_id: UUID
    status: ExecutionStatus
    result: Any = None
    result_omitted: bool = False


class FastUpstream(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """records.Upstream, field for field, in its order."""

    root_params: dict[str, Any] = msgspec.field(default_factory=dict)
    executions: Annotated[dict[JobId, FastUpstreamExecution], msgspec.Meta(max_length=64)] = \
        msgspec.field(default_factory=dict)


class FastTriggerEvent(msgspec.Struct, frozen=True, kw_only=True):
    """records.TriggerEvent as a handler sees it in `ctx.events` (the pool's pipe carries
    it: runner.Invocation): `.topic`, `.partition`, `.offset`, `.timestamp`, `.key`,
    `.value`, `.headers`, `.value_omitted`."""

    topic: str
    partition: int
    offset: int
    timestamp: datetime
    key: str | None = None
    value: Any = None
    headers: dict[str, str | None] = msgspec.field(default_factory=dict)
    value_omitted: bool = False


class FastEvent(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """records.ExecutionEvent, field for field, in its order (read only: nothing is
    published from it)."""

    schema_version: Literal[1] = 1
    event_id: UUID
    execution_id: UUID
    job_id: JobId
    run_id: UUID
    status: ExecutionStatus
    attempt_number: Annotated[int, msgspec.Meta(ge=1, le=1_000)]
    scheduled_at: Instant
    occurred_at: Instant
    delivery: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 1
    worker_id: WorkerId | None = None
    started_at: Instant | None = None
    completed_at: Instant | None = None
    error_message: Text | None = None
    result: Any = None
    progress: Annotated[float, msgspec.Meta(ge=0, le=100)] | None = None
    progress_message: Annotated[str, msgspec.Meta(max_length=1024)] | None = None
    priority: Priority | None = None
    queue: QueueName | None = None
    reason: DueReason | None = None
    idempotency_key: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    job: FastSnapshot | None = None
    approved_by: Actor | None = None
    rejected_by: Actor | None = None
    cancelled_by: Actor | None = None
    triggered_by: Actor | None = None
    waiting_reason: Text | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


class FastDue(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """records.JobDue, field for field, in its order. What the dispatcher and the workers
    read of a JobDue (the dispatcher publishes the record's own bytes onwards, never this
    one re-encoded)."""

    schema_version: Literal[1] = 1
    execution_id: UUID
    job_id: JobId
    run_id: UUID
    scheduled_at: Instant
    attempt_number: Annotated[int, msgspec.Meta(ge=1, le=1_000)] = 1
    reason: DueReason
    delivery: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 1
    idempotency_key: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    job: FastSnapshot
    approved_by: Actor | None = None
    triggered_by: Actor | None = None
    upstream: FastUpstream | None = None

    def model(self) -> JobDue:
        """The same record as the model, for the rare paths that copy or re-encode it."""
        return JobDue.model_validate_json(msgspec.json.encode(self))


# What the monitor holds of a decoded event: the fast record, or the model for the rest.
EventRecord = ExecutionEvent | FastEvent
# What the dispatcher and the workers hold of a decoded JobDue, the same way.
DueRecord = JobDue | FastDue

_EVENTS = msgspec.json.Decoder(FastEvent)


class _Ending(msgspec.Struct):
    status: str
    execution_id: UUID


_ENDING = msgspec.json.Decoder(_Ending)


def ending_of(value: bytes | None) -> tuple[str, UUID] | None:
    """The top-level `status` and `execution_id` of an execution event, the rest skipped
    unread (a fifth of a whole decode); None when the record has none to read."""
    if value is None:
        return None
    try:
        ending = _ENDING.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return ending.status, ending.execution_id


_DUES = msgspec.json.Decoder(FastDue)
_FINER_THAN_MICROSECONDS = re.compile(rb":\d\d\.\d{7}")


def _plain(job: FastSnapshot | None) -> bool:
    """Whether the fast path checked all of `job`: a concurrency key is an expression,
    which only the model parses (and keyed jobs are not the hot path)."""
    return job is None or job.concurrency is None or job.concurrency.key is None


def _in_range(value: datetime | None) -> bool:
    if value is None:
        return True
    if value.tzinfo is UTC and 1970 <= value.year < 2999:  # the usual case, in a third of the time
        return True
    return value.utcoffset() == _ZERO and EARLIEST <= value <= LATEST


def _takes(value: bytes, key: bytes | None) -> bool:
    """Whether the fast path may read the record at all (its size, key and times)."""
    return not (len(value) > FAST_MAX_BYTES or key is None
                or _FINER_THAN_MICROSECONDS.search(value))


def _fast(value: bytes, key: bytes | None) -> FastEvent | None:
    """The event, when the fast path can take it whole; None: the model decides."""
    if not _takes(value, key):
        return None
    try:
        event = _EVENTS.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if (event.status not in FAST_STATUSES or key != event.job_id.encode() or not _plain(event.job)
            or (event.job is not None and event.job.events is not None)
            or not (_in_range(event.scheduled_at) and _in_range(event.occurred_at)
                    and _in_range(event.started_at) and _in_range(event.completed_at))):
        return None
    return event


def decode_event(value: bytes | None, key: bytes | None) -> ExecutionEvent | FastEvent:
    """An execution event (key: its job_id), or DecodeError with the model's reason."""
    if value is not None:
        event = _fast(value, key)
        if event is not None:
            return event
    return decode(ExecutionEvent, value, key=key, key_field="job_id")


def as_model(due: JobDue | FastDue) -> JobDue:
    """`due` as the model (a FastDue converted, a JobDue as it is)."""
    return due if isinstance(due, JobDue) else due.model()


def upstream_of(due: JobDue | FastDue) -> FastUpstream | None:
    """The DAG step's upstream view of `due` as the fast record (the pool protocol carries
    it: runner.Invocation), or None for every execution that is not a DAG step."""
    upstream = due.upstream
    if upstream is None or isinstance(upstream, FastUpstream):
        return upstream
    return msgspec.convert(upstream.model_dump(mode="json"), FastUpstream)


def events_of(due: JobDue | FastDue) -> list[FastTriggerEvent] | None:
    """An event trigger's run's records (`ctx.events`), or None for any other execution (a
    JobDue with events is always the model: `decode_due`)."""
    events = due.job.events
    if not events or isinstance(due, FastDue):
        return None
    return [msgspec.convert(e.model_dump(mode="json"), FastTriggerEvent, strict=False) for e in events]


def decode_due(value: bytes | None, key: bytes | None) -> JobDue | FastDue:
    """A JobDue (key: its job_id) as a FastDue, or through the model as a JobDue, or
    DecodeError with the model's reason: `decode_event`'s rules for a JobDue, whose
    every reason takes the fast path."""
    if value is not None and _takes(value, key):
        try:
            due = _DUES.decode(value)
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
        else:
            if (key == due.job_id.encode() and _in_range(due.scheduled_at) and due.job.events is None
                    and _plain(due.job)):
                return due
    return decode(JobDue, value, key=key, key_field="job_id")


__all__ += ["DecodeError"]
