"""What each page shows: reads through `Store` (the Schedulers page: `SchedulerRoles`, on
Kafka), shaped for the templates.

Every read is bounded (a page size, a LIMIT in SQL) and index-backed; parameters are
validated here and a bad one raises ValueError naming it (a 400 for the user).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from pydantic import ValidationError

from cronstream.shared.calendars import ResolvedCalendar, resolve
from cronstream.shared.condition import ConditionError, parse_condition
from cronstream.shared.records import Calendar, ExecutionStatus, JobDefinition, Pool
from cronstream.shared.schedule import upcoming
from cronstream.shared.statuses import FINAL, TERMINAL, Status
from cronstream.ui import graph
from cronstream.ui.schedulers import SchedulerRoles, shard_table
from cronstream.ui.store import Store
from cronstream.ui.timeline import Mark, MarkKind, Row, Window, load, project_row
from cronstream.versions import DefinitionVersion, changed_fields, to_yaml, with_changes, yaml_diff

PAGE_SIZE = 50
STATUS_SCAN = 2000      # jobs probed per page when filtering by last status
LIVE_ROWS = 100
# Executions the Pools page lists (holders and waiters of every pool together).
POOL_ROWS = 500
RESULT_CHARS = 16 * 1024
TIMELINE_JOBS = 25
TIMELINE_BUCKETS = 240
TIMELINE_HOURS = (6, 24, 72, 168)
LOG_LINES_SHOWN = 1000  # the execution page's log: its last lines
TRIGGER_RECORDS_SHOWN = 200  # an event trigger's run: its first records' positions
VERSIONS_SHOWN = 20  # the job page's latest versions
STATUSES: tuple[str, ...] = ExecutionStatus.__args__  # type: ignore[attr-defined]
_FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)


class NotFound(LookupError):
    """The job, execution or run does not exist (in the projection)."""


class Conflict(RuntimeError):
    """The action does not apply to the current state."""


def _text(params: Mapping[str, str], name: str, limit: int = 128) -> str | None:
    value = params.get(name, "").strip()
    if len(value) > limit:
        raise ValueError(f"{name}: at most {limit} characters")
    return value or None


def _choice(params: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str | None:
    value = _text(params, name)
    if value is not None and value not in allowed:
        raise ValueError(f"{name}: must be one of {', '.join(allowed)} (got {value[:40]!r})")
    return value


def _time(params: Mapping[str, str], name: str) -> datetime | None:
    value = _text(params, name, 64)
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{name}: not an ISO 8601 time: {value!r}") from None
    if parsed.tzinfo is None:
        raise ValueError(f"{name}: needs a timezone (Z or +HH:MM)")
    return parsed


def _like(search: str | None) -> str | None:
    if search is None:
        return None
    escaped = search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _definition(raw: str | None) -> JobDefinition | None:
    if raw is None:
        return None
    try:
        return JobDefinition.model_validate_json(raw)
    except ValidationError:
        return None


# -- Jobs -------------------------------------------------------------------------------

async def jobs(store: Store, params: Mapping[str, str]) -> dict[str, Any]:
    search = _text(params, "q", 100)
    status = _choice(params, "status", STATUSES)
    queue = _text(params, "queue", 64)
    paused_text = _choice(params, "paused", ("yes", "no"))
    paused = None if paused_text is None else paused_text == "yes"
    after = _text(params, "after") or ""
    scan = STATUS_SCAN if status else PAGE_SIZE + 1
    found = await store.fetchrow("jobs_scan", after, _like(search), queue, paused, status, scan,
                                 PAGE_SIZE + 1)
    assert found is not None
    ids: list[str] = list(found["job_ids"])
    more = len(ids) > PAGE_SIZE
    ids = ids[:PAGE_SIZE]
    next_after: str | None = None
    scan_stopped = False
    if more:
        next_after = ids[-1]
    elif found["scanned"] >= scan and status:
        next_after, scan_stopped = found["scanned_to"], True  # not every job was looked at
    rows = await store.fetch("jobs_rows", ids) if ids else []
    total = await store.fetchrow("jobs_count")
    filters = {k: v for k, v in (("q", search), ("status", status), ("queue", queue),
                                 ("paused", paused_text)) if v}
    return {
        "rows": rows, "next_after": next_after, "scan_stopped": scan_stopped,
        "scan_limit": STATUS_SCAN, "filters": filters, "first_page": not after,
        "total": total["n"] if total else 0, "queues": [r["queue"] for r in await store.fetch("queues")],
        "statuses": STATUSES, "now": datetime.now(UTC),
    }


# -- Job --------------------------------------------------------------------------------

async def job(store: Store, job_id: str, params: Mapping[str, str]) -> dict[str, Any]:
    row = await store.fetchrow("job", job_id)
    if row is None:
        raise NotFound(f"no job {job_id!r}")
    before = _time(params, "before") or _FAR_FUTURE
    now = datetime.now(UTC)
    definition = _definition(row["definition"])
    fires: list[datetime] = []
    if definition is not None and definition.type != "DEPENDENT" and row["deleted_at"] is None:
        calendar = (await _calendars(store, [definition])).get(definition.calendar or "")
        if definition.calendar is None or calendar is not None:
            fires = upcoming(definition, now, 10, calendar=calendar)
    runs = await store.fetch("job_runs", job_id, before, PAGE_SIZE + 1)
    durations = await store.fetchrow("job_durations", job_id)
    # One more than shown: the oldest shown says what it changed too.
    kept = [DefinitionVersion.from_row(r) for r in
            reversed(await store.fetch("job_versions", job_id, VERSIONS_SHOWN + 1))]
    versions = with_changes(kept)[-VERSIONS_SHOWN:][::-1]
    return {
        "job": row, "definition": definition, "fires": fires, "runs": runs[:PAGE_SIZE],
        "next_before": runs[PAGE_SIZE - 1]["scheduled_at"].isoformat() if len(runs) > PAGE_SIZE else None,
        "first_page": before == _FAR_FUTURE, "durations": durations,
        "alerts": await store.fetch("job_alerts", job_id, 20),
        "upstreams": [r["upstream_job_id"] for r in await store.fetch("job_upstreams", job_id)],
        "downstreams": [r["downstream_job_id"] for r in await store.fetch("job_downstreams", job_id)],
        "versions": versions, "more_versions": len(kept) > VERSIONS_SHOWN,
        "params_json": json.dumps(json.loads(row["params"] or "{}"), indent=2, ensure_ascii=False),
        "now": now,
    }


async def version(store: Store, job_id: str, number: str, params: Mapping[str, str]) -> dict[str, Any]:
    """Version `number` of a job's definition, and its diff from version `against` (by
    default the one before it)."""
    wanted = _version_number(number, "version")
    against = _version_number(params["against"], "against") if params.get("against") else wanted - 1
    found = {v.version: v for v in map(DefinitionVersion.from_row, await store.fetch(
        "job_versions_among", job_id, [wanted, against]))}
    if wanted not in found:
        raise NotFound(f"no version {wanted} of job {job_id!r} (it may be past retention)")
    after, before = found[wanted], found.get(against)
    if before is None and params.get("against"):
        raise NotFound(f"no version {against} of job {job_id!r} (it may be past retention)")
    lost = before is None and after.version > 1  # the one before it is past retention
    return {"job_id": job_id, "version": after, "against": before,
            "diff": [] if lost else yaml_diff(before, after),
            "change": "(the version before it is past retention)" if lost
            else changed_fields(before, after),
            "document": None if after.document is None else to_yaml(after.document)}


def _version_number(value: str, name: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 2**31 - 1:
        raise ValueError(f"{name}: not a version number: {value[:20]!r}")
    return int(value)


# -- Runs (live) ------------------------------------------------------------------------

async def runs(store: Store) -> dict[str, Any]:
    counts = {r["status"]: r["n"] for r in await store.fetch("active_counts")}
    return {
        "counts": {s: counts.get(s, 0) for s in (Status.RUNNING, Status.QUEUED, Status.AWAITING_APPROVAL,
                                                 Status.WAITING)},
        "running": await store.fetch("active", "RUNNING", LIVE_ROWS),
        "waiting": await store.fetch("active", "WAITING", LIVE_ROWS),
        "queued": await store.fetch("active", "QUEUED", LIVE_ROWS),
        "awaiting": await store.fetch("active", "AWAITING_APPROVAL", LIVE_ROWS),
        "recent": await store.fetch("recent_terminal", LIVE_ROWS),
        "limit": LIVE_ROWS,
    }


# -- Execution --------------------------------------------------------------------------

async def execution(store: Store, execution_id: UUID) -> dict[str, Any]:
    row = await store.fetchrow("execution", execution_id, RESULT_CHARS)
    if row is None:
        raise NotFound(f"no execution {execution_id} (it may not be projected yet)")
    return {
        "execution": row,
        "events": await store.fetch("execution_events", execution_id, 500),
        "trigger_records": (
            await store.fetch("execution_trigger_records", execution_id, TRIGGER_RECORDS_SHOWN)
            if row["reason"] == "EVENT" else []),
        "attempts": await store.fetch("run_attempts", row["run_id"], row["job_id"]),
        "trigger_records_shown": TRIGGER_RECORDS_SHOWN,
        "result_truncated": (row["result_chars"] or 0) > RESULT_CHARS,
        "now": datetime.now(UTC),
        **await execution_log(store, execution_id),
    }


async def execution_log(store: Store, execution_id: UUID) -> dict[str, Any]:
    """The tail of an execution's log, where it stands and its traceback (the execution
    page and its live log)."""
    state = await store.fetchrow("execution_log_state", execution_id)
    lines = await store.fetch("execution_log_tail", execution_id, LOG_LINES_SHOWN)
    if state is None:
        return {"log": lines, "log_count": 0, "log_cut": False, "log_ended": False,
                "log_live": False, "traceback": None, "status": None}
    total = state["lines"]
    return {
        "status": state["status"],
        "log": lines, "log_count": total, "log_cut": total > len(lines),
        "log_ended": state["ended"],
        # Live until the execution is final and its log whole (or it wrote nothing).
        "log_live": state["status"] not in TERMINAL or bool(total and not state["ended"]),
        "traceback": state["traceback"],
    }


# -- DAG run ----------------------------------------------------------------------------

def _result(raw: str | None) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None  # truncated: too large to evaluate here


def _condition_view(job: Any, steps: dict[str, Any]) -> dict[str, Any] | None:
    """The condition of a step, evaluated on its upstreams' outcomes in this run."""
    if not job["condition"]:
        return None
    view: dict[str, Any] = {"source": job["condition"], "value": None, "operands": []}
    ups = list(job["depends_on"])
    if not all(u in steps and steps[u]["status"] in FINAL for u in ups):
        view["pending"] = True
        return view
    upstream = {u: {"status": steps[u]["status"], "result": _result(steps[u]["result"])} for u in ups}
    try:
        condition = parse_condition(job["condition"], ups)
    except ConditionError as exc:
        view["error"] = str(exc)
        return view
    view["value"] = condition.evaluate(upstream)
    view["operands"] = [(path, json.dumps(value)[:200]) for path, value in condition.operands(upstream)]
    return view


async def dag_run(store: Store, run_id: UUID) -> dict[str, Any]:
    executions = await store.fetch("run_executions", run_id)
    if not executions:
        raise NotFound(f"no run {run_id} (it may not be projected yet)")
    steps = {r["job_id"]: r for r in executions}
    types = {r["job_id"]: r["type"] for r in await store.fetch("job_types", list(steps))}
    roots = sorted(j for j in steps if types.get(j) not in (None, "DEPENDENT"))
    root = roots[0] if roots else min(steps, key=lambda j: steps[j]["scheduled_at"])
    jobs = {r["job_id"]: r for r in await store.fetch("dag_of", root)}
    names = sorted(set(jobs) | set(steps))
    edges = [(up, j) for j, r in jobs.items() for up in r["depends_on"] if up in jobs or up in steps]
    picture = graph.layout(names, edges)
    evaluations = {r["job_id"]: r for r in await store.fetch("run_evaluations", run_id)}
    table = []
    for name in sorted(names, key=lambda n: (picture.nodes[n].column, picture.nodes[n].row)):
        job_row = jobs.get(name)
        step = steps.get(name)
        table.append({
            "job_id": name, "step": step, "status": step["status"] if step else "PENDING",
            "definition": job_row, "evaluation": evaluations.get(name),
            "condition": _condition_view(job_row, steps) if job_row else None,
        })
    return {"run_id": run_id, "root": root, "picture": picture, "steps": table,
            "by_job": {t["job_id"]: t for t in table}, "now": datetime.now(UTC)}


# -- Workers, Alerts --------------------------------------------------------------------

async def workers(store: Store) -> dict[str, Any]:
    return {"workers": await store.fetch("workers", 500),
            "queues": await store.fetch("queue_depth"), "now": datetime.now(UTC)}


async def pools(store: Store, known: dict[str, Pool] | None) -> dict[str, Any]:
    """Per pool: its slots (None: unknown) and description, the slots held and by whom, and
    what waits and why (decision 0056). A pool that nothing uses is listed with its size
    alone; one that executions name but Kafka does not know, with an unknown size."""
    rows = await store.fetch("pool_executions", POOL_ROWS)
    found: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        pool = (known or {}).get(name)
        return found.setdefault(name, {
            "pool": name, "slots": None if pool is None else pool.slots,
            "description": None if pool is None else pool.description,
            "in_use": 0, "holders": [], "waiters": []})

    for name in sorted(known or {}):
        entry(name)
    for r in rows:
        pool = entry(r["pool"])
        if r["status"] == Status.WAITING:
            pool["waiters"].append(r)
        else:
            pool["holders"].append(r)
            pool["in_use"] += r["slots"]
    return {"pools": sorted(found.values(), key=lambda p: p["pool"]), "sizes_known": known is not None,
            "limit": POOL_ROWS, "now": datetime.now(UTC)}


async def schedulers(roles: SchedulerRoles, standbys: int) -> dict[str, Any]:
    """The live scheduler processes with the shards each leads and keeps warm, and each
    shard with its leader and standbys (SchedulersUnavailable when Kafka does not say)."""
    found = await roles.get()
    shards = shard_table(found)
    return {"schedulers": sorted(found.schedulers, key=lambda r: r["scheduler_id"]),
            "shards": shards, "shard_count": found.shards, "standbys": standbys,
            "unled": [s["shard"] for s in shards if s["leader"] is None],
            "without_standby": [s["shard"] for s in shards if s["leader"] is not None and not s["standby"]],
            "read_at": found.read_at}


async def alerts(store: Store, params: Mapping[str, str]) -> dict[str, Any]:
    state = _choice(params, "state", ("FIRING", "RESOLVED"))
    before = _time(params, "before") or _FAR_FUTURE
    rows = await store.fetch("alerts", state, before, PAGE_SIZE + 1)
    return {"alerts": rows[:PAGE_SIZE], "state": state, "first_page": before == _FAR_FUTURE,
            "next_before": rows[PAGE_SIZE - 1]["fired_at"].isoformat() if len(rows) > PAGE_SIZE else None,
            "firing": (await store.fetchrow("firing_count") or {"n": 0})["n"]}


# -- Timeline ---------------------------------------------------------------------------


async def _calendars(store: Store, definitions: list[JobDefinition]) -> dict[str, ResolvedCalendar]:
    """The projected calendars the definitions name, resolved (once per version)."""
    named = sorted({d.calendar for d in definitions if d.calendar is not None})
    if not named:
        return {}
    found = {}
    for r in await store.fetch("calendar_documents", named):
        with contextlib.suppress(ValueError):
            found[r["calendar_id"]] = resolve(Calendar.model_validate_json(r["definition"]))
    return found

PLOT_X, PLOT_W, ROW_H, AXIS_H, LOAD_H = 210, 960, 22, 26, 44


def _ticks(window: Window, hours: int) -> list[tuple[float, str]]:
    """Gridlines on whole hours (every 1, 2, 6 or 24 h), labelled in UTC."""
    step = {6: 1, 24: 2, 72: 6, 168: 24}[hours]
    t = window.start.replace(minute=0, second=0, microsecond=0)
    while t < window.start or t.hour % step:
        t += timedelta(hours=1)
    ticks = []
    while t < window.end:
        x = PLOT_X + (t - window.start) / (window.end - window.start) * PLOT_W
        ticks.append((round(x, 1), t.strftime("%H:%M") if step < 24 else t.strftime("%a %d")))
        t += timedelta(hours=step)
    return ticks


def _past_marks(rows: list[Any], window: Window) -> dict[str, list[Mark]]:
    marks: dict[str, list[Mark]] = {}
    for r in rows:
        bucket = r["bucket"] - 1  # width_bucket counts from 1
        if not 0 <= bucket < window.buckets:
            continue
        kind: MarkKind = "active" if r["active"] else "failed" if r["failed"] else "ok"
        first = min(bucket, window.bucket(r["first_start"]))
        last = max(bucket, window.bucket(r["last_end"]))
        marks.setdefault(r["job_id"], []).append(Mark(first, last, kind, r["first_start"], r["n"]))
    return marks


async def timeline(store: Store, params: Mapping[str, str]) -> dict[str, Any]:
    hours_text = _choice(params, "hours", tuple(str(h) for h in TIMELINE_HOURS)) or "24"
    hours = int(hours_text)
    search, queue = _text(params, "q", 100), _text(params, "queue", 64)
    after = _text(params, "after") or ""
    now = datetime.now(UTC)
    window = Window(now - timedelta(hours=hours / 4), now + timedelta(hours=hours * 3 / 4),
                    TIMELINE_BUCKETS)
    found = await store.fetch("timeline_jobs", after, _like(search), queue, TIMELINE_JOBS + 1)
    page_rows = found[:TIMELINE_JOBS]
    ids = [r["job_id"] for r in page_rows]
    past = _past_marks(await store.fetch("timeline_past", ids, window.start, window.end,
                                         window.buckets), window) if ids else {}
    rows: list[Row] = []
    definitions = {r["job_id"]: _definition(r["definition"]) for r in page_rows}
    calendars = await _calendars(store, [d for d in definitions.values() if d is not None])
    for r in page_rows:
        definition = definitions[r["job_id"]]
        if definition is None:
            row = Row(r["job_id"], note="definition cannot be read")
        else:
            row = project_row(definition, enabled=r["enabled"], last_fire=r["last_fire"],
                              typical_seconds=r["p50"], now=now, window=window,
                              calendar=calendars.get(definition.calendar or ""))
        row.marks = past.get(r["job_id"], []) + row.marks
        rows.append(row)
    bucket_w = PLOT_W / window.buckets
    counts = load(rows, window.buckets)
    peak = max(counts, default=0)
    return {
        "rows": rows, "window": window, "hours": hours, "hours_options": TIMELINE_HOURS,
        "filters": {k: v for k, v in (("q", search), ("queue", queue), ("hours", hours_text)) if v},
        "next_after": ids[-1] if len(found) > TIMELINE_JOBS else None, "first_page": not after,
        "ticks": _ticks(window, hours), "bucket_w": bucket_w, "load": counts, "peak": peak,
        "now_x": PLOT_X + (now - window.start) / (window.end - window.start) * PLOT_W,
        "plot_x": PLOT_X, "plot_w": PLOT_W, "row_h": ROW_H, "axis_h": AXIS_H, "load_h": LOAD_H,
        "height": AXIS_H + LOAD_H + ROW_H * max(1, len(rows)) + 8,
        "quiet": sum(1 for c in counts if c == 0) * (window.end - window.start) / window.buckets,
        "queues": [q["queue"] for q in await store.fetch("queues")], "now": now,
        "terminal": TERMINAL,
    }
