"""Every record a shard's leader writes, built in one place: fires (each the root span of
its execution's trace), job states, retry tombstones, what definitions turn into, and the
alerts of suspended jobs. Pure: the leader commits what these return. State records and
retry tombstones go to the shard's own partition (co-partitioned with `job-definitions`:
shared/shards.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import NamedTuple
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
from cronstream.shared.shards import shard_of
from cronstream.shared.telemetry import Headers
from cronstream.shared.topics import Topics

logger = logging.getLogger(__name__)

SERVICE = "scheduler"


class Applied(NamedTuple):
    """A definition the leader applied: what the shard's store learns once it commits."""

    job_id: str
    offset: int
    observed_ms: int
    raw: bytes | None
    change: StateChange


class LeaderRecords:
    def __init__(self, topics: Topics, clock: Clock, shard: int = 0,
                 fired_of: Callable[[str], tuple[int | None, int]] | None = None) -> None:
        self.topics = topics
        self.clock = clock
        self.shard = shard
        # A job's last fire and count of fires when the clock does not hold it (the
        # shard's store knows).
        self.fired_of = fired_of or (lambda job_id: (None, 0))
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
        fresh = telemetry.fresh_traces()
        for due in plan.dues:
            retry = self.retry_headers.get(due.execution_id)
            if fresh is not None and retry is None:  # a trace nothing records: only its ids
                headers = by_job[due.job_id] = fresh()
                records.append(OutRecord(topic, due.job_id.encode(), due.value, headers))
                continue
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
                              self.retry_headers.get(str(k)), self.shard) for k in plan.fired_retries]
        return records

    def definitions(self, batch: Batch, applied: list[Applied]) -> list[OutRecord]:
        """What the batch's definitions turn into, its dead letters included; whatever
        applying one raises dead-letters that one (one record never stops the leader).
        Each applied definition is added to `applied`."""
        msgs = batch.records
        records: list[OutRecord] = []

        def apply(msg: Message) -> None:
            records.extend(self.definition(batch, msg, len(msgs) > 10, applied))

        for msg in msgs:
            batch.apply(msg, partial(apply, msg), "applying the definition")
        if len(msgs) > 10:
            log(logger, "definitions_applied", count=len(msgs), last_offset=msgs[-1].offset())
        return records + batch.dead

    def definition(self, batch: Batch, msg: Message, quiet: bool,
                   applied: list[Applied] | None = None) -> list[OutRecord]:
        """The records one definition turns into: its state (an invalid definition, which
        `batch` dead-letters, suspends its job until a valid one replaces it)."""
        job_id = batch.read(lambda _value, key: decode_key(key), msg)
        if job_id is None:
            return []
        shard = shard_of(job_id, self.topics.shards)
        if position(msg)[1] != shard:
            # Published with another partitioner: another shard may hold the job too, and
            # two leaders would fire it. Refused, with what to do.
            batch.reject(msg, f"job {job_id!r} is on partition {position(msg)[1]}, but murmur2 of its "
                              f"job_id gives shard {shard}: publish definitions with the Java client's "
                              "partitioner (librdkafka: partitioner=murmur2_random)")
            return []
        value = msg.value()
        definition = None
        if value is not None:
            definition = batch.decode(JobDefinition, msg, key_field="job_id")
            problem = None if definition is None else self.clock.dag_problem(definition)
            if problem is not None:
                definition = None
                batch.reject(msg, f"invalid DAG: {problem}")
        offset, observed = position(msg)[2], record_time_ms(msg)
        last_fire_ms, runs = self.fired_of(job_id)
        change = self.clock.apply_definition(job_id, definition, value, offset, observed,
                                             last_fire_ms=last_fire_ms, runs=runs)
        if applied is not None:
            applied.append(Applied(job_id, offset, observed, value, change))
        records = [self.state(change)]
        log(logger, "definition_applied" if value is not None else "definition_deleted",
            logging.DEBUG if quiet else logging.INFO,
            job_id=job_id, offset=msg.offset(), valid=definition is not None or value is None,
            next_fire_ms=change.next_fire_ms)
        return records

    def has_suspensions(self) -> bool:
        return bool(self.clock.suspensions)

    def dead_letter_retry(self, key: bytes, value: bytes, reason: str) -> OutRecord:
        """The dead letter of a `retries` record of the shard that does not read."""
        return OutRecord(self.topics.dead_letters, key, value[:256 * 1024], [
            ("cronstream.dlq.topic", self.topics.retries.encode()),
            ("cronstream.dlq.partition", str(self.shard).encode()),
            ("cronstream.dlq.error", f"invalid RetryRequest: {reason}"[:2000].encode()),
            ("cronstream.dlq.service", b"scheduler")])

    def count_round(self, plan: FirePlan, now_ms: int, planned_ms: int) -> None:
        """The metrics and the log line of a committed round."""
        if plan.skipped:
            metrics.MISFIRES.labels(outcome="skipped").inc(plan.skipped)
        if not plan.dues:
            return
        committed_ms = time_ms()
        retried = len(plan.fired_retries)
        metrics.FIRES.labels(reason="RETRY").inc(retried)
        metrics.FIRES.labels(reason="SCHEDULE").inc(len(plan.dues) - retried)
        for fire in plan.dues:
            metrics.FIRE_LAG.observe(max(0, committed_ms - fire.scheduled_ms) / 1000)
        log(logger, "jobs_fired", shard=self.shard, fired=len(plan.dues),
            max_lag_ms=committed_ms - min(d.scheduled_ms for d in plan.dues),
            plan_ms=planned_ms - now_ms, commit_ms=committed_ms - planned_ms,
            first_job_id=plan.dues[0].job_id, first_scheduled_ms=plan.dues[0].scheduled_ms)

    def suspension_alerts(self) -> list[OutRecord]:
        """An alert for each job the clock suspended since the last call (at least once:
        the alert id is deterministic per job and definition offset)."""
        found, self.clock.suspensions = self.clock.suspensions, []
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
                         headers or self.batch_headers, self.shard)


def time_ms() -> int:
    return time.time_ns() // 1_000_000
