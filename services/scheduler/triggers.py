"""Event triggers, the pure part: what a record of a source topic is to a filter and to a
handler, how records gather into the batches that become runs, and the trigger's durable
state (docs/decisions/0057; the engine that reads the topic and commits is sources.py).

A batch closes when `max_events` records matched, when `max_wait_seconds` passed since
the first of them was written (its Kafka timestamp, or when it was read if that is
earlier: a producer's clock ahead of ours does not hold a batch back), or before its
records together would pass MAX_EVENTS_BYTES. A closed batch carries the positions the
trigger has read up to *at its last record*: committed with the run, they say that every
record before them is in this run or an earlier one, or was passed over.

No Kafka here: the engine feeds `SourceRecord`s and commits what `Closed` says.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec
from pydantic import Field

from cronstream.shared.condition import Condition, parse_filter
from cronstream.shared.records import (
    MAX_EVENT_VALUE_BYTES,
    MAX_EVENTS_BYTES,
    EventStart,
    EventTrigger,
    JobId,
    Record,
    TopicName,
    TriggerEvent,
)
from cronstream.shared.schedule import from_epoch_ms

logger = logging.getLogger(__name__)

_decode_json = msgspec.json.decode
_encode_json = msgspec.json.encode

# What one event costs in a JobDue besides its key, value and headers (names, position,
# timestamp): counted so that a batch of small records stays under the limit too.
EVENT_OVERHEAD_BYTES = 160


class TriggerState(Record):
    """An event trigger's durable state, on the compacted `trigger-state` topic (key:
    job_id, the partition of the job's shard), committed in the shard's transaction with
    the run whose records it moves past (decision 0057).

    `positions`: the next offset to read of each partition of `topic` (by partition
    number, as text: JSON's keys); a partition without one starts where `start` says —
    the beginning (`earliest`) or the first record written at or after `start_ms`, when
    the job was first accepted (`latest`)."""

    job_id: JobId
    topic: TopicName
    start: EventStart = "latest"
    start_ms: Annotated[int, Field(ge=0)]
    positions: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    # Since when (epoch ms) the trigger falls behind: its TRIGGER_BEHIND alert's episode,
    # open until the lag is back under the floor (`behind`); None while it keeps up.
    behind_since_ms: Annotated[int, Field(ge=0)] | None = None

    def next_offsets(self) -> dict[int, int]:
        return {int(p): o for p, o in self.positions.items()}


def state_of(job_id: str, trigger: EventTrigger, start_ms: int,
             positions: Mapping[int, int] | None = None, *,
             behind_since_ms: int | None = None) -> TriggerState:
    return TriggerState(job_id=job_id, topic=trigger.topic, start=trigger.start, start_ms=start_ms,
                        positions={str(p): o for p, o in sorted((positions or {}).items())},
                        behind_since_ms=behind_since_ms)


# A trigger falls behind (the TRIGGER_BEHIND alert) when its lag — records of its topic in
# no committed run and not passed over — stayed above its floor on BEHIND_LOOKS looks in a
# row (one every LOOK_SECONDS in sources.py: 30 s) and grew across them; the episode ends
# when the lag is back at or under the floor. The floor is BEHIND_RECORDS, or twice
# `max_events` for a trigger whose batches hold more: a batch waiting to fill is not lag.
BEHIND_RECORDS = 1000
BEHIND_LOOKS = 6


def behind_floor(trigger: EventTrigger) -> int:
    return max(BEHIND_RECORDS, 2 * trigger.batch.max_events)


def behind(looks: list[int], floor: int, open_since: bool) -> bool | None:
    """The alert's change after the latest look (`looks`: the lags of the last looks,
    oldest first): True to open an episode, False to end the open one, None for none."""
    if not looks:
        return None
    if open_since:
        return False if looks[-1] <= floor else None
    recent = looks[-BEHIND_LOOKS:]
    if len(recent) == BEHIND_LOOKS and min(recent) > floor and recent[-1] > recent[0]:
        return True
    return None


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """What a trigger reads of one record of its topic."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] | None = None


class Unevaluable(Exception):
    """The filter cannot be evaluated on this record: it does not match, and is counted."""


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "replace")


def decoded_value(raw: bytes | None) -> Any:
    """A record's value as a filter and a handler see it: JSON when it parses, else its
    text (invalid UTF-8 replaced), None for a null value."""
    if raw is None:
        return None
    try:
        return _decode_json(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError):
        # not JSON (or a number out of range), or nested deeper than a parser goes
        return raw.decode("utf-8", "replace")


def filter_view(record: SourceRecord) -> dict[str, Any]:
    """The fields a filter reads (condition.RECORD_FIELDS)."""
    return {
        "key": _text(record.key), "value": decoded_value(record.value),
        "headers": {name: _text(value) for name, value in record.headers or ()},
        "topic": record.topic, "partition": record.partition, "offset": record.offset,
        "timestamp": record.timestamp_ms,
    }


def matches(condition: Condition | None, view: Mapping[str, Any]) -> bool:
    """Whether the record passes the filter; Unevaluable when the filter cannot be
    evaluated on it (it then does not match)."""
    if condition is None:
        return True
    try:
        return condition.matches(view)
    except Exception as exc:  # a value no comparison foresaw: counted, never stops the trigger
        raise Unevaluable(f"{type(exc).__name__}: {str(exc)[:200]}") from None


def _json_size(value: Any) -> int:
    """About the bytes `value` takes in a JobDue (JSON data as the decoder made it)."""
    try:
        return len(_encode_json(value))
    except (TypeError, ValueError, OverflowError, RecursionError):
        return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode())


def to_event(record: SourceRecord, view: Mapping[str, Any]) -> tuple[TriggerEvent, int]:
    """The run's view of a matching record (`ctx.events`) and about what it costs in the
    JobDue, in bytes. A value larger than MAX_EVENT_VALUE_BYTES is left out (`value_omitted`)."""
    value = view["value"]
    value_size = _json_size(value)
    omitted = value_size > MAX_EVENT_VALUE_BYTES
    if omitted:
        value, value_size = None, 4
    key, headers = view["key"], view["headers"]
    # Built, not validated: every field comes from Kafka's own types or our decoding (a
    # topic name Kafka accepted, offsets, an aware UTC time, text, JSON data): the hot path.
    event = TriggerEvent.model_construct(
        topic=record.topic, partition=record.partition, offset=record.offset,
        timestamp=from_epoch_ms(record.timestamp_ms), key=key, value=value, headers=headers,
        value_omitted=omitted)
    # Key and headers as text in JSON: at most six bytes a byte (an escape, \u00XX).
    size = (EVENT_OVERHEAD_BYTES + value_size + len(record.key or b"") * 6
            + sum(len(name) * 6 + len(v or b"") * 6 for name, v in record.headers or ()))
    return event, size


@dataclass(frozen=True, slots=True)
class Closed:
    """A batch ready to run: its events and the positions to commit with its run."""

    events: list[TriggerEvent]
    positions: dict[int, int]


@dataclass
class Batcher:
    """One trigger's open batch, fed the records of its topic in order from `committed`
    (the positions of its last committed state)."""

    trigger: EventTrigger
    committed: dict[int, int] = field(default_factory=dict)
    condition: Condition | None = None
    positions: dict[int, int] = field(default_factory=dict)
    events: list[TriggerEvent] = field(default_factory=list)
    first_ms: int | None = None
    size: int = 0
    unevaluable: int = 0
    matched: int = 0
    passed_over: int = 0

    def __post_init__(self) -> None:
        if self.condition is None and self.trigger.filter is not None:
            self.condition = parse_filter(self.trigger.filter)
        self.positions = dict(self.committed)

    @property
    def max_wait_ms(self) -> int:
        return int(self.trigger.batch.max_wait_seconds * 1000)

    def add(self, record: SourceRecord, now_ms: int) -> Closed | None:
        """Take the next record of its partition; a batch it closes (the record is then
        in the next one, or passed over)."""
        if record.offset < self.positions.get(record.partition, 0):
            return None  # read again (a seek back): already in a batch or passed over
        view = filter_view(record)
        try:
            hit = matches(self.condition, view)
        except Unevaluable as exc:
            self.unevaluable += 1
            logger.debug("trigger record unevaluable", extra={
                "action": "trigger_record_unevaluable", "topic": record.topic,
                "partition": record.partition, "offset": record.offset, "error": str(exc)})
            hit = False
        closed = None
        if hit:
            event, size = to_event(record, view)
            if self.events and self.size + size > MAX_EVENTS_BYTES:
                closed = self._close()
            self.events.append(event)
            self.size += size
            self.matched += 1
            if self.first_ms is None:
                self.first_ms = min(record.timestamp_ms, now_ms)
        else:
            self.passed_over += 1
        self.positions[record.partition] = record.offset + 1
        if closed is None and len(self.events) >= self.trigger.batch.max_events:
            closed = self._close()
        return closed

    def due_ms(self) -> int | None:
        """When the open batch runs if no more records come (None: it is empty)."""
        return None if self.first_ms is None else self.first_ms + self.max_wait_ms

    def due(self, now_ms: int) -> Closed | None:
        """The open batch, when its wait is over."""
        due = self.due_ms()
        return self._close() if due is not None and now_ms >= due else None

    def _close(self) -> Closed:
        # Everything read so far (the record being added, when it starts the next batch,
        # is not counted yet): each record before these positions is in this batch, in
        # an earlier one, or was passed over.
        closed = Closed(self.events, dict(self.positions))
        self.events, self.size, self.first_ms = [], 0, None
        return closed

    def advanced(self) -> dict[int, int] | None:
        """With no batch open: positions past records that were only passed over, worth
        committing on their own (a restart does not read them again); else None."""
        if self.events or self.positions == self.committed:
            return None
        return dict(self.positions)

    def commit(self, positions: Mapping[int, int]) -> None:
        """What a committed transaction made durable."""
        for partition, offset in positions.items():
            self.committed[partition] = max(offset, self.committed.get(partition, 0))

    def rewind(self) -> None:
        """Forget what was read past the committed positions (a transaction failed, or the
        job was paused): it is read again from there."""
        self.positions = dict(self.committed)
        self.events, self.size, self.first_ms = [], 0, None


def lag(ends: Mapping[int, int], committed: Mapping[int, int], starts: Mapping[int, int]) -> int:
    """Records of the topic the trigger has not yet put in a committed run or passed over:
    per partition, its end minus the committed position (or where it starts)."""
    return sum(max(0, end - committed.get(p, starts.get(p, end))) for p, end in ends.items())


def fed(batcher: Batcher, records: Iterable[SourceRecord], now_ms: int) -> list[Closed]:
    """Every batch that `records`, taken in order, close."""
    out = []
    for record in records:
        closed = batcher.add(record, now_ms)
        if closed is not None:
            out.append(closed)
    return out
