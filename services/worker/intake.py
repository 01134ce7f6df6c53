"""What a worker has consumed and not yet started — no Kafka, no clock of its own.

Records wait in a buffer per priority tier, in the order they were consumed; a turn
takes them highest tier first (`next`). A record scheduled a little ahead (a fire
committed ahead: docs/decisions/0027) is held until its scheduled_at, and so is what
follows it in its partition, so that the partition's offsets commit in order; other
partitions go on. For example, with partition 0 holding [A at 12:00:00.300, B due] and
partition 1 holding [C due], at 12:00:00.100 `next` gives C, then nothing (A and B wait),
and from 12:00:00.300 on A, then B.

Backpressure (decision 0011). Pausing a partition discards what librdkafka prefetched,
which it fetches again on resume (and paused and resumed often, stale fetches pile up in
its queue: librdkafka #5218): under a backlog that is the worker refetching, and decoding,
the same records over and over. So a full buffer does not pause: past its limit a turn
consumes one record at a time (its poll still serves rebalance callbacks), which the starts
outpace. Only handlers that stall let the buffer reach twice the limit, and that pauses
until the buffer is half empty.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from confluent_kafka import Message

from cronstream.shared.fast_records import DueRecord
from cronstream.shared.records import PRIORITIES

# A record scheduled at most this far ahead waits for its time (scheduler_fire_ahead_ms
# ≤ 1 s, plus clock skew); one scheduled further ahead was not put there by a fire ahead,
# and starts at once.
HOLD_AT_MOST_SECONDS = 2.0

Partition = tuple[str, int]
Reader = Callable[[Message], DueRecord | None]  # the JobDue, or None: dead-lettered


@dataclass(slots=True)
class Held:
    """A record waiting behind the first held record of its partition (or that one)."""

    msg: Message
    due: DueRecord | None = None
    read: bool = False  # decoded (due None: it was dead-lettered)


def partition_of(msg: Message) -> Partition:
    return msg.topic() or "", msg.partition() or 0


class Intake:
    """The buffer of one worker: consumed records by tier, and those held for their time.

    `tiers` maps each work topic to its priority tier (a topic it does not know is `low`).
    """

    def __init__(self, tiers: dict[str, str], capacity: int) -> None:
        self.tiers = dict(tiers)
        self.limit = max(1000, 4 * capacity)
        self.pause_limit = 2 * self.limit
        self._buffer: dict[str, deque[Message]] = {p: deque() for p in PRIORITIES}
        self._held: dict[Partition, deque[Held]] = {}
        # The earliest instant (epoch seconds) a held record comes due, as the last
        # selection (`next` since `begin`) found it; None: nothing held.
        self.hold_until: float | None = None

    def __len__(self) -> int:
        return sum(len(q) for q in self._buffer.values()) + sum(len(q) for q in self._held.values())

    def room(self) -> int:
        """How many records the next consume may take (at least one: see the docstring)."""
        return max(1, self.limit - len(self))

    def wants_pause(self, paused: bool) -> bool:
        """Whether the partitions should be paused now, given whether they are."""
        buffered = len(self)
        return buffered >= self.pause_limit or (paused and buffered > self.limit // 2)

    def add(self, messages: Iterable[Message]) -> None:
        for msg in messages:
            self._buffer[self.tiers.get(msg.topic() or "", "low")].append(msg)

    def waiting(self) -> bool:
        """Whether records wait in the tier buffers (held ones aside)."""
        return any(self._buffer.values())

    def partitions(self) -> set[Partition]:
        """The partitions of the records buffered or held."""
        return {partition_of(m) for q in self._buffer.values() for m in q} | self._held.keys()

    def begin(self) -> None:
        """Start a selection: `hold_until` is found anew by the calls to `next` that follow."""
        self.hold_until = None

    def next(self, read: Reader, now: datetime) -> tuple[Message, DueRecord | None] | None:
        """The next record to start and its JobDue (None: dead-lettered by `read`), by
        priority tier, never before its scheduled_at; None when nothing can start now."""
        for priority in PRIORITIES:
            for key, held in self._held.items():
                if self.tiers.get(key[0], "low") != priority:
                    continue
                head = held[0]
                if not head.read:
                    head.due, head.read = read(head.msg), True
                if head.due is not None and self._hold(head.due, now):
                    continue
                held.popleft()
                if not held:
                    del self._held[key]
                return head.msg, head.due
            tier = self._buffer[priority]
            while tier:
                msg = tier.popleft()
                key = partition_of(msg)
                behind = self._held.get(key)
                if behind is not None:
                    behind.append(Held(msg))  # decoded when its turn comes
                    continue
                due = read(msg)
                if due is not None and self._hold(due, now):
                    self._held[key] = deque([Held(msg, due, read=True)])
                    continue
                return msg, due
        return None

    def _hold(self, due: DueRecord, now: datetime) -> bool:
        """Whether `due` waits for its scheduled_at (then noted as a time to wake)."""
        wait = (due.scheduled_at - now).total_seconds()
        if not 0 < wait <= HOLD_AT_MOST_SECONDS:
            return False
        until = now.timestamp() + wait
        if self.hold_until is None or until < self.hold_until:
            self.hold_until = until
        return True

    def drop(self, partitions: set[Partition]) -> None:
        """Forget the records of `partitions` (revoked: they belong to their next owner)."""
        for priority, q in self._buffer.items():
            self._buffer[priority] = deque(m for m in q if partition_of(m) not in partitions)
        for key in partitions & self._held.keys():
            del self._held[key]

    def clear(self) -> None:
        for q in self._buffer.values():
            q.clear()
        self._held.clear()
        self.hold_until = None
