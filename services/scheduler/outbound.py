"""Every record the scheduler leader writes, built in one place: fires (each the root span of
its execution's trace), job states, retry tombstones, what definitions turn into, and the
alerts of suspended jobs. Pure: the leader commits what these return."""

from __future__ import annotations

import logging
from functools import partial
from uuid import uuid5

from confluent_kafka import Message
from opentelemetry.trace import Span

from cronstream.services.scheduler.clock import Clock, FirePlan, StateChange
from cronstream.shared import metrics, telemetry
from cronstream.shared.codec import decode_key
from cronstream.shared.ids import NAMESPACE
from cronstream.shared.inbound import Batch
from cronstream.shared.kafka.reading import position, record_time_ms
from cronstream.shared.logs import log
from cronstream.shared.producers import OutRecord
from cronstream.shared.records import Alert, JobDefinition, now_utc
from cronstream.shared.telemetry import Headers
from cronstream.shared.topics import Topics

logger = logging.getLogger(__name__)

SERVICE = "scheduler"


class LeaderRecords:
    def __init__(self, topics: Topics, clock: Clock) -> None:
        self.topics = topics
        self.clock = clock
        # Trace headers of each pending retry (the failed attempt's run span: a link).
        self.retry_headers: dict[str, Headers] = {}
        # State records that no fire caused share one trace per round (a million of them
        # at a first takeover: one context, not a million).
        self.batch_headers = telemetry.new_headers()

    def new_round(self) -> None:
        self.batch_headers = telemetry.new_headers()

    def fires(self, plan: FirePlan, spans: list[Span]) -> list[OutRecord]:
        """The plan's records; each fire is the root span of its execution's trace (a
        retry's links to the attempt that failed), and the job's state record carries it.
        The spans are appended to `spans`, for the leader to end once committed."""
        records: list[OutRecord] = []
        by_job: dict[str, Headers] = {}
        topic = self.topics.job_due
        tracing = telemetry.recording()
        for due in plan.dues:
            retry = self.retry_headers.get(due.execution_id)
            span = telemetry.root(
                "cronstream.fire",
                telemetry.messaging(topic, job_id=due.job_id, execution_id=due.execution_id,
                                    reason="RETRY" if retry is not None else "SCHEDULE")
                if tracing else None,
                links=telemetry.link_to(retry) if retry is not None else ())
            spans.append(span)
            headers = by_job[due.job_id] = telemetry.headers_of(span)
            records.append(OutRecord(topic, due.job_id.encode(), due.value, headers))
        records += [self.state(c, by_job.get(c.job_id)) for c in plan.states]
        records += [OutRecord(self.topics.retries, str(k).encode(), None,
                              self.retry_headers.get(str(k))) for k in plan.fired_retries]
        return records

    def definitions(self, batch: Batch) -> list[OutRecord]:
        """What the batch's definitions turn into, its dead letters included; whatever
        applying one raises dead-letters that one (one record never stops the leader)."""
        msgs = batch.records
        records: list[OutRecord] = []

        def apply(msg: Message) -> None:
            records.extend(self.definition(batch, msg, len(msgs) > 10))

        for msg in msgs:
            batch.apply(msg, partial(apply, msg), "applying the definition")
        if len(msgs) > 10:
            log(logger, "definitions_applied", count=len(msgs), last_offset=msgs[-1].offset())
        return records + batch.dead

    def definition(self, batch: Batch, msg: Message, quiet: bool) -> list[OutRecord]:
        """The records one definition turns into: its state (an invalid definition, which
        `batch` dead-letters, suspends its job until a valid one replaces it)."""
        job_id = batch.read(lambda _value, key: decode_key(key), msg)
        if job_id is None:
            return []
        value = msg.value()
        definition = None
        if value is not None:
            definition = batch.decode(JobDefinition, msg, key_field="job_id")
            problem = None if definition is None else self.clock.dag_problem(definition)
            if problem is not None:
                definition = None
                batch.reject(msg, f"invalid DAG: {problem}")
        change = self.clock.apply_definition(
            job_id, definition, value, position(msg)[2], record_time_ms(msg))
        records = [self.state(change)]
        log(logger, "definition_applied" if value is not None else "definition_deleted",
            logging.DEBUG if quiet else logging.INFO,
            job_id=job_id, offset=msg.offset(), valid=definition is not None or value is None,
            next_fire_ms=change.next_fire_ms)
        return records

    def suspension_alerts(self) -> list[OutRecord]:
        """An alert for each job the clock suspended since the last call (at least once:
        the alert id is deterministic per job and definition offset)."""
        found, self.clock.suspensions = self.clock.suspensions, []
        metrics.SCHEDULER_SUSPENDED.set(len(self.clock.suspended))
        records = []
        for job_id, offset, reason in found:
            now = now_utc()
            alert = Alert(
                alert_id=uuid5(NAMESPACE, f"alert|JOB_SUSPENDED|{job_id}|{offset}"),
                kind="JOB_SUSPENDED", severity="error", job_id=job_id,
                summary=f"job {job_id} is suspended: its definition cannot be scheduled",
                error_message=reason[:2000], evidence={"definition_offset": offset},
                occurred_at=now, raised_at=now)
            records.append(OutRecord(self.topics.alerts, alert.key, alert.to_json(),
                                     telemetry.new_headers()))
        return records

    def state(self, change: StateChange, headers: Headers | None = None) -> OutRecord:
        return OutRecord(self.topics.scheduler_state, change.job_id.encode(), change.value,
                         headers or self.batch_headers)
