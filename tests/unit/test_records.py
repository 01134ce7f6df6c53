"""The record contract: strict, closed, frozen models with errors that name the field."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from cronstream.shared.codec import DecodeError, decode, describe
from cronstream.shared.records import (
    ExecutionEvent,
    JobDefinition,
    JobDue,
    JobSnapshot,
    Record,
    RetryRequest,
    UtcDatetime,
)

BASE = {"job_id": "nightly.report-1", "type": "CRON", "schedule": "0 2 * * *", "handler": "noop"}


def errors_of(data: dict[str, object]) -> str:
    # As people write them (apply, the SDK): closed to unknown fields, as strict as the wire.
    with pytest.raises(ValidationError) as caught:
        JobDefinition.from_dict(data)
    return describe(caught.value)


def test_defaults_follow_the_spec() -> None:
    d = JobDefinition.model_validate_json(json.dumps(BASE))
    assert (d.timezone, d.max_retries, d.retry_delay_seconds, d.max_retry_delay_seconds,
            d.timeout_seconds, d.priority, d.queue, d.concurrency_policy, d.misfire_policy,
            d.misfire_grace_seconds, d.enabled, d.trigger_rule, d.schema_version) == (
        "UTC", 0, 10, 3600, 3600, "normal", "default", "ALLOW", "FIRE_ONCE", 60, True,
        "ALL_SUCCESS", 1)


@pytest.mark.parametrize(("change", "needle"), [
    ({"job_id": "no spaces allowed"}, "job_id: String should match pattern"),
    ({"job_id": "x" * 129}, "job_id"),
    ({"schedule": "* * *"}, "schedule: invalid cron expression"),
    ({"timezone": "Europe/Atlantis"}, "timezone: unknown IANA timezone"),
    ({"schedule": None}, "schedule is required for type CRON"),
    ({"interval_seconds": 5}, "interval_seconds is only allowed for type INTERVAL"),
    ({"type": "INTERVAL", "schedule": None, "interval_seconds": 0}, "interval_seconds: Input should be greater than or equal to 1"),
    ({"type": "INTERVAL", "schedule": None, "interval_seconds": "5"}, "interval_seconds: Input should be a valid integer"),
    ({"type": "ONE_TIME", "schedule": None}, "run_at is required for type ONE_TIME"),
    ({"type": "DEPENDENT", "schedule": None}, "depends_on is required for type DEPENDENT"),
    ({"type": "DEPENDENT", "schedule": None, "depends_on": ["nightly.report-1"]}, "cannot depend on itself"),
    ({"condition": "a.result.x > 1"}, "condition is only allowed for type DEPENDENT"),
    ({"params": {"blob": "x" * 70_000}}, "params: is 70011 bytes of JSON; the limit is 65536"),
    ({"handler": "os.system('rm -rf /')"}, "handler: String should match pattern"),
    ({"priority": "urgent"}, "priority: Input should be 'high', 'normal' or 'low'"),
    ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
    ({"start_at": "2026-01-01T00:00:00"}, "start_at: Input should have timezone info"),
    ({"start_at": "2026-02-01T00:00:00Z", "end_at": "2026-01-01T00:00:00Z"}, "end_at must be later than start_at"),
    ({"max_retries": -1}, "max_retries: Input should be greater than or equal to 0"),
    ({"timeout_seconds": 0}, "timeout_seconds: Input should be greater than 0"),
    ({"enabled": "yes"}, "enabled: Input should be a valid boolean"),
])
def test_invalid_definitions_name_the_field(change: dict[str, object], needle: str) -> None:
    assert needle in errors_of({**BASE, **change})


def test_times_are_utc_and_models_are_frozen() -> None:
    d = JobDefinition.model_validate(
        {**BASE, "start_at": datetime(2026, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))})
    assert d.start_at == datetime(2026, 1, 1, tzinfo=UTC) and d.start_at.tzinfo == UTC
    with pytest.raises(ValidationError):
        d.job_id = "other"  # type: ignore[misc]


def test_job_due_and_retry_request_round_trip() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    due = JobDue(execution_id=uuid.uuid4(), job_id="j", run_id=uuid.uuid4(), scheduled_at=now,
                 reason="SCHEDULE", idempotency_key="k", job=JobSnapshot(handler="noop"))
    assert JobDue.model_validate_json(due.to_json()) == due
    retry = RetryRequest(**due.model_dump(), due_at=now + timedelta(seconds=5))
    assert retry.job_due() == due
    assert json.loads(retry.to_json())["due_at"] == "2026-01-01T00:00:05Z"


def test_event_result_is_limited() -> None:
    fields = dict(event_id=uuid.uuid4(), execution_id=uuid.uuid4(), job_id="j", run_id=uuid.uuid4(),
                  status="COMPLETED", attempt_number=1, scheduled_at=datetime.now(UTC),
                  occurred_at=datetime.now(UTC))
    ExecutionEvent.model_validate({**fields, "result": {"ok": "x" * 1000}})
    with pytest.raises(ValidationError, match="limit is 65536"):
        ExecutionEvent.model_validate({**fields, "result": {"big": "x" * 70_000}})


def test_decode_checks_key_size_and_nulls() -> None:
    raw = json.dumps(BASE).encode()
    assert decode(JobDefinition, raw, key=b"nightly.report-1", key_field="job_id").job_id == BASE["job_id"]
    with pytest.raises(DecodeError, match="does not match job_id"):
        decode(JobDefinition, raw, key=b"other", key_field="job_id")
    with pytest.raises(DecodeError, match="null value"):
        decode(JobDefinition, None)
    with pytest.raises(DecodeError, match="limit"):
        decode(JobDefinition, b" " * 300_000)
    with pytest.raises(DecodeError, match="invalid JobDefinition"):
        decode(JobDefinition, b"\xff\xfe")


def test_one_source_of_statuses_the_wire_the_enum_and_the_sql_guard_agree() -> None:
    import re
    from typing import get_args

    from cronstream.shared.db import query
    from cronstream.shared.records import ExecutionStatus
    from cronstream.shared.statuses import FINAL, TERMINAL, Status

    assert set(get_args(ExecutionStatus)) == {s.value for s in Status}
    assert all(s.__doc__ and len(s.__doc__) > 20 for s in Status), "each status says who moves it"
    guard = query("upsert_executions").split("WHERE je.status NOT IN", 1)[1].split(")", 1)[0]
    assert set(re.findall(r"'([A-Z_]+)'", guard)) == TERMINAL
    assert FINAL < TERMINAL


def test_times_with_another_offset_are_read_as_the_same_instants_in_utc() -> None:
    raw = {"event_id": str(uuid.uuid4()), "execution_id": str(uuid.uuid4()), "job_id": "j",
           "run_id": str(uuid.uuid4()), "status": "COMPLETED", "attempt_number": 1,
           "scheduled_at": "2026-03-29T03:30:00+02:00", "occurred_at": "2026-03-29T01:31:00Z",
           "started_at": "2026-03-28T20:30:30-05:00", "completed_at": None}
    event = ExecutionEvent.model_validate_json(json.dumps(raw))
    assert event.scheduled_at == datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    assert event.started_at == datetime(2026, 3, 29, 1, 30, 30, tzinfo=UTC)
    assert all(t is not None and t.utcoffset() == timedelta(0)
               for t in (event.scheduled_at, event.occurred_at, event.started_at))
    written = json.loads(event.to_json())
    assert (written["scheduled_at"], written["started_at"], written["completed_at"]) == (
        "2026-03-29T01:30:00Z", "2026-03-29T01:30:30Z", None)
    # Built in code too, and on the definitions people write:
    due = JobDue(execution_id=uuid.uuid4(), job_id="j", run_id=uuid.uuid4(), reason="MANUAL",
                 scheduled_at=datetime(2026, 1, 1, 9, tzinfo=timezone(timedelta(hours=9))),
                 idempotency_key="k", job=JobSnapshot(handler="noop"))
    assert due.scheduled_at == datetime(2026, 1, 1, tzinfo=UTC) and due.scheduled_at.utcoffset() == timedelta(0)
    one_time = JobDefinition.from_dict({"job_id": "o", "type": "ONE_TIME", "handler": "noop",
                                        "run_at": "2026-06-01T12:00:00+05:30"})
    assert one_time.run_at == datetime(2026, 6, 1, 6, 30, tzinfo=UTC)


@pytest.mark.parametrize(("value", "needle"), [
    ("2026-01-01T00:00:00", "Input should have timezone info"),
    ("1970-01-01T00:30:00+01:00", "greater than or equal to 1970-01-01"),  # 1969 in UTC
    ("2999-12-31T23:00:00-05:00", "less than or equal to 2999-12-31"),  # 3000 in UTC
])
def test_a_time_is_checked_as_the_instant_it_names(value: str, needle: str) -> None:
    assert needle in errors_of({**BASE, "start_at": value})


def test_a_utc_datetime_the_record_cannot_move_to_utc_is_refused_when_declared() -> None:
    with pytest.raises(TypeError, match="inside a container"):
        class Stamps(Record):  # a list of times: not moved to UTC, so not allowed
            at: list[UtcDatetime]
