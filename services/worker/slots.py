"""A worker's slots: how many handlers run at once, and which — no Kafka.

A slot is taken when an execution starts (after its RUNNING event committed) and given
back when its handler returns, not when its end is reported: the report and the next
start share a transaction. An execution is the worker's own (listed in its heartbeats)
from the moment its start is being committed until its end is: the monitor re-queues a
RUNNING execution that a heartbeat sent after its start does not list, and a commit can
take seconds (a cluster losing its leader).
"""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID

from cronstream.services.worker.executions import Finished, Running


class Slots:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.running: dict[UUID, Running] = {}  # started, until their end is reported
        self._finished: list[Finished] = []  # returned, their end not yet reported
        self._starting: list[UUID] = []  # starts whose transaction is being committed

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
        return len(self.running) - len(self._finished)

    def free(self) -> int:
        return self.capacity - self.busy()

    def committing(self, starts: list[Running]) -> None:
        """`starts` are being committed (None of them run yet, all are listed)."""
        self._starting = [run.due.execution_id for run in starts]

    def committed(self) -> None:
        self._starting = []

    def start(self, run: Running) -> None:
        self.running[run.due.execution_id] = run

    def finish(self, done: Finished) -> None:
        """Its handler returned: the slot is free; its end waits for the next turn."""
        self._finished.append(done)

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
