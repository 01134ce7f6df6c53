"""Every record the monitor publishes, built in one place.

The monitor publishes at least once (before the PostgreSQL commit of the batch that
caused them; again after a crash), so everything here is either deterministic in its id
(DAG step and approval JobDues, alerts) or harmless to repeat (SKIPPED / CANCELLED /
AWAITING_APPROVAL events of one execution: the projection keeps the first terminal one).
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID, uuid5

from opentelemetry.trace import SpanKind

from cronstream.shared.ids import NAMESPACE, requeue_idempotency_key
from cronstream.shared.logs import log
from cronstream.shared.producers import OutRecord
from cronstream.shared.records import (
    Alert,
    ExecutionEvent,
    ExecutionStatus,
    JobDefinition,
    JobDue,
    JobSnapshot,
    Upstream,
    now_utc,
)
from cronstream.shared.schedule import to_millis
from cronstream.shared.telemetry import (
    Headers,
    Hop,
    headers_of,
    link_to,
    messaging,
    recording,
    root,
    trace_id,
)
from cronstream.shared.topics import Topics

logger = logging.getLogger(__name__)


class Outbound:
    def __init__(self, topics: Topics) -> None:
        self.topics = topics

    def due(self, due: JobDue, headers: Headers) -> OutRecord:
        return OutRecord(self.topics.job_due, due.job_id.encode(), due.to_json(), headers)

    def event(self, event: ExecutionEvent, headers: Headers) -> OutRecord:
        return OutRecord(self.topics.execution_events, event.job_id.encode(), event.to_json(),
                         headers)

    def retry_tombstone(self, retry_id: UUID, job_id: str, headers: Headers) -> OutRecord:
        """Drop a pending retry timer: on the job's shard, where the timer is."""
        return OutRecord(self.topics.retries, str(retry_id).encode(), None, headers,
                         self.topics.shard(job_id))

    # -- DAG steps ------------------------------------------------------------------------

    def step(self, definition: JobDefinition, run_id: UUID, step: UUID, *, decision: str,
             detail: str, evaluation: Headers, definition_offset: int | None = None,
             upstream: Upstream | None = None) -> OutRecord:
        """What a DAG step's evaluation publishes: its JobDue (RUN, with its view of the
        run's upstreams), or its SKIPPED or AWAITING_APPROVAL event — the root of the step's
        own trace, which links to the evaluation (in the upstream execution's trace)."""
        span = root("cronstream.fire", messaging(self.topics.job_due, job_id=definition.job_id,
                                                 execution_id=step, reason="DEPENDENCY")
                    if recording() else None, links=link_to(evaluation))
        headers = headers_of(span)
        span.end()
        now = to_millis(now_utc())
        due = JobDue.step(definition, run_id, now, definition_offset=definition_offset,
                          upstream=upstream)
        assert due.execution_id == step, "the evaluation claimed the step's own id"
        snapshot, key = due.job, due.idempotency_key
        if decision == "RUN":
            return self.due(due, headers)
        status: ExecutionStatus = "SKIPPED" if decision == "SKIP" else "AWAITING_APPROVAL"
        return self.event(ExecutionEvent.for_due(
            due, status, occurred_at=now, completed_at=now if status == "SKIPPED" else None,
            error_message=detail, reason="DEPENDENCY", idempotency_key=key, job=snapshot,
            priority=snapshot.priority, queue=snapshot.queue), headers)

    # -- rows of job_executions -------------------------------------------------------------

    @staticmethod
    def due_of(row: Any, **changes: Any) -> JobDue:
        """The JobDue of an execution as projected (from its QUEUED event's snapshot, or
        the job's current definition for executions projected before snapshots existed):
        a stored one restored from its columns, like a decoded record, not a new one."""
        raw = row["job"]
        job = JobSnapshot.of(JobDefinition.model_validate_json(raw)) if row.get("from_definition") \
            else JobSnapshot.model_validate_json(raw)
        values: dict[str, Any] = {
            "execution_id": row["execution_id"], "job_id": row["job_id"], "run_id": row["run_id"],
            "scheduled_at": row["scheduled_at"], "attempt_number": row["attempt_number"],
            "reason": row.get("reason") or "REQUEUE", "delivery": row["delivery"],
            "idempotency_key": requeue_idempotency_key(row["idempotency_key"], row["job_id"],
                                                       row["run_id"]),
            "job": job, "triggered_by": row.get("triggered_by"),
        }
        values.update(changes)
        return JobDue(**values)

    def requeue(self, row: Any, why: str, upstream: Upstream | None = None) -> list[OutRecord]:
        """REQUEUED and the JobDue of the next delivery: the execution runs again elsewhere
        (same execution_id and trace, and a DAG step's same `upstream`; events of the older
        delivery are stale from now on)."""
        due = self.due_of(row, upstream=upstream).next_delivery()
        hop = self.continued("cronstream.requeue", row, due)
        log(logger, "execution_requeued", job_id=due.job_id, execution_id=str(due.execution_id),
            delivery=due.delivery, reason=why, worker_id=row["worker_id"],
            trace_id=trace_id(hop.traceparent))
        records = [self.event(ExecutionEvent.for_due(due, "REQUEUED", error_message=why), hop.headers),
                   self.due(due, hop.headers)]
        hop.end()
        return records

    def continued(self, name: str, row: Any, due: JobDue) -> Hop:
        """A span of the execution's own trace (from its stored traceparent), linked to it."""
        stored: Headers = [("traceparent", row["traceparent"].encode())] if row.get("traceparent") else []
        attributes = messaging(self.topics.job_due, job_id=due.job_id, execution_id=due.execution_id,
                               attempt=due.attempt_number, delivery=due.delivery) if recording() else None
        return Hop(name, stored, kind=SpanKind.PRODUCER, attributes=attributes, links=link_to(stored))

    # -- alerts -----------------------------------------------------------------------------

    def permanently_failed(self, event: ExecutionEvent, headers: Headers) -> OutRecord:
        alert = Alert(
            alert_id=uuid5(NAMESPACE, f"alert|EXECUTION_PERMANENTLY_FAILED|{event.execution_id}"),
            kind="EXECUTION_PERMANENTLY_FAILED", severity="error", job_id=event.job_id,
            execution_id=event.execution_id, run_id=event.run_id,
            attempt_number=event.attempt_number, error_message=event.error_message,
            summary=f"{event.job_id} failed after {event.attempt_number} attempt(s)",
            occurred_at=event.occurred_at, raised_at=now_utc())
        log(logger, "alert_raised", logging.ERROR, kind=alert.kind, job_id=alert.job_id,
            execution_id=str(alert.execution_id), attempt=alert.attempt_number,
            error=(alert.error_message or "")[:300])
        return OutRecord(self.topics.alerts, alert.key, alert.to_json(), headers)
