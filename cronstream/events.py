"""Consume cronstream's public `execution-events` topic from your own systems.

    from cronstream.events import subscribe

    with subscribe(group_id="billing") as events:
        for event in events:                 # a typed ExecutionEvent
            if event.status == "COMPLETED":
                bill(event.job_id, event.result)
            # the event counts as consumed only once this body has returned

Guarantees (docs/consuming-events.md):
- read_committed: only events of committed transactions, in order per job (the topic is
  keyed by job_id).
- An event's offset is committed only after the loop body (your callback) for it has
  returned: stop the process at any point and the next consumer of the group starts at
  the first event you had not finished. A clean stop (`stop()`, leaving the `with`,
  Ctrl-C) commits what was finished, so a restart sees every event exactly once.
- Repeats are dropped by `event_id` (a window of the last `dedupe_window` ids). After a
  crash (no clean stop) the events finished since the last periodic commit
  (`commit_interval`) come again: make effects idempotent on `event_id` when that matters.
- Records this version cannot read (garbage, an unknown major `schema_version`) are
  logged (`action=event_skipped`) and skipped, never raised into your loop; their count
  is `Subscription.skipped`.

`stop()` may be called from another thread or a signal handler:

    signal.signal(signal.SIGTERM, lambda *_: events.stop())
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Collection, Iterator
from types import TracebackType
from typing import Any
from uuid import UUID

from confluent_kafka import Consumer, KafkaError, KafkaException, Message

from cronstream.shared.codec import DecodeError, decode
from cronstream.shared.kafka.config import client_config
from cronstream.shared.logs import log
from cronstream.shared.records import ExecutionEvent, ExecutionStatus
from cronstream.shared.settings import Settings

__all__ = ["ExecutionEvent", "Subscription", "subscribe"]

logger = logging.getLogger(__name__)


class Subscription:
    """An iterator over `execution-events` for one consumer group. Use it once, in a
    `with` block (or call `close()`); see the module's documentation."""

    def __init__(
        self,
        group_id: str,
        *,
        settings: Settings | None = None,
        from_beginning: bool = False,
        job_ids: Collection[str] | None = None,
        statuses: Collection[ExecutionStatus] | None = None,
        dedupe_window: int = 100_000,
        commit_interval: float = 1.0,
        poll_timeout: float = 0.5,
    ) -> None:
        if not group_id:
            raise ValueError("group_id: required (the consumer group that owns the offsets)")
        self.settings = settings or Settings.from_env()
        self.topic = self.settings.topics.execution_events
        self.group_id = group_id
        self.skipped = 0
        self._job_ids = frozenset(job_ids) if job_ids is not None else None
        self._statuses = frozenset(statuses) if statuses is not None else None
        self._seen: OrderedDict[UUID, None] = OrderedDict()
        self._window = dedupe_window
        self._poll_timeout = poll_timeout
        self._stopping = threading.Event()
        self._closed = False
        conf: dict[str, Any] = client_config(self.settings, f"cronstream-events-{group_id}")
        conf.update({
            "group.id": group_id,
            "isolation.level": "read_committed",
            # Offsets are stored only once the caller is done with an event; librdkafka
            # commits what is stored periodically, on a rebalance and on close.
            "enable.auto.commit": True,
            "enable.auto.offset.store": False,
            "auto.commit.interval.ms": max(100, int(commit_interval * 1000)),
            "auto.offset.reset": "earliest" if from_beginning else "latest",
        })
        self._consumer = Consumer(conf)
        self._consumer.subscribe([self.topic])

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __iter__(self) -> Iterator[ExecutionEvent]:
        try:
            while not self._stopping.is_set():
                msg = self._consumer.poll(self._poll_timeout)
                if msg is None:
                    continue
                event = self._accept(msg)
                if event is None:
                    self._done(msg)
                    continue
                yield event
                # Only reached when the caller asks for the next event: the body for this
                # one has returned.
                self._remember(event.event_id)
                self._done(msg)
        finally:
            self.close()

    def stop(self) -> None:
        """End the iteration after the current event (thread- and signal-safe)."""
        self._stopping.set()

    def close(self) -> None:
        """Commit what was finished and leave the group (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(KafkaException):  # _NO_OFFSET: nothing finished yet
            self._consumer.commit(asynchronous=False)
        self._consumer.close()

    def _accept(self, msg: Message) -> ExecutionEvent | None:
        err: KafkaError | None = msg.error()
        if err is not None:
            if err.fatal():
                raise KafkaException(err)
            if err.code() != KafkaError._PARTITION_EOF:
                log(logger, "consumer_error", logging.WARNING, consumer=self.group_id, error=err.str())
            return None
        try:
            event = decode(ExecutionEvent, msg.value(), key=msg.key(), key_field="job_id")
        except DecodeError as exc:
            self.skipped += 1
            log(logger, "event_skipped", logging.WARNING, topic=msg.topic(),
                partition=msg.partition(), offset=msg.offset(), reason=str(exc)[:300])
            return None
        if event.event_id in self._seen:
            return None
        if self._job_ids is not None and event.job_id not in self._job_ids:
            return None
        if self._statuses is not None and event.status not in self._statuses:
            return None
        return event

    def _remember(self, event_id: UUID) -> None:
        self._seen[event_id] = None
        if len(self._seen) > self._window:
            self._seen.popitem(last=False)

    def _done(self, msg: Message) -> None:
        if msg.error() is None:
            self._consumer.store_offsets(message=msg)


def subscribe(
    group_id: str,
    *,
    settings: Settings | None = None,
    from_beginning: bool = False,
    job_ids: Collection[str] | None = None,
    statuses: Collection[ExecutionStatus] | None = None,
    dedupe_window: int = 100_000,
    commit_interval: float = 1.0,
) -> Subscription:
    """Consume `execution-events` as consumer group `group_id` (settings from
    `CRONSTREAM_*` by default). A new group starts at the end of the topic, or at its
    beginning with `from_beginning`; an existing group resumes where it committed.
    `job_ids` / `statuses` filter what is yielded (the rest is consumed silently)."""
    return Subscription(group_id, settings=settings, from_beginning=from_beginning,
                        job_ids=job_ids, statuses=statuses, dedupe_window=dedupe_window,
                        commit_interval=commit_interval)
