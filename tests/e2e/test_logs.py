"""Execution logs end to end, on the real broker and database: what a failing handler
wrote and its traceback come back from `cronstream logs` and `describe execution`; `logs
-f` shows a running execution's lines before it ends and ends with it; a flood is cut at
the limit while everything else carries on; and lines written to `execution-logs` by
hand, past an attempt's limit or after its log ended, are not kept where the log is."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pytest

from cronstream.services.monitor.log_bounds import handler_budget
from cronstream.shared.inbound import DLQ_ERROR, DLQ_SERVICE, DLQ_TOPIC
from cronstream.shared.settings import Settings
from tests.conftest import Processes
from tests.support import (
    ServiceProcess,
    cli,
    env_for,
    eventually,
    header,
    produce_json,
    read_all,
    run_now,
    sql,
)


def execution(settings: Settings, job_id: str, status: str | None = None, attempt: int = 1) -> Any:
    rows = sql(settings.database_url, "SELECT * FROM job_executions WHERE job_id = $1 "
               "AND attempt_number = $2 AND ($3::text IS NULL OR status = $3)", job_id, attempt,
               status)
    return rows[0] if rows else None


def log_ended(settings: Settings, execution_id: Any) -> bool:
    return bool(sql(settings.database_url, "SELECT 1 FROM execution_log_ends WHERE execution_id = $1",
                    execution_id))


def test_a_failed_run_keeps_what_it_wrote_and_its_traceback(
    processes: Processes, topics: Settings,
) -> None:
    processes.system()
    run_now(topics, "chatty", "test.chatty-fail", params={"region": "eu"}, max_retries=1,
            retry_delay_seconds=1)
    first = eventually(lambda: execution(topics, "chatty", "FAILED"), 40, message="attempt 1 FAILED")
    eventually(lambda: log_ended(topics, first["execution_id"]), 20, message="its log ended")

    out = cli(topics, "logs", str(first["execution_id"]))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for expected in ("processing eu\n", "progress: half\n", "raw bytes \\xff\\xfe on fd 1\n",
                     "from a child process\n", "tests.chatty: retrying the lookup\n"):
        assert expected in text
    # The traceback comes last, chained cause included, naming the handler's file.
    traceback = text[text.index("Traceback (most recent call last):"):]
    assert "handlers_for_tests.py" in traceback and "KeyError: 'region'" in traceback
    assert traceback.rstrip().endswith("RuntimeError: lookup failed")

    lines = [json.loads(line) for line in cli(topics, "logs", str(first["execution_id"]),
                                              "-o", "json").stdout.splitlines()]
    assert {(line["stream"], line["level"]) for line in lines} >= {
        ("stdout", None), ("stderr", None), ("log", "WARNING"), ("traceback", "ERROR")}
    assert all(line["attempt"] == 1 and line["at"].endswith("Z") for line in lines)
    assert [line["seq"] for line in lines] == list(range(len(lines)))
    # Each line carries the execution's trace id: a trace and its log find each other.
    assert first["trace_id"] and {line["trace_id"] for line in lines} == {first["trace_id"]}

    described = cli(topics, "describe", "execution", str(first["execution_id"])).stdout
    assert "Traceback:" in described and "RuntimeError: lookup failed" in described

    # The retry has its own log, reached from the first attempt's id.
    second = eventually(lambda: execution(topics, "chatty", "PERMANENTLY_FAILED", attempt=2), 40,
                        message="attempt 2 PERMANENTLY_FAILED")
    eventually(lambda: log_ended(topics, second["execution_id"]), 20)
    retried = [json.loads(line) for line in cli(topics, "logs", str(first["execution_id"]),
                                                "--attempt", "2", "-o", "json").stdout.splitlines()]
    assert retried and all(line["attempt"] == 2 for line in retried)
    missing = cli(topics, "logs", str(first["execution_id"]), "--attempt", "3")
    assert missing.returncode == 4 and "attempt 3" in missing.stderr


def test_logs_follow_shows_a_running_execution_and_ends_with_it(
    processes: Processes, topics: Settings,
) -> None:
    processes.system()
    run_now(topics, "printer", "test.print-lines", params={"lines": 8, "every": 0.5})
    running = eventually(lambda: execution(topics, "printer", "RUNNING"), 40, message="RUNNING")
    seen: list[tuple[float, str, str]] = []  # (when, line, the execution's status then)
    with subprocess.Popen(
            [sys.executable, "-m", "cronstream", "logs", "-f", str(running["execution_id"])],
            env=env_for(topics), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as follow:

        def read() -> None:
            assert follow.stdout is not None
            for line in follow.stdout:
                row = execution(topics, "printer")
                seen.append((time.time(), line.rstrip("\n"), row["status"] if row else "-"))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            assert follow.wait(40) == 0, follow.stderr.read() if follow.stderr else ""
        finally:
            follow.kill()
        reader.join(5)
    assert [line.split(" at ")[0] for _, line, _ in seen] == [f"line {i}" for i in range(8)]
    assert seen[0][2] == "RUNNING", "the first line was shown while the execution still ran"
    done = execution(topics, "printer", "COMPLETED")
    assert done is not None, "-f ended when the execution ended"


def test_a_flood_is_cut_at_the_limit_while_the_rest_carries_on(
    processes: Processes, topics: Settings,
) -> None:
    processes.system(worker_args=("--concurrency", "4"))
    run_now(topics, "steady-before", "noop")
    eventually(lambda: execution(topics, "steady-before", "COMPLETED"), 40)
    run_now(topics, "flood", "test.flood", params={"megabytes": 20, "long_line": 10_000_000})
    started = eventually(lambda: execution(topics, "flood", "RUNNING") or execution(topics, "flood"),
                         40, message="the flood started")
    # Other executions run and are projected while it floods.
    for i in range(3):
        run_now(topics, f"steady-{i}", "test.print-lines", params={"lines": 2})
    for i in range(3):
        row = eventually(partial(execution, topics, f"steady-{i}", "COMPLETED"), 60,
                         message=f"steady-{i} COMPLETED")
        eventually(partial(log_ended, topics, row["execution_id"]), 20)
        assert [line.split(" at ")[0] for line in
                cli(topics, "logs", str(row["execution_id"])).stdout.splitlines()] == ["line 0", "line 1"]
    flood = eventually(lambda: execution(topics, "flood", "COMPLETED"), 60, message="the flood ends")
    eventually(lambda: log_ended(topics, flood["execution_id"]), 20)
    kept = sql(topics.database_url, "SELECT stream, line FROM execution_logs WHERE execution_id = $1 "
               "ORDER BY delivery, seq", started["execution_id"])
    stdout_bytes = sum(len(r["line"].encode()) for r in kept if r["stream"] == "stdout")
    assert 1_000_000 <= stdout_bytes <= 1 << 20
    assert kept[-1]["stream"] == "cronstream" and "[log cut]" in kept[-1]["line"]


def test_a_killed_workers_shipped_lines_stay_and_the_next_delivery_logs_after_them(
    processes: Processes, topics: Settings,
) -> None:
    """SIGKILL mid-run: what the first worker had shipped is kept, as delivery 1; the
    execution is re-queued and runs again elsewhere, its lines as delivery 2 after them."""
    processes.system(workers=0)
    first = processes.worker("w1")
    run_now(topics, "long-printer", "test.print-lines", params={"lines": 12, "every": 0.25})
    running = eventually(lambda: execution(topics, "long-printer", "RUNNING"), 40, message="RUNNING")
    execution_id = running["execution_id"]

    def shipped() -> int:
        return int(sql(topics.database_url, "SELECT count(*) AS n FROM execution_logs WHERE "
                                            "execution_id = $1 AND delivery = 1", execution_id)[0]["n"])

    eventually(lambda: shipped() >= 3, 30, message="some lines of delivery 1 projected")
    first.kill()
    kept = shipped()
    processes.worker("w2")
    done = eventually(lambda: execution(topics, "long-printer", "COMPLETED"), 60,
                      message="re-queued and completed elsewhere")
    assert done["delivery"] == 2 and done["worker_id"] == "w2"
    eventually(lambda: log_ended(topics, execution_id), 20)
    lines = [json.loads(line) for line in cli(topics, "logs", str(execution_id), "-o", "json").stdout.splitlines()]
    deliveries = [line["delivery"] for line in lines]
    assert deliveries == sorted(deliveries)  # delivery 1's lines, then delivery 2's
    before_kill = [line["text"].split(" at ")[0] for line in lines if line["delivery"] == 1]
    assert len(before_kill) >= kept >= 3  # what it had shipped is kept (and in order)
    assert before_kill == [f"line {i}" for i in range(len(before_kill))]
    assert [line["text"].split(" at ")[0] for line in lines if line["delivery"] == 2] == \
        [f"line {i}" for i in range(12)]


def forged(row: Any, first_seq: int, texts: list[str], final: bool = False) -> dict[str, Any]:
    """A LogBatch of `row`'s execution, as anyone who may write to `execution-logs` (a
    worker's credential) can publish it."""
    at = datetime.now(UTC).isoformat()
    return {"schema_version": 1, "execution_id": str(row["execution_id"]), "job_id": row["job_id"],
            "run_id": str(row["run_id"]), "attempt_number": row["attempt_number"],
            "delivery": row["delivery"], "worker_id": "w1",
            "lines": [{"seq": first_seq + i, "at": at, "stream": "stdout", "text": text}
                      for i, text in enumerate(texts)], "final": final}


def refused_counts(monitor: ServiceProcess) -> dict[str, float]:
    counts = {"limit": 0.0, "ended": 0.0}
    for line in monitor.get("/metrics")[1].splitlines():
        for reason in counts:
            if line.startswith(f'cronstream_log_lines_refused_total{{reason="{reason}"}} '):
                counts[reason] = float(line.rsplit(" ", 1)[1])
    return counts


def test_hand_published_lines_past_the_limit_or_after_the_end_are_refused_dead_lettered_and_counted(
    processes: Processes, topics: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The finding: batches of 8,000 lines published by hand for a COMPLETED execution
    were all kept. Now lines after a log's end are refused, a log is kept up to the limit
    (and says it was cut), each refused record is dead-lettered with the reason and its
    lines counted, and a restarted monitor goes on from what the log holds."""
    limit = 64 * 1024
    monkeypatch.setenv("CRONSTREAM_WORKER_LOG_LIMIT_BYTES", str(limit))  # every service's
    services = processes.system()
    t = topics.topics

    def logs_dead_letters() -> list[Any]:
        return [m for m in read_all(topics, t.dead_letters) if header(m, DLQ_TOPIC) == t.execution_logs]

    def lines_of(execution_id: Any) -> list[Any]:
        return sql(topics.database_url, "SELECT seq, stream, line FROM execution_logs "
                   "WHERE execution_id = $1 ORDER BY delivery, seq", execution_id)

    run_now(topics, "printer", "test.print-lines", params={"lines": 2})
    done = eventually(lambda: execution(topics, "printer", "COMPLETED"), 40, message="COMPLETED")
    eventually(lambda: log_ended(topics, done["execution_id"]), 20, message="its log ended")
    for first in (2, 8002):
        produce_json(topics, t.execution_logs, str(done["execution_id"]),
                     forged(done, first, [f"late {i}" for i in range(8000)]))
    # An execution the projection does not know (yet): 4 batches of 30,000 bytes.
    running = {"execution_id": uuid.uuid4(), "job_id": "elsewhere", "run_id": uuid.uuid4(),
               "attempt_number": 1, "delivery": 1}
    for i in range(4):
        produce_json(topics, t.execution_logs, str(running["execution_id"]),
                     forged(running, 300 * i, [f"{300 * i + j:06d} " + "x" * 93 for j in range(300)]))

    dead = eventually(lambda: len(d := logs_dead_letters()) >= 4 and d, 60,
                      message="the refused records dead-lettered")
    assert len(dead) == 4 and {header(m, DLQ_SERVICE) for m in dead} == {"monitor"}
    reasons: dict[str, list[str]] = {}
    for m in dead:  # keyed as they were published: by execution
        reasons.setdefault((m.key() or b"").decode(), []).append(header(m, DLQ_ERROR) or "")
    assert sorted(reasons) == sorted([str(done["execution_id"]), str(running["execution_id"])])
    assert reasons[str(done["execution_id"])] == [
        f"log lines not kept, of 8000: 8000 lines after the log of execution {done['execution_id']} "
        "delivery 1 ended"] * 2
    assert all(f"past the log of execution {running['execution_id']} delivery 1's limit" in r
               and "ended" not in r for r in reasons[str(running["execution_id"])])

    assert [r["line"].split(" at ")[0] for r in lines_of(done["execution_id"])] == ["line 0", "line 1"]
    kept = lines_of(running["execution_id"])
    output = [r for r in kept if r["stream"] == "stdout"]
    assert limit - 100 < sum(len(r["line"].encode()) for r in output) <= handler_budget(limit)
    assert [r["seq"] for r in kept] == list(range(len(kept)))
    assert kept[-1]["stream"] == "cronstream" and kept[-1]["line"].startswith("[log cut]")
    refused = {"ended": 16_000.0, "limit": 1200.0 - len(output)}
    eventually(lambda: refused_counts(services["monitor"]) == refused, 20,
               message=f"the refused lines counted: {refused}")

    # A restarted monitor reads what the log holds: still cut.
    services["monitor"].stop()
    monitor = processes.start("monitor", name="monitor-2")
    monitor.wait_for_log("action=partitions_assigned")
    produce_json(topics, t.execution_logs, str(running["execution_id"]),
                 forged(running, 1200, ["one more"] * 10))
    eventually(lambda: len(logs_dead_letters()) == 5, 60, message="the next record dead-lettered")
    eventually(lambda: refused_counts(monitor) == {"ended": 0.0, "limit": 10.0}, 20,
               message="its lines counted by the new monitor")
    assert lines_of(running["execution_id"]) == kept
    assert monitor.alive() and all(p.alive() for name, p in services.items() if name != "monitor")


def test_a_hand_published_line_with_a_nul_is_kept_escaped_and_the_monitor_carries_on(
    processes: Processes, topics: Settings,
) -> None:
    """PostgreSQL text holds no NUL, which JSON carries ("\\u0000") and a worker never
    sends (capture.py escapes it): such a record once stopped the monitor for good (its
    batch refused again when written sanitised, the projection failed, and a restarted
    monitor read the same record). Its line is kept with U+FFFD instead."""
    monitor = processes.start("monitor")
    monitor.wait_for_log("action=partitions_assigned")
    t = topics.topics
    row = {"execution_id": uuid.uuid4(), "job_id": "j", "run_id": uuid.uuid4(), "attempt_number": 1,
           "delivery": 1}
    produce_json(topics, t.execution_logs, str(row["execution_id"]), forged(row, 0, ["a\x00b"]))
    produce_json(topics, t.execution_logs, str(row["execution_id"]), forged(row, 1, ["after"]))
    stored = eventually(lambda: len(rows := sql(
        topics.database_url, "SELECT line FROM execution_logs WHERE execution_id = $1 ORDER BY seq",
        row["execution_id"])) == 2 and rows, 30, message="both lines kept")
    assert [r["line"] for r in stored] == ["a\ufffdb", "after"]
    assert monitor.alive()
