"""The calendars a scheduler process fires with (docs/decisions/0055).

Calendars are not sharded: a job of any shard may name any calendar, so every scheduler
process reads the whole compacted `calendars` topic into one table (calendar_id → the
resolved current version), to its end before any shard it leads fires, and then keeps
following it. The shard leaders of the process share the table and are told of each
change, upon which each re-plans, at once, the jobs of its shard that name the calendar.

A version is named by its record's offset on `calendars`: every process reads the same
log, and compaction keeps the offsets of the records it keeps, so the offset is the same
everywhere. A job's SchedulerState records the offset its next fire was computed with
(`calendar_offset`); a new leader trusts that timing only while the offset is still the
current one.

A tombstone deletes a calendar; a record that does not validate (the monitor dead-letters
it) leaves the calendar unknown too, as the SDK's `calendars()` reads it: the jobs naming
an unknown calendar wait (no fire) until it is applied again. A job never fires on a
calendar that is not the current version.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Message, TopicPartition

from cronstream.shared.calendars import ResolvedCalendar, resolve
from cronstream.shared.codec import decode_key
from cronstream.shared.inbound import SKIP, Inbound
from cronstream.shared.kafka.consumer import ConsumerThread
from cronstream.shared.kafka.errors import settled
from cronstream.shared.kafka.reading import position, read_to_end, record_time_ms
from cronstream.shared.logs import log
from cronstream.shared.records import Calendar
from cronstream.shared.topics import Topics

logger = logging.getLogger(__name__)

MAX_CALENDAR_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class KnownCalendar:
    """The current version of one calendar: evaluated, its offset on `calendars` (the
    version's name), and its record's Kafka timestamp (when the change took effect)."""

    resolved: ResolvedCalendar
    offset: int
    observed_ms: int


class CalendarTable:
    """calendar_id → its current version. Written by the process's calendar reader (on the
    event loop), read by the clocks of its shard leaders."""

    def __init__(self, *, ready: bool = False) -> None:
        self._known: dict[str, KnownCalendar] = {}
        # Set once the topic was read to the end it had at start: shards may fire then.
        self.ready = asyncio.Event()
        if ready:
            self.ready.set()
        self._listeners: list[Callable[[str], None]] = []

    def get(self, calendar_id: str) -> KnownCalendar | None:
        return self._known.get(calendar_id)

    def offset(self, calendar_id: str) -> int | None:
        known = self._known.get(calendar_id)
        return None if known is None else known.offset

    def ids(self) -> set[str]:
        return set(self._known)

    def __len__(self) -> int:
        return len(self._known)

    def listen(self, listener: Callable[[str], None]) -> None:
        """Call `listener(calendar_id)` on every change (a new version, a delete)."""
        self._listeners.append(listener)

    def unlisten(self, listener: Callable[[str], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def put(self, calendar: Calendar, offset: int, observed_ms: int) -> None:
        """A new version of a calendar (tests and the reader)."""
        self._set(calendar.calendar_id, KnownCalendar(resolve(calendar), offset, observed_ms))

    def delete(self, calendar_id: str) -> None:
        self._set(calendar_id, None)

    def apply(self, calendar_id: str, value: bytes | None, offset: int, observed_ms: int) -> None:
        """One record of `calendars`: a version, or (None, or a record that does not read)
        the calendar is gone."""
        known = self._known.get(calendar_id)
        if known is not None and known.offset == offset:
            return
        calendar = None
        if value is not None and len(value) <= MAX_CALENDAR_BYTES:
            try:
                calendar = Calendar.model_validate_json(value)
                if calendar.calendar_id != calendar_id:
                    raise ValueError(f"the key {calendar_id!r} is not its calendar_id")
            except Exception as exc:  # the monitor dead-letters it; here it is simply not known
                log(logger, "calendar_unreadable", logging.WARNING, calendar_id=calendar_id[:200],
                    offset=offset, error=str(exc)[:300])
                calendar = None
        if calendar is None:
            self._set(calendar_id, None)
        else:
            self._set(calendar_id, KnownCalendar(resolve(calendar), offset, observed_ms))

    def _set(self, calendar_id: str, known: KnownCalendar | None) -> None:
        if known is None:
            if self._known.pop(calendar_id, None) is None:
                return
        else:
            self._known[calendar_id] = known
        log(logger, "calendar_changed" if known is not None else "calendar_gone",
            logging.INFO if self.ready.is_set() else logging.DEBUG, calendar_id=calendar_id,
            offset=None if known is None else known.offset)
        for listener in list(self._listeners):
            listener(calendar_id)


class CalendarReader:
    """Reads `calendars` (every partition) into a table: to the end first, then on."""

    def __init__(self, topics: Topics, reader: ConsumerThread, table: CalendarTable) -> None:
        self.topics = topics
        self.reader = reader
        self.table = table
        # Bad records of `calendars` are the monitor's to dead-letter: here they are skipped.
        self.inbound = Inbound("scheduler", topics, SKIP)

    async def run(self, stopping: asyncio.Event) -> None:
        topic = self.topics.calendars
        found = await settled(lambda: self.reader.partitions(topic), f"partitions of {topic}")
        if not found:
            raise RuntimeError(f"topic {topic} does not exist: run `cronstream init`")
        await read_to_end(self.reader, [TopicPartition(topic, p) for p in found], self.apply)
        self.table.ready.set()
        log(logger, "calendars_read", calendars=len(self.table))
        while not stopping.is_set():
            self.apply(self.inbound.batch(await self.reader.consume(1000, 0.2)).records)

    def apply(self, records: list[Message]) -> None:
        """Records of `calendars` (read to the end by read_to_end, or through the inbound
        path, which passes consumer errors over)."""
        for msg in records:
            try:
                calendar_id = decode_key(msg.key())
            except Exception:  # a record without a readable key: the monitor's to dead-letter
                continue
            self.table.apply(calendar_id, msg.value(), position(msg)[2], record_time_ms(msg))
