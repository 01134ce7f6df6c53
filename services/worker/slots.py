"""A worker's slots: how many handlers run at once, which, and what it has claimed — no Kafka.

`--concurrency` is how many handlers run at once. A worker *claims* executions in its
turns — commits their RUNNING events with their consumed offsets, so that each runs on one
worker only — and *starts* them as slots free, between turns, without a transaction: a
short handler's slot never waits for the next turn (Celery's prefetch, decision 0029).
How many it claims beyond its free slots follows its handlers: as many as its slots are
expected to run before the turn after next (their recent durations say), so that short
handlers keep every slot busy while long ones are never hoarded by one worker while
another idles (a handler of a second claims nothing ahead with 100 ms turns, and a slot
held by a run that has outlasted the usual duration counts for nothing).

A slot is taken when an execution starts and given back when its handler returns, not
when its end is reported: the report and the next start share a transaction. An
execution is the worker's own (listed in its heartbeats) from the moment its claim is
being committed until its end is: the monitor re-queues a RUNNING execution that a
heartbeat sent after its start does not list (a commit can take seconds: a cluster
losing its leader), and re-queues what a dead worker held, claimed or running.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from uuid import UUID

from cronstream.services.worker.executions import Finished, Running

# How fast the estimate of a handler's duration follows its recent runs (the weight of
# each new run in an exponential moving average).
DURATION_WEIGHT = 0.05
# The most a turn claims beyond the free slots.
CLAIM_AT_MOST = 1000
# A busy slot counts as one that will run more before the turn after next while its run
# has lasted less than this many times the usual duration.
USUAL_DURATIONS = 2


class Slots:
    def __init__(self, capacity: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self._clock = clock
        self._began: dict[UUID, float] = {}  # when each running handler began
        self.running: dict[UUID, Running] = {}  # claimed, until their end is reported
        self._waiting: deque[Running] = deque()  # claimed, not started yet
        self._active = 0  # handlers running now
        self._finished: list[Finished] = []  # returned, their end not yet reported
        self._starting: list[UUID] = []  # claims whose transaction is being committed
        self.duration: float | None = None  # seconds a handler runs, recently (EWMA)

    def __contains__(self, execution_id: UUID) -> bool:
        return execution_id in self.running

    def __iter__(self) -> Iterator[Running]:
        return iter(list(self.running.values()))

    def __len__(self) -> int:
        return len(self.running)

    def get(self, execution_id: UUID) -> Running | None:
        return self.running.get(execution_id)

    def busy(self) -> int:
        """Slots whose handler has not returned."""
        return self._active

    def free(self) -> int:
        return self.capacity - self._active

    def claimable(self, horizon: float) -> int:
        """How many executions the next turn may claim: the slots free once those claimed
        start, plus as many runs as the slots are expected to finish within `horizon`
        seconds (until the turn after next), by the handlers' recent durations. Slots held
        by runs that outlast the usual duration (long handlers among short ones) count for
        nothing: no execution waits behind them."""
        room = self.free() - len(self._waiting)
        usual = self.duration
        if usual is not None:
            now = self._clock()
            turning = self.free() + sum(1 for began in self._began.values()
                                        if now - began < USUAL_DURATIONS * usual)
            room += min(CLAIM_AT_MOST, math.floor(turning * horizon / max(usual, 1e-6)))
        return max(0, room)

    def committing(self, claims: list[Running]) -> None:
        """`claims` are being committed (none of them runs yet, all are listed)."""
        self._starting = [run.due.execution_id for run in claims]

    def committed(self) -> None:
        self._starting = []

    def claim(self, run: Running) -> None:
        """Its claim committed: it starts when a slot is free (`next_start`)."""
        self.running[run.due.execution_id] = run
        self._waiting.append(run)

    def next_start(self) -> Running | None:
        """A claimed execution to start now, its slot taken; None: no slot, or none waits."""
        if self._active >= self.capacity or not self._waiting:
            return None
        self._active += 1
        run = self._waiting.popleft()
        self._began[run.due.execution_id] = self._clock()
        return run

    def finish(self, done: Finished, seconds: float | None) -> None:
        """The execution `next_start` gave ended, its handler after `seconds` (None: it
        never began, cancelled while claimed): the slot is free; its end waits for the
        next turn."""
        self._active -= 1
        self._began.pop(done.running.due.execution_id, None)
        if seconds is not None:
            self.duration = seconds if self.duration is None else \
                self.duration + DURATION_WEIGHT * (seconds - self.duration)
        self._finished.append(done)

    def unstarted(self) -> list[Running]:
        """The claimed executions that have not started (taken out of the queue: they
        never will here; `forget` them once given up)."""
        waiting, self._waiting = list(self._waiting), deque()
        return waiting

    def forget(self, runs: list[Running]) -> None:
        for run in runs:
            self.running.pop(run.due.execution_id, None)

    def has_finished(self) -> bool:
        return bool(self._finished)

    def take_finished(self) -> list[Finished]:
        """The executions whose end the next turn reports (given back if it does not commit)."""
        finished, self._finished = self._finished, []
        return finished

    def give_back(self, finished: list[Finished]) -> None:
        """Ends not reported (the turn did not commit): reported by the next one."""
        self._finished = finished + self._finished

    def reported(self, finished: list[Finished]) -> None:
        for done in finished:
            self.running.pop(done.running.due.execution_id, None)

    def listed(self) -> list[UUID]:
        """The executions this worker's heartbeats list as its own (the docstring)."""
        return [*self.running, *self._starting]

    def clear(self) -> None:
        self.running.clear()
        self._waiting.clear()
        self._began.clear()
