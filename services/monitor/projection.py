"""Folding a batch of execution events into one row patch per execution.

The same transition guard as the SQL upsert (queries.sql `upsert_executions`) applies
inside the batch, so the fold and the database agree:
- a terminal status is final: later events of that execution change nothing;
- an event of an older delivery than the patch's is stale and ignored;
- an event of a newer delivery (after a requeue) resets the run fields.

Worked example, one batch for execution E (delivery d):
    RUNNING(d=1, w1)  PROGRESS(d=1, 40%)  REQUEUED(d=2)  RUNNING(d=2, w2)  COMPLETED(d=1, w1)
    → status RUNNING, delivery 2, worker w2, progress None: the zombie's COMPLETED is stale.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import Any
from uuid import UUID

from cronstream.shared.fast_records import EventRecord
from cronstream.shared.records import Alert, Heartbeat
from cronstream.shared.statuses import EVENTS_ONLY, TERMINAL
from cronstream.shared.telemetry import trace_id


@dataclass(slots=True)
class ExecutionPatch:
    execution_id: UUID
    job_id: str
    run_id: UUID
    status: str
    scheduled_at: datetime
    attempt_number: int
    delivery: int
    updated_at: datetime
    last_event: str
    queued_at: datetime | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None
    worker_id: str | None = None
    error_message: str | None = None
    result: str | None = None  # JSON text
    progress: float | None = None
    progress_message: str | None = None
    priority: str | None = None
    queue: str | None = None
    reason: str | None = None
    idempotency_key: str | None = None
    job: str | None = None  # JobSnapshot JSON
    approved_by: str | None = None
    rejected_by: str | None = None
    cancelled_by: str | None = None
    trace_id: str | None = None
    traceparent: str | None = None
    triggered_by: str | None = None
    definition_offset: int | None = None  # of the definition its snapshot was taken from
    waiting_reason: str | None = None  # the last WAITING event's: why it was held back

    @classmethod
    def start(cls, event: EventRecord) -> ExecutionPatch:
        patch = cls(
            execution_id=event.execution_id, job_id=event.job_id, run_id=event.run_id,
            status="RUNNING", scheduled_at=event.scheduled_at,
            attempt_number=event.attempt_number, delivery=event.delivery,
            updated_at=event.occurred_at, last_event=event.status,
        )
        patch.apply(event)
        return patch

    def accepts(self, event: EventRecord) -> bool:
        return self.status not in TERMINAL and event.delivery >= self.delivery

    def apply(self, event: EventRecord) -> None:
        if event.delivery > self.delivery:
            self.started_at = self.worker_id = self.progress_message = None
            self.progress = None
        self.delivery = event.delivery
        self.last_event = event.status
        self.updated_at = event.occurred_at
        status = event.status
        if status == "WAITING":
            self.status, self.waiting_reason = "WAITING", event.waiting_reason
            self._routed(event)
        elif status == "QUEUED":
            self.status, self.queued_at = "QUEUED", event.occurred_at
            self._routed(event)
        elif status == "REQUEUED":
            self.status = "QUEUED"
            self.started_at = self.worker_id = self.progress_message = None
            self.progress = None
        elif status == "RUNNING":
            self.status = "RUNNING"
            self.started_at = event.started_at or event.occurred_at
            self.worker_id = event.worker_id
        elif status == "PROGRESS":
            if self.status not in ("RUNNING",):
                self.status = "RUNNING"
            self.progress = event.progress
            self.progress_message = event.progress_message
            self.worker_id = event.worker_id or self.worker_id
            self.started_at = event.started_at or self.started_at
        else:  # AWAITING_APPROVAL and the terminal statuses
            self.status = status
            if status in TERMINAL:
                self.completed_at = event.completed_at or event.occurred_at
            self.worker_id = event.worker_id or self.worker_id
            # A worker's later events carry when the handler began, which may be after its
            # RUNNING (claimed ahead, started as a slot freed: decision 0029).
            self.started_at = event.started_at or self.started_at
        self._details(event)

    def _routed(self, event: EventRecord) -> None:
        self.priority = event.priority or self.priority
        self.queue = event.queue or self.queue

    def _details(self, event: EventRecord) -> None:
        """What any event may carry, whatever its status."""
        status = event.status
        self.reason = event.reason or self.reason
        self.idempotency_key = event.idempotency_key or self.idempotency_key
        if event.job is not None:
            self.job = event.job.model_dump_json()
            self.definition_offset = event.job.definition_offset
        if event.error_message is not None:
            self.error_message = event.error_message
        if event.result is not None:
            self.result = json.dumps(event.result, separators=(",", ":"))
        if status not in EVENTS_ONLY and event.progress is not None:
            self.progress = event.progress
        self.approved_by = event.approved_by or self.approved_by
        self.rejected_by = event.rejected_by or self.rejected_by
        self.cancelled_by = event.cancelled_by or self.cancelled_by
        self.triggered_by = event.triggered_by or self.triggered_by


def fold(events: Sequence[EventRecord], traces: dict[UUID, str] | None = None
         ) -> dict[UUID, ExecutionPatch]:
    """One patch per execution; `traces` (event_id -> traceparent) gives each patch the
    trace context of its latest accepted event."""
    patches: dict[UUID, ExecutionPatch] = {}
    traces = traces or {}
    for event in events:
        patch = patches.get(event.execution_id)
        if patch is None:
            patch = patches[event.execution_id] = ExecutionPatch.start(event)
        elif patch.accepts(event):
            patch.apply(event)
        else:
            continue
        traceparent = traces.get(event.event_id)
        if traceparent is not None:
            patch.traceparent = traceparent
            patch.trace_id = patch.trace_id or trace_id(traceparent)
    return patches


_PATCH_COLUMNS = (
    "execution_id", "job_id", "run_id", "status", "scheduled_at", "queued_at", "started_at",
    "completed_at", "worker_id", "attempt_number", "delivery", "error_message", "result",
    "progress", "progress_message", "priority", "queue", "last_event", "updated_at", "reason",
    "idempotency_key", "job", "approved_by", "rejected_by", "cancelled_by", "trace_id",
    "traceparent", "triggered_by", "definition_offset", "waiting_reason",
)


_PATCH_ROW = attrgetter(*_PATCH_COLUMNS)  # one C call per patch, not one getattr per column


def patch_rows(patches: list[ExecutionPatch]) -> list[tuple[Any, ...]]:
    """Rows of `staged_executions` (queries.sql `create_staging`), in its column order."""
    return [_PATCH_ROW(p) for p in patches]


def event_rows(rows: list[tuple[EventRecord, int, int]], traces: dict[UUID, str] | None = None
               ) -> list[tuple[Any, ...]]:
    """Rows of `staged_events` (queries.sql `create_staging`) from (event, partition, offset)."""
    traces = traces or {}
    return [(
        event.event_id, event.execution_id, event.job_id, event.run_id, event.status,
        event.attempt_number, event.delivery, event.scheduled_at, event.occurred_at,
        event.worker_id, event.started_at, event.completed_at, event.error_message,
        None if event.result is None else json.dumps(event.result, separators=(",", ":")),
        event.progress, event.progress_message, partition, offset,
        trace_id(traces.get(event.event_id)),
    ) for event, partition, offset in rows]


def heartbeat_arrays(beats: list[Heartbeat]) -> list[list[Any]]:
    latest: dict[str, Heartbeat] = {}
    for beat in beats:
        known = latest.get(beat.worker_id)
        if known is None or beat.sent_at >= known.sent_at:
            latest[beat.worker_id] = beat
    rows = list(latest.values())
    return [
        [b.worker_id for b in rows],
        [b.hostname for b in rows],
        [b.status for b in rows],
        [b.sent_at for b in rows],
        [",".join(str(r) for r in b.running) for b in rows],
        [b.capacity for b in rows],
        [",".join(b.queues) for b in rows],
    ]


def alert_arrays(alerts: list[tuple[Alert, int, int]]) -> list[list[Any]]:
    """Column arrays for `upsert_alerts` (one row per episode: the last record of a batch
    wins, so a FIRING and its RESOLVED in one batch end RESOLVED)."""
    last: dict[UUID, tuple[Alert, int, int]] = {}
    for item in alerts:
        previous = last.get(item[0].alert_id)
        if previous is None or previous[0].state == "FIRING":
            last[item[0].alert_id] = item
    rows = list(last.values())
    return [
        [a.alert_id for a, _, _ in rows],
        [a.kind for a, _, _ in rows],
        [a.severity for a, _, _ in rows],
        [a.state for a, _, _ in rows],
        [a.job_id for a, _, _ in rows],
        [a.queue for a, _, _ in rows],
        [a.execution_id for a, _, _ in rows],
        [a.run_id for a, _, _ in rows],
        [a.summary for a, _, _ in rows],
        [a.error_message for a, _, _ in rows],
        [json.dumps(a.evidence) for a, _, _ in rows],
        [a.raised_at for a, _, _ in rows],
        [p for _, p, _ in rows],
        [o for _, _, o in rows],
    ]
