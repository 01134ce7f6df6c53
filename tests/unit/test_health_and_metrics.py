"""The operating contract: metric names equal docs/metrics.md; probes tell a live loop
from a stuck one and a ready service from one that is not."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.metrics import MetricWrapperBase

from cronstream.shared import metrics
from cronstream.shared.health import Health, HealthServer, open_http

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _exported_name(metric: MetricWrapperBase) -> str:
    return metric._name + ("_total" if metric._type == "counter" else "")


def test_docs_list_exactly_the_metrics_the_code_defines() -> None:
    in_code = {_exported_name(m) for m in metrics.COMMON} | {
        _exported_name(m) for group in metrics.BY_SERVICE.values() for m in group}
    in_docs = set(re.findall(r"^\| `(cronstream_[a-z_]+)` \|", DOCS.read_text(), re.MULTILINE))
    assert in_docs == in_code


def test_no_metric_is_labelled_by_an_unbounded_id() -> None:
    forbidden = {"job_id", "execution_id", "run_id", "worker_id", "error", "message"}
    for metric in (*metrics.COMMON, *(m for g in metrics.BY_SERVICE.values() for m in g)):
        assert not forbidden & set(metric._labelnames), metric._name


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_kept_child_is_the_labelled_series_itself() -> None:
    kept = metrics.child(metrics.EXECUTION_DURATION, "q-child", "high", "FAILED")
    assert kept is metrics.child(metrics.EXECUTION_DURATION, "q-child", "high", "FAILED")
    assert kept is metrics.EXECUTION_DURATION.labels(queue="q-child", priority="high", status="FAILED")
    kept.observe(2.5)
    series = {s.labels.get("le"): s.value for m in metrics.EXECUTION_DURATION.collect()
              for s in m.samples if s.name.endswith("_bucket") and s.labels.get("queue") == "q-child"}
    assert series["+Inf"] == 1


@pytest.fixture
def served() -> Iterator[tuple[Health, int]]:
    health = Health("worker", stall_seconds=0.5)
    server = HealthServer(health, "127.0.0.1", 0)
    server.start()
    yield health, server.port
    server.stop()


def test_readyz_follows_the_components(served: tuple[Health, int]) -> None:
    health, port = served
    health.require("assignment")
    status, body = _get(port, "/readyz")
    assert status == 503
    assert json.loads(body)["components"] == {"assignment": "starting"}
    health.set("assignment", True)
    status, body = _get(port, "/readyz")
    assert status == 200 and json.loads(body)["ready"] is True
    health.set("assignment", False, "rebalancing")
    assert _get(port, "/readyz")[0] == 503


def test_healthz_fails_while_the_event_loop_is_blocked(served: tuple[Health, int]) -> None:
    health, port = served
    results: list[int] = []

    async def main() -> None:
        async def tick() -> None:
            while True:
                health.tick()
                await asyncio.sleep(0.05)

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0.2)
        results.append(_get(port, "/healthz")[0])  # the loop turns
        def probe_later() -> None:
            time.sleep(1.0)
            results.append(_get(port, "/healthz")[0])

        probe = threading.Thread(target=probe_later)
        probe.start()
        time.sleep(1.5)  # a blocking call on the loop: the very fault liveness must catch
        probe.join()
        await asyncio.sleep(0.2)
        results.append(_get(port, "/healthz")[0])  # turning again
        ticker.cancel()

    asyncio.run(main())
    assert results == [200, 503, 200]


def test_a_fatal_condition_fails_liveness_for_good(served: tuple[Health, int]) -> None:
    health, port = served
    health.tick()
    health.fail("housekeeping gave up after 5 restarts")
    status, body = _get(port, "/healthz")
    assert status == 503 and "housekeeping" in body
    assert _get(port, "/readyz")[0] == 503


def test_metrics_are_prometheus_text(served: tuple[Health, int]) -> None:
    _, port = served
    metrics.announce("worker")
    metrics.WORKER_SLOTS.set(8)
    status, body = _get(port, "/metrics")
    assert status == 200
    assert "cronstream_worker_slots 8.0" in body
    assert 'cronstream_build_info{service="worker"' in body
    assert "cronstream_scheduler_leader" not in body  # only the running service's own


def test_a_failing_background_task_is_restarted_and_one_that_keeps_failing_ends_the_service() -> None:
    """Issue 9, item 2: no background task dies silently — it restarts with backoff; past
    its failure budget liveness fails and the service stops (to be restarted)."""
    from cronstream.shared.lifecycle import TaskGaveUp, supervise

    async def scenario() -> None:
        health = Health("monitor")
        stopping = asyncio.Event()
        calls = {"flaky": 0, "broken": 0}

        async def flaky() -> None:
            calls["flaky"] += 1
            if calls["flaky"] < 3:
                raise RuntimeError("the database went away")

        async def broken() -> None:
            calls["broken"] += 1
            raise RuntimeError("always")

        await supervise("flaky", flaky, health, stopping, max_failures=3)
        assert calls["flaky"] == 3 and health.live()[0] and not stopping.is_set()
        with pytest.raises(TaskGaveUp, match="broken gave up"):
            await supervise("broken", broken, health, stopping, max_failures=2)
        assert calls["broken"] == 2
        assert stopping.is_set()
        live, why = health.live()
        assert not live and "broken failed 2 times" in why

    asyncio.run(scenario())


def test_a_loop_histogram_exports_what_a_histogram_does() -> None:
    """The worker's lock-free histograms (start lag, run time) must look exactly like
    prometheus_client's to Prometheus: buckets, count, sum, created, and each bucket's
    latest exemplar, in both text formats."""
    from prometheus_client import CollectorRegistry, Histogram
    from prometheus_client.exposition import choose_encoder

    def exposition(kind: type[Histogram]) -> tuple[str, str]:
        registry = CollectorRegistry()
        histogram = kind("cronstream_test_seconds", "A test.", ["queue"],
                         buckets=metrics.LATENCY_BUCKETS, registry=registry)
        for i, value in enumerate([0.0, 0.004, 0.005, 0.0051, 0.3, 0.3, 2.5, 59.9, 60.0, 61.0, 1e9]):
            child = histogram.labels(queue="a" if i % 3 else "b")
            child.observe(value, {"trace_id": f"{i:032x}"} if i % 2 else None)
        scrubbed = []
        for accept in ("text/plain", "application/openmetrics-text"):
            text = choose_encoder(accept)[0](registry).decode()
            undated = re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text)  # when each was made
            scrubbed.append(re.sub(r"(# \{trace_id=\"[0-9a-f]+\"\} \S+) \S+", r"\1 T", undated))
        return scrubbed[0], scrubbed[1]

    ours, theirs = exposition(metrics.LoopHistogram), exposition(Histogram)
    assert ours == theirs
    assert '# {trace_id="' in ours[1] and "_created" in ours[0]


def test_a_taken_default_port_gives_way_to_a_free_one_but_an_explicit_port_does_not() -> None:
    health = Health("worker")
    first = HealthServer(health, "127.0.0.1", 0)
    try:
        default = first.port  # taken from now on
        second = open_http(lambda port: HealthServer(health, "127.0.0.1", port), "worker", None, default)
        assert second.port not in (default, 0)
        second.server_close()
        with pytest.raises(OSError, match="in use"):
            open_http(lambda port: HealthServer(health, "127.0.0.1", port), "worker", default, default)
    finally:
        first.server_close()
