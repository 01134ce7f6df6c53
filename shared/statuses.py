"""Execution statuses: the one source of what each means and who moves an execution on.

`ExecutionStatus` (records.py) is the wire form — a string literal, so that it reads the
same in JSON, YAML and Python; `Status` is the same set with the meaning of each, and the
sets below are derived from it. A unit test holds the literal, this enum and the SQL
transition guard (`upsert_executions` in queries.sql) to one another.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """Each status, documented by who moves an execution out of it (docs/reference/statuses.md)."""

    def __new__(cls, value: str, doc: str) -> Status:
        member = str.__new__(cls, value)
        member._value_ = value
        member.__doc__ = doc
        return member

    WAITING = ("WAITING",
               "The dispatcher holds it back under flow control (a pool, a concurrency key, a "
               "rate limit: decision 0056); waiting_reason says which. The dispatcher that owns the "
               "limit moves it to QUEUED when it is admitted (first come first served per key, "
               "round robin across keys); the monitor moves it to CANCELLED on a CANCEL "
               "command (it held nothing, and releases nothing).")
    QUEUED = ("QUEUED",
              "The dispatcher wrote the work record. The worker that consumes the record moves "
              "it to RUNNING, or to CANCELLED when a CANCEL command came first.")
    RUNNING = ("RUNNING",
               "A worker committed its consumption and runs the handler. That worker moves it to "
               "its end; the monitor back to QUEUED (REQUEUED) when the worker is declared dead "
               "or does not run it; the worker itself on drain.")
    PROGRESS = ("PROGRESS", "An event, not a resting state: the execution stays RUNNING.")
    REQUEUED = ("REQUEUED",
                "An event, not a resting state: back to QUEUED with delivery + 1; reports of "
                "older deliveries are stale from then on.")
    AWAITING_APPROVAL = ("AWAITING_APPROVAL",
                         "The monitor parked a DAG step. The monitor moves it to QUEUED (APPROVE), "
                         "SKIPPED (REJECT) or CANCELLED (CANCEL), the first command winning.")
    COMPLETED = ("COMPLETED", "Terminal: the handler returned.")
    FAILED = ("FAILED",
              "Terminal for this attempt: the handler raised, with attempts left. The next "
              "attempt is a new execution (a RetryRequest the scheduler fires).")
    TIMED_OUT = ("TIMED_OUT",
                 "Terminal for this attempt: killed at timeout_seconds, with attempts left (a "
                 "new execution retries it, as for FAILED).")
    CANCELLED = ("CANCELLED", "Terminal: a CANCEL command (or REPLACE) stopped or skipped it.")
    PERMANENTLY_FAILED = ("PERMANENTLY_FAILED",
                          "Terminal: the last attempt failed, or the failure is not retryable "
                          "(unknown handler, NonRetryableError); the monitor raises an alert.")
    SKIPPED = ("SKIPPED",
               "Terminal: a concurrency policy (FORBID) or a DAG rule (trigger rule, condition, "
               "rejection) decided it does not run; the reason is its error_message.")


TERMINAL: frozenset[str] = frozenset({
    Status.COMPLETED, Status.FAILED, Status.TIMED_OUT, Status.CANCELLED,
    Status.PERMANENTLY_FAILED, Status.SKIPPED})
# Terminal and no retry will follow: what a DAG step waits for upstream.
FINAL: frozenset[str] = frozenset({
    Status.COMPLETED, Status.PERMANENTLY_FAILED, Status.CANCELLED, Status.SKIPPED})
RETRYABLE: frozenset[str] = frozenset({Status.FAILED, Status.TIMED_OUT})
SUCCESS: frozenset[str] = frozenset({Status.COMPLETED})
FAILURE: frozenset[str] = frozenset({Status.FAILED, Status.TIMED_OUT, Status.PERMANENTLY_FAILED})
# How a run ends once it ran, its last attempt's status: what a success rate counts. Per
# run, not per attempt: a first try that fails and a retry that succeeds is one success;
# CANCELLED and SKIPPED are decisions, not outcomes (docs/decisions/0053).
RUN_OUTCOMES: frozenset[str] = frozenset({Status.COMPLETED, Status.PERMANENTLY_FAILED})
# Events, not resting states: a projected execution keeps its status through them.
EVENTS_ONLY: frozenset[str] = frozenset({Status.PROGRESS, Status.REQUEUED})
# Handed to a worker and not ended: what holds a flow-control slot (decision 0056).
HOLDING: frozenset[str] = frozenset({Status.QUEUED, Status.RUNNING})
# Not at rest: waiting for a limit, a worker or a person, or running.
ACTIVE: frozenset[str] = frozenset({Status.WAITING, Status.QUEUED, Status.RUNNING,
                                    Status.AWAITING_APPROVAL})
