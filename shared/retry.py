"""Retry policy: exponential backoff with jitter, capped (docs/reference/semantics.md#retries).

The next attempt of an execution that ends FAILED or TIMED_OUT is due at

    failure time + min(retry_delay_seconds × 2^(attempt_number − 1) × U(0.8, 1.2),
                       max_retry_delay_seconds)

Total attempts are 1 + max_retries: `max_retries` counts the retries after the first
attempt, as in Celery and Airflow (docs/decisions/0004-retries.md).
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from cronstream.shared.fast_records import DueRecord, FastSnapshot, as_model
from cronstream.shared.records import JobSnapshot, RetryRequest
from cronstream.shared.schedule import to_millis

JITTER = (0.8, 1.2)


def retry_delay(job: JobSnapshot | FastSnapshot, attempt_number: int, rng: random.Random) -> float:
    """Seconds from the failure of `attempt_number` to the next attempt."""
    base = job.retry_delay_seconds * 2 ** (attempt_number - 1) * rng.uniform(*JITTER)
    return min(base, job.max_retry_delay_seconds)


def attempts_left(due: DueRecord) -> bool:
    return due.attempt_number < 1 + due.job.max_retries


def next_attempt(due: DueRecord, failed_at: datetime, rng: random.Random) -> RetryRequest:
    """The timer of the attempt after `due`'s, which failed at `failed_at`."""
    due_at = to_millis(failed_at + timedelta(seconds=retry_delay(due.job, due.attempt_number, rng)))
    return RetryRequest.of(as_model(due).next_attempt(due_at), due_at)
