"""The end-to-end benchmark's projection lag and ceiling rule without servers: a sample
from what each partition holds past the projection, a window's figures, the rule that
counts a rate only while the projection stays within a few seconds of the present, and
the table docs/benchmarks.md is generated from the JSON with the lag beside every run."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bench import report
from bench.ceiling import CEILING_LAG_SECONDS, ceiling_of, holds, shortfalls
from bench.lag import LagSample, LagSampler, Unprojected, lag_of, summarise

NOW = 1_800_000_000.0


def test_the_lag_is_the_age_of_the_oldest_event_not_projected_over_every_partition() -> None:
    sample = lag_of({
        0: Unprojected(next_offset=1_000, end=4_000, first_timestamp_ms=int((NOW - 2.5) * 1000)),
        1: Unprojected(next_offset=500, end=700, first_timestamp_ms=int((NOW - 0.4) * 1000)),
        2: Unprojected(next_offset=9_000, end=9_001, first_timestamp_ms=None),
    }, NOW, datetime.fromtimestamp(NOW - 0.3, UTC))
    assert sample.seconds == 2.5  # the laggard partition, not the freshest one
    assert sample.offsets == 3_200  # a partition at its end adds nothing (its marker)
    assert sample.newest_completion_age == pytest.approx(0.3)


def test_a_projection_at_the_end_of_every_partition_is_not_behind() -> None:
    sample = lag_of({p: Unprojected(next_offset=10, end=11, first_timestamp_ms=None) for p in range(6)},
                    NOW, None)
    assert (sample.seconds, sample.offsets, sample.newest_completion_age) == (0.0, 0, None)


def test_a_window_reports_the_median_the_maximum_and_the_last_sample() -> None:
    samples = [LagSample(NOW + i, seconds, 100 * i, None)
               for i, seconds in enumerate([0.3, 0.5, 4.0, 0.6, 0.4])]
    figures = summarise(samples, missed=1)
    assert figures["seconds"] == {"p50": 0.5, "max": 4.0, "at_end": 0.4}
    assert figures["offsets"]["max"] == 400
    assert figures["newest_completion_age_seconds"] == {"p50": None, "max": None, "at_end": None}
    assert (figures["samples"], figures["missed"]) == (5, 1)


def test_samples_are_taken_every_period_and_once_as_the_window_closes() -> None:
    sampler = LagSampler.__new__(LagSampler)  # the cadence only: no servers
    began, taken = time.monotonic(), []
    sampler.sample = lambda: taken.append(time.monotonic() - began)  # type: ignore[method-assign]
    sampler.sample_until(began + 0.25, every=0.1)
    assert len(taken) == 4
    assert taken[-1] >= 0.25 and taken[0] < 0.05


def run(offered: int = 6000, shown: float = 1.0, p99: float = 400.0, lag: float | None = 1.2,
        **extra: Any) -> dict[str, Any]:
    """A run's figures as bench/e2e_throughput.py writes them (what the rule and the report read)."""
    figures: dict[str, Any] = {
        "offered_per_second": offered, "window_seconds": 30.0, "handler": "noop", "workers": 2,
        "worker_concurrency": 64, "completed_per_second": offered * 1.0,
        "completed_fraction_of_offered": 1.0, "shown_per_second": offered * shown,
        "shown_fraction_of_offered": shown, "start_lag_ms": {"p50": 90.0, "p99": p99, "count": 1},
        "cpu_us_per_execution": {"total": 300.0}, "kafka_transactions_per_second": 37.0,
        "broker_partitions": {"total": 1_475, "this_run": 95},
        "projection_behind_events": {"caught_up_after": True},
    }
    if lag is not None:
        figures["projection_lag"] = {"seconds": {"p50": lag / 2, "max": lag, "at_end": lag / 3}}
    return figures | extra


def test_a_rate_holds_only_while_the_projection_stays_within_a_few_seconds_of_the_present() -> None:
    assert holds(run(lag=CEILING_LAG_SECONDS))
    assert shortfalls(run(lag=14.5)) == ["projection 14.5 s behind > 5 s"]
    # Executed is not enough: the rule counts what PostgreSQL shows after the window.
    assert shortfalls(run(shown=0.85)) == ["shown 85.0 % of offered < 95 %"]
    assert shortfalls(run(p99=1_291.0)) == ["start lag p99 1,291 ms > 1 s"]
    assert shortfalls(run(p99=float("nan"))) == ["start lag p99 nan ms > 1 s"]


def test_a_run_measured_before_the_lag_was_sampled_does_not_hold() -> None:
    old = run(lag=None)
    del old["shown_fraction_of_offered"]
    assert shortfalls(old) == ["completions shown not counted", "projection lag not sampled"]


def test_the_ceiling_is_the_last_step_that_holds_before_the_first_that_does_not() -> None:
    search = [run(1000), run(2000), run(3000, lag=7.0), run(4000)]
    assert ceiling_of(search) == search[1]  # 4,000 held, past a failed step: not the ceiling
    assert ceiling_of([run(1000, lag=None)]) is None


def test_the_table_shows_the_lag_and_the_partitions_beside_every_run_and_the_ceiling_by_the_rule(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    e2e = {"benchmark": "e2e_throughput", "at": "2026-12-06T00:00:00Z",
           "matrix": [run(1000, lag=0.6), run(6000, lag=14.5)],
           "search": [run(5000, lag=2.2), run(6000, lag=14.5)],
           "ceiling": run(6000, lag=14.5),  # the search's verdict by the rule it ran under
           "ceiling_sustained": run(5000, lag=2.4)}
    (tmp_path / "e2e_throughput.json").write_text(json.dumps(e2e))
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    text = report.render()
    rows = [line for line in text.splitlines() if line.startswith(("| --concurrency", "| search",
                                                                   "| sustained"))]
    assert len(rows) == 5
    assert all("1,475 (95)" in row for row in rows)
    assert "| 0.3 / 0.6 / 0.2 |" in rows[0] and rows[0].endswith("| holds |")
    assert rows[1].endswith("| projection 14.5 s behind > 5 s |")
    assert "**Ceiling: 5,000/s, the projection at most 2.2 s behind the present (p50 1.1 s).**" in text


def test_an_old_result_without_the_lag_is_shown_as_not_measured_and_holds_no_ceiling(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = run(7000, lag=None)
    for key in ("shown_per_second", "shown_fraction_of_offered", "broker_partitions"):
        del old[key]
    (tmp_path / "e2e_throughput.json").write_text(json.dumps({"search": [old], "ceiling": old}))
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    text = report.render()
    assert "**Ceiling: none held.**" in text
    assert "The search's own verdict, by the rule it ran under, was 7,000/s" in text
    row = next(line for line in text.splitlines() if line.startswith("| search"))
    assert "| 7,000 | – | 7,000 | – |" in row


def test_a_run_of_some_parts_keeps_the_others_as_the_file_held_them_with_their_date(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = tmp_path / "benchmarks.md"
    docs.write_text("\n".join([
        "# Benchmarks", "", "## End to end (`bench/e2e_throughput.py`, measured 2026-12-05T04:58:16Z)", "",
        "### A handler that sleeps 20 ms, at the default concurrency", "", "| sleeper row |", "",
        "### The ceiling (`--concurrency` 64)", "", "**Ceiling: 7,000/s.**", "",
        "### Execution logs (pool handlers, 1,000/s, `--concurrency` 64)", "", "| logs row |", "",
        "## Side by side", ""]))
    results = tmp_path / "results"
    results.mkdir()
    (results / "e2e_throughput.json").write_text(json.dumps(
        {"at": "2026-12-08T01:00:00Z", "search": [run(5000, lag=2.2), run(6000, lag=14.5)]}))
    monkeypatch.setattr(report, "RESULTS", results)
    monkeypatch.setattr(report, "DOCS", docs)
    text = report.render()
    assert "measured 2026-12-08T01:00:00Z" in text
    assert "**Ceiling: 5,000/s" in text and "7,000/s" not in text  # the new search replaces the old
    note = "Measured 2026-12-05T04:58:16Z, in an earlier run of the programme"
    for part, row in (("### A handler that sleeps", "| sleeper row |"), ("### Execution logs", "| logs row |")):
        lines = text.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith(part))
        assert lines[at + 2].startswith(note) and row in lines[at + 3:at + 6]
    # Carried again by a later run of other parts: the date stays the one it was measured on.
    docs.write_text(text)
    (results / "e2e_throughput.json").write_text(json.dumps(
        {"at": "2026-12-09T01:00:00Z", "search": [run(5000, lag=2.2)]}))
    again = report.render()
    assert again.count(note) == 2 and "2026-12-09T01:00:00Z, in an earlier" not in again


def test_each_pair_of_trees_is_a_section_with_where_its_cpu_differs_and_stays_when_not_rerun(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n")
    results = tmp_path / "results"
    results.mkdir()

    def cell(before_cpu: dict[str, float], after_cpu: dict[str, float]) -> dict[str, Any]:
        return {"concurrency": 64, "offered_per_second": 3000, "handler": "noop",
                "before": run(3000, lag=None, cpu_us_per_execution=before_cpu),
                "after": run(3000, lag=1.0, cpu_us_per_execution=after_cpu)}

    for name, after, at, note in (("side_by_side", "b326734", "2026-12-08T00:42:48Z", "main today"),
                                  ("side_by_side_702bfd7", "702bfd7", "2026-12-08T01:30:00Z", "issue 54's items")):
        (results / f"{name}.json").write_text(json.dumps({
            "at": at, "before_commit": "4240ad3", "after_commit": after, "window_seconds": 30,
            "note": note, "cells": [cell({"total": 500.0, "scheduler": 50.0, "kafka": 85.0},
                                         {"total": 630.0, "scheduler": 96.0, "kafka": 137.0})]}))
    monkeypatch.setattr(report, "RESULTS", results)
    monkeypatch.setattr(report, "DOCS", docs)
    text = report.render()
    headings = [line for line in text.splitlines() if line.startswith("## Side by side")]
    assert [h.split(" (`")[0] for h in headings] == ["## Side by side: 4240ad3 (before) and b326734",
                                                    "## Side by side: 4240ad3 (before) and 702bfd7"]
    assert "\nmain today\n" in text and "\nissue 54's items\n" in text
    assert text.count("- noop, --concurrency 64, 3,000/s: +130.0 (+26.0 %); kafka +52.0, scheduler +46.0") == 2
    docs.write_text(text)
    (results / "side_by_side.json").unlink()  # one pair re-run, the other's result gone
    assert [line for line in report.render().splitlines() if line.startswith("## Side by side")] == [
        headings[1], headings[0]]
    for path in results.glob("side_by_side*.json"):
        path.unlink()
    assert [line for line in report.render().splitlines() if line.startswith("## Side by side")] == headings
