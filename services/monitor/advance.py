"""DAG advancement and operators' decisions, inside the projection's transaction.

Both read the projection and publish what follows from it (a DAG step's JobDue or
SKIPPED / AWAITING_APPROVAL event; an approved step's JobDue; a rejected, cancelled or
pending-retry-cancelled execution's terminal event), and both make their decision once,
in PostgreSQL, in the same transaction as the batch that caused it:
- a DAG step is evaluated once per run (`dag_evaluations`), and a run's evaluation is
  serialised across monitors (`lock_run`): a join whose upstreams finish on partitions
  owned by different monitors is evaluated by whichever commits second, never skipped by
  both;
- an execution waiting for approval is decided once (`execution_decisions`): the first
  APPROVE, REJECT or CANCEL wins.
The pure decision of a step is `dag.decide`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from opentelemetry.trace import SpanKind

from cronstream.services.monitor.dag import DAG_FINAL, decide, upstream_view
from cronstream.services.monitor.outbound import Outbound
from cronstream.services.monitor.projection import ExecutionPatch
from cronstream.services.monitor.upstream import decided_view, step_upstream
from cronstream.shared import metrics
from cronstream.shared.db import query
from cronstream.shared.ids import retry_execution_id
from cronstream.shared.logs import log
from cronstream.shared.producers import OutRecord
from cronstream.shared.records import Command, ExecutionEvent, JobDefinition, now_utc
from cronstream.shared.retry import attempts_left
from cronstream.shared.telemetry import Headers, Hop, attached, new_headers, recording

logger = logging.getLogger(__name__)


class DagAdvancer:
    def __init__(self, outbound: Outbound) -> None:
        self.outbound = outbound

    async def advance(self, conn: Any, patches: list[ExecutionPatch]) -> list[OutRecord]:
        finals = [p for p in patches if p.status in DAG_FINAL]
        if not finals:
            return []
        # Asked in this transaction, not cached: with several monitors, the one that
        # projected a DAG's definitions is not the one that sees its runs end.
        upstreams = {r[0] for r in await conn.fetch(query("dag_upstreams_among"),
                                                   sorted({p.job_id for p in finals}))}
        finals = [p for p in finals if p.job_id in upstreams]
        for run_id in sorted({str(p.run_id) for p in finals}):  # a fixed order: no deadlock
            await conn.execute(query("lock_run"), run_id)
        records: list[OutRecord] = []
        for patch in finals:
            for row in await conn.fetch(query("dag_downstreams"), patch.job_id):
                definition = json.loads(row["definition"])
                depends_on = definition["depends_on"]
                states = await conn.fetch(query("run_states"), patch.run_id, depends_on)
                if len(states) < len(depends_on) or any(s["status"] not in DAG_FINAL for s in states):
                    continue  # not every upstream is final in this run yet
                outcomes = upstream_view(list(states))
                verdict = decide(definition, outcomes)
                step = retry_execution_id(row["job_id"], patch.run_id, 1)
                claimed = await conn.fetchval(query("claim_evaluation"), patch.run_id, row["job_id"],
                                              step, verdict.decision, verdict.detail,
                                              [outcomes[j]["execution_id"] for j in depends_on])
                if claimed is None:
                    continue  # evaluated already in this run
                view = await decided_view(conn, patch.run_id, depends_on, outcomes) \
                    if verdict.decision == "RUN" else None
                metrics.DAG_EVALUATIONS.labels(decision=verdict.decision).inc()
                # The evaluation is part of the upstream execution's trace; the step's own
                # trace links to it.
                upstream: Headers = [("traceparent", patch.traceparent.encode())] \
                    if patch.traceparent else []
                evaluation = Hop("cronstream.dag.evaluate", upstream, kind=SpanKind.INTERNAL,
                                 attributes={"cronstream.job_id": row["job_id"],
                                             "cronstream.run_id": str(patch.run_id),
                                             "cronstream.decision": verdict.decision}
                                 if recording() else None)
                with attached(evaluation.headers):
                    log(logger, "dag_step_decided", job_id=row["job_id"], run_id=str(patch.run_id),
                        execution_id=str(step), decision=verdict.decision, detail=verdict.detail)
                records.append(self.outbound.step(
                    JobDefinition.model_validate_json(row["definition"]), patch.run_id, step,
                    decision=verdict.decision, detail=verdict.detail, evaluation=evaluation.headers,
                    definition_offset=row["definition_offset"], upstream=view))
                evaluation.end()
        return records


class Decisions:
    """APPROVE / REJECT / CANCEL commands the monitor answers for. (A CANCEL of a queued or
    running execution is the workers': only the consumer of the work record decides.)"""

    def __init__(self, outbound: Outbound) -> None:
        self.outbound = outbound

    async def apply(self, conn: Any, command: Command) -> list[OutRecord]:
        row = await conn.fetchrow(query("awaiting_execution"), command.execution_id)
        if row is not None:
            return await self._decide(conn, command, row)
        if command.command == "CANCEL":
            waiting = await conn.fetchrow(query("waiting_execution"), command.execution_id)
            if waiting is not None:
                return await self._cancel_waiting(conn, command, waiting)
        if command.command == "CANCEL" and command.job_id is not None:
            return await self._cancel_pending_retry(conn, command, command.job_id)
        if command.command != "CANCEL":
            log(logger, "command_ignored", logging.WARNING, command=command.command,
                execution_id=str(command.execution_id), reason="not awaiting approval")
        return []

    async def _decide(self, conn: Any, command: Command, row: Any) -> list[OutRecord]:
        claimed = await conn.fetchval(query("claim_decision"), command.execution_id,
                                      command.command, command.issued_by)
        if claimed is None:
            log(logger, "command_ignored", command=command.command,
                execution_id=str(command.execution_id), reason="decided already")
            return []
        who = f" by {command.issued_by}" if command.issued_by else ""
        log(logger, {"APPROVE": "execution_approved", "REJECT": "execution_rejected"}.get(
            command.command, "execution_cancelled"), job_id=row["job_id"],
            execution_id=str(row["execution_id"]), issued_by=command.issued_by)
        upstream = await step_upstream(conn, row["run_id"], row["job_id"]) \
            if command.command == "APPROVE" else None
        due = self.outbound.due_of(row, reason="DEPENDENCY", approved_by=command.issued_by,
                                   upstream=upstream)
        hop = self.outbound.continued(f"cronstream.{command.command.lower()}", row, due)
        hop.end()
        if command.command == "APPROVE":
            return [self.outbound.due(due, hop.headers)]
        now = now_utc()
        if command.command == "REJECT":
            return [self.outbound.event(ExecutionEvent.for_due(
                due, "SKIPPED", occurred_at=now, completed_at=now, rejected_by=command.issued_by,
                error_message=f"rejected{who}: {command.reason or 'no reason given'}"), hop.headers)]
        return [self.outbound.event(ExecutionEvent.for_due(
            due, "CANCELLED", occurred_at=now, completed_at=now, cancelled_by=command.issued_by,
            error_message=f"cancelled{who} while awaiting approval: "
                          f"{command.reason or 'no reason given'}"), hop.headers)]

    async def _cancel_waiting(self, conn: Any, command: Command, row: Any) -> list[OutRecord]:
        """CANCEL of a WAITING execution: it ends CANCELLED at once, holding nothing; the
        dispatcher takes it out of its line when it reads the event. (Admitted meanwhile,
        its worker skips it on the same command, and its end frees the slot.)"""
        claimed = await conn.fetchval(query("claim_decision"), command.execution_id,
                                      command.command, command.issued_by)
        if claimed is None:
            return []
        log(logger, "execution_cancelled", job_id=row["job_id"],
            execution_id=str(row["execution_id"]), issued_by=command.issued_by, waiting=True)
        due = self.outbound.due_of(row)
        hop = self.outbound.continued("cronstream.cancel", row, due)
        hop.end()
        who = f" by {command.issued_by}" if command.issued_by else ""
        now = now_utc()
        return [self.outbound.event(ExecutionEvent.for_due(
            due, "CANCELLED", occurred_at=now, completed_at=now, cancelled_by=command.issued_by,
            error_message=f"cancelled{who} while waiting ({row['waiting_reason']}): "
                          f"{command.reason or 'no reason given'}"), hop.headers)]

    async def _cancel_pending_retry(self, conn: Any, command: Command, job_id: str) -> list[OutRecord]:
        """CANCEL of an attempt that does not exist yet: the retry timer of a failed one.
        Drop the timer and end the attempt CANCELLED. (Had the retry fired already, its
        worker skips it on the same command.)"""
        for row in await conn.fetch(query("retryable_failures"), job_id):
            if retry_execution_id(job_id, row["run_id"], row["attempt_number"] + 1) != command.execution_id:
                continue
            now = now_utc()
            parent = self.outbound.due_of({**row, "job_id": job_id, "scheduled_at": now,
                                           "delivery": 1, "idempotency_key": None})
            if not attempts_left(parent):
                return []
            retry = parent.next_attempt(now)
            log(logger, "pending_retry_cancelled", job_id=job_id,
                execution_id=str(command.execution_id), issued_by=command.issued_by)
            headers = new_headers()
            return [self.outbound.retry_tombstone(command.execution_id, job_id, headers),
                    self.outbound.event(ExecutionEvent.for_due(
                        retry, "CANCELLED", occurred_at=now, completed_at=now,
                        cancelled_by=command.issued_by,
                        error_message=f"pending retry cancelled: {command.reason or 'no reason given'}"),
                        headers)]
        return []
