"""Deterministic identifiers (docs/reference/semantics.md#exactly-once-fires).

An execution's id is a UUIDv5 of (job_id, the scheduled_at of the run's first attempt,
attempt_number), so that every component that derives it — a leader before failover and
its successor, a worker producing a retry twice, a backfill over an instant that already
fired — derives the same value, and consumers dedupe on it.
"""

from __future__ import annotations

import os
import random
import time
from datetime import datetime
from functools import lru_cache
from hashlib import sha1
from uuid import UUID, uuid5

__all__ = [
    "NAMESPACE", "event_run_id", "execution_id", "fast_uuid4", "fast_uuid5", "fast_uuid7",
    "given_idempotency_key", "idempotency_key", "new_event_id", "requeue_idempotency_key",
    "run_id", "step_idempotency_key", "wire_time", "wire_time_ms",
]

NAMESPACE = UUID("8f0b7f5e-1a7c-5c1e-9d7e-6372306e7374")
_NAMESPACE_BYTES = NAMESPACE.bytes


def fast_uuid5(name: str) -> str:
    """str(uuid5(NAMESPACE, name)) without building UUID objects (the scheduler's hot
    path computes two per fire)."""
    return _uuid_text(sha1(_NAMESPACE_BYTES + name.encode()).digest()[:16], 5)


def fast_uuid4() -> str:
    """str(uuid4()) without building a UUID object."""
    return _uuid_text(os.urandom(16), 4)


# The random bits of event ids: a generator of our own, seeded from os.urandom, so that
# an id costs no system call (three per execution; a call is also where a process on a
# busy machine loses its CPU) and a handler that seeds the `random` module (inline ones
# run in the worker's process) cannot make two workers write the same ids. Reseeded in
# a forked child, which would otherwise repeat its parent's ids.
_ids_rng = random.Random()
os.register_at_fork(after_in_child=_ids_rng.seed)
_random_bits = _ids_rng.getrandbits
_V7 = (0x7 << 76) | (0x2 << 62)  # the version (7) and variant (0b10) bits
_LOW_62 = (1 << 62) - 1


def fast_uuid7() -> str:
    """A UUIDv7 (RFC 9562) as text: 48 bits of Unix milliseconds, then 74 random bits.

    Event ids are these. They are unique like a v4, and ordered by when they were made,
    so the primary key of `execution_events` grows at its right edge: a random id put
    every insert on another leaf page of the index, and each leaf touched for the first
    time after a checkpoint is written whole to the WAL (docs/decisions/0017)."""
    bits = _random_bits(74)
    h = "%032x" % ((time.time_ns() // 1_000_000) << 80 | _V7 | (bits >> 62) << 64 | bits & _LOW_62)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def new_event_id() -> UUID:
    """A fresh event id (`fast_uuid7`) as a UUID."""
    return UUID(fast_uuid7())


def _uuid_text(raw: bytes, version: int) -> str:
    """str(UUID(bytes=raw, version=version)), from 16 bytes."""
    digest = bytearray(raw)
    digest[6] = (digest[6] & 0x0F) | (version << 4)
    digest[8] = (digest[8] & 0x3F) | 0x80
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@lru_cache(maxsize=8)
def _second_prefix(sec: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))


def wire_time_ms(ms: int) -> tuple[str, str]:
    """(wire_time, the pydantic JSON form) of an epoch-ms instant; a burst of fires in the
    same second formats the date once."""
    sec, milli = divmod(ms, 1000)
    prefix = _second_prefix(sec)
    return f"{prefix}.{milli:03d}Z", (f"{prefix}.{milli:03d}000Z" if milli else f"{prefix}Z")


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


def event_run_id(job_id: str, topic: str, partition: int, offset: int) -> UUID:
    """The run an event trigger starts with the record at (topic, partition, offset) as its
    first event: a record is in one run only, so whoever forms that run names it alike."""
    return uuid5(NAMESPACE, f"event|{job_id}|{topic}|{partition}|{offset}")


def retry_execution_id(job_id: str, run_id: UUID, attempt: int) -> UUID:
    """Deterministic: a run's attempt n of a job has one id whoever computes it (a retry,
    and a DAG step's first attempt, n = 1)."""
    return uuid5(NAMESPACE, f"retry|{job_id}|{run_id}|{attempt}")


def given_idempotency_key(params: dict[str, object]) -> str | None:
    """`params.idempotency_key` when the job sets one (it wins over any derived key)."""
    given = params.get("idempotency_key")
    return given[:256] if isinstance(given, str) and given else None


def idempotency_key(job_id: str, origin: datetime, params: dict[str, object]) -> str:
    """Of a scheduled, manual or backfilled run: stable across retries and requeues."""
    return given_idempotency_key(params) or f"{job_id}@{wire_time(origin)}"


def step_idempotency_key(job_id: str, run_id: UUID, params: dict[str, object]) -> str:
    """Of a DAG step: one per (job, run), whoever evaluates it and however often."""
    return given_idempotency_key(params) or f"{job_id}@{run_id}"


def requeue_idempotency_key(stored: str | None, job_id: str, run_id: UUID) -> str:
    """Of a requeued execution: the key it had (from its QUEUED event); the DAG-step form
    for executions projected before keys were stored."""
    return stored or f"{job_id}@{run_id}"
