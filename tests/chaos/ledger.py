"""The ledger check that follows every fault, and the recovery time of a fault.

After the window's last fire has settled, a chaos test holds the system to:
1. every fire of the window is in PostgreSQL exactly once: each expected execution id
   (shared/ids.py over the grid of shared/schedule.py) has its row, no other first
   attempt of the load's jobs exists, and `job-due` holds at most one first-attempt
   JobDue (reason SCHEDULE) per execution id (docs/reference/semantics.md#exactly-once-fires);
2. every execution reaches exactly one terminal status — COMPLETED, since the load's
   handlers never fail — with exactly one terminal event in `execution_events`;
3. nothing ran twice at one delivery: at most one RUNNING per (execution_id, delivery);
4. the projection equals the log (tests/support.py: projection_equals_log).
The services' side (alive, or restarted after a clear error) is the supervisor's record,
checked by the test harness (harness.py).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any
from uuid import UUID

from pydantic import ValidationError

from cronstream.shared.records import ExecutionEvent
from cronstream.shared.settings import Settings
from tests.chaos.load import Fire, LoadShape
from tests.support import most_at_once, read_all, sql

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
TERMINAL = frozenset({"COMPLETED", "FAILED", "TIMED_OUT", "CANCELLED", "PERMANENTLY_FAILED",
                      "SKIPPED"})


@lru_cache(maxsize=1)
def _queries() -> dict[str, str]:
    parts = _NAME.split((Path(__file__).parent / "ledger.sql").read_text())
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts), 2)}


def q(name: str) -> str:
    return _queries()[name]


@dataclass
class LedgerResult:
    expected: int
    problems: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)


def terminal_count(url: str, fires: dict[UUID, Fire]) -> int:
    return int(sql(url, q("terminal_count"), list(fires))[0][0])


def _sample(items: list[Any], n: int = 5) -> str:
    shown = ", ".join(str(i) for i in items[:n])
    return shown + (f" … (+{len(items) - n})" if len(items) > n else "")


def _fire(fire: Fire) -> str:
    return f"{fire.job_id}@{fire.scheduled_at:%H:%M:%S.%f}"[:-3]


@dataclass
class LogEvents:
    """What `execution-events` holds, read once: the ids of its records that decode as
    execution events (the flood test's garbage is dead-lettered, never projected), how many
    records repeat an id, and the ids whose copies differ (a worker may re-send a finished
    execution's records when a lost broker left its commit's outcome unknown, but a repeat
    must be the same record)."""

    ids: set[str]
    repeated: int
    differing: list[str]


def log_events(settings: Settings) -> LogEvents:
    seen: dict[str, bytes] = {}
    repeated, differing = 0, []
    for msg in read_all(settings, settings.topics.execution_events, 30):
        value = msg.value() or b""
        try:
            event_id = str(ExecutionEvent.model_validate_json(value).event_id)
        except (ValidationError, ValueError, RecursionError):
            continue
        if event_id in seen:
            repeated += 1
            if seen[event_id] != value:
                differing.append(event_id)
        else:
            seen[event_id] = value
    return LogEvents(set(seen), repeated, differing)


def projected_event_ids(settings: Settings) -> set[str]:
    return {str(r["event_id"]) for r in sql(settings.database_url, q("event_ids"))}


def projection_matches_log(settings: Settings) -> bool:
    """Whether the projection holds exactly the events on the log (event_id is its key)."""
    return projected_event_ids(settings) == log_events(settings).ids


def _first_attempts(settings: Settings, reason: str) -> Iterator[dict[str, Any]]:
    """The first-attempt JobDues of `reason` on `job-due`, as committed (one committed twice
    is there twice), parsed."""
    for msg in read_all(settings, settings.topics.job_due, timeout=30):
        try:
            due = json.loads(msg.value() or b"")
        except (ValueError, RecursionError):
            continue
        if isinstance(due, dict) and due.get("reason") == reason and due.get("attempt_number") == 1:
            yield due


def first_attempt_dues(settings: Settings) -> Counter[str]:
    """How many first-attempt, scheduled JobDues `job-due` holds per execution id."""
    return Counter(str(due.get("execution_id")) for due in _first_attempts(settings, "SCHEDULE"))


def check(settings: Settings, fires: dict[UUID, Fire], job_ids: list[str]) -> LedgerResult:
    url = settings.database_url
    result = LedgerResult(expected=len(fires))
    problems = result.problems
    rows = sql(url, q("executions_of_jobs"), job_ids)
    by_id = {r["execution_id"]: r for r in rows}
    missing = [_fire(fires[e]) for e in fires if e not in by_id]
    extra = [_fire(Fire(r["job_id"], r["scheduled_at"])) for r in rows
             if r["attempt_number"] == 1 and r["execution_id"] not in fires]
    retries = [r for r in rows if r["attempt_number"] != 1]
    statuses = Counter(by_id[e]["status"] for e in fires if e in by_id)
    result.figures.update(expected_fires=len(fires), projected=len(fires) - len(missing),
                          statuses=dict(statuses), extra_fires=len(extra), retries=len(retries))
    if missing:
        problems.append(f"{len(missing)} of {len(fires)} fires missing from job_executions: "
                        f"{_sample(missing)}")
    if extra:
        problems.append(f"{len(extra)} fires that the window does not hold: {_sample(extra)}")
    not_completed = [r for e in fires if (r := by_id.get(e)) is not None and r["status"] != "COMPLETED"]
    if not_completed:
        errors = Counter(f"{r['status']}: {(r['error_message'] or '')[:120]}" for r in not_completed)
        problems.append(f"{len(not_completed)} executions not COMPLETED: "
                        f"{_sample([f'{n}× {s}' for s, n in errors.most_common()], 4)}")
    if retries:
        problems.append(f"{len(retries)} retry attempts of handlers that never fail: "
                        f"{_sample([r['execution_id'] for r in retries])}")
    dues = first_attempt_dues(settings)
    doubled = [e for e in fires if dues[str(e)] > 1]
    result.figures["duplicate_fires"] = len(doubled)
    if doubled:
        problems.append(f"{len(doubled)} fires committed more than once on job-due: "
                        f"{_sample([_fire(fires[e]) + f' ×{dues[str(e)]}' for e in doubled])}")
    not_once = sql(url, q("terminal_events_not_once"), list(fires))
    no_terminal = [e for e in fires if e in by_id and by_id[e]["status"] not in TERMINAL]
    if not_once:
        problems.append(f"{len(not_once)} executions with more than one terminal event: "
                        f"{_sample([(r['execution_id'], list(r['statuses'])) for r in not_once], 3)}")
    if no_terminal:
        problems.append(f"{len(no_terminal)} executions never reached a terminal status: "
                        f"{_sample([(str(e), by_id[e]['status'], by_id[e]['worker_id']) for e in no_terminal])}")
    twice = sql(url, q("ran_twice_at_one_delivery"), job_ids)
    result.figures["ran_twice_at_one_delivery"] = len(twice)
    if twice:
        problems.append(f"{len(twice)} (execution, delivery) pairs RUNNING more than once: "
                        f"{_sample([(r['execution_id'], r['delivery'], list(r['workers'])) for r in twice], 3)}")
    log = log_events(settings)
    result.figures["events_repeated_on_log"] = log.repeated
    if log.differing:
        problems.append(f"{len(log.differing)} event ids written twice with different contents: "
                        f"{_sample(log.differing, 3)}")
    on_log, in_db = log.ids, projected_event_ids(settings)
    equal = on_log == in_db
    result.figures["projection_equals_log"] = equal
    if not equal:
        problems.append(
            "the projection (execution_events) differs from the execution-events log: "
            f"{len(on_log - in_db)} events only on the log ({_sample(sorted(on_log - in_db), 3)}), "
            f"{len(in_db - on_log)} only in PostgreSQL ({_sample(sorted(in_db - on_log), 3)})")
    return result


def recovery(url: str, job_ids: list[str], fault_end: datetime) -> dict[str, float | None]:
    """Seconds from `fault_end`:
    - `first`: to the first completion of a fire scheduled after it (the issue's figure);
    - `all_jobs_moving`: until every job had an execution start after it — a fault that
      stalls some partitions shows there, not in `first`;
    - `all_jobs_started`: until every job had a fire scheduled after it running. Reported,
      not held to the target: with FIRE_ALL it waits for the backlog the outage left in
      front of that fire (a 15 s broker outage plus the broker's own restart leaves ~25 s
      of the pool's sleep jobs, which 32 slots take ~12 s to run), so it measures
      catch-up capacity rather than recovery."""
    rows = sql(url, q("first_completion_per_job"), job_ids, fault_end)
    completed = [(r["first_completed"] - fault_end).total_seconds() for r in rows]
    started = [(r["first_started"] - fault_end).total_seconds() for r in rows]
    moving = [(r["first_started"] - fault_end).total_seconds()
              for r in sql(url, q("first_start_per_job"), job_ids, fault_end)]
    return {
        "first": round(min(completed), 3) if completed else None,
        "all_jobs_moving": round(max(moving), 3) if len(moving) == len(job_ids) else None,
        "all_jobs_started": round(max(started), 3) if len(rows) == len(job_ids) else None,
    }


def requeue_after_death(url: str, job_ids: list[str], worker_id: str,
                        died_at: datetime) -> tuple[int, int, float | None]:
    """What `worker_id` was running when it died, how much of it was re-queued, and the
    seconds until the last of it was: (running, requeued, seconds)."""
    running = [r["execution_id"] for r in sql(url, q("running_on_worker_at"), job_ids, worker_id,
                                              died_at)]
    requeued = sql(url, q("first_requeue_after"), running, died_at) if running else []
    seconds = max(((r["requeued_at"] - died_at).total_seconds() for r in requeued), default=None)
    return len(running), len(requeued), None if seconds is None else round(seconds, 3)


def kept_lines_problems(url: str, job_ids: list[str], worker_id: str, died_at: datetime,
                        frozen_at: datetime, shape: LoadShape) -> tuple[int, list[str]]:
    """The lines a killed worker's `print` executions had printed, as kept (issue 46): each
    delivery's lines are `line 0`, `line 1`, ... with none missing in between, and every
    line printed a second before the worker was frozen (the stop that precedes the kill;
    lines ship every 200 ms) is there. Returns (lines kept, problems)."""
    printers = [job for job in job_ids if job.startswith("print-")]
    running = sql(url, q("running_on_worker_at"), printers, worker_id, died_at)
    rows = sql(url, q("kept_log_lines"), [r["execution_id"] for r in running], worker_id) if running else []
    kept: defaultdict[tuple[UUID, int], list[Any]] = defaultdict(list)
    for row in rows:
        kept[row["execution_id"], row["delivery"]].append(row)
    problems = []
    for run in running:
        lines = kept.get((run["execution_id"], run["delivery"]), [])
        numbers = [int(line["line"].split()[1]) for line in lines]
        name = f"{worker_id}'s delivery {run['delivery']} of {run['execution_id']}"
        if numbers != list(range(len(numbers))):
            problems.append(f"{name} kept lines {numbers}, not line 0, 1, ... in order")
        elif lines and len(lines) < shape.print_lines:
            next_at = lines[-1]["at"] + timedelta(seconds=shape.print_every)
            if next_at < frozen_at - timedelta(seconds=1):
                problems.append(f"{name} kept {len(lines)} lines: line {len(lines)}, printed about "
                                f"{next_at:%H:%M:%S.%f}, more than a second before the worker was "
                                f"frozen ({frozen_at:%H:%M:%S.%f}), is lost")
    return len(rows), problems


def flow_limits(url: str, shape: LoadShape) -> tuple[list[str], dict[str, Any]]:
    """Issue 57's limits under the fault: the pooled jobs together never ran more than the
    pool's slots at once, each keyed job never more than one per key (its one key), and how
    many executions the limits held back (WAITING) — a fault that held none tested little."""
    problems: list[str] = []
    figures: dict[str, Any] = {}
    if shape.pooled:
        rows = sql(url, q("run_spans"), shape.pooled)
        most = most_at_once([(r["started_at"], r["completed_at"]) for r in rows])
        figures["pool_most_at_once"] = most
        figures["pool_waited"] = int(sql(url, q("executions_that_waited"), shape.pooled)[0][0])
        if most > shape.pool_slots:
            problems.append(f"the pooled jobs ran {most} at once, the pool has {shape.pool_slots} slots")
    for job_id in shape.keyed:
        rows = sql(url, q("run_spans"), [job_id])
        most = most_at_once([(r["started_at"], r["completed_at"]) for r in rows])
        figures.setdefault("key_most_at_once", {})[job_id] = most
        if most > 1:
            problems.append(f"{job_id} ran {most} at once under its key's max_running 1")
    if shape.keyed:
        figures["key_waited"] = int(sql(url, q("executions_that_waited"), shape.keyed)[0][0])
    return problems, figures


def event_runs(settings: Settings, job_id: str) -> list[dict[str, Any]]:
    """The first attempts of `job_id`'s event runs on `job-due`, as committed (a run
    committed twice is there twice): {execution_id, positions: [(partition, offset)]}."""
    return [{"execution_id": str(due["execution_id"]),
             "positions": [(e["partition"], e["offset"]) for e in (due.get("job") or {}).get("events") or []]}
            for due in _first_attempts(settings, "EVENT") if due.get("job_id") == job_id]


def event_ledger(settings: Settings, job_id: str, matching: set[tuple[int, int]],
                 max_events: int) -> tuple[list[str], dict[str, Any]]:
    """Issue 56 under the fault: every matching record the source acknowledged is in
    exactly one run, no other record is in any, no run was committed twice or holds more
    than `max_events`, and every run COMPLETED."""
    problems: list[str] = []
    runs = event_runs(settings, job_id)
    ids = Counter(r["execution_id"] for r in runs)
    doubled_runs = [e for e, n in ids.items() if n > 1]
    seen = Counter(p for r in runs for p in r["positions"])
    in_two = sorted(p for p, n in seen.items() if n > 1)
    missing = sorted(matching - set(seen))
    unexpected = sorted(set(seen) - matching)
    oversize = [r["execution_id"] for r in runs if len(r["positions"]) > max_events]
    statuses = Counter(r["status"] for r in sql(settings.database_url, q("statuses_of"),
                                                 [UUID(e) for e in ids]))
    figures = {"event_records": len(matching), "event_runs": len(ids),
               "event_run_statuses": dict(statuses)}
    if doubled_runs:
        problems.append(f"{len(doubled_runs)} event runs committed twice: {_sample(doubled_runs)}")
    if in_two:
        problems.append(f"{len(in_two)} source records in two runs: {_sample(in_two)}")
    if missing:
        problems.append(f"{len(missing)} of {len(matching)} matching source records in no run: "
                        f"{_sample(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} records in runs that the filter does not pass or "
                        f"the source never acknowledged: {_sample(unexpected)}")
    if oversize:
        problems.append(f"{len(oversize)} event runs with more than {max_events} records")
    if statuses.get("COMPLETED", 0) != len(ids):
        problems.append(f"event runs not all COMPLETED: {dict(statuses)} of {len(ids)}")
    return problems, figures
