"""Keeping shards warm: one reader per scheduler process follows the partitions of every
shard the process leads or stands by for, and writes what it reads into each shard's
store (store.py), so that taking a shard over reads only the tail.

Per shard, by the process's role in it:
- standby: `job-definitions`, `scheduler-state` and `retries` of the shard, applied to its
  store as they come (nothing validated: the leader judges the records);
- taking over: `scheduler-state` and `retries`, until they reach the end they had once
  the new leader fenced its predecessor (`caught_up`): then the store holds everything
  the predecessor committed (the leader reads the definitions itself, from where the
  store stands);
- leading: `retries` only, handed to the leader (a retry a worker asked for is a timer
  of the shard). Definitions reach the leader through the election consumer, and the
  state it writes itself.

Positions are stored with the rows, in the same SQLite transaction: a process that stops
resumes where its store stands.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from confluent_kafka import Message, TopicPartition

from cronstream.services.scheduler.store import ShardStore
from cronstream.shared.codec import decode_key
from cronstream.shared.inbound import SKIP, Inbound
from cronstream.shared.kafka.config import OFFSET_BEGINNING
from cronstream.shared.kafka.consumer import ConsumerThread, OnLane
from cronstream.shared.kafka.reading import ends, position, record_time_ms
from cronstream.shared.topics import Topics

logger = logging.getLogger(__name__)

Role = Literal["standby", "taking_over", "leading"]
BATCH = 10_000
# A poll with nothing to read waits this long; a takeover's first call on the lane waits
# for it (0.2 s before: two calls a shard, behind the polls, made a takeover's tail of a
# few records take 0.7 to 1.6 s).
IDLE_POLL_SECONDS = 0.05
# A hold lasts at most this long in a row; then one batch is read before the next.
HOLD_AT_MOST_SECONDS = 1.0


def retry_due_ms(value: bytes) -> int:
    """When a `retries` record is due, read cheaply (0, due now, when it does not read:
    the leader then judges it, and dead-letters it, when it comes due)."""
    try:
        data = json.loads(value)
        when = datetime.fromisoformat(data["due_at"].replace("Z", "+00:00"))
        return int(when.timestamp() * 1000) if when.tzinfo is not None else 0
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return 0


@dataclass
class Followed:
    """One shard as the follower reads it."""

    shard: int
    store: ShardStore
    role: Role
    # Taking over: the end each partition must reach, and who waits for it.
    ends: dict[str, int] = field(default_factory=dict)
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    # Leading: where a retry record of the shard goes.
    on_retries: Callable[[list[Message]], None] | None = None


class Follower:
    def __init__(self, topics: Topics, reader: ConsumerThread) -> None:
        self.topics = topics
        self.reader = reader
        self.inbound = Inbound("scheduler", topics, SKIP)
        self.shards: dict[int, Followed] = {}
        # What is assigned, and for which Followed (a shard followed anew starts again).
        self._assigned: dict[tuple[str, int], Followed] = {}
        self._changed = asyncio.Event()
        # (monotonic) until when the reader is held, and since when without a batch read.
        self._held_until = 0.0
        self._held_since = 0.0
        # Takeovers waiting to learn their partitions' ends: asked together, by the loop.
        self._asks: list[tuple[Followed, asyncio.Future[None]]] = []

    def hold(self, seconds: float) -> None:
        """A leader of this process fires a burst: read nothing for `seconds` (unless a
        takeover waits), at most HOLD_AT_MOST_SECONDS in a row."""
        now = time.monotonic()
        if now >= self._held_until:
            self._held_since = now
        self._held_until = max(self._held_until, now + seconds)

    def _holding(self) -> bool:
        now = time.monotonic()
        if now >= self._held_until:
            return False
        if now - self._held_since >= HOLD_AT_MOST_SECONDS:
            self._held_since = now  # one batch now, then held again
            return False
        return True

    # -- what to follow --------------------------------------------------------------

    def follow(self, shard: int, store: ShardStore, role: Role,
               on_retries: Callable[[list[Message]], None] | None = None) -> Followed:
        followed = Followed(shard, store, role, on_retries=on_retries)
        self.shards[shard] = followed
        self._changed.set()
        return followed

    def forget(self, shard: int) -> None:
        if self.shards.pop(shard, None) is not None:
            self._changed.set()

    def _wanted(self) -> dict[tuple[str, int], Followed]:
        wanted: dict[tuple[str, int], Followed] = {}
        for s, f in self.shards.items():
            for topic in self._topics(f.role):
                wanted[(topic, s)] = f
        return wanted

    def _topics(self, role: Role) -> list[str]:
        """What the follower reads of a shard: everything for a standby; a shard taken over
        reads its definitions through the leader's own consumer (from where this store
        stands), so only its state and retries here; a leader's, only its retries."""
        t = self.topics
        if role == "standby":
            return [t.job_definitions, t.scheduler_state, t.retries]
        return [t.scheduler_state, t.retries] if role == "taking_over" else [t.retries]

    async def _reassign(self, wanted: dict[tuple[str, int], Followed]) -> None:
        """Assign what is wanted, incrementally: a partition followed as before keeps its
        fetch (a takeover's new role, or a new standby shard, does not reset the fetch of
        every other partition); one newly wanted, or followed anew (a new role, a new
        store), starts where its store stands."""
        same = {key for key, f in wanted.items() if self._assigned.get(key) is f}
        gone = [TopicPartition(topic, shard) for topic, shard in sorted(set(self._assigned) - same)]
        new = []
        for (topic, shard), f in sorted(wanted.items()):
            if (topic, shard) not in same:
                at = f.store.positions().get(topic)
                new.append(TopicPartition(topic, shard, OFFSET_BEGINNING if at is None else at))
        if gone:
            await self.reader.on_lane(lambda c: c.incremental_unassign(gone))
        if new:
            await self.reader.on_lane(lambda c: c.incremental_assign(new))
        self._assigned = dict(wanted)

    # -- taking over ----------------------------------------------------------------

    async def caught_up(self, shard: int) -> None:
        """Read the shard's state and retries to the end they have now (the new leader has
        fenced its predecessor, so nothing it committed is still to come)."""
        f = self.shards[shard]
        f.reached.clear()
        asked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._asks.append((f, asked))
        self._changed.set()
        await asked
        self._check_reached(f)
        await f.reached.wait()

    async def _ask_ends(self) -> None:
        """The ends of the partitions every waiting takeover must reach, in one request
        (a process given a stopped one's shards takes them over all at once)."""
        asks, self._asks = self._asks, []
        try:
            now = await ends(self.reader, [TopicPartition(topic, f.shard)
                                           for f, _ in asks for topic in self._topics(f.role)])
        except Exception as exc:
            for _f, asked in asks:
                if not asked.done():
                    asked.set_exception(exc)
            return
        for f, asked in asks:
            f.ends = {topic: now[(topic, f.shard)] for topic in self._topics(f.role)}
            if not asked.done():
                asked.set_result(None)

    def _check_reached(self, f: Followed) -> None:
        if not f.ends:
            return
        at = f.store.positions()
        if all(at.get(topic, 0) >= end for topic, end in f.ends.items()):
            f.ends = {}
            f.reached.set()

    # -- the loop -------------------------------------------------------------------

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            if self._changed.is_set():
                self._changed.clear()
                await self._reassign(self._wanted())
            if self._asks:
                await self._ask_ends()
            if not self._assigned:
                await _wait(self._changed, stopping, 0.5)
                continue
            waiting = any(f.ends for f in self.shards.values())
            if not waiting and self._holding():
                await _wait(self._changed, stopping, 0.02)
                continue
            # A takeover waits on this loop: poll briefly then, and look at the positions
            # after every batch (a partition written in transactions ends in a marker,
            # which takes an offset and brings no record).
            short = waiting or bool(self._asks)
            messages = await self.reader.consume(BATCH, 0.01 if short else IDLE_POLL_SECONDS)
            self.apply(messages)
            if waiting:
                await self._check_positions()

    async def _check_positions(self) -> None:
        """Nothing came: a partition whose records end in a transaction marker is at its
        end by position, not by a record (markers take offsets too)."""
        waiting = [f for f in self.shards.values() if f.ends]
        if not waiting:
            return
        wanted = [TopicPartition(topic, f.shard) for f in waiting for topic in f.ends]
        for tp in await self.reader.position(wanted):
            f = self.shards.get(tp.partition)
            if f is not None and tp.offset >= 0 and tp.offset > f.store.positions().get(tp.topic, -1):
                f.store.write(positions=[(tp.topic, tp.offset)])
        for f in waiting:
            self._check_reached(f)

    def apply(self, messages: list[Message]) -> None:
        """Write each shard's records into its store (one transaction per shard). Nothing
        is judged here (the leader judges the records it fires): the inbound path only
        reports consumer errors."""
        t = self.topics
        by_shard: dict[int, dict[str, list[Message]]] = {}
        for msg in self.inbound.batch(messages).records:
            topic, partition, _offset = position(msg)
            by_shard.setdefault(partition, {}).setdefault(topic, []).append(msg)
        for shard, topics in by_shard.items():
            f = self.shards.get(shard)
            if f is None:
                continue
            definitions, states, retries = [], [], []
            positions = []
            for topic, msgs in topics.items():
                positions.append((topic, position(msgs[-1])[2] + 1))
                if topic == t.job_definitions:
                    definitions = [(_key(m), position(m)[2], record_time_ms(m), m.value())
                                   for m in msgs if _key(m)]
                elif topic == t.scheduler_state:
                    states = [_state(m) for m in msgs if _key(m)]
                elif topic == t.retries:
                    if f.role == "leading" and f.on_retries is not None:
                        f.on_retries(msgs)
                        continue
                    retries = [(_key(m), retry_due_ms(v) if (v := m.value()) is not None else None, v,
                                _headers(m)) for m in msgs if _key(m)]
            f.store.write(definitions=definitions, states=[s for s in states if s is not None],
                          retries=retries, positions=positions)
            self._check_reached(f)

    def lag(self) -> int:
        """Records of the standby partitions not applied yet (the cached ends)."""
        return sum(self.lag_of(s) or 0 for s, f in self.shards.items() if f.role == "standby")

    def lag_of(self, shard: int) -> int | None:
        """Records of a standby shard not applied yet (the cached ends); None while an end
        is not known yet (nothing fetched), or the shard is not a standby's."""
        f = self.shards.get(shard)
        if f is None or f.role != "standby":
            return None
        at = f.store.positions()
        total = 0
        for topic in (self.topics.job_definitions, self.topics.scheduler_state, self.topics.retries):
            end = self._cached_end(topic, shard)
            if end is None:
                return None
            total += max(0, end - at.get(topic, 0))
        return total

    def _cached_end(self, topic: str, shard: int) -> int | None:
        def ask(consumer: OnLane) -> int:
            return consumer.watermarks(TopicPartition(topic, shard), 0.0, cached=True)[1]

        try:
            high = self.reader.run_sync(ask)
        except Exception:  # not fetched yet: nothing known
            return None
        return high if high >= 0 else None


def _key(msg: Message) -> str:
    try:
        return decode_key(msg.key())
    except Exception:  # a record without a readable key is the leader's to dead-letter
        return ""


def _headers(msg: Message) -> str | None:
    headers = msg.headers()
    if not headers or not isinstance(headers, list):
        return None
    return json.dumps([[k, v.decode("utf-8", "replace") if isinstance(v, bytes) else v]
                       for k, v in headers])


def _state(msg: Message) -> tuple[str, int | None, int | None, int | None, bool, int | None,
                                  int | None] | None:
    job_id, value = _key(msg), msg.value()
    if value is None:
        return job_id, None, None, None, True, None, None
    try:
        data = json.loads(value)
        return (job_id, int(data["definition_offset"]), data.get("next_fire_ms"),
                data.get("last_fire_ms"), False, data.get("calendar_offset"), data.get("runs"))
    except (ValueError, KeyError, TypeError, RecursionError, AttributeError):
        return job_id, None, None, None, True, None, None  # our own record, unreadable: recomputed


async def _wait(event: asyncio.Event, stopping: asyncio.Event, timeout: float) -> None:
    waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(stopping.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
