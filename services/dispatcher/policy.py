"""Concurrency policies (docs/reference/semantics.md#concurrency-policy) and the state they need.

For jobs whose policy is FORBID or REPLACE the dispatcher tracks the executions that are
not terminal yet, from the QUEUED events it writes and the events it reads back from
`execution-events`. That state is durable: every change is written to the compacted
`dispatcher-state` topic, in the partition of the job, in the same transaction as the
consumed offsets that caused it; an instance assigned partition i reads partition i of
`dispatcher-state` before it dispatches anything.

Decisions, for a JobDue of a new run (reason SCHEDULE, MANUAL, BACKFILL, DEPENDENCY, EVENT):
- ALLOW: queue it.
- FORBID: another execution of the job is not terminal → SKIPPED, with the reason.
- `max_concurrent_runs: N` (with ALLOW; FORBID is N = 1): N runs of the job are not
  terminal → SKIPPED, with the reason (decision 0037).
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

from cronstream.shared.fast_records import DueRecord, EventRecord, FastSnapshot
from cronstream.shared.ids import retry_execution_id
from cronstream.shared.records import JobSnapshot, UtcDatetime, UtcModel
from cronstream.shared.statuses import RETRYABLE, TERMINAL

Decision = Literal["QUEUE", "SKIP", "REPLACE"]
NEW_RUN_REASONS = frozenset({"SCHEDULE", "MANUAL", "BACKFILL", "DEPENDENCY", "EVENT"})


def run_limit(job: JobSnapshot | FastSnapshot) -> int | None:
    """How many runs of the job may be active at once (FORBID: 1), or None: any number."""
    return 1 if job.concurrency_policy == "FORBID" else job.max_concurrent_runs


def tracked(job: JobSnapshot | FastSnapshot) -> bool:
    """Whether a job's executions must be followed to decide its next fire."""
    return job.concurrency_policy == "REPLACE" or run_limit(job) is not None


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

    def active_runs(self, due: DueRecord) -> dict[UUID, ActiveExecution]:
        """The other runs of the job that are not terminal: one execution each (a run's
        attempts follow one another; its retry pending stands for it)."""
        return {a.run_id: a for a in self.others(due) if a.run_id != due.run_id}

    def decide(self, due: DueRecord) -> Decision:
        if due.reason not in NEW_RUN_REASONS:
            return "QUEUE"
        if due.job.concurrency_policy == "REPLACE":
            return "REPLACE" if self.others(due) else "QUEUE"
        limit = run_limit(due.job)
        if limit is None or len(self.active_runs(due)) < limit:
            return "QUEUE"
        return "SKIP"

    def skip_reason(self, due: DueRecord) -> str:
        """Why `decide` skipped `due`: what runs, under which rule."""
        active = sorted(self.active_runs(due).values(), key=lambda a: (a.scheduled_at, str(a.execution_id)))
        if due.job.concurrency_policy == "FORBID":
            return (f"skipped: execution {active[0].execution_id} of this job is still "
                    f"{active[0].status} (concurrency_policy FORBID)")
        shown = ", ".join(f"{a.execution_id} ({a.status})" for a in active[:5])
        more = f" and {len(active) - 5} more" if len(active) > 5 else ""
        return (f"skipped: {len(active)} runs of this job are active, max_concurrent_runs is "
                f"{due.job.max_concurrent_runs}: {shown}{more}")

    def queued(self, due: DueRecord, partition: int) -> None:
        if not tracked(due.job) and due.job_id not in self.jobs:
            return
        self._put(due.job_id, partition, ActiveExecution(
            execution_id=due.execution_id, run_id=due.run_id,
            attempt_number=due.attempt_number, scheduled_at=due.scheduled_at,
            delivery=due.delivery, status="QUEUED", max_retries=due.job.max_retries))

    def observe(self, event: EventRecord, partition: int) -> None:
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
