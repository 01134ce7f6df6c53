"""Retry policy (SPEC §5.5): exponential backoff with jitter, capped.

The next attempt of an execution that ends FAILED or TIMED_OUT is due at

    failure time + min(retry_delay_seconds × 2^(attempt_number − 1) × U(0.8, 1.2),
                       max_retry_delay_seconds)

Total attempts are 1 + max_retries: `max_retries` counts the retries after the first
attempt, as in Celery and Airflow (docs/decisions/0004-retries.md).
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from uuid import UUID, uuid5

from cronstream.shared.fast_records import DueRecord, FastSnapshot, as_model
from cronstream.shared.ids import NAMESPACE
from cronstream.shared.records import JobSnapshot, RetryRequest
from cronstream.shared.schedule import to_millis

JITTER = (0.8, 1.2)


def retry_delay(job: JobSnapshot | FastSnapshot, attempt_number: int, rng: random.Random) -> float:
    """Seconds from the failure of `attempt_number` to the next attempt."""
    base = job.retry_delay_seconds * 2 ** (attempt_number - 1) * rng.uniform(*JITTER)
    return min(base, job.max_retry_delay_seconds)


def attempts_left(due: DueRecord) -> bool:
    return due.attempt_number < 1 + due.job.max_retries


def retry_execution_id(job_id: str, run_id: UUID, attempt: int) -> UUID:
    """Deterministic: a run's attempt n of a job has one id whoever computes it."""
    return uuid5(NAMESPACE, f"retry|{job_id}|{run_id}|{attempt}")


def next_attempt(due: DueRecord, failed_at: datetime, rng: random.Random) -> RetryRequest:
    attempt = due.attempt_number + 1
    due_at = to_millis(failed_at + timedelta(seconds=retry_delay(due.job, due.attempt_number, rng)))
    model = as_model(due)
    # The same run: who asked for it and, for a DAG step, what it saw of its upstreams.
    return RetryRequest(
        execution_id=retry_execution_id(due.job_id, due.run_id, attempt),
        job_id=due.job_id,
        run_id=due.run_id,
        scheduled_at=due_at,
        attempt_number=attempt,
        reason="RETRY",
        idempotency_key=due.idempotency_key,
        job=model.job,
        triggered_by=model.triggered_by,
        upstream=model.upstream,
        due_at=due_at,
    )
