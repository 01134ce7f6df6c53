"""The Grafana dashboards as code: `python deploy/grafana/generate.py` (or `make dashboards`)
writes deploy/grafana/dashboards/*.json from the definitions below and the SQL blocks of
panels.sql.

Plain JSON, no library: grafanalib's last release is from January 2024 and the
grafana-foundation-sdk would add a dependency for four dashboards; the JSON model is
stable, and tests check what matters (tests/unit/test_dashboards.py: the files are what
this module generates, every query names a provisioned datasource and defined variables;
tests/integration/test_dashboards.py: every SQL panel on 1,000,000 executions returns its
columns through an index; tests/e2e/test_promql.py: every PromQL expression parses with
promtool and names only metrics the services export).

Datasources are referred to by the uids the provisioning file gives them
(provisioning/datasources/cronstream.yaml), so the dashboards work as provisioned.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "dashboards"
PROMETHEUS = {"type": "prometheus", "uid": "cronstream-prometheus"}
POSTGRES = {"type": "grafana-postgresql-datasource", "uid": "cronstream-postgres"}
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def sql_blocks() -> dict[str, str]:
    parts = _NAME.split((HERE / "panels.sql").read_text())
    blocks = {}
    for i in range(1, len(parts), 2):
        lines = [ln for ln in parts[i + 1].strip().splitlines() if not ln.startswith("--")]
        blocks[parts[i]] = "\n".join(lines).strip().rstrip(";")
    return blocks


@dataclass(frozen=True)
class Prom:
    """A PromQL panel: one expression per (legend, expr)."""

    title: str
    exprs: tuple[tuple[str, str], ...]
    unit: str = "short"
    kind: str = "timeseries"
    w: int = 12
    h: int = 8
    description: str = ""


@dataclass(frozen=True)
class Sql:
    """A PostgreSQL panel: `query` names a block of panels.sql; `columns` are what the panel
    reads (checked against the query's result on a seeded database)."""

    title: str
    query: str
    columns: tuple[str, ...]
    kind: str = "table"
    fmt: str = "table"
    unit: str = "short"
    w: int = 12
    h: int = 8
    description: str = ""


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    panels: tuple[Prom | Sql, ...]
    variables: tuple[dict[str, Any], ...] = ()
    time_from: str = "now-6h"
    description: str = ""
    links: tuple[str, ...] = field(default=())


def _rate(expr: str) -> str:
    return f"rate({expr}[$__rate_interval])"


def _quantile(q: float, histogram: str, by: str = "") -> str:
    group = f"le{', ' + by if by else ''}"
    return f"histogram_quantile({q}, sum by ({group}) ({_rate(histogram + '_bucket')}))"


COMPLETED = 'cronstream_executions_total{status="COMPLETED"}'
# Per run (docs/decisions/0053): a run ends COMPLETED or PERMANENTLY_FAILED; a FAILED or
# TIMED_OUT attempt has a retry to come.
ENDED = 'cronstream_executions_total{status=~"COMPLETED|PERMANENTLY_FAILED"}'
SUCCESS_RATE = f"sum({_rate(COMPLETED)}) / sum({_rate(ENDED)})"

OVERVIEW = Dashboard(
    uid="cronstream-overview",
    title="cronstream / Overview",
    description="Fires, executions, success rate, durations, lags, queues, workers, dead letters, alerts.",
    panels=(
        Prom("Fires per second, by reason",
             (("{{reason}}", f"sum by (reason) ({_rate('cronstream_scheduler_fires_total')})"),),
             unit="ops"),
        Prom("Executions per second, by final status",
             (("{{status}}", f"sum by (status) ({_rate('cronstream_executions_total')})"),), unit="ops"),
        Prom("Success rate per run (all jobs)",
             (("success rate", SUCCESS_RATE),),
             unit="percentunit"),
        Prom("Execution duration p50 / p95 / p99",
             tuple((f"p{round(q * 100)}", _quantile(q, "cronstream_execution_duration_seconds"))
                   for q in (0.5, 0.95, 0.99)), unit="s"),
        Prom("Start lag (scheduled → running) p50 / p99",
             tuple((f"p{round(q * 100)}", _quantile(q, "cronstream_execution_start_lag_seconds"))
                   for q in (0.5, 0.99)), unit="s"),
        Prom("Fire lag (scheduled → JobDue committed) p99",
             (("p99", _quantile(0.99, "cronstream_scheduler_fire_lag_seconds")),), unit="s"),
        Prom("Queue depth, by queue and priority",
             (("{{queue}} {{priority}}", "sum by (queue, priority) (cronstream_queue_depth)"),)),
        Prom("Consumer lag, by service and topic",
             (("{{service}} {{topic}}", "sum by (service, topic) (cronstream_consumer_lag)"),)),
        Prom("Workers, by status",
             (("{{status}}", "sum by (status) (cronstream_workers)"),), w=8),
        Prom("Worker utilisation",
             (("busy slots / slots", "sum(cronstream_worker_slots_busy) / sum(cronstream_worker_slots)"),),
             unit="percentunit", w=8),
        Prom("Dead letters, by service and topic",
             (("{{service}} {{topic}}",
               "sum by (service, topic) (increase(cronstream_dead_letters_total[$__rate_interval]))"),),
             w=8),
        Sql("Alerts firing", "overview_alerts_firing",
            ("time", "kind", "severity", "subject", "summary"), w=24),
        Sql("Jobs: last status, next run, 24 h success rate per run", "overview_jobs",
            ("job_id", "type", "schedule", "enabled", "last_status", "last_run", "next_run",
             "success_rate_24h"), w=24, h=10),
        Sql("Executions by status (projection)", "overview_executions_by_status",
            ("time", "metric", "value"), kind="timeseries", fmt="time_series"),
        Sql("Success rate (projection)", "overview_success_rate", ("time", "success_rate"),
            kind="timeseries", fmt="time_series", unit="percent"),
        Sql("Duration p50 / p95 / p99 (projection)", "overview_duration_percentiles",
            ("time", "p50", "p95", "p99"), kind="timeseries", fmt="time_series", unit="s", w=24),
    ),
)

JOB_VAR = {"name": "job", "label": "job", "query": "var_jobs"}
JOB = Dashboard(
    uid="cronstream-job",
    title="cronstream / Job",
    description="One job: its runs with status, duration, attempts and progress; success rate "
                "and duration over time; next fire; alerts.",
    time_from="now-24h",
    variables=(JOB_VAR,),
    panels=(
        Sql("Last 24 h", "job_stats",
            ("finished", "success_rate_percent", "duration_p50_seconds", "duration_p95_seconds",
             "duration_p99_seconds"), kind="stat", w=16, h=5),
        Sql("Next fire", "job_next_fire",
            ("next_run", "type", "schedule", "timezone", "enabled", "misfire_policy",
             "concurrency_policy"), w=8, h=5),
        Sql("Success rate", "job_success_rate", ("time", "success_rate"), kind="timeseries",
            fmt="time_series", unit="percent"),
        Sql("Duration p50 / p95 and attempts", "job_durations", ("time", "p50", "p95", "max_attempt"),
            kind="timeseries", fmt="time_series", unit="s"),
        Sql("Runs", "job_runs",
            ("time", "execution_id", "status", "attempt", "duration_seconds", "start_lag_seconds",
             "progress", "progress_message", "worker_id", "error_message"), w=24, h=12),
        Sql("Log of the last failure", "job_last_failure_log",
            ("time", "execution_id", "attempt", "stream", "level", "line"), w=24, h=12,
            description="What the latest failed attempt wrote, its traceback last "
                        "(all of it: `cronstream logs EXECUTION_ID`, or the dashboard's "
                        "execution page)."),
        Sql("Alerts", "job_alerts", ("time", "kind", "state", "severity", "summary", "resolved_at"),
            w=24),
    ),
)

DAG = Dashboard(
    uid="cronstream-dag-runs",
    title="cronstream / DAG runs",
    description="Runs of a root job with each step's status and DAG decision; approvals waiting.",
    time_from="now-7d",
    variables=({"name": "root", "label": "root job", "query": "var_roots"},
               {"name": "run", "label": "run", "query": "var_runs"}),
    panels=(
        Sql("Runs of $root", "dag_runs",
            ("time", "run_id", "root_status", "steps", "completed", "skipped", "failed",
             "awaiting_approval"), w=24, h=10),
        Sql("Steps of run $run", "dag_steps",
            ("step", "status", "attempt", "scheduled_at", "started_at", "completed_at", "decision",
             "detail", "approved_by", "rejected_by", "error_message"), w=24, h=10),
        Sql("Waiting for approval (all DAGs)", "dag_awaiting_approval",
            ("time", "job_id", "run_id", "execution_id", "waiting_seconds"), w=24),
    ),
)

PLATFORM = Dashboard(
    uid="cronstream-platform",
    title="cronstream / Platform",
    description="Per service: processes, the clock's shards (led, kept warm, standby lag), lags, "
                "projection, pool use, transaction aborts, restarts, analytics.",
    time_from="now-3h",
    panels=(
        Prom("Processes, by service", (("{{service}}", "count by (service) (cronstream_build_info)"),),
             w=8),
        Prom("Scheduler shards without a leader (must be 0)",
             (("without a leader", "max(cronstream_scheduler_shards) - (sum(cronstream_scheduler_shards_led) "
                                   "or vector(0))"),
              ("without a standby", "clamp_min(max(cronstream_scheduler_shards) - "
                                    "(sum(cronstream_scheduler_shards_standby) or vector(0)), 0)")), w=8,
             description="Shards nobody leads (their jobs do not fire) and shards nobody keeps warm, "
                         "from what every scheduler reports (one standby each: "
                         "CRONSTREAM_SCHEDULER_STANDBYS). `cronstream schedulers` names them."),
        Prom("Scrape targets up", (("{{job}} {{instance}}", 'up{job=~"cronstream.*"}'),), w=8),
        Prom("Consumer lag, by service and group",
             (("{{service}} {{group}}", "sum by (service, group) (cronstream_consumer_lag)"),)),
        Prom("Scheduler shards led and kept warm, per scheduler",
             (("leads {{instance}}", "sum by (instance) (cronstream_scheduler_shards_led)"),
              ("stands by {{instance}}", "sum by (instance) (cronstream_scheduler_shards_standby)"),
              ("shards", "max(cronstream_scheduler_shards)")),
             description="Which process leads how many shards of the clock, and how many it keeps warm "
                         "for a takeover; the leads add up to the shards. The Schedulers page of the "
                         "dashboard (and `cronstream schedulers`) says which."),
        Prom("Scheduler standby lag, per scheduler",
             (("{{instance}}", "sum by (instance) (cronstream_scheduler_standby_lag_records)"),),
             description="Records of its standby shards a scheduler has not applied yet: what a takeover "
                         "from it would first catch up on. Near 0 but while a process warms up."),
        Prom("Event trigger lag, per scheduler",
             (("{{instance}}", "sum by (instance) (cronstream_trigger_lag_records)"),),
             description="Records of the event triggers' topics, in the shards a scheduler leads, not yet "
                         "in a run (docs/decisions/0057). `cronstream describe job` shows each "
                         "trigger's own."),
        Prom("Projection lag (events not yet in PostgreSQL)",
             (("lag", "sum(cronstream_projection_lag_events)"),
              ("projected/s", f"sum({_rate('cronstream_projection_records_total')})"))),
        Prom("Projection and dispatch transaction p99",
             (("projection", _quantile(0.99, "cronstream_projection_batch_seconds")),
              ("dispatcher", _quantile(0.99, "cronstream_dispatcher_batch_seconds"))), unit="s"),
        Prom("Worker pool use",
             (("busy", "sum(cronstream_worker_slots_busy)"), ("slots", "sum(cronstream_worker_slots)"),
              ("buffered", "sum(cronstream_worker_buffered)"))),
        Prom("Flow control: pool slots in use, and executions waiting by reason",
             (("in use {{pool}}", "sum by (pool) (cronstream_pool_slots_in_use)"),
              ("waiting: {{reason}}", "sum by (reason) (cronstream_waiting_executions)")),
             description="Slots of each pool held by admitted executions (0 once all is done: a "
                         "slot that stays held is a leak), and what holds the waiting ones back: a "
                         "pool, a concurrency key, a rate limit, a pool that does not exist. "
                         "`cronstream pools` and `cronstream runs --status WAITING` say which "
                         "(decision 0056)."),
        Prom("Kafka transaction aborts and producer resets, by service",
             (("aborts {{service}}",
               "sum by (service) (increase(cronstream_kafka_transaction_aborts_total[$__rate_interval]))"),
              ("resets {{service}}",
               "sum by (service) (increase(cronstream_kafka_producer_resets_total[$__rate_interval]))"))),
        Prom("Background task restarts, by service and task",
             (("{{service}} {{task}}",
               "sum by (service, task) "
               "(increase(cronstream_background_task_restarts_total[$__rate_interval]))"),)),
        Prom("Resident memory, by service",
             (("{{service}} {{instance}}",
               "process_resident_memory_bytes * on (instance) group_left (service) cronstream_build_info"),),
             unit="bytes"),
        Prom("Analytics: open alert episodes, by kind",
             (("{{kind}}", "sum by (kind) (cronstream_analytics_open_alerts)"),), w=8),
        Prom("Analytics: late fires, by reason",
             (("{{reason}}", "sum by (reason) (cronstream_analytics_late_fires)"),), w=8),
        Prom("Analytics: expected fires, by outcome",
             (("{{outcome}}", f"sum by (outcome) ({_rate('cronstream_analytics_fires_total')})"),),
             unit="ops", w=8),
    ),
)

DASHBOARDS = (OVERVIEW, JOB, DAG, PLATFORM)


# -- what Grafana does to a panel's SQL (for the tests and the benchmark) ------------------

_TIME_FILTER = re.compile(r"\$__timeFilter\(([^)]+)\)")
_TIME_GROUP_ALIAS = re.compile(r"\$__timeGroupAlias\(([^,]+),\s*([^)]+)\)")
_SQLSTRING = re.compile(r"\$\{(\w+):sqlstring\}")


def expand(sql: str, start: datetime, end: datetime, interval_seconds: int,
           variables: dict[str, str]) -> str:
    """The SQL Grafana's PostgreSQL datasource sends for a panel: its macros
    (`$__timeFilter`, `$__timeGroupAlias`, `$__interval`) and `${var:sqlstring}` variables
    expanded as Grafana expands them."""
    def literal(t: datetime) -> str:
        return f"'{t.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}'"

    def quoted(m: re.Match[str]) -> str:
        return "'" + variables[m[1]].replace("'", "''") + "'"

    sql = sql.replace("$__interval", f"'{interval_seconds}s'")
    sql = _TIME_GROUP_ALIAS.sub(lambda m: f"floor(extract(epoch from {m[1].strip()})/{interval_seconds})"
                                          f"*{interval_seconds} AS \"time\"", sql)
    sql = _TIME_FILTER.sub(lambda m: f"{m[1].strip()} BETWEEN {literal(start)} AND {literal(end)}", sql)
    return _SQLSTRING.sub(quoted, sql)


def default_range(d: Dashboard, now: datetime) -> tuple[datetime, datetime]:
    """The dashboard's default time range (`now-6h` … `now`) at `now`."""
    match = re.fullmatch(r"now-(\d+)([hd])", d.time_from)
    assert match, d.time_from
    hours = int(match[1]) * (24 if match[2] == "d" else 1)
    return now - timedelta(hours=hours), now


def sql_panels() -> list[tuple[Dashboard, Sql]]:
    return [(d, p) for d in DASHBOARDS for p in d.panels if isinstance(p, Sql)]


def prom_exprs() -> list[tuple[str, str]]:
    """(where, expression) of every PromQL query of every dashboard."""
    return [(f"{d.uid}: {p.title}", expr) for d in DASHBOARDS for p in d.panels
            if isinstance(p, Prom) for _, expr in p.exprs]


# -- rendering ---------------------------------------------------------------------------


def _grid(panels: tuple[Prom | Sql, ...]) -> list[dict[str, int]]:
    """Left to right, top to bottom, on Grafana's 24-column grid."""
    out, x, y, row_h = [], 0, 0, 0
    for p in panels:
        if x + p.w > 24:
            x, y, row_h = 0, y + row_h, 0
        out.append({"h": p.h, "w": p.w, "x": x, "y": y})
        x, row_h = x + p.w, max(row_h, p.h)
    return out


def _panel(pid: int, p: Prom | Sql, grid: dict[str, int], blocks: dict[str, str]) -> dict[str, Any]:
    panel: dict[str, Any] = {"id": pid, "type": p.kind, "title": p.title, "gridPos": grid,
                             "description": p.description,
                             "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
                             "options": {}}
    if isinstance(p, Prom):
        panel["datasource"] = PROMETHEUS
        panel["targets"] = [{"refId": chr(ord("A") + i), "datasource": PROMETHEUS, "expr": expr,
                             "legendFormat": legend, "range": True}
                            for i, (legend, expr) in enumerate(p.exprs)]
    else:
        panel["datasource"] = POSTGRES
        panel["targets"] = [{"refId": "A", "datasource": POSTGRES, "editorMode": "code",
                             "format": p.fmt, "rawQuery": True, "rawSql": blocks[p.query]}]
    if p.kind == "timeseries":
        panel["options"] = {"legend": {"displayMode": "list", "placement": "bottom"},
                            "tooltip": {"mode": "multi"}}
    return panel


def _variable(v: dict[str, Any], blocks: dict[str, str]) -> dict[str, Any]:
    return {"name": v["name"], "label": v["label"], "type": "query", "datasource": POSTGRES,
            "query": blocks[v["query"]], "definition": blocks[v["query"]], "refresh": 2,
            "includeAll": False, "multi": False, "sort": 0, "current": {}}


def render(d: Dashboard) -> dict[str, Any]:
    blocks = sql_blocks()
    return {
        "uid": d.uid, "title": d.title, "description": d.description, "tags": ["cronstream"],
        "timezone": "utc", "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1,
        "refresh": "30s", "time": {"from": d.time_from, "to": "now"},
        "annotations": {"list": []},
        "links": [{"title": "cronstream", "type": "dashboards", "tags": ["cronstream"],
                   "asDropdown": True}],
        "templating": {"list": [_variable(v, blocks) for v in d.variables]},
        "panels": [_panel(i + 1, p, g, blocks) for i, (p, g) in enumerate(zip(d.panels, _grid(d.panels),
                                                                              strict=True))],
    }


def files() -> dict[Path, str]:
    return {OUT / f"{d.uid.removeprefix('cronstream-')}.json": json.dumps(render(d), indent=2) + "\n"
            for d in DASHBOARDS}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for path, text in files().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(HERE.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
