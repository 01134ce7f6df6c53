"""Every PromQL expression of the dashboards and alerting rules names only metrics the
services really export: checked against a live scrape of each service's /metrics."""

from __future__ import annotations

import re

from cronstream.shared.settings import Settings
from tests import promql
from tests.conftest import Processes

SUFFIXES = ("", "_total", "_bucket", "_sum", "_count", "_created")
# Exported by Prometheus itself for every target, not by a service.
SCRAPE_SERIES = {"up"}


def families(exposition: str) -> set[str]:
    """Metric families announced by `# TYPE` lines (labelled metrics are announced before
    their first sample, so a metric nothing has moved yet still counts)."""
    return set(re.findall(r"^# TYPE (\S+) \S+$", exposition, re.MULTILINE))


def exported(names: set[str]) -> set[str]:
    return {name + suffix for name in names for suffix in SUFFIXES}


def test_every_promql_expression_names_only_exported_metrics(processes: Processes, topics: Settings) -> None:
    services = processes.system()
    services["analytics"] = processes.start("analytics")
    services["analytics"].wait_for_log("action=analytics_caught_up")
    scraped: dict[str, set[str]] = {}
    for name, proc in services.items():
        status, body = proc.get("/metrics")
        assert status == 200, name
        scraped[name] = families(body)
    everything = exported(set().union(*scraped.values())) | SCRAPE_SERIES

    # Each service exports its own metrics (the live scrape is not vacuous).
    assert "cronstream_scheduler_leader" in scraped["scheduler"]
    assert "cronstream_queue_depth" in scraped["monitor"]
    assert "cronstream_worker_slots" in scraped["worker-1"]
    assert {"cronstream_analytics_open_alerts", "cronstream_analytics_late_fires"} <= scraped["analytics"]
    assert "process_resident_memory_bytes" in scraped["dispatcher"]

    unknown = {}
    for where, expr in promql.all_exprs():
        missing = promql.metric_names(expr) - everything
        if missing:
            unknown[where] = sorted(missing)
    assert not unknown, f"expressions name metrics no service exports: {unknown}"
