"""Concurrency policies (SPEC §5.8) and the state they need.

For jobs whose policy is FORBID or REPLACE the dispatcher tracks the executions that are
not terminal yet, from the QUEUED events it writes and the events it reads back from
`execution-events`. That state is durable: every change is written to the compacted
`dispatcher-state` topic, in the partition of the job, in the same transaction as the
consumed offsets that caused it; an instance assigned partition i reads partition i of
`dispatcher-state` before it dispatches anything.

Decisions, for a JobDue of a new run (reason SCHEDULE, MANUAL, BACKFILL, DEPENDENCY):
- ALLOW: queue it.
- FORBID: another execution of the job is not terminal → SKIPPED, with the reason.
- REPLACE: cancel the others (a CANCEL command; a QUEUED one is CANCELLED at once), then
  queue it.
A RETRY or REQUEUE continues a run that was already admitted: it is always queued.

An execution that FAILED or TIMED_OUT with attempts left stays active as the retry it
will become (RETRY_PENDING, under the retry's deterministic execution id): FORBID keeps
holding while the run is still trying, and the retry's own events take over the entry.
A cancelled pending retry ends with a CANCELLED event of that id, which clears it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from cronstream.shared.fast_records import DueRecord
from cronstream.shared.ids import retry_execution_id
from cronstream.shared.records import ExecutionEvent, UtcDatetime, UtcModel
from cronstream.shared.statuses import RETRYABLE, TERMINAL

Decision = Literal["QUEUE", "SKIP", "REPLACE"]
NEW_RUN_REASONS = frozenset({"SCHEDULE", "MANUAL", "BACKFILL", "DEPENDENCY"})


class ActiveExecution(UtcModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    execution_id: UUID
    run_id: UUID
    attempt_number: int
    scheduled_at: UtcDatetime
    delivery: int
    status: Literal["QUEUED", "RUNNING", "RETRY_PENDING"]
    max_retries: int = 0


class JobActivity(BaseModel):
    """The value of a `dispatcher-state` record (key: job_id)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    job_id: str
    active: list[ActiveExecution]


@dataclass
class PolicyState:
    """Non-terminal executions of tracked jobs, per partition; `dirty` lists the jobs
    whose record must be written with the current batch."""

    jobs: dict[str, dict[UUID, ActiveExecution]] = field(default_factory=dict)
    partition_of: dict[str, int] = field(default_factory=dict)
    dirty: set[str] = field(default_factory=set)

    def load(self, partition: int, value: bytes | None, key: str) -> None:
        if value is None:
            self.jobs.pop(key, None)
            return
        activity = JobActivity.model_validate_json(value)
        self.jobs[key] = {a.execution_id: a for a in activity.active}
        self.partition_of[key] = partition

    def others(self, due: DueRecord) -> list[ActiveExecution]:
        return [a for a in self.jobs.get(due.job_id, {}).values()
                if a.execution_id != due.execution_id]

    def decide(self, due: DueRecord) -> Decision:
        policy = due.job.concurrency_policy
        if policy == "ALLOW" or due.reason not in NEW_RUN_REASONS or not self.others(due):
            return "QUEUE"
        return "SKIP" if policy == "FORBID" else "REPLACE"

    def queued(self, due: DueRecord, partition: int) -> None:
        if due.job.concurrency_policy == "ALLOW" and due.job_id not in self.jobs:
            return
        self._put(due.job_id, partition, ActiveExecution(
            execution_id=due.execution_id, run_id=due.run_id,
            attempt_number=due.attempt_number, scheduled_at=due.scheduled_at,
            delivery=due.delivery, status="QUEUED", max_retries=due.job.max_retries))

    def observe(self, event: ExecutionEvent, partition: int) -> None:
        """Follow an event of a tracked job."""
        executions = self.jobs.get(event.job_id)
        if executions is None:
            return
        known = executions.get(event.execution_id)
        if known is not None and event.delivery < known.delivery:
            return  # a stale report of an older delivery
        if event.status in TERMINAL:
            if known is not None:
                self.remove(event.job_id, event.execution_id, partition)
                if event.status in RETRYABLE and event.attempt_number < 1 + known.max_retries:
                    attempt = event.attempt_number + 1
                    self._put(event.job_id, partition, known.model_copy(update={
                        "execution_id": retry_execution_id(event.job_id, known.run_id, attempt),
                        "attempt_number": attempt, "delivery": 1, "status": "RETRY_PENDING"}))
        elif event.status == "RUNNING" and known is not None:
            self._put(event.job_id, partition,
                      known.model_copy(update={"status": "RUNNING", "delivery": event.delivery}))
        elif event.status == "REQUEUED" and known is not None:
            self._put(event.job_id, partition,
                      known.model_copy(update={"status": "QUEUED", "delivery": event.delivery}))

    def remove(self, job_id: str, execution_id: UUID, partition: int) -> None:
        executions = self.jobs.get(job_id)
        if executions is not None and executions.pop(execution_id, None) is not None:
            self.partition_of[job_id] = partition
            self.dirty.add(job_id)

    def _put(self, job_id: str, partition: int, execution: ActiveExecution) -> None:
        self.jobs.setdefault(job_id, {})[execution.execution_id] = execution
        self.partition_of[job_id] = partition
        self.dirty.add(job_id)

    def drain_dirty(self) -> list[tuple[str, int, bytes | None]]:
        """(job_id, partition, record value or None for a tombstone) of changed jobs."""
        out: list[tuple[str, int, bytes | None]] = []
        for job_id in sorted(self.dirty):
            executions = self.jobs.get(job_id) or {}
            partition = self.partition_of.get(job_id, 0)
            if executions:
                value = JobActivity(job_id=job_id, active=list(executions.values())) \
                    .model_dump_json().encode()
                out.append((job_id, partition, value))
            else:
                self.jobs.pop(job_id, None)
                out.append((job_id, partition, None))
        self.dirty.clear()
        return out
