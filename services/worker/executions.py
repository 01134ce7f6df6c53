"""What a worker knows about the executions it runs, and the records they produce.

Every lifecycle event a worker writes is built here (`ExecutionEvent.for_due` does the
common part), so RUNNING, PROGRESS, the terminal events, REQUEUED after a drain and the
RetryRequest of a failure all agree on ids, delivery, worker and trace. The two events of
every execution — RUNNING, and COMPLETED without an error — are rendered directly
(`records.render_event`), byte for byte what the model would write.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from cronstream.services.worker.logs import ExecutionLog
from cronstream.services.worker.runner import CancelSignal, Outcome
from cronstream.shared import metrics
from cronstream.shared.fast_records import DueRecord, as_model
from cronstream.shared.ids import fast_uuid7
from cronstream.shared.logs import log
from cronstream.shared.producers import OutRecord
from cronstream.shared.records import ExecutionEvent, ExecutionStatus, now_utc, render_event
from cronstream.shared.retry import attempts_left, next_attempt
from cronstream.shared.telemetry import Hop, trace_id
from cronstream.shared.topics import Topics

logger = logging.getLogger(__name__)


@dataclass
class Running:
    """An execution this worker claimed (one delivery of it), from its claim to its end."""

    due: DueRecord
    hop: Hop  # the run's span: a child of the dispatcher's queue span
    started_at: datetime
    cancel: CancelSignal = field(default_factory=CancelSignal)
    task: asyncio.Task[None] | None = None
    last_progress: float = 0.0
    log: ExecutionLog | None = None  # made when its handler first writes (logs.py)

    @property
    def headers(self) -> list[tuple[str, bytes]]:
        return self.hop.headers

    @property
    def trace_id(self) -> str | None:
        return trace_id(self.hop.traceparent)

    @cached_property
    def exemplar(self) -> dict[str, str] | None:
        """The execution's trace id, attached to its histogram samples (docs/metrics.md);
        found once for both (start lag, run time)."""
        trace = self.trace_id
        return {"trace_id": trace} if trace else None


@dataclass
class Finished:
    running: Running
    outcome: Outcome
    completed_at: datetime
    status: str = ""  # the status reported (set when its records are built)
    # Built once: a turn whose outcome is unknown reports them again, byte for byte, so a
    # repeat carries the same event_id (and the same retry) and consumers drop it.
    records: list[OutRecord] | None = None
    log: list[OutRecord] = field(default_factory=list)  # the final batch of its log (logs.py)


class Reporter:
    """Builds the records of one worker's executions."""

    def __init__(self, topics: Topics, worker_id: str) -> None:
        self.topics = topics
        self.worker_id = worker_id
        self._rng = random.Random()

    def event(self, run: Running, status: ExecutionStatus, **fields: Any) -> OutRecord:
        fields.setdefault("started_at", run.started_at)
        event = ExecutionEvent.for_due(run.due, status, worker_id=self.worker_id, **fields)
        return self._record(run, event.to_json())

    def running(self, run: Running) -> OutRecord:
        """The RUNNING event of a start (as `event(run, "RUNNING")` builds it)."""
        return self._record(run, render_event(run.due, "RUNNING", fast_uuid7(), now_utc(),
                                              worker_id=self.worker_id, started_at=run.started_at))

    def _record(self, run: Running, event: bytes) -> OutRecord:
        return OutRecord(self.topics.execution_events, run.due.job_id.encode(), event, run.headers)

    def cancelled_before_start(self, run: Running, reason: str, by: str | None) -> OutRecord:
        due = run.due
        return self.event(run, "CANCELLED", completed_at=run.started_at, started_at=None,
                          error_message=f"cancelled before it started: {reason}",
                          cancelled_by=by, priority=due.job.priority, queue=due.job.queue)

    def finished(self, done: Finished) -> list[OutRecord]:
        """The terminal event of a finished execution, and the RetryRequest of its next
        attempt when it failed with attempts left. The same records every time it is asked."""
        if done.records is not None:
            return done.records
        run, outcome = done.running, done.outcome
        status: ExecutionStatus = outcome.status
        records: list[OutRecord] = []
        if outcome.retryable and not attempts_left(run.due):
            status = "PERMANENTLY_FAILED"
        elif outcome.retryable:
            retry = next_attempt(run.due, done.completed_at, self._rng)
            records.append(OutRecord(self.topics.retries, str(retry.execution_id).encode(),
                                     retry.to_json(), run.headers, self.topics.shard(retry.job_id)))
        error = outcome.error
        if status == "CANCELLED" and run.cancel.reason:
            error = run.cancel.reason if error in (None, "cancelled") else f"{run.cancel.reason}: {error}"
        done.status = status
        if status == "COMPLETED" and error is None:
            job = run.due.job
            records.insert(0, self._record(run, render_event(
                run.due, status, fast_uuid7(), now_utc(), worker_id=self.worker_id,
                started_at=run.started_at, completed_at=done.completed_at, result=outcome.result,
                progress=100.0, priority=job.priority, queue=job.queue)))
        else:
            records.insert(0, self.event(
                run, status, completed_at=done.completed_at, error_message=error,
                result=outcome.result, progress=100.0 if status == "COMPLETED" else None,
                priority=run.due.job.priority, queue=run.due.job.queue,
                cancelled_by=run.cancel.by if status == "CANCELLED" else None,
            ))
        level = logging.DEBUG if status == "COMPLETED" else logging.WARNING
        if logger.isEnabledFor(level):  # its fields cost more than the rest, per execution
            log(logger, "execution_finished", level, job_id=run.due.job_id,
                execution_id=str(run.due.execution_id), status=status,
                attempt=run.due.attempt_number, error=error, trace_id=run.trace_id)
        records.extend(done.log)
        done.records = records
        return records

    def requeued(self, run: Running, why: str) -> list[OutRecord]:
        """REQUEUED and the JobDue of the next delivery, for an execution this worker
        gives up on without an outcome (drain): it runs again elsewhere, never fails."""
        due = as_model(run.due).next_delivery()
        log(logger, "execution_requeued", job_id=due.job_id, execution_id=str(due.execution_id),
            delivery=due.delivery, reason=why)
        return [
            self.event(run, "REQUEUED", error_message=why, delivery=due.delivery),
            OutRecord(self.topics.job_due, due.job_id.encode(), due.to_json(), run.headers),
        ]


def count_started(run: Running) -> None:
    job = run.due.job
    metrics.child(metrics.START_LAG, job.queue, job.priority).observe(
        max(0.0, (run.started_at - run.due.scheduled_at).total_seconds()), run.exemplar)


def count_finished(done: Finished) -> None:
    job, status = done.running.due.job, done.status
    metrics.child(metrics.WORKER_EXECUTIONS, status, job.queue, job.priority).inc()
    metrics.child(metrics.EXECUTION_DURATION, job.queue, job.priority, status).observe(
        max(0.0, (done.completed_at - done.running.started_at).total_seconds()),
        done.running.exemplar)
