"""Flow control's admission: which held-back executions may start now (no Kafka).

An execution of a job with `concurrency`, `pool` or `rate_limit` asks to start (`ask`).
It starts at once when nothing holds it back, and otherwise waits (WAITING, with the
reason) in the FIFO of its *lane*: the job and its concurrency key's value
(`export`, `customer=42`). `admit` starts waiting executions as limits free up:

1. only the head of a lane may start (first come first served per key);
2. lanes take turns, one start each per turn (round robin), so a key with a backlog
   never starves another (a plain FIFO across keys would);
3. the head starts when its lane runs fewer than `max_running`, its pool has
   `slots` free, and its lane started fewer than N executions in the last window of
   its `rate_limit` (an exact sliding window: "no window of that length starts
   more than N").

An admitted execution *holds* (its lane's running count, its pool slots) until
`release`: every way it ends (a terminal status, a cancellation, REPLACE). A dead
worker's re-queue is not an end: the execution keeps its id and its hold and runs
elsewhere. A waiting execution that is cancelled is `withdraw`n: it held nothing and
releases nothing. A retry is a new execution: it asks again, at the back of its lane.

One `Admission` holds the lanes and pools of one `dispatcher-state` partition: the
dispatcher routes every ask and release of a pool (or, without a pool, of a job) to one
partition, owned by one dispatcher at a time (decision 0056). Each change is a record
to write with the batch (`drain_dirty`): `flow:wait:<execution_id>` (an Ask, with the
JobDue to queue when admitted), `flow:hold:<execution_id>` (a Hold), and
`flow:rate:<job_id>/<key>` (the lane's recent starts); `load` reads them back.

Worked example, pool `etl` of 2 slots, lanes a (3 waiting) and b (1 waiting), in
arrival order a1 a2 a3 b1: `ask` starts a1 and a2 (2 of 2 slots), a3 and b1 wait.
a1 ends: the turn is b's (a took the last start), so b1 starts, not a3.
"""

from __future__ import annotations

import json
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from cronstream.shared.condition import parse_expression
from cronstream.shared.records import Concurrency, parse_rate_limit

PREFIX = "flow:"
_WAIT, _HOLD, _RATE = f"{PREFIX}wait:", f"{PREFIX}hold:", f"{PREFIX}rate:"
# The most of a lane's starts kept for its rate limit (a rate_limit allows more only in
# name: its window would hold more starts than this many).
MAX_RATE_LOG = 10_000

Lane = tuple[str, str]  # (job_id, rendered key: "customer=42", or "" for the whole job)


def key_of(concurrency: Concurrency | Any | None, params: Mapping[str, Any]) -> str:
    """The lane key of an execution: its concurrency key's label and value
    (`params.customer` of {"customer": 42} is `customer=42`), or "" for the whole job."""
    if concurrency is None or concurrency.key is None:
        return ""
    value = parse_expression(concurrency.key, ("params",)).value({"params": params})
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
    return f"{concurrency.key.removeprefix('params.')}={text}"


@dataclass(frozen=True, slots=True)
class Ask:
    """An execution that asks to start, with its limits (from its JobDue's snapshot). A
    plain dataclass, not a model: one is made per limited execution on the dispatcher's
    hot path, and only a waiting one is ever written (`to_json`)."""

    execution_id: UUID
    job_id: str
    key: str = ""
    max_running: int | None = None
    rate_limit: str | None = None
    pool: str | None = None
    slots: int = 1
    due: str = ""  # the JobDue to queue when admitted (opaque here)
    seq: int = 0  # the arrival order within the partition (set by `ask`)

    @property
    def lane(self) -> Lane:
        return (self.job_id, self.key)

    def to_json(self) -> bytes:
        return json.dumps({**_fields(self), "execution_id": str(self.execution_id)},
                          separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, value: bytes) -> Ask:
        data = json.loads(value)
        return cls(**{**data, "execution_id": UUID(data["execution_id"])})


@dataclass(frozen=True, slots=True)
class Hold:
    """What an admitted execution holds until it ends."""

    execution_id: UUID
    job_id: str
    key: str = ""
    pool: str | None = None
    slots: int = 1

    @property
    def lane(self) -> Lane:
        return (self.job_id, self.key)

    def to_json(self) -> bytes:
        return json.dumps({**_fields(self), "execution_id": str(self.execution_id)},
                          separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, value: bytes) -> Hold:
        data = json.loads(value)
        return cls(**{**data, "execution_id": UUID(data["execution_id"])})


def _fields(record: Ask | Hold) -> dict[str, Any]:
    return {name: getattr(record, name) for name in record.__dataclass_fields__}


@dataclass
class Admission:
    """The lanes, holds and pools of one partition. `pools` maps each pool to its slots
    (the live `pools` topic; a pool missing from it holds its executions back)."""

    pools: Mapping[str, int] = field(default_factory=dict)
    waiting: dict[Lane, deque[Ask]] = field(default_factory=dict)
    turns: deque[Lane] = field(default_factory=deque)  # lanes with waiters, next turn first
    where: dict[UUID, Lane] = field(default_factory=dict)  # each waiting execution's lane
    holds: dict[UUID, Hold] = field(default_factory=dict)
    running: Counter[Lane] = field(default_factory=Counter)
    in_use: Counter[str] = field(default_factory=Counter)
    starts: dict[Lane, deque[float]] = field(default_factory=dict)
    windows: dict[Lane, int] = field(default_factory=dict)  # each rate-limited lane's window
    dirty: dict[str, bytes | None] = field(default_factory=dict)
    seq: int = 0

    # -- decisions --------------------------------------------------------------------

    def ask(self, ask: Ask, now: float) -> tuple[bool, str | None]:
        """(True, None): `ask` starts now (it holds from here); (False, reason): it waits.
        Asking again for an execution that waits or holds changes nothing."""
        if ask.execution_id in self.holds:
            return True, None
        if ask.execution_id in self.where:
            waiting = next(a for a in self.waiting[self.where[ask.execution_id]]
                           if a.execution_id == ask.execution_id)
            return False, self.reason(waiting, now)
        lane = self.waiting.get(ask.lane)
        self.seq += 1
        ask = replace(ask, seq=self.seq)
        blocked = self.blocked(ask, now) if lane is None else self.reason(lane[0], now)
        if blocked is None:
            self._start(ask, now)
            return True, None
        if lane is None:
            lane = self.waiting[ask.lane] = deque()
            self.turns.append(ask.lane)
        ahead = len(lane)
        lane.append(ask)
        self.where[ask.execution_id] = ask.lane
        self.dirty[f"{_WAIT}{ask.execution_id}"] = ask.to_json()
        return False, blocked if not ahead else f"{blocked}; {ahead} earlier waiting"

    def admit(self, now: float) -> list[Ask]:
        """The waiting executions that start now, in the order they start. Each pass gives
        every lane in turn at most one start; a lane that started goes to the back of the
        turns, one that could not keeps its place (least recently served first)."""
        started: list[Ask] = []
        while True:
            before = len(started)
            for lane in list(self.turns):
                queue = self.waiting[lane]
                if self.blocked(queue[0], now) is not None:
                    continue
                ask = queue.popleft()
                del self.where[ask.execution_id]
                self.dirty[f"{_WAIT}{ask.execution_id}"] = None
                self._start(ask, now)
                started.append(ask)
                self.turns.remove(lane)
                if queue:
                    self.turns.append(lane)
                else:
                    del self.waiting[lane]
            if len(started) == before:
                return started

    def release(self, execution_id: UUID) -> Hold | None:
        """An admitted execution ended (any way): what it held is free again."""
        hold = self.holds.pop(execution_id, None)
        if hold is None:
            return None
        self.running[hold.lane] -= 1
        if self.running[hold.lane] <= 0:
            del self.running[hold.lane]
        if hold.pool is not None:
            self.in_use[hold.pool] -= hold.slots
            if self.in_use[hold.pool] <= 0:
                del self.in_use[hold.pool]
        self.dirty[f"{_HOLD}{execution_id}"] = None
        return hold

    def withdraw(self, execution_id: UUID) -> Ask | None:
        """A waiting execution was cancelled: out of its lane, releasing nothing."""
        lane = self.where.pop(execution_id, None)
        if lane is None:
            return None
        queue = self.waiting[lane]
        ask = next(a for a in queue if a.execution_id == execution_id)
        queue.remove(ask)
        if not queue:
            del self.waiting[lane]
            self.turns.remove(lane)
        self.dirty[f"{_WAIT}{execution_id}"] = None
        return ask

    def end(self, execution_id: UUID) -> bool:
        """An execution ended, whether it held or waited: settle it. Whether it was known."""
        return self.release(execution_id) is not None or self.withdraw(execution_id) is not None

    # -- why ----------------------------------------------------------------------------

    def blocked(self, ask: Ask, now: float) -> str | None:
        """Why `ask` cannot start now, in words a person can act on; None: it can."""
        lane = ask.lane
        if ask.max_running is not None and self.running[lane] >= ask.max_running:
            who = f"key {ask.key}" if ask.key else f"job {ask.job_id}"
            return f"{who}: {self.running[lane]} of {ask.max_running} running"
        if ask.pool is not None:
            size = self.pools.get(ask.pool)
            if size is None:
                return f"pool {ask.pool} does not exist (cronstream pool set {ask.pool} --slots N)"
            used = self.in_use[ask.pool]
            if used + ask.slots > size:
                needs = f", needs {ask.slots}" if ask.slots != 1 else ""
                return f"pool {ask.pool}: {used} of {size} slots in use{needs}"
        if ask.rate_limit is not None:
            at = self._next_start(lane, ask.rate_limit, now)
            if at is not None:
                when = datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")
                return f"rate limit {ask.rate_limit}, next start at {when}"
        return None

    def reason(self, ask: Ask, now: float) -> str:
        """Why a waiting `ask` waits: its lane's head's limit, or the executions ahead."""
        queue = self.waiting.get(ask.lane)
        head = queue[0] if queue else ask
        why = self.blocked(head, now) or "next to start"
        if head is ask:
            return why
        assert queue is not None
        ahead = next(i for i, a in enumerate(queue) if a.execution_id == ask.execution_id)
        return f"{why}; {ahead} earlier waiting"

    def next_wakeup(self) -> float | None:
        """When a rate limit next lets a waiting head start (None: only a release or a
        pool's new size can)."""
        times = [at for lane, queue in self.waiting.items() if queue[0].rate_limit is not None
                 for at in [self._next_start(lane, queue[0].rate_limit, float("-inf"))]
                 if at is not None]
        return min(times) if times else None

    def _next_start(self, lane: Lane, rate_limit: str, now: float) -> float | None:
        count, window = parse_rate_limit(rate_limit)
        log = self.starts.get(lane)
        if log is None:
            return None
        while log and log[0] <= now - window:
            log.popleft()
        if len(log) < min(count, MAX_RATE_LOG):
            return None
        return log[-min(count, MAX_RATE_LOG)] + window

    def _start(self, ask: Ask, now: float) -> None:
        hold = Hold(execution_id=ask.execution_id, job_id=ask.job_id, key=ask.key,
                    pool=ask.pool, slots=ask.slots)
        self.holds[ask.execution_id] = hold
        self.running[ask.lane] += 1
        if ask.pool is not None:
            self.in_use[ask.pool] += ask.slots
        self.dirty[f"{_HOLD}{ask.execution_id}"] = hold.to_json()
        if ask.rate_limit is not None:
            count, window = parse_rate_limit(ask.rate_limit)
            log = self.starts.setdefault(ask.lane, deque(maxlen=min(count, MAX_RATE_LOG)))
            if log.maxlen != min(count, MAX_RATE_LOG):  # the limit changed
                log = self.starts[ask.lane] = deque(log, maxlen=min(count, MAX_RATE_LOG))
            log.append(now)
            self.windows[ask.lane] = window
            self.dirty[f"{_RATE}{ask.job_id}/{ask.key}"] = json.dumps(
                {"window": window, "starts": [t for t in log if t > now - window]}).encode()

    # -- durability ---------------------------------------------------------------------

    def drain_dirty(self) -> list[tuple[str, bytes | None]]:
        """(key, value or None for a tombstone) of what changed since the last drain."""
        out = list(self.dirty.items())  # in change order: one record per key, any order
        self.dirty.clear()
        return out

    def load(self, records: Iterable[tuple[str, bytes | None]]) -> None:
        """Rebuild from `dispatcher-state` records (the latest per key, in log order):
        waiting executions line up again in their arrival order, and lanes take turns in
        the order of their heads' arrival (which lane was served last is not kept)."""
        latest = dict(records)
        asks = []
        for key, value in latest.items():
            if value is None:
                continue
            if key.startswith(_HOLD):
                hold = Hold.from_json(value)
                self.holds[hold.execution_id] = hold
                self.running[hold.lane] += 1
                if hold.pool is not None:
                    self.in_use[hold.pool] += hold.slots
            elif key.startswith(_WAIT):
                asks.append(Ask.from_json(value))
            elif key.startswith(_RATE):
                job_id, _, lane_key = key[len(_RATE):].partition("/")
                recent = json.loads(value)
                self.starts[(job_id, lane_key)] = deque(recent["starts"])
                self.windows[(job_id, lane_key)] = recent["window"]
        for ask in sorted(asks, key=lambda a: a.seq):
            if ask.execution_id in self.holds:
                continue  # started: its wait record's tombstone is in the same transaction
            if ask.lane not in self.waiting:
                self.waiting[ask.lane] = deque()
                self.turns.append(ask.lane)
            self.waiting[ask.lane].append(ask)
            self.where[ask.execution_id] = ask.lane
        self.seq = max([self.seq, *(a.seq for a in asks)])

    def sweep(self, now: float) -> int:
        """Forget the rate logs whose last start left its window (a key seen once must not
        be kept for ever): tombstoned with the batch. How many were dropped."""
        dropped = 0
        for lane, log in list(self.starts.items()):
            if not log or log[-1] <= now - self.windows.get(lane, 0):
                del self.starts[lane]
                self.windows.pop(lane, None)
                self.dirty[f"{_RATE}{lane[0]}/{lane[1]}"] = None
                dropped += 1
        return dropped

    def in_use_of(self, pool: str) -> int:
        return self.in_use[pool]

    def waiting_count(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    def waiting_by_kind(self, now: float) -> Counter[str]:
        """Waiting executions by what holds their lane's head back (a bounded label)."""
        kinds: Counter[str] = Counter()
        for queue in self.waiting.values():
            kinds[kind_of(self.blocked(queue[0], now))] += len(queue)
        return kinds


def kind_of(reason: str | None) -> str:
    """The kind of a waiting reason: pool, key, rate_limit, missing_pool (or ready)."""
    if reason is None:
        return "ready"
    if reason.startswith("pool "):
        return "missing_pool" if reason.endswith("--slots N)") else "pool"
    if reason.startswith("rate limit"):
        return "rate_limit"
    return "key"
