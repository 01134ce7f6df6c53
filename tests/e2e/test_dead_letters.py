"""Garbage on every consumed topic is dead-lettered; every service stays up."""

from __future__ import annotations

import json
import uuid

from cronstream.shared.inbound import DLQ_ERROR, DLQ_SERVICE, DLQ_TOPIC
from cronstream.shared.settings import Settings
from tests.conftest import Processes
from tests.support import eventually, header, produce, produce_json, read_all, sql

UNDECODABLE = b"\xff\xfe\x00 not json at all"
SCHEMA_INVALID = json.dumps({"job_id": 5, "surprise": True}).encode()


def test_garbage_on_every_topic_is_dead_lettered_and_nothing_stops(
    processes: Processes, topics: Settings,
) -> None:
    settings = topics
    t = settings.topics
    services = processes.system()
    consumed = {
        t.job_definitions: "scheduler",
        t.retries: "scheduler",
        t.job_due: "dispatcher",
        t.work("normal", "default"): "worker",
        t.execution_events: "monitor",
        t.heartbeats: "monitor",
        t.commands: "monitor",
    }
    for topic in consumed:
        # Keys are required on the compacted topics; give every record one.
        produce(settings, topic, b"bad-1", UNDECODABLE)
        produce(settings, topic, str(uuid.uuid4()).encode(), SCHEMA_INVALID)

    def dead_letters() -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for msg in read_all(settings, t.dead_letters):
            found.setdefault(header(msg, DLQ_TOPIC) or "", []).append(header(msg, DLQ_SERVICE) or "")
        return found

    found = eventually(lambda: (d := dead_letters()) and all(len(d.get(k, [])) >= 2 for k in consumed) and d,
                       timeout=60, message="two dead letters per consumed topic")
    for topic, service in consumed.items():
        assert found[topic] == [service, service], (topic, found[topic])
    for msg in read_all(settings, t.dead_letters):
        assert header(msg, DLQ_ERROR), "every dead letter says why"
        assert msg.value() in (UNDECODABLE, SCHEMA_INVALID), "the original bytes are kept"

    for name, proc in services.items():
        assert proc.alive(), f"{name} died"

    produce_json(settings, t.job_definitions, "after-garbage", {
        "job_id": "after-garbage", "type": "INTERVAL", "interval_seconds": 1, "handler": "noop",
        "params": {"still": "alive"},
    })
    eventually(lambda: sql(settings.database_url,
                           "SELECT 1 FROM job_executions WHERE job_id = 'after-garbage' "
                           "AND status = 'COMPLETED'"),
               timeout=30, message="a valid job completes after the garbage")
    # Exactly once: each bad record was dead-lettered once, not once per batch or restart.
    assert sum(len(v) for v in dead_letters().values()) == 2 * len(consumed)
