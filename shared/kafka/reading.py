"""Reading partitions by position: a record's place and time, where a topic's records since
a moment start, and reading compacted state to its end (the end each partition had when
the read began: the last stable offset, for read_committed)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from cronstream.shared.kafka.config import OFFSET_BEGINNING
from cronstream.shared.kafka.consumer import ConsumerThread
from cronstream.shared.kafka.errors import log_consumer_error, settled


def position(msg: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a consumed record (always set on one)."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


def record_time_ms(msg: Message) -> int:
    """The record's Kafka timestamp in epoch ms (now, for a record without one)."""
    kind, ts = msg.timestamp()
    return ts if kind and ts > 0 else time.time_ns() // 1_000_000


# The `offsets_for_times` timestamp that asks for a partition's latest offset.
LATEST = -1


async def ends(reader: ConsumerThread, partitions: Sequence[TopicPartition]) -> dict[tuple[str, int], int]:
    """The end each of `partitions` has now, asked in one request once the broker has
    settled: the latest offset the reader is given (read_committed: the last stable
    offset, the end of what committed). One request, not one per partition behind the
    reader's polls: a scheduler taking over eight shards waited 0.2 to 0.9 s for sixteen."""
    wanted = [TopicPartition(tp.topic, tp.partition, LATEST) for tp in partitions]

    async def ask() -> list[TopicPartition]:
        found = await reader.offsets_for_times(wanted)
        for tp in found:
            if tp.error is not None:
                raise KafkaException(tp.error)
        return found

    what = ", ".join(sorted({tp.topic for tp in wanted}))
    return {(tp.topic, tp.partition): tp.offset for tp in await settled(ask, f"ends of {what}")}


async def offsets_since(reader: ConsumerThread, topic: str, since_ms: int,
                        ) -> tuple[list[TopicPartition], dict[tuple[str, int], int]]:
    """Where to read each partition of `topic` from to see its records since `since_ms`
    (its end, where nothing is that recent), and the end each has now: once the broker
    has settled."""
    found = await settled(lambda: reader.partitions(topic), f"partitions of {topic}")
    if found is None:
        raise RuntimeError(f"topic {topic} does not exist: run `cronstream init`")
    wanted = [TopicPartition(topic, p, since_ms) for p in found]
    starts = await settled(lambda: reader.offsets_for_times(wanted), f"offsets of {topic}")
    now = await ends(reader, starts)
    for tp in starts:
        if tp.offset < 0:
            tp.offset = now[(tp.topic, tp.partition)]
    return starts, now


async def read_to_end(
    reader: ConsumerThread,
    partitions: Sequence[TopicPartition],
    handle: Callable[[list[Message]], None],
    batch: int = 10_000,
) -> None:
    """Assign `partitions` from the beginning and feed every record to `handle` until
    the end each had when the call began (the last stable offset: read_committed).

    The reader must have `enable.partition.eof`. Control records (transaction markers)
    occupy offsets, so the end is recognised by EOF or by position, not by last offset.
    """
    until = await ends(reader, partitions)
    # Every partition is assigned, even an empty one: the caller may keep consuming.
    await reader.assign([TopicPartition(t, p, OFFSET_BEGINNING) for (t, p) in until])
    pending = {k for k, end in until.items() if end > 0}
    while pending:
        messages = await reader.consume(batch, 0.5)
        records = []
        for msg in messages:
            err = msg.error()
            topic, partition, offset = position(msg)
            key = (topic, partition)
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if offset >= until.get(key, 0):
                        pending.discard(key)
                    continue
                log_consumer_error(reader.name, err)
                continue
            records.append(msg)
            if offset + 1 >= until.get(key, 0):
                pending.discard(key)
        if records:
            handle(records)
        if pending and not messages:
            positions = await reader.position([TopicPartition(t, p) for (t, p) in pending])
            for tp in positions:
                if tp.offset >= until[(tp.topic, tp.partition)]:
                    pending.discard((tp.topic, tp.partition))
