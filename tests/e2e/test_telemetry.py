"""Telemetry through the real services (issue 10): one trace per execution across every
hop and into the handler's own spans; retries and DAG steps linked; trace ids stored and
logged; every /metrics valid and in agreement with PostgreSQL; probes that tell."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cronstream.shared.settings import Settings
from tests.conftest import CI, Processes
from tests.otlp import Receiver
from tests.promql import find_promtool
from tests.support import eventually, holding_the_workers_group, produce_json, run_now, sql


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver.serving() as server:
        yield server


def test_one_trace_per_execution_from_fire_to_projection_with_linked_retry_and_dag_step(
    processes: Processes, topics: Settings, receiver: Receiver,
) -> None:
    tracing = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    processes.start("monitor", extra_env=tracing)
    processes.start("dispatcher", extra_env=tracing).wait_for_log("action=dispatcher_started")
    scheduler = processes.start("scheduler", "--instance-id", "s1", extra_env=tracing)
    scheduler.wait_for_log("action=scheduler_ready")
    worker = processes.worker("w1", extra_env=tracing)
    produce_json(topics, topics.topics.job_definitions, "after-traced", {
        "job_id": "after-traced", "type": "DEPENDENT", "depends_on": ["traced"], "handler": "noop"})
    run_now(topics, "traced", "test.traced", max_retries=1, retry_delay_seconds=1)
    rows = eventually(lambda: (r := sql(topics.database_url,
                                        "SELECT * FROM job_executions WHERE job_id IN "
                                        "('traced', 'after-traced') ORDER BY scheduled_at, attempt_number"))
                      and len([x for x in r if x["status"] == "COMPLETED"]) == 2 and r, 60,
                      message="the retry and the DAG step complete")
    first = next(r for r in rows if r["job_id"] == "traced" and r["attempt_number"] == 1)
    retry = next(r for r in rows if r["job_id"] == "traced" and r["attempt_number"] == 2)
    step = next(r for r in rows if r["job_id"] == "after-traced")
    assert first["status"] == "FAILED" and first["trace_id"]
    assert len({first["trace_id"], retry["trace_id"], step["trace_id"]}) == 3, "one trace per execution"

    def services_of(trace_id: str) -> set[str]:
        return {s.service for s in receiver.trace(trace_id)}

    everyone = {f"cronstream-{s}" for s in ("scheduler", "dispatcher", "worker", "monitor")}
    wanted = {"cronstream.fire", "cronstream.queue", "cronstream.run", "user.work",
              "cronstream.handler test.traced", "cronstream.project"}
    eventually(lambda: everyone <= services_of(first["trace_id"])
               and wanted <= {s.name for s in receiver.trace(first["trace_id"])}, 30,
               message="spans of the first attempt from all four services and the handler")
    spans = receiver.trace(first["trace_id"])
    by_id = {s.span_id: s for s in spans}
    roots = [s for s in spans if not s.parent]
    assert [r.name for r in roots] == ["cronstream.fire"], "the scheduler's fire is the root"
    assert roots[0].service == "cronstream-scheduler"
    user = next(s for s in spans if s.name == "user.work")
    handler_span = by_id[user.parent]  # the handler's span, made in the pool process
    run = by_id[handler_span.parent]
    assert run.name == "cronstream.run" and run.service == "cronstream-worker"
    queue = by_id[run.parent]
    assert queue.name == "cronstream.queue" and queue.service == "cronstream-dispatcher"
    assert by_id[queue.parent] is roots[0]
    project = next(s for s in spans if s.name == "cronstream.project")
    assert project.service == "cronstream-monitor" and project.parent == run.span_id

    # The retry's trace starts with a fire that links to the failed attempt's trace.
    retry_root = eventually(lambda: next((s for s in receiver.trace(retry["trace_id"])
                                          if s.name == "cronstream.fire"), None), 30,
                            message="the retry's fire")
    assert any(link[0] == first["trace_id"] for link in retry_root.links)
    # The DAG step's trace starts at the monitor and links to the evaluation, which is part
    # of the retry's (the successful attempt's) trace.
    step_root = eventually(lambda: next((s for s in receiver.trace(step["trace_id"])
                                         if not s.parent), None), 30, message="the step's root")
    assert step_root.service == "cronstream-monitor"
    evaluation = [s for s in receiver.trace(retry["trace_id"]) if s.name == "cronstream.dag.evaluate"]
    assert evaluation and (retry["trace_id"], evaluation[0].span_id) in step_root.links
    # The worker's log lines about the first attempt carry its trace id.
    finished = [line for line in worker.log().splitlines()
                if "action=execution_finished" in line and str(first["execution_id"]) in line]
    assert finished and f"trace_id={first['trace_id']}" in finished[0]


def test_every_service_serves_valid_metrics_that_agree_with_postgresql(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    promtool = find_promtool()
    if promtool is None:
        message = "promtool is needed (Debian package prometheus; `make test` installs it)"
        if CI:
            pytest.fail(message)
        pytest.skip(message)
    services = processes.system()
    for i in range(6):
        run_now(topics, f"ok-{i}", "noop")
    run_now(topics, "bad", "fail", params={"message": "no"})
    eventually(lambda: sql(topics.database_url, "SELECT count(*) AS n FROM job_executions WHERE "
                           "status IN ('COMPLETED', 'PERMANENTLY_FAILED')")[0]["n"] == 7, 40,
               message="seven executions end")

    def counter(text: str, name: str, **labels: str) -> float:
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def agrees() -> bool:
        text = services["monitor"].get("/metrics")[1]
        return (counter(text, "cronstream_executions_total", status="COMPLETED") == 6
                and counter(text, "cronstream_executions_total", status="PERMANENTLY_FAILED") == 1)

    eventually(agrees, 20, message="the monitor's counters agree with PostgreSQL")
    for name, proc in services.items():
        status, text = proc.get("/metrics")
        assert status == 200
        scraped = tmp_path / f"{name}.prom"
        scraped.write_text(text)
        check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                               text=True, check=False)
        assert check.returncode == 0, f"{name}: {check.stdout}{check.stderr}"
        assert "cronstream_build_info" in text
    worker_text = services["worker-1"].get("/metrics")[1]
    assert counter(worker_text, "cronstream_worker_executions_total", status="COMPLETED") == 6
    assert "cronstream_execution_duration_seconds_bucket" in worker_text
    scheduler_text = services["scheduler"].get("/metrics")[1]
    assert "cronstream_scheduler_leader 1.0" in scheduler_text
    assert counter(scheduler_text, "cronstream_scheduler_fires_total", reason="SCHEDULE") >= 7
    # Every hop committed its batches in transactions, and says how many (the broker's CPU
    # follows that count, decision 0012).
    committed = {name: counter(proc.get("/metrics")[1], "cronstream_kafka_transactions_total")
                 for name, proc in services.items()}
    assert committed["scheduler"] >= 1 and committed["dispatcher"] >= 1, committed
    assert sum(v for name, v in committed.items() if name.startswith("worker")) >= 1, committed


def test_readiness_follows_assignment_and_outages_leave_a_service_alive(
    processes: Processes, topics: Settings,
) -> None:
    with holding_the_workers_group(topics):  # subscribed, and nothing assigned
        worker = processes.worker("w1", wait=False)
        worker.wait_for_log("action=worker_started")
        status, body = worker.get("/readyz")
        assert status == 503, f"not ready while its partitions are not assigned: {body}"
        assert worker.get("/healthz")[0] == 200, "alive while it waits"
    worker.wait_for_log("action=partitions_assigned")
    eventually(lambda: worker.get("/readyz")[0] == 200, 20, message="ready once assigned")
    assert worker.get("/healthz")[0] == 200
    # A monitor whose database does not answer waits for it: alive, not ready.
    stranded = processes.start("monitor", name="stranded", extra_env={
        "CRONSTREAM_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/nowhere"})
    stranded.wait_for_log("action=database_unavailable")
    status, body = stranded.get("/readyz")
    assert status == 503 and "database" in body
    assert stranded.get("/healthz")[0] == 200
    assert stranded.alive()
