"""WAITING_TOO_LONG: an execution held back by flow control longer than its job's interval
(no Kafka; docs/decisions/0056).

A job that fires every 5 minutes and whose runs wait 7 for a pool slot falls further
behind at every fire: its pool (or its key's limit, or its rate) is too small for it. The
service feeds this the WAITING events and whatever comes after them (QUEUED when
admitted, CANCELLED...), and the definitions; `judge` says, per job, whether its oldest
waiting execution has waited longer than the job's interval (INTERVAL: interval_seconds;
CRON: the gap between its next two fires). Other jobs have no interval to compare with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from uuid import UUID

from cronstream.shared.records import JobDefinition
from cronstream.shared.schedule import next_fire


def interval_of(definition: JobDefinition, now: datetime | None = None) -> float | None:
    """Seconds between two fires of the job, or None when it has no steady interval."""
    if definition.type == "INTERVAL":
        return float(definition.interval_seconds or 0) or None
    if definition.type != "CRON" or definition.calendar is not None:
        return None
    try:
        first = next_fire(definition, now or datetime.now(UTC))
        second = None if first is None else next_fire(definition, first)
    except ValueError:
        return None
    return None if first is None or second is None else (second - first).total_seconds()


@dataclass(frozen=True, slots=True)
class Wait:
    too_long: bool
    waiting: int
    oldest_execution: UUID | None = None
    oldest_seconds: float = 0.0
    interval_seconds: float | None = None
    reason: str | None = None


@dataclass
class Waits:
    # job_id -> execution_id -> (since when it waits, epoch ms; its waiting_reason)
    waiting: dict[str, dict[UUID, tuple[int, str | None]]] = field(default_factory=dict)
    intervals: dict[str, float | None] = field(default_factory=dict)

    def definition(self, job_id: str, definition: JobDefinition | None) -> None:
        if definition is None:
            self.intervals.pop(job_id, None)
            self.waiting.pop(job_id, None)
        else:
            self.intervals[job_id] = interval_of(definition)

    def event(self, job_id: str, execution_id: UUID, status: str, at_ms: int,
              reason: str | None) -> None:
        """An event of any status: WAITING starts a wait (its first one counts), any other
        status of the execution ends it."""
        if status == "WAITING":
            self.waiting.setdefault(job_id, {}).setdefault(execution_id, (at_ms, reason))
            return
        executions = self.waiting.get(job_id)
        if executions is not None and executions.pop(execution_id, None) is not None and not executions:
            del self.waiting[job_id]

    def jobs(self) -> set[str]:
        return set(self.waiting)

    def judge(self, job_id: str, now_ms: int) -> Wait:
        executions = self.waiting.get(job_id) or {}
        interval = self.intervals.get(job_id)
        if not executions:
            return Wait(False, 0, interval_seconds=interval)
        oldest, (since, reason) = min(executions.items(), key=lambda item: item[1][0])
        waited = max(0.0, (now_ms - since) / 1000)
        return Wait(interval is not None and waited > interval, len(executions), oldest, waited,
                    interval, reason)
