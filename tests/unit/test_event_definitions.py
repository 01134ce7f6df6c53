"""EVENT job definitions (docs/reference/semantics.md#event-triggers, docs/decisions/0057): what validates, what is refused
and with which field named, and the JobDue of an event trigger's run."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from cronstream.definitions import parse_definitions
from cronstream.errors import DefinitionError
from cronstream.services.dispatcher.policy import NEW_RUN_REASONS
from cronstream.shared.fast_records import decode_due, decode_event
from cronstream.shared.records import ExecutionEvent, JobDefinition, JobDue, TriggerEvent

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def event_job(**fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"job_id": "on-orders", "type": "EVENT", "handler": "h",
                            "event": {"topic": "shop.orders"}}
    data.update(fields)
    return data


def refused(data: dict[str, Any]) -> tuple[list[str | None], str]:
    with pytest.raises(DefinitionError) as caught:
        parse_definitions([data])
    return [p.field for p in caught.value.problems], str(caught.value)


def test_an_event_job_takes_its_defaults() -> None:
    (d,) = parse_definitions([event_job()])
    assert d.type == "EVENT" and d.event is not None
    assert (d.event.topic, d.event.filter, d.event.start) == ("shop.orders", None, "latest")
    assert (d.event.batch.max_events, d.event.batch.max_wait_seconds) == (1, 0)


def test_an_event_job_with_everything_set_validates_and_survives_the_wire() -> None:
    d = JobDefinition.from_dict(event_job(event={
        "topic": "cronstream.execution-events",
        "filter": 'value.job_id == "etl" and value.status == "COMPLETED"',
        "batch": {"max_events": 100, "max_wait_seconds": 2.5}, "start": "earliest"},
        max_retries=2, concurrency_policy="FORBID", priority="high"))
    assert JobDefinition.model_validate_json(d.to_json()) == d


@pytest.mark.parametrize(("fields", "field", "reason"), [
    ({"event": {"topic": "t", "filter": "value.x =="}}, "event.filter", "invalid filter"),
    ({"event": {"topic": "t", "filter": "job.result == 1"}}, "event.filter", "a filter reads key, value"),
    ({"event": {"topic": "t", "batch": {"max_events": 0}}}, "event.batch.max_events", "greater than or equal to 1"),
    ({"event": {"topic": "t", "batch": {"max_events": 10_001}}}, "event.batch.max_events", "10000"),
    ({"event": {"topic": "t", "batch": {"max_wait_seconds": 3601}}}, "event.batch.max_wait_seconds", "3600"),
    ({"event": {"topic": "t", "start": "beginning"}}, "event.start", "'latest' or 'earliest'"),
    ({"event": {"topic": "no spaces"}}, "event.topic", "pattern"),
    ({"event": {"topic": "t", "topics": ["a"]}}, "event.topics", "Extra inputs"),
])
def test_a_bad_trigger_is_refused_naming_its_field(fields: dict[str, Any], field: str, reason: str) -> None:
    fields_named, message = refused(event_job(**fields))
    assert field in fields_named
    assert reason in message


@pytest.mark.parametrize(("data", "reason"), [
    (event_job(event=None), "event is required for type EVENT"),
    ({"job_id": "j", "type": "CRON", "schedule": "* * * * *", "handler": "h",
      "event": {"topic": "t"}}, "event: only for type EVENT, not CRON"),
    (event_job(schedule="* * * * *"), "schedule is only allowed for type CRON"),
    (event_job(jitter_seconds=5), "jitter_seconds: not for type EVENT"),
    (event_job(start_at="2026-01-01T00:00:00Z"), "start_at: not for type EVENT"),
    (event_job(calendar="work"), "calendar: only for types CRON and INTERVAL"),
    (event_job(depends_on=["x"]), "depends_on is only allowed for type DEPENDENT"),
])
def test_fields_of_other_types_are_refused_with_the_reason(data: dict[str, Any], reason: str) -> None:
    assert reason in refused(data)[1]


def events(n: int, first_offset: int = 7) -> list[TriggerEvent]:
    return [TriggerEvent(topic="shop.orders", partition=1, offset=first_offset + i, timestamp=T0,
                         key="k", value={"n": i}, headers={"h": "v"}) for i in range(n)]


def test_the_run_of_a_batch_is_named_by_its_first_record_and_its_retries_keep_the_records() -> None:
    (d,) = parse_definitions([event_job()])
    due = JobDue.event(d, events(3), T0, definition_offset=4)
    assert due.reason == "EVENT" and due.job.events == events(3)
    assert due.job.definition_offset == 4
    assert JobDue.event(d, events(3), T0.replace(hour=13)).execution_id == due.execution_id
    assert JobDue.event(d, events(3, first_offset=8), T0).execution_id != due.execution_id
    retry = due.next_attempt(T0)
    assert retry.run_id == due.run_id and retry.job.events == due.job.events


def test_a_job_due_with_events_reads_back_through_the_model() -> None:
    (d,) = parse_definitions([event_job()])
    due = JobDue.event(d, events(2), T0)
    read = decode_due(due.to_json(), b"on-orders")
    assert isinstance(read, JobDue) and read == due


def test_the_dispatcher_admits_an_event_run_as_a_new_run() -> None:
    assert "EVENT" in NEW_RUN_REASONS


def test_a_requeue_rebuilt_from_the_projected_snapshot_runs_with_the_same_records() -> None:
    from cronstream.services.monitor.outbound import Outbound

    (d,) = parse_definitions([event_job()])
    due = JobDue.event(d, events(2), T0)
    queued = ExecutionEvent.for_due(due, "QUEUED", reason="EVENT", job=due.job)
    read = decode_event(queued.to_json(), b"on-orders")  # the monitor's read of it
    assert read.job is not None and read.job.events == events(2)
    row = {"job": read.job.to_json().decode(), "execution_id": due.execution_id, "job_id": due.job_id,
           "run_id": due.run_id, "scheduled_at": due.scheduled_at, "attempt_number": 1,
           "reason": "EVENT", "delivery": 1, "idempotency_key": due.idempotency_key}
    again = Outbound.due_of(row).next_delivery()
    assert again.job.events == events(2) and again.delivery == 2
