"""A consumed batch of the monitor's topics, decoded through the one inbound path.

Every item keeps its (partition, offset) so that the part another monitor has already
projected can be left out (store.py: the fence). Records that do not decode are
dead-lettered (published with the batch, before its PostgreSQL commit); bad
`job-definitions` records are the scheduler's to dead-letter, so the monitor only logs
and skips them. Bad `calendars` records are the monitor's to dead-letter: every
scheduler shard reads that topic, and none of them owns it. A log record keeps its
message: lines of it refused where they are kept (log_bounds.py) dead-letter it then,
through the same path (`reject`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from confluent_kafka import Message

from cronstream.shared.codec import DecodeError, decode, decode_key
from cronstream.shared.fast_records import EventRecord, decode_event
from cronstream.shared.inbound import Inbound
from cronstream.shared.kafka.reading import position, record_time_ms
from cronstream.shared.logs import log
from cronstream.shared.producers import OutRecord
from cronstream.shared.records import (
    DELETED_BY_HEADER,
    MAX_LOG_BATCH_BYTES,
    Alert,
    Calendar,
    Command,
    Heartbeat,
    JobDefinition,
    LogBatch,
)
from cronstream.shared.schedule import from_epoch_ms
from cronstream.shared.telemetry import traceparent_of
from cronstream.shared.topics import Topics

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DefinitionRecord:
    """One record of `job-definitions`: a definition, or a delete (None) with who deleted
    it when the tombstone says (DELETED_BY_HEADER); when it was written, and where."""

    job_id: str
    definition: JobDefinition | None
    recorded_at: datetime
    partition: int
    offset: int
    deleted_by: str | None = None


@dataclass(frozen=True, slots=True)
class CalendarRecord:
    """One record of `calendars`: a calendar, or a delete (None) with who deleted it;
    when it was written, and where."""

    calendar_id: str
    calendar: Calendar | None
    recorded_at: datetime
    partition: int
    offset: int
    deleted_by: str | None = None


@dataclass(frozen=True, slots=True)
class ConsumedLog:
    """One record of `execution-logs`: its batch of lines, where it was read, and the record
    itself (dead-lettered when its lines are refused: services/monitor/log_bounds.py)."""

    batch: LogBatch
    partition: int
    offset: int
    message: Message


@dataclass
class MonitorBatch:
    """One consumed batch, decoded, each item with its partition and offset."""

    events: list[tuple[EventRecord, int, int]] = field(default_factory=list)
    beats: list[tuple[Heartbeat, int, int]] = field(default_factory=list)
    definitions: list[DefinitionRecord] = field(default_factory=list)
    calendars: list[CalendarRecord] = field(default_factory=list)
    commands: list[tuple[Command, int, int]] = field(default_factory=list)
    alerts: list[tuple[Alert, int, int]] = field(default_factory=list)
    logs: list[ConsumedLog] = field(default_factory=list)
    dead: list[tuple[OutRecord, str, int, int]] = field(default_factory=list)
    traces: dict[UUID, str] = field(default_factory=dict)  # event_id -> traceparent
    epoch: int = 0  # the monitor's resync epoch when it was read (service.py: _resync)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    starts: dict[tuple[str, int], int] = field(default_factory=dict)

    def seen(self, topic: str, partition: int, offset: int) -> None:
        self.offsets[(topic, partition)] = offset + 1
        self.starts.setdefault((topic, partition), offset)

    def __len__(self) -> int:
        return sum(self.offsets[k] - self.starts[k] for k in self.offsets)


class Decoder:
    def __init__(self, inbound: Inbound, topics: Topics) -> None:
        self.inbound = inbound
        self.topics = topics

    def decode(self, messages: list[Message]) -> MonitorBatch:
        batch = MonitorBatch()
        consumed = self.inbound.batch(messages)
        t = self.topics
        # Each record on its own: a batch validated as one JSON list would take two events
        # in one record, or two records that form an event only when joined, for valid ones.
        for msg in consumed.records:
            topic, partition, offset = position(msg)
            batch.seen(topic, partition, offset)
            try:
                if topic == t.execution_events:
                    event = decode_event(msg.value(), msg.key())
                    batch.events.append((event, partition, offset))
                    self._trace(batch, event, msg)
                elif topic == t.execution_logs:
                    batch.logs.append(ConsumedLog(
                        decode(LogBatch, msg.value(), key=msg.key(), key_field="execution_id",
                               max_bytes=MAX_LOG_BATCH_BYTES), partition, offset, msg))
                elif topic == t.heartbeats:
                    beat = decode(Heartbeat, msg.value(), key=msg.key(), key_field="worker_id")
                    batch.beats.append((beat, partition, offset))
                elif topic == t.commands:
                    batch.commands.append((decode(Command, msg.value()), partition, offset))
                elif topic == t.alerts:
                    batch.alerts.append((decode(Alert, msg.value()), partition, offset))
                elif topic == t.calendars:
                    calendar_id = decode_key(msg.key())
                    calendar = None if msg.value() is None else decode(
                        Calendar, msg.value(), key=msg.key(), key_field="calendar_id")
                    batch.calendars.append(CalendarRecord(
                        calendar_id, calendar, from_epoch_ms(record_time_ms(msg)), partition, offset,
                        None if calendar is not None else _deleted_by(msg)))
                else:
                    job_id = decode_key(msg.key())
                    definition = None if msg.value() is None else decode(
                        JobDefinition, msg.value(), key=msg.key(), key_field="job_id")
                    batch.definitions.append(DefinitionRecord(
                        job_id, definition, from_epoch_ms(record_time_ms(msg)), partition, offset,
                        None if definition is not None else _deleted_by(msg)))
            except DecodeError as exc:
                if topic == t.job_definitions:
                    log(logger, "definition_skipped", logging.WARNING, offset=offset,
                        reason=str(exc)[:300])
                else:
                    consumed.reject(msg, str(exc))
                    batch.dead.append((consumed.dead[-1], topic, partition, offset))
        return batch

    def reject(self, msg: Message, reason: str) -> list[OutRecord]:
        """The dead letter of a record that decoded but was refused where it is written
        (log lines past their bounds: log_bounds.py), through the one inbound path."""
        refused = self.inbound.batch([])
        refused.reject(msg, reason)
        return refused.dead

    @staticmethod
    def _trace(batch: MonitorBatch, event: EventRecord, msg: Message) -> None:
        traceparent = traceparent_of(msg.headers())
        if traceparent is not None:
            batch.traces[event.event_id] = traceparent


def _deleted_by(msg: Message) -> str | None:
    given = msg.headers()  # a list of (name, bytes) when read from Kafka
    for header in given if isinstance(given, list) else []:
        name, value = header
        if name == DELETED_BY_HEADER and isinstance(value, bytes):
            return value.decode("utf-8", "replace")[:256] or None
    return None
