"""Other teams' view of a running system: `cronstream.events` across a consumer restart,
and records of a newer minor version (or another major one) published into it."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cronstream import Client
from cronstream.shared.inbound import DLQ_ERROR, DLQ_SERVICE, DLQ_TOPIC
from cronstream.shared.settings import Settings
from tests.conftest import Processes
from tests.support import env_for, eventually, header, produce_json, read_all, run_now, sql, value


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def start_subscriber(settings: Settings, group: str, out: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as log_file:
        return subprocess.Popen([sys.executable, "-m", "tests.e2e.subscriber_for_tests", group, str(out)],
                                env=env_for(settings), stdout=log_file, stderr=subprocess.STDOUT)


def test_subscribe_sees_every_event_of_a_run_once_across_a_restart(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    processes.system()
    out, log = tmp_path / "events.jsonl", tmp_path / "subscriber.log"
    first = start_subscriber(topics, "billing", out, log)
    try:
        # A run with many events: QUEUED, RUNNING, a PROGRESS every 0.1 s, COMPLETED.
        run_now(topics, "long", "sleep", params={"seconds": 3})
        eventually(lambda: any(e["status"] == "PROGRESS" for e in lines(out)), timeout=60,
                   message="the first consumer is mid-run")
    finally:
        first.terminate()
        assert first.wait(30) == 0, log.read_text()
    seen_by_first = len(lines(out))
    second = start_subscriber(topics, "billing", out, log)
    try:
        eventually(lambda: any(e["status"] == "COMPLETED" for e in lines(out)), timeout=60,
                   message="the second consumer sees the run end")
    finally:
        second.terminate()
        assert second.wait(30) == 0, log.read_text()

    received = [e["event_id"] for e in lines(out)]
    published = [json.loads(value(m))["event_id"] for m in read_all(topics, topics.topics.execution_events)]
    assert 0 < seen_by_first < len(received), "the restart happened mid-run"
    assert len(received) == len(set(received)), "no event twice"
    assert set(received) == set(published), "no event missed"


def test_newer_minor_records_flow_and_other_majors_are_dead_lettered(
    processes: Processes, topics: Settings,
) -> None:
    processes.system()
    t = topics.topics
    # A definition from a newer cronstream: the same major version, two optional fields
    # this version does not know (top level and nested in params is just data).
    produce_json(topics, t.job_definitions, "newer", {
        "schema_version": 1, "job_id": "newer", "type": "ONE_TIME",
        "run_at": datetime.now(UTC).isoformat(), "handler": "noop",
        "labels": {"team": "data"}, "sla_seconds": 30})
    # A JobDue from a newer producer (e.g. a newer CLI trigger), unknown fields at both levels.
    execution = uuid.uuid4()
    produce_json(topics, t.job_due, "direct", {
        "execution_id": str(execution), "job_id": "direct", "run_id": str(uuid.uuid4()),
        "scheduled_at": datetime.now(UTC).isoformat(), "reason": "MANUAL", "idempotency_key": "k",
        "job": {"handler": "noop", "memory_mb": 256}, "tenant": "acme"})

    def completed(job_id: str) -> bool:
        return bool(sql(topics.database_url, "SELECT 1 FROM job_executions WHERE job_id = $1 "
                                             "AND status = 'COMPLETED'", job_id))
    eventually(lambda: completed("newer") and completed("direct"), timeout=60,
               message="both newer-version records ran")
    # Passed through untouched: the work record and the projected definition keep them.
    work = [json.loads(value(m)) for m in read_all(topics, t.work("normal", "default"))]
    direct = next(w for w in work if w["job_id"] == "direct")
    assert direct["tenant"] == "acme" and direct["job"]["memory_mb"] == 256
    (stored,) = sql(topics.database_url, "SELECT definition FROM job_definitions WHERE job_id = 'newer'")
    assert json.loads(stored["definition"])["labels"] == {"team": "data"}
    # An older client that re-publishes the definition (pause) keeps the newer fields.
    with Client(topics) as client:
        client.pause("newer")
    latest = [json.loads(value(m)) for m in read_all(topics, t.job_definitions) if m.key() == b"newer"][-1]
    assert (latest["enabled"], latest["labels"], latest["sla_seconds"]) == (False, {"team": "data"}, 30)

    # Another major version is dead-lettered with that reason, by the topic's owner.
    produce_json(topics, t.job_definitions, "future", {
        "schema_version": 2, "job_id": "future", "type": "ONE_TIME",
        "run_at": datetime.now(UTC).isoformat(), "handler": "noop"})
    produce_json(topics, t.job_due, "future-due", {
        "schema_version": 2, "execution_id": str(uuid.uuid4()), "job_id": "future-due",
        "run_id": str(uuid.uuid4()), "scheduled_at": datetime.now(UTC).isoformat(),
        "reason": "MANUAL", "idempotency_key": "k", "job": {"handler": "noop"}})

    def dead() -> dict[str, tuple[str, str]]:
        return {header(m, DLQ_TOPIC) or "": (header(m, DLQ_SERVICE) or "", header(m, DLQ_ERROR) or "")
                for m in read_all(topics, t.dead_letters)}
    found = eventually(lambda: len(d := dead()) == 2 and d, timeout=60, message="two dead letters")
    assert found[t.job_definitions][0] == "scheduler" and found[t.job_due][0] == "dispatcher"
    for _service, error in found.values():
        assert "unsupported schema_version 2" in error and "major version 1" in error
    assert not completed("future") and not completed("future-due")
