"""Deterministic identifiers (SPEC §5.1).

An execution's id is a UUIDv5 of (job_id, the scheduled_at of the run's first attempt,
attempt_number), so that every component that derives it — a leader before failover and
its successor, a worker producing a retry twice, a backfill over an instant that already
fired — derives the same value, and consumers dedupe on it.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID, uuid5

__all__ = ["NAMESPACE", "execution_id", "idempotency_key", "run_id", "wire_time"]

NAMESPACE = UUID("8f0b7f5e-1a7c-5c1e-9d7e-6372306e7374")


def wire_time(t: datetime) -> str:
    """RFC 3339 UTC with milliseconds, the canonical text of an instant in an id."""
    return (f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:"
            f"{t.second:02d}.{t.microsecond // 1000:03d}Z")


def run_id(job_id: str, origin: datetime) -> UUID:
    """The run a fire starts; retries and DAG steps of that fire share it."""
    return uuid5(NAMESPACE, f"run|{job_id}|{wire_time(origin)}")


def execution_id(job_id: str, origin: datetime, attempt: int) -> UUID:
    """`origin` is the scheduled_at of the run's first attempt of this job."""
    return uuid5(NAMESPACE, f"exec|{job_id}|{wire_time(origin)}|{attempt}")


def idempotency_key(job_id: str, origin: datetime, params: dict[str, object]) -> str:
    """Stable across retries and requeues; `params.idempotency_key` wins when given."""
    given = params.get("idempotency_key")
    if isinstance(given, str) and given:
        return given[:256]
    return f"{job_id}@{wire_time(origin)}"
