"""The one inbound path of every consumer: error check, position, decode, dead-letter.

Every consumed batch goes through `Inbound`:

    inbound = Inbound("dispatcher", topics)
    batch = inbound.batch(messages)          # errors logged, positions noted
    for msg in batch.records:
        due = batch.decode(JobDue, msg, key_field="job_id")
        if due is None:
            continue                         # dead-lettered, with the reason
    ... produce batch.dead with the batch's transaction, commit batch.offsets()

Anything raised while decoding or validating one record — a validation error, a
RecursionError from a pathological expression, an OverflowError from a date no
computation can handle — dead-letters that record and the loop goes on
(docs/reference/limits.md#bad-input). The dead-letter copy keeps the original key and
bytes, truncated when it would not fit on the `dead-letters` topic, with the original
size, topic, partition, offset, service and reason in its headers.

What a consumer does with a record it cannot read is its policy, said where it builds its
`Inbound`: DEAD_LETTER (every service on the correctness path), or SKIP — log it
(`action=record_skipped`) and go on — for a reader of topics whose owners dead-letter
already (analytics replays `execution-events` at every start: it would copy the same
garbage again each time). A record passed over on purpose (`reject=False`: one an earlier
incarnation handled already) is neither.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from confluent_kafka import KafkaError, Message, TopicPartition

from cronstream.shared import metrics
from cronstream.shared.codec import DecodeError, decode
from cronstream.shared.kafka.errors import log_consumer_error
from cronstream.shared.kafka.reading import position
from cronstream.shared.logs import log
from cronstream.shared.producers import OutRecord
from cronstream.shared.records import Record
from cronstream.shared.topics import Topics

logger = logging.getLogger(__name__)

T = TypeVar("T", bound=Record)
R = TypeVar("R")

DLQ_TOPIC = "cronstream.dlq.topic"
DLQ_PARTITION = "cronstream.dlq.partition"
DLQ_OFFSET = "cronstream.dlq.offset"
DLQ_ERROR = "cronstream.dlq.error"
DLQ_SERVICE = "cronstream.dlq.service"
DLQ_ORIGINAL_SIZE = "cronstream.dlq.original-size"
DLQ_TRUNCATED = "cronstream.dlq.truncated"

# The dead-letter copy must fit under the producer's message.max.bytes (~1 MB) with its
# headers, whatever the broker accepted from someone else: keep the first 256 KiB.
MAX_DEAD_LETTER_VALUE = 256 * 1024
MAX_COPIED_HEADERS = 16 * 1024
MAX_REASON_CHARS = 2000

Policy = Literal["dead_letter", "skip"]
DEAD_LETTER: Policy = "dead_letter"
SKIP: Policy = "skip"


def dead_letter(topics: Topics, msg: Message, error: str, service: str) -> OutRecord:
    """The dead-letter copy of `msg`: original key and (possibly truncated) bytes, the
    reason and the origin in headers."""
    value = msg.value()
    size = len(value) if value is not None else 0
    truncated = value is not None and size > MAX_DEAD_LETTER_VALUE
    if truncated:
        assert value is not None
        value = value[:MAX_DEAD_LETTER_VALUE]
    key = msg.key()
    if key is not None and len(key) > MAX_COPIED_HEADERS:
        key = key[:MAX_COPIED_HEADERS]
    given = msg.headers() or []  # a list of (name, bytes) when read from Kafka
    original = [(k, v) for k, v in given if isinstance(v, bytes)] if isinstance(given, list) else []
    if sum(len(k) + len(v) for k, v in original) > MAX_COPIED_HEADERS:
        original = []  # a header flood is not worth copying
    headers = [
        *original,
        (DLQ_TOPIC, (msg.topic() or "").encode()),
        (DLQ_PARTITION, str(msg.partition()).encode()),
        (DLQ_OFFSET, str(msg.offset()).encode()),
        (DLQ_ERROR, error[:MAX_REASON_CHARS].encode()),
        (DLQ_SERVICE, service.encode()),
        (DLQ_ORIGINAL_SIZE, str(size).encode()),
    ]
    if truncated:
        headers.append((DLQ_TRUNCATED, b"true"))
    metrics.DEAD_LETTERS.labels(service=service, topic=topics.logical(msg.topic() or "")).inc()
    log(logger, "record_dead_lettered", logging.WARNING, service=service, topic=msg.topic(),
        partition=msg.partition(), offset=msg.offset(), size=size, reason=error[:300])
    return OutRecord(topics.dead_letters, key, value, headers)


@dataclass
class Batch:
    """One consumed batch: its valid records, their next offsets, the partitions it read
    to their end (EOF), the dead letters."""

    inbound: Inbound
    records: list[Message] = field(default_factory=list)
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    first_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    ended: set[tuple[str, int]] = field(default_factory=set)
    dead: list[OutRecord] = field(default_factory=list)

    def decode(self, model: type[T], msg: Message, key_field: str | None = None, *,
               reject: bool = True) -> T | None:
        """The record as `model`, or None after rejecting it with the reason."""
        return self.read(lambda value, key: decode(model, value, key=key, key_field=key_field), msg,
                         reject=reject)

    def read(self, reader: Callable[[bytes | None, bytes | None], R], msg: Message, *,
             reject: bool = True) -> R | None:
        """The record as `reader(value, key)` decodes it (raising DecodeError, as `decode`
        and the fast decoders do), or None after rejecting it with the reason (unless
        `reject` is False: a record handled before, passed over quietly)."""
        try:
            return reader(msg.value(), msg.key())
        except DecodeError as exc:
            if reject:
                self.reject(msg, str(exc))
            return None

    def apply(self, msg: Message, fn: Callable[[], Any], what: str) -> bool:
        """Run `fn` for a decoded record; whatever it raises dead-letters the record."""
        try:
            fn()
            return True
        except Exception as exc:
            self.reject(msg, f"{what} failed: {type(exc).__name__}: {exc}")
            return False

    def reject(self, msg: Message, reason: str) -> None:
        """Dead-letter the record with the reason, or log and skip it: the inbound's policy."""
        if self.inbound.policy == SKIP:
            log(logger, "record_skipped", logging.WARNING, service=self.inbound.service,
                topic=msg.topic(), partition=msg.partition(), offset=msg.offset(), reason=reason[:300])
            return
        self.dead.append(dead_letter(self.inbound.topics, msg, reason, self.inbound.service))

    def take(self, msg: Message) -> None:
        """Add a record read earlier (a worker's buffered claim): it is this batch's now,
        and so is its offset."""
        topic, partition, offset = position(msg)
        self.records.append(msg)
        self.next_offsets[(topic, partition)] = offset + 1
        self.first_offsets.setdefault((topic, partition), offset)

    def offsets(self) -> list[TopicPartition]:
        return [TopicPartition(t, p, o) for (t, p), o in self.next_offsets.items()]


class Inbound:
    def __init__(self, service: str, topics: Topics, policy: Policy = DEAD_LETTER) -> None:
        self.service = service
        self.topics = topics
        self.policy = policy

    def batch(self, messages: list[Message]) -> Batch:
        """Errors logged (a fatal consumer error raises), ends reached noted, positions of
        the records noted."""
        batch = Batch(self)
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    topic, partition, _ = position(msg)
                    batch.ended.add((topic, partition))
                log_consumer_error(self.service, err)
                continue
            batch.take(msg)
        return batch
