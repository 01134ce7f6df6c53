"""`Execution`: one execution as the monitor has projected it into PostgreSQL; `LogEntry`:
one line of its log."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from cronstream.shared.statuses import TERMINAL

__all__ = ["Execution", "LogEntry"]


def _plain(value: Any) -> Any:
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return value


@dataclass(frozen=True, slots=True)
class Execution:
    """The current state of one execution (a row of `job_executions`).

    `status` is the latest lifecycle state (records.py documents the state machine);
    `delivery` counts hand-overs to a worker (a requeue adds one)."""

    execution_id: UUID
    job_id: str
    run_id: UUID
    status: str
    attempt_number: int
    delivery: int
    scheduled_at: datetime
    queued_at: datetime | None
    started_at: datetime | None
    completed_at: datetime | None
    worker_id: str | None
    progress: float | None
    progress_message: str | None
    error_message: str | None
    result: Any
    priority: str | None
    queue: str | None
    reason: str | None
    approved_by: str | None
    rejected_by: str | None
    cancelled_by: str | None
    updated_at: datetime
    # Who asked for the run (a trigger's or a backfill's), the params it ran with (the
    # job's, overlaid by the trigger's), and the version of the job's definition it ran.
    triggered_by: str | None = None
    params: dict[str, Any] | None = None
    definition_version: int | None = None
    # Why a WAITING execution is held back (a pool, a concurrency key, a rate limit); kept
    # after it is admitted: why it started late.
    waiting_reason: str | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at is None or self.completed_at is None:
            return None
        return (self.completed_at - self.started_at).total_seconds()

    @classmethod
    def from_row(cls, row: Mapping[str, Any] | Any) -> Execution:
        """From a `list_executions` / `get_execution` row (asyncpg.Record or mapping)."""
        values = {name: row[name] for name in cls.__dataclass_fields__}
        for name in ("result", "params"):
            if isinstance(values[name], str):  # jsonb arrives as its text
                values[name] = json.loads(values[name])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible: ids as strings, times as RFC 3339."""
        return {key: _plain(value) for key, value in asdict(self).items()}


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One line of an execution's log (a row of `execution_logs`): what its handler wrote
    to `stdout` or `stderr`, a `log` record (with its `level`), the `traceback` of a failed
    attempt, or a note of the worker's (`cronstream`). `delivery` and `seq` order the lines;
    `trace_id` finds the execution's trace."""

    execution_id: UUID
    attempt_number: int
    delivery: int
    seq: int
    at: datetime
    stream: str
    level: str | None
    text: str
    worker_id: str | None
    trace_id: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any] | Any) -> LogEntry:
        """From a `log_lines` row."""
        return cls(row["execution_id"], row["attempt_number"], row["delivery"], row["seq"],
                   row["at"], row["stream"], row["level"], row["line"], row["worker_id"],
                   row["trace_id"])

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible: ids as strings, times as RFC 3339."""
        return {key: _plain(value) for key, value in asdict(self).items()}
