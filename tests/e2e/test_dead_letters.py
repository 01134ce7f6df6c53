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


def test_execution_events_that_only_decode_side_by_side_are_dead_lettered(
    processes: Processes, topics: Settings,
) -> None:
    """Each record is validated on its own: two events in one record, and two records that
    are valid events only when joined, are dead-lettered (not projected, not the monitor
    stopped); a valid event after them is projected."""
    t = topics.topics

    def event(job_id: str) -> dict[str, object]:
        return {"event_id": str(uuid.uuid4()), "execution_id": str(uuid.uuid4()), "job_id": job_id,
                "run_id": str(uuid.uuid4()), "status": "QUEUED", "attempt_number": 1,
                "scheduled_at": "2026-03-01T12:00:00Z", "occurred_at": "2026-03-01T12:00:01Z"}

    first, second, third = event("side"), event("side"), event("side")
    two_in_one = json.dumps(first).encode() + b"," + json.dumps(second).encode()
    # Joined with a comma, these two are one event with an extra field ("pad": [{}, {}]).
    head = json.dumps(third).encode()[:-1] + b',"pad":[{}'
    tail = b"{}]}"
    monitor = processes.start("monitor")
    monitor.wait_for_log("action=partitions_assigned")
    for value in (two_in_one, head, tail):  # one key: one partition, in this order
        produce(topics, t.execution_events, b"side", value)
    eventually(lambda: len([m for m in read_all(topics, t.dead_letters)
                            if header(m, DLQ_TOPIC) == t.execution_events]) == 3,
               timeout=60, message="the three records dead-lettered")
    valid = event("after")
    produce_json(topics, t.execution_events, "after", valid)
    eventually(lambda: sql(topics.database_url, "SELECT 1 FROM execution_events WHERE event_id = $1",
                           uuid.UUID(str(valid["event_id"]))), timeout=30,
               message="a valid event after them is projected")
    assert monitor.alive()
    projected = sql(topics.database_url, "SELECT event_id FROM execution_events WHERE job_id = 'side'")
    assert projected == [], "nothing of the records that do not decode alone"
