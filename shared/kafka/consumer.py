"""The one way a service reads Kafka: a consumer whose every call runs on its own lane.

confluent-kafka is synchronous; services are asyncio programs. Each consumer owns one
lane (`shared/lanes.py`: a daemon thread) on which every call on it runs, so rebalance
callbacks run there too, the event loop is never blocked by a poll, and no call can hold
the service hostage: each has a deadline, after which the service fails loudly (and its
supervisor restarts it) instead of hanging.

Services use the verbs below and never the librdkafka consumer itself
(tests/unit/test_seams.py): `consume`, `subscribe`, `assign`, the offsets (`committed`,
`position`, `watermarks`, `offsets_for_times`), `group_metadata` for a transaction. What
must happen atomically with the rebalance callbacks — which run on the lane — runs as
one `on_lane` call on an `OnLane` view, the same view the callbacks get. The in-memory
bus of the unit tests (tests/unit/bus.py) fakes exactly this interface.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from cronstream.shared.kafka.errors import NOT_AUTHORIZED_HINT, NotAuthorized, not_authorized
from cronstream.shared.lanes import CallTimedOut, Lane
from cronstream.shared.logs import log

logger = logging.getLogger(__name__)

T = TypeVar("T")

# A call on a consumer that has not returned after this long is stuck (a rebalance
# callback included, which may load state): the service fails and is restarted.
CONSUMER_CALL_DEADLINE = 120.0
CLOSE_DEADLINE = 10.0
OFFSETS_TIMEOUT = 10.0


class OnLane:
    """The consumer as seen on its own lane: inside a rebalance callback, or an `on_lane`
    call. Synchronous, and only valid there."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    def assignment(self) -> list[TopicPartition]:
        return list(self._consumer.assignment())

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        self._consumer.assign(list(partitions))

    def unassign(self) -> None:
        self._consumer.unassign()

    def incremental_assign(self, partitions: Sequence[TopicPartition]) -> None:
        self._consumer.incremental_assign(list(partitions))

    def incremental_unassign(self, partitions: Sequence[TopicPartition]) -> None:
        self._consumer.incremental_unassign(list(partitions))

    def pause(self, partitions: Sequence[TopicPartition]) -> None:
        self._consumer.pause(list(partitions))

    def resume(self, partitions: Sequence[TopicPartition]) -> None:
        self._consumer.resume(list(partitions))

    def seek(self, partition: TopicPartition) -> None:
        self._consumer.seek(partition)

    def committed(self, partitions: Sequence[TopicPartition],
                  timeout: float = OFFSETS_TIMEOUT) -> list[TopicPartition]:
        return list(self._consumer.committed(list(partitions), timeout))

    def position(self, partitions: Sequence[TopicPartition]) -> list[TopicPartition]:
        return list(self._consumer.position(list(partitions)))

    def watermarks(self, partition: TopicPartition, timeout: float = OFFSETS_TIMEOUT,
                   cached: bool = False) -> tuple[int, int]:
        low, high = self._consumer.get_watermark_offsets(partition, timeout, cached)
        return int(low), int(high)

    def commit(self, offsets: Sequence[TopicPartition], asynchronous: bool = False) -> None:
        """Store `offsets` as the group's committed offsets."""
        if asynchronous:
            self._consumer.commit(offsets=list(offsets), asynchronous=True)
        else:
            self._consumer.commit(offsets=list(offsets), asynchronous=False)

    def seek_to_committed(self, partitions: Sequence[TopicPartition] | None = None,
                          from_start: int = -2) -> list[TopicPartition]:
        """Move each of `partitions` (default: the assignment) back to its committed
        offset (`from_start` where the group has none); the partitions a seek refused
        (not fetching yet: they start from their committed offset anyway) are logged."""
        wanted = self.assignment() if partitions is None else list(partitions)
        if not wanted:
            return []
        committed = self.committed([TopicPartition(tp.topic, tp.partition) for tp in wanted])
        for tp in committed:
            tp.offset = tp.offset if tp.offset >= 0 else from_start
            try:
                self._consumer.seek(tp)
            except KafkaException as exc:
                log(logger, "rewind_skipped", logging.DEBUG, topic=tp.topic,
                    partition=tp.partition, error=str(exc))
        return committed


Rebalance = Callable[[OnLane, list[TopicPartition]], None]


class ConsumerThread:
    """A confluent-kafka Consumer whose every call runs on one lane, with a deadline."""

    def __init__(self, conf: dict[str, Any], name: str) -> None:
        self.name = name
        self._lane = Lane(f"consumer-{name}")
        self._consumer: Consumer = self._lane.run(Consumer, conf, deadline=CONSUMER_CALL_DEADLINE)
        self._view = OnLane(self._consumer)
        self._closed = False

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._lane.call(fn, *args, deadline=CONSUMER_CALL_DEADLINE)

    async def on_lane(self, fn: Callable[[OnLane], T]) -> T:
        """Run `fn` on the consumer's lane, between polls and rebalance callbacks."""
        return await self._call(fn, self._view)

    # -- group membership -----------------------------------------------------------

    async def subscribe(self, topics: Sequence[str], on_assign: Rebalance | None = None,
                        on_revoke: Rebalance | None = None, on_lost: Rebalance | None = None) -> None:
        """Join the group on `topics`; the callbacks run on the lane, inside `consume`."""
        view = self._view

        def wrap(callback: Rebalance | None) -> Any:
            if callback is None:
                return None
            return lambda _consumer, partitions: callback(view, partitions)

        kwargs = {name: wrap(cb) for name, cb in
                  (("on_assign", on_assign), ("on_revoke", on_revoke), ("on_lost", on_lost))
                  if cb is not None}
        await self._call(lambda: self._consumer.subscribe(list(topics), **kwargs))

    def group_metadata(self) -> Any:
        """The group's generation, for a transaction's offsets (KIP-447 fencing). Safe from
        any thread (librdkafka copies it under its own lock)."""
        return self._consumer.consumer_group_metadata()

    # -- records ----------------------------------------------------------------------

    async def consume(self, max_messages: int, timeout: float) -> list[Message]:
        """Up to `max_messages`, returning as soon as any are available.

        `Consumer.consume(n, timeout)` waits until n records arrive or the timeout ends,
        which turns a batch size into latency. Instead: wait for the first record with
        `poll`, then take whatever else is already fetched without waiting.
        """
        return await self._call(self._consume, max_messages, timeout)

    def _consume(self, max_messages: int, timeout: float) -> list[Message]:
        first = self._consumer.poll(timeout)
        if first is None:
            return []
        if max_messages <= 1:
            return [first]
        return [first, *self._consumer.consume(max_messages - 1, 0)]

    # -- assignment and offsets (group-less readers, and checks) ----------------------

    async def assign(self, partitions: Sequence[TopicPartition]) -> None:
        await self.on_lane(lambda c: c.assign(partitions))

    async def unassign(self) -> None:
        await self.on_lane(lambda c: c.unassign())

    async def assignment(self) -> list[TopicPartition]:
        return await self.on_lane(lambda c: c.assignment())

    async def committed(self, partitions: Sequence[TopicPartition],
                        timeout: float = OFFSETS_TIMEOUT) -> list[TopicPartition]:
        return await self.on_lane(lambda c: c.committed(partitions, timeout))

    async def position(self, partitions: Sequence[TopicPartition]) -> list[TopicPartition]:
        return await self.on_lane(lambda c: c.position(partitions))

    async def watermarks(self, partition: TopicPartition, timeout: float = OFFSETS_TIMEOUT,
                         cached: bool = False) -> tuple[int, int]:
        return await self.on_lane(lambda c: c.watermarks(partition, timeout, cached))

    async def partitions(self, topic: str, timeout: float = OFFSETS_TIMEOUT) -> list[int] | None:
        """The partitions of `topic`, or None where it does not exist."""
        metadata = await self._call(self._consumer.list_topics, topic, timeout)
        found = metadata.topics.get(topic)
        if found is not None and not_authorized(found.error):
            # Refused, not missing: the principal's ACLs, said as such (the service stops).
            log(logger, "kafka_not_authorized", logging.ERROR, consumer=self.name, topic=topic,
                error=found.error.str(), hint=NOT_AUTHORIZED_HINT)
            raise NotAuthorized(f"{self.name}: {topic}: {found.error.str()}: {NOT_AUTHORIZED_HINT}")
        if found is None or found.error is not None or not found.partitions:
            return None
        return sorted(found.partitions)

    async def offsets_for_times(self, partitions: Sequence[TopicPartition],
                                timeout: float = OFFSETS_TIMEOUT) -> list[TopicPartition]:
        return list(await self._call(self._consumer.offsets_for_times, list(partitions), timeout))

    def run_sync(self, fn: Callable[[OnLane], T]) -> T:
        """`on_lane` from a non-event-loop context."""
        return self._lane.run(fn, self._view, deadline=CONSUMER_CALL_DEADLINE)

    async def close(self) -> None:
        """Leave the group and close; a close that hangs (no coordinator) is abandoned."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._lane.call(self._consumer.close, deadline=CLOSE_DEADLINE)
        except (KafkaException, RuntimeError, CallTimedOut) as exc:
            log(logger, "consumer_close_failed", logging.WARNING, consumer=self.name, error=str(exc))
        self._lane.close()
