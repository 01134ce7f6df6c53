"""Event triggers against a real broker (issue 56, docs/decisions/0057): records written to
a topic run an EVENT job, each matching record in exactly one run — also when the
scheduler leading the job's shard is SIGKILLed in the middle of the stream. The scheduler
tests read `job-due` directly; one test runs the whole system and reads what the handler
saw in `ctx.events`."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions  # type: ignore[attr-defined]

from cronstream.shared.db import query
from cronstream.shared.kafka.admin import ensure_topics
from cronstream.shared.records import JobDue
from cronstream.shared.settings import Settings
from cronstream.shared.topics import TopicSpec
from tests.conftest import Processes
from tests.support import ServiceProcess, cli, eventually, produce, produce_json, read_all, sql, value


def source_topic(settings: Settings, partitions: int = 3) -> str:
    topic = f"{settings.topic_prefix}orders"
    ensure_topics(settings, [TopicSpec(topic, partitions, {})])
    return topic


def event_job(job_id: str, topic: str, **event: Any) -> dict[str, Any]:
    return {"job_id": job_id, "type": "EVENT", "handler": "test.events",
            "event": {"topic": topic, **event}}


_WRITERS: dict[str, Producer] = {}


def write(settings: Settings, topic: str, first: int, count: int) -> None:
    """Records `first` .. `first + count - 1`: value {"n": i, "keep": i is even}. (One
    producer kept per broker: a new idempotent one waits ~0.5 s for its id.)"""
    servers = settings.kafka_bootstrap_servers
    producer = _WRITERS.get(servers) or _WRITERS.setdefault(servers, Producer({
        "bootstrap.servers": servers, "enable.idempotence": True, "linger.ms": 5}))
    for i in range(first, first + count):
        producer.produce(topic, json.dumps({"n": i, "keep": i % 2 == 0}).encode(), f"k{i % 7}".encode(),
                         headers=[("source", b"e2e")])
        if i % 50 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0


def event_runs(settings: Settings, job_id: str) -> list[JobDue]:
    return [due for due in (JobDue.model_validate_json(value(m))
                            for m in read_all(settings, settings.topics.job_due))
            if due.job_id == job_id and due.reason == "EVENT"]


def numbers(runs: list[JobDue]) -> list[int]:
    return [e.value["n"] for due in runs for e in due.job.events or ()]


def assert_each_once(runs: list[JobDue], expected: set[int]) -> None:
    seen = numbers(runs)
    doubled = sorted(n for n, c in Counter(seen).items() if c > 1)
    assert not doubled, f"records in two runs: {doubled[:20]}"
    assert set(seen) == expected, (f"missing {sorted(expected - set(seen))[:20]}, "
                                   f"unexpected {sorted(set(seen) - expected)[:20]}")
    assert len({due.execution_id for due in runs}) == len(runs)


def trigger_started(procs: list[ServiceProcess], job_id: str, count: int = 1) -> ServiceProcess:
    def find() -> ServiceProcess | None:
        for proc in procs:
            lines = [line for line in proc.log().splitlines()
                     if "action=trigger_started" in line and f"job_id={job_id}" in line]
            if proc.alive() and len(lines) >= count:
                return proc
        return None
    return eventually(find, 60, message=f"the trigger of {job_id} reads its topic")


def test_every_matching_record_is_in_exactly_one_run_of_its_batch_size(
    processes: Processes, topics: Settings,
) -> None:
    topic = source_topic(topics)
    scheduler = processes.start("scheduler", "--instance-id", "s1", name="scheduler")
    scheduler.wait_for_log("action=scheduler_ready")
    write(topics, topic, 0, 10)  # before the job: `start: latest` leaves them out
    produce_json(topics, topics.topics.job_definitions, "orders", event_job(
        "orders", topic, filter="value.keep == true", batch={"max_events": 5, "max_wait_seconds": 1}))
    trigger_started([scheduler], "orders")
    write(topics, topic, 10, 200)
    expected = set(range(10, 210, 2))
    eventually(lambda: set(numbers(event_runs(topics, "orders"))) >= expected, 60,
               message="every matching record in a run")
    runs = event_runs(topics, "orders")
    assert_each_once(runs, expected)
    assert all(1 <= len(due.job.events or ()) <= 5 for due in runs)
    assert sum(len(due.job.events or ()) == 5 for due in runs) >= len(runs) - 3, "mostly full batches"
    event = runs[0].job.events[0]  # type: ignore[index]
    assert (event.topic, event.key is not None, event.headers) == (topic, True, {"source": "e2e"})


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_sigkill_of_the_scheduler_mid_stream_still_runs_every_record_exactly_once(
    processes: Processes, topics: Settings, how: str,
) -> None:
    """SIGKILL: the successor fences it and resumes from the committed positions; SIGTERM:
    it hands its shards over (its open batches are read again by the successor)."""
    topic = source_topic(topics)
    schedulers = [processes.start("scheduler", "--instance-id", f"s{i}", name=f"scheduler-{i}")
                  for i in range(2)]
    for s in schedulers:
        s.wait_for_log("action=scheduler_ready")
    produce_json(topics, topics.topics.job_definitions, "stream", event_job(
        "stream", topic, filter="value.keep == true", batch={"max_events": 7, "max_wait_seconds": 2}))
    leader = trigger_started(schedulers, "stream")

    def stream() -> None:
        for i in range(30):
            write(topics, topic, i * 100, 100)
            time.sleep(0.2)  # the pace of the stream (about 6 s long), not a synchronisation

    writer = threading.Thread(target=stream)
    writer.start()
    eventually(lambda: len(numbers(event_runs(topics, "stream"))) >= 200, 60,
               message="runs before the kill")
    assert writer.is_alive(), "the kill comes in the middle of the stream"
    if how == "SIGKILL":
        leader.kill()
    else:
        assert leader.stop() == 0
    successor = trigger_started([s for s in schedulers if s is not leader], "stream")
    writer.join(120)
    assert successor.alive()
    expected = set(range(0, 3000, 2))
    eventually(lambda: set(numbers(event_runs(topics, "stream"))) >= expected, 90,
               message="every matching record in a run after the kill")
    assert_each_once(event_runs(topics, "stream"), expected)


def test_partitions_added_to_the_topic_are_read_from_their_first_record(
    processes: Processes, topics: Settings,
) -> None:
    topic = source_topic(topics, partitions=1)
    scheduler = processes.start("scheduler", "--instance-id", "s1", name="scheduler")
    scheduler.wait_for_log("action=scheduler_ready")
    produce_json(topics, topics.topics.job_definitions, "grow", event_job(
        "grow", topic, batch={"max_events": 5, "max_wait_seconds": 1}))
    trigger_started([scheduler], "grow")
    write(topics, topic, 0, 20)
    eventually(lambda: set(numbers(event_runs(topics, "grow"))) >= set(range(20)), 30,
               message="the records of the first partition in runs")
    admin = AdminClient({"bootstrap.servers": topics.kafka_bootstrap_servers})
    for future in admin.create_partitions([NewPartitions(topic, 3)]).values():
        future.result(30)
    # Written at once, before the trigger has seen the new partitions: it must start them
    # from their first record, not from their end when it notices them. (A new writer: the
    # kept one would go on writing to the one partition it knows of.)
    _WRITERS.clear()
    write(topics, topic, 20, 100)
    scheduler.wait_for_log("action=trigger_partitions_changed", timeout=30)
    trigger_started([scheduler], "grow", count=2)
    eventually(lambda: set(numbers(event_runs(topics, "grow"))) >= set(range(120)), 60,
               message="the records of the new partitions in runs")
    runs = event_runs(topics, "grow")
    assert {e.partition for due in runs for e in due.job.events or ()} == {0, 1, 2}
    assert_each_once(runs, set(range(120)))


def test_the_handler_sees_its_runs_records_in_ctx_events(processes: Processes, topics: Settings) -> None:
    topic = source_topic(topics, partitions=1)
    processes.system()
    produce_json(topics, topics.topics.job_definitions, "seen", event_job(
        "seen", topic, batch={"max_events": 3, "max_wait_seconds": 30}, start="earliest"))
    write(topics, topic, 0, 3)

    def completed() -> list[Any]:
        return sql(topics.database_url, "SELECT execution_id, result FROM job_executions "
                                        "WHERE job_id = 'seen' AND status = 'COMPLETED'")
    (row,) = eventually(completed, 60, message="the event run completed")
    execution = cli(topics, "describe", "execution", str(row["execution_id"]))
    assert execution.returncode == 0, execution.stderr
    assert f"3 record(s): {topic}[0]@0, {topic}[0]@1, {topic}[0]@2" in execution.stdout
    assert "EVENT" in execution.stdout
    result = json.loads(row["result"]) if isinstance(row["result"], str) else row["result"]
    assert [e["value"] for e in result["events"]] == [{"n": i, "keep": i % 2 == 0} for i in range(3)]
    assert [(e["topic"], e["partition"], e["offset"]) for e in result["events"]] == [
        (topic, 0, 0), (topic, 0, 1), (topic, 0, 2)]
    assert result["events"][0]["headers"] == {"source": "e2e"}
    queued = [json.loads(value(m)) for m in read_all(topics, topics.topics.execution_events)]
    assert [e["reason"] for e in queued if e["job_id"] == "seen" and e["status"] == "QUEUED"] == ["EVENT"]
    # The dashboard's execution page lists the run's records from the projection.
    shown = sql(topics.database_url, query("execution_trigger_records", "ui.sql"), row["execution_id"], 200)
    assert [(r["topic"], r["partition"], r["offset"]) for r in shown] == [(topic, 0, i) for i in range(3)]

    def described() -> str | None:
        done = cli(topics, "describe", "job", "seen")
        return done.stdout if done.returncode == 0 and "lag 0 records" in done.stdout else None
    out = eventually(described, 30, message="describe job shows the trigger caught up")
    assert "records of " + topic in out and "positions 0:3" in out
    write(topics, topic, 3, 2)  # two of the next batch of three: they wait
    out = eventually(lambda: (d := cli(topics, "describe", "job", "seen")).returncode == 0
                     and "lag 2 records" in d.stdout and d.stdout, 30,
                     message="describe job shows the records waiting for a run")


def test_a_retry_of_an_event_run_sees_the_same_records(processes: Processes, topics: Settings) -> None:
    topic = source_topic(topics, partitions=1)
    processes.system()
    produce_json(topics, topics.topics.job_definitions, "flaky", {
        **event_job("flaky", topic, batch={"max_events": 2, "max_wait_seconds": 30}, start="earliest"),
        "max_retries": 1, "retry_delay_seconds": 0, "params": {"fail_before_attempt": 2}})
    write(topics, topic, 0, 2)

    def finished() -> list[Any]:
        return sql(topics.database_url, "SELECT attempt_number, status, result FROM job_executions "
                                        "WHERE job_id = 'flaky' AND status = 'COMPLETED'")
    (row,) = eventually(finished, 60, message="the retry completed")
    result = json.loads(row["result"]) if isinstance(row["result"], str) else row["result"]
    assert row["attempt_number"] == 2 and result["attempt"] == 2
    assert [e["offset"] for e in result["events"]] == [0, 1]


def test_a_paused_job_holds_its_records_and_a_deleted_one_lets_them_go(
    processes: Processes, topics: Settings,
) -> None:
    topic = source_topic(topics)
    scheduler = processes.start("scheduler", "--instance-id", "s1", name="scheduler")
    scheduler.wait_for_log("action=scheduler_ready")
    job = event_job("held", topic)
    produce_json(topics, topics.topics.job_definitions, "held", job)
    trigger_started([scheduler], "held")
    write(topics, topic, 0, 4)
    eventually(lambda: set(numbers(event_runs(topics, "held"))) == set(range(4)), 30,
               message="runs before the pause")

    produce_json(topics, topics.topics.job_definitions, "held", {**job, "enabled": False})
    scheduler.wait_for_log("action=trigger_held")
    write(topics, topic, 4, 4)
    time.sleep(2)  # a window in which an unpaused trigger would have run them
    assert set(numbers(event_runs(topics, "held"))) == set(range(4)), "a paused job runs nothing"
    produce_json(topics, topics.topics.job_definitions, "held", job)
    eventually(lambda: set(numbers(event_runs(topics, "held"))) == set(range(8)), 30,
               message="the held records run on resume")
    assert_each_once(event_runs(topics, "held"), set(range(8)))

    produce(topics, topics.topics.job_definitions, b"held", None)
    scheduler.wait_for_log("action=trigger_removed")
    write(topics, topic, 8, 3)  # while the job does not exist: let go
    produce_json(topics, topics.topics.job_definitions, "held", job)
    trigger_started([scheduler], "held", count=3)
    write(topics, topic, 11, 2)
    eventually(lambda: set(numbers(event_runs(topics, "held"))) >= {11, 12}, 30,
               message="the new job's records run")
    assert_each_once(event_runs(topics, "held"), set(range(8)) | {11, 12})


def test_a_job_triggered_by_another_jobs_outcome(processes: Processes, topics: Settings) -> None:
    """The recipe of docs/reference/semantics.md#event-triggers: a trigger on
    `<prefix>execution-events` filtered on the upstream's job_id and status."""
    processes.system()
    produce_json(topics, topics.topics.job_definitions, "after-etl", {
        "job_id": "after-etl", "type": "EVENT", "handler": "test.events",
        "event": {"topic": topics.topics.execution_events,
                  "filter": 'value.job_id == "etl" and value.status == "COMPLETED"'}})
    trigger_started(processes.started, "after-etl")
    produce_json(topics, topics.topics.job_definitions, "etl", {
        "job_id": "etl", "type": "INTERVAL", "interval_seconds": 1, "handler": "test.context",
        "max_runs": 2})

    def completed() -> list[Any]:
        rows = sql(topics.database_url, "SELECT result FROM job_executions WHERE job_id = 'after-etl' "
                                        "AND status = 'COMPLETED'")
        return rows if len(rows) >= 2 else []
    rows = eventually(completed, 60, message="a run after each completed etl run")
    seen = [json.loads(r["result"]) if isinstance(r["result"], str) else r["result"] for r in rows]
    statuses = [(e["value"]["job_id"], e["value"]["status"]) for s in seen for e in s["events"]]
    assert statuses == [("etl", "COMPLETED"), ("etl", "COMPLETED")]


def test_without_the_trigger_state_topic_the_clock_runs_and_triggers_stay_off(
    settings: Settings, tmp_path: Path,
) -> None:
    """A deployment made before event triggers, not yet `init`ed again."""
    ensure_topics(settings, [s for s in settings.topics.specs() if s.name != settings.topics.trigger_state])
    processes = Processes(settings, tmp_path)
    try:
        scheduler = processes.start("scheduler", "--instance-id", "s1", name="scheduler")
        scheduler.wait_for_log("action=triggers_disabled")
        produce_json(settings, settings.topics.job_definitions, "orders",
                     event_job("orders", settings.topics.execution_events))
        produce_json(settings, settings.topics.job_definitions, "tick", {
            "job_id": "tick", "type": "INTERVAL", "interval_seconds": 1, "handler": "noop"})
        eventually(lambda: any(d.job_id == "tick" for d in (
            JobDue.model_validate_json(value(m)) for m in read_all(settings, settings.topics.job_due))),
            30, message="the clock fires")
        assert scheduler.alive() and "action=leader_stepped_down" not in scheduler.log()
    finally:
        processes.stop_all()
