"""Compatible evolution (decision 0050): newer minor versions pass, typos in what people
write do not, and an unknown major version is refused with that reason."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from cronstream.shared.codec import DecodeError, decode, describe
from cronstream.shared.records import ExecutionEvent, JobDefinition, JobDue, JobSnapshot, RetryRequest

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)


def event(**more: object) -> dict[str, object]:
    return {"event_id": str(uuid.uuid4()), "execution_id": str(uuid.uuid4()), "job_id": "j",
            "run_id": str(uuid.uuid4()), "status": "COMPLETED", "attempt_number": 1,
            "scheduled_at": "2026-03-01T12:00:00Z", "occurred_at": "2026-03-01T12:00:01Z", **more}


def test_a_newer_minor_version_is_read_and_its_fields_pass_through() -> None:
    raw = json.dumps(event(cost_cents=12, labels={"team": "data"})).encode()
    decoded = decode(ExecutionEvent, raw, key=b"j", key_field="job_id")
    assert decoded.status == "COMPLETED"
    assert decoded.model_extra == {"cost_cents": 12, "labels": {"team": "data"}}
    # Whatever re-publishes the record keeps what it does not understand.
    again = json.loads(decoded.model_copy(update={"worker_id": "w1"}).to_json())
    assert again["cost_cents"] == 12 and again["labels"] == {"team": "data"}


def test_nested_unknown_fields_survive_a_retry_request_becoming_a_job_due() -> None:
    due = {"execution_id": str(uuid.uuid4()), "job_id": "j", "run_id": str(uuid.uuid4()),
           "scheduled_at": "2026-03-01T12:00:00Z", "reason": "RETRY", "idempotency_key": "k",
           "job": {"handler": "noop", "memory_mb": 512}, "due_at": "2026-03-01T12:00:10Z",
           "tenant": "acme"}
    request = RetryRequest.model_validate_json(json.dumps(due))
    out = json.loads(request.job_due().to_json())
    assert out["tenant"] == "acme" and out["job"]["memory_mb"] == 512 and "due_at" not in out


@pytest.mark.parametrize("version", [2, 0, "1", "2.0"])
def test_another_major_version_is_refused_with_that_reason(version: object) -> None:
    raw = json.dumps(event(schema_version=version)).encode()
    with pytest.raises(DecodeError, match=r"unsupported schema_version .*major version 1"):
        decode(ExecutionEvent, raw)


def test_a_record_without_schema_version_is_version_1() -> None:
    assert decode(ExecutionEvent, json.dumps(event()).encode()).schema_version == 1


BASE = {"job_id": "nightly", "type": "ONE_TIME", "handler": "noop"}


def test_from_dict_accepts_iso_strings_and_aware_datetimes() -> None:
    from_text = JobDefinition.from_dict({**BASE, "run_at": "2026-12-01T00:00:00Z"})
    berlin = timezone(timedelta(hours=1))
    from_value = JobDefinition.from_dict({**BASE, "run_at": datetime(2026, 12, 1, 1, tzinfo=berlin)})
    assert from_text == from_value
    assert from_text.run_at == datetime(2026, 12, 1, tzinfo=UTC)


def test_from_dict_refuses_typos_by_name_while_the_wire_accepts_them() -> None:
    data = {**BASE, "run_at": "2026-12-01T00:00:00Z", "max_retry": 3, "params": {"any": "thing"}}
    with pytest.raises(ValidationError) as caught:
        JobDefinition.from_dict(data)
    assert describe(caught.value) == "max_retry: Extra inputs are not permitted"
    assert JobDefinition.model_validate_json(json.dumps(data)).model_extra == {"max_retry": 3}


def test_from_dict_stays_as_strict_as_the_wire() -> None:
    with pytest.raises(ValidationError) as caught:
        JobDefinition.from_dict({**BASE, "run_at": "2026-12-01T00:00:00", "max_retries": "3"})
    problems = describe(caught.value)
    assert "run_at: Input should have timezone info" in problems
    assert "max_retries: Input should be a valid integer" in problems


def test_from_dict_on_nested_records_refuses_nested_typos() -> None:
    due = {"execution_id": str(uuid.uuid4()), "job_id": "j", "run_id": str(uuid.uuid4()),
           "scheduled_at": NOW, "reason": "MANUAL", "idempotency_key": "k",
           "job": {"handler": "noop", "timeout": 5}}
    with pytest.raises(ValidationError, match=r"job\.timeout"):
        JobDue.from_dict(due)
    assert JobDue.from_dict({**due, "job": {"handler": "noop"}}).job == JobSnapshot(handler="noop")
