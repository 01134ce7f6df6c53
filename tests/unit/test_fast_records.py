"""The fast decoders (the monitor's of events, the dispatcher's of JobDue records) against
the models they stand in for: the same fields in the same order with the same defaults,
equal values for what both accept, and never an accept where the model refuses — over
valid records and thousands of mutated ones."""

from __future__ import annotations

import copy
import json
import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, get_args

import msgspec
import pytest

from cronstream.shared.codec import DecodeError, decode
from cronstream.shared.fast_records import (
    FAST_STATUSES,
    FastDue,
    FastEvent,
    FastSnapshot,
    as_model,
    decode_due,
    decode_event,
)
from cronstream.shared.records import DueReason, ExecutionEvent, JobDue, JobSnapshot

STATUSES = ["QUEUED", "RUNNING", "PROGRESS", "COMPLETED", "FAILED", "SKIPPED", "REQUEUED"]


def _defaults(model: Any) -> dict[str, Any]:
    return {name: (info.default_factory() if info.default_factory else info.default)
            for name, info in model.model_fields.items() if not info.is_required()}


def _struct_defaults(struct: Any) -> dict[str, Any]:
    info = msgspec.structs.fields(struct)
    return {f.name: (f.default_factory() if f.default_factory is not msgspec.NODEFAULT else f.default)
            for f in info if f.required is False}


@pytest.mark.parametrize(("struct", "model"), [(FastEvent, ExecutionEvent), (FastSnapshot, JobSnapshot),
                                               (FastDue, JobDue)])
def test_the_fast_records_have_the_models_fields_order_and_defaults(struct: Any, model: Any) -> None:
    fields = msgspec.structs.fields(struct)
    assert [f.name for f in fields] == list(model.model_fields)
    assert {f.name for f in fields if f.required} == {
        name for name, info in model.model_fields.items() if info.is_required()}
    assert _struct_defaults(struct) == _defaults(model)


def _event(rng: random.Random, status: str) -> dict[str, Any]:
    now = datetime(2026, rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 23),
                   rng.randint(0, 59), rng.randint(0, 59), rng.choice([0, 1000, 123456]), tzinfo=UTC)
    event: dict[str, Any] = {
        "schema_version": 1, "event_id": str(uuid.uuid4()), "execution_id": str(uuid.uuid4()),
        "job_id": rng.choice(["job", "a.b-c_d", "X" * 128]), "run_id": str(uuid.uuid4()),
        "status": status, "attempt_number": rng.randint(1, 1000),
        "scheduled_at": now.isoformat().replace("+00:00", "Z"),
        "occurred_at": (now + timedelta(milliseconds=rng.randint(0, 5000))).isoformat(),
        "delivery": rng.randint(1, 1_000_000),
    }
    if status == "QUEUED":
        event.update(priority=rng.choice(["high", "normal", "low"]), queue="default",
                     reason=rng.choice(["SCHEDULE", "RETRY", "REQUEUE"]),
                     idempotency_key=rng.choice(["k", 'quoted "key" é']),
                     job={"handler": rng.choice(["noop", "a:b.c-d"]), "params": rng.choice(
                         [{}, {"i": 1, "é": [1.5, None, "x\ny"]}]),
                          "timeout_seconds": rng.choice([3600, 0.25]), "max_retries": rng.randint(0, 100),
                          "priority": "low", "queue": "q-1", "concurrency_policy": "FORBID"})
    if status in ("RUNNING", "PROGRESS", "COMPLETED", "FAILED"):
        event.update(worker_id=rng.choice(["w1", "host.example:8080@pod-7"]),
                     started_at=event["occurred_at"])
    if status == "PROGRESS":
        event.update(progress=rng.choice([0, 40.5, 100]), progress_message=rng.choice([None, "half ✓"]))
    if status in ("COMPLETED", "FAILED", "SKIPPED"):
        event.update(completed_at=event["occurred_at"], progress=100.0,
                     result=rng.choice([None, {"rows": 3}, [1, "two"], "x", 2**70, -0.0]),
                     error_message=None if status == "COMPLETED" else "it broke")
    return event


def _same(fast: FastEvent | FastDue, model: ExecutionEvent | JobDue) -> None:
    for name in type(model).model_fields:
        got, want = getattr(fast, name), getattr(model, name)
        if name == "job" and want is not None:
            assert json.loads(got.to_json()) == json.loads(want.to_json())
        elif name == "upstream" and want is not None:
            assert json.loads(msgspec.json.encode(got)) == json.loads(want.model_dump_json())
        else:
            assert (got, type(got)) == (want, type(want)), name
    if isinstance(fast, FastEvent):
        assert fast.terminal == model.terminal  # type: ignore[union-attr]


def test_valid_events_of_every_execution_take_the_fast_path_with_the_models_values() -> None:
    rng = random.Random(18)
    for _ in range(2000):
        status = rng.choice(STATUSES)
        raw = json.dumps(_event(rng, status)).encode()
        key = json.loads(raw)["job_id"].encode()
        model = decode(ExecutionEvent, raw, key=key, key_field="job_id")
        got = decode_event(raw, key)
        if status in FAST_STATUSES:
            assert isinstance(got, FastEvent), status
            _same(got, model)
        else:
            assert isinstance(got, ExecutionEvent) and got == model


NASTY: list[Any] = [
    None, "", " ", "x" * 300, "x" * 9000, "job\n", "a b", "é", 0, -1, 1, 1.0, 1.5, 101, 1001,
    2**64, True, False, [], {}, [1], "NaN", "1", "QUEUED", "queued", "normal", "HIGH",
    str(uuid.uuid4()).upper(), uuid.uuid4().hex, "{" + str(uuid.uuid4()) + "}",
    "urn:uuid:" + str(uuid.uuid4()), str(uuid.uuid4())[:-1], "00000000-0000-0000-0000-000000000000",
    "2026-01-01T00:00:00Z", "2026-01-01T00:00:00+02:00", "2026-01-01T00:00:00-00:00",
    "2026-01-01 00:00:00Z", "2026-01-01T00:00:00", "1969-12-31T23:59:59Z", "1970-01-01T00:00:00Z",
    "2999-12-31T23:59:59Z", "3000-01-01T00:00:00Z", "2026-01-01T00:00:60Z", "2026-01-01t00:00:00z",
    "2026-01-01T00:00:00.1234567Z", "2026-01-01T00:00:00.123456789Z", "2026-13-01T00:00:00Z",
    "2026-01-01T24:00:00Z", "2026-01-01", "2026-01-01T00:00Z", "2026-W01-1T00:00:00Z",
    1_700_000_000, 1_700_000_000.5, "1700000000", {"handler": "noop"},
    {"handler": "noop", "extra": 1}, {"handler": "bad name"}, {"handler": "noop", "params": []},
    {"handler": "noop", "timeout_seconds": 0}, {"handler": "noop", "priority": None},
    {"params": {}}, "w1\n", "host@pod:1", "q.1", "q_1-x",
]
FIELDS = [*ExecutionEvent.model_fields, "unknown_field", "job.handler", "job.params",
          "job.timeout_seconds", "job.queue", "job.extra"]


def _mutate(rng: random.Random, event: dict[str, Any], fields: list[str] = FIELDS) -> bytes:
    event = json.loads(json.dumps(event))
    for _ in range(rng.choice([1, 1, 1, 2])):
        name = rng.choice(fields)
        value = rng.choice(NASTY)
        target = event
        if "." in name:
            outer, name = name.split(".", 1)
            if not isinstance(event.get(outer), dict):
                event[outer] = {"handler": "noop"} if outer == "job" else {}
            target = event[outer]
        if rng.random() < 0.15:
            target.pop(name, None)
        else:
            target[name] = copy.deepcopy(value)  # a NASTY dict set twice would nest in itself
    raw = json.dumps(event)
    if rng.random() < 0.05:  # a duplicate key, the later one different
        raw = raw[:-1] + ', "status": "COMPLETED"}'
    return raw.encode()


REASONS = list(get_args(DueReason))


def _job_due(rng: random.Random) -> dict[str, Any]:
    queued = _event(rng, "QUEUED")
    due = {name: queued[name] for name in (
        "schema_version", "execution_id", "job_id", "run_id", "scheduled_at", "attempt_number",
        "delivery", "idempotency_key", "job")}
    due["reason"] = rng.choice(REASONS)
    if rng.random() < 0.3:
        due["approved_by"] = rng.choice(["alice@example.com", "ui/token"])
    if rng.random() < 0.3:
        due["triggered_by"] = rng.choice(["alice@host", "ui/token", "é" * 256])
    if rng.random() < 0.4:  # a DAG step's view of its run
        due["upstream"] = {
            "root_params": rng.choice([{}, {"region": "eu", "n": [1, None]}]),
            "executions": {rng.choice(["extract", "a.b-c_d"]): {
                "execution_id": str(uuid.uuid4()),
                "status": rng.choice(["COMPLETED", "SKIPPED", "PERMANENTLY_FAILED"]),
                "result": rng.choice([None, {"rows": 3}, [1, "two"], 2**70]),
                "result_omitted": rng.choice([False, True])}}}
    return due


def test_valid_job_dues_take_the_fast_path_with_the_models_values() -> None:
    rng = random.Random(16)
    for _ in range(2000):
        raw = json.dumps(_job_due(rng)).encode()
        key = json.loads(raw)["job_id"].encode()
        got = decode_due(raw, key)
        assert isinstance(got, FastDue)
        model = decode(JobDue, raw, key=key, key_field="job_id")
        _same(got, model)
        # What a requeue or a retry builds from: the model again, equal.
        assert as_model(got) == model and as_model(model) is model


DUE_FIELDS = [*JobDue.model_fields, "unknown_field", "job.handler", "job.params",
              "job.timeout_seconds", "job.queue", "job.extra", "job.max_concurrent_runs",
              "job.definition_offset", "upstream.root_params", "upstream.executions",
              "upstream.extra"]


# name: (model, fast decoder, fast record, a valid record, the fields to mutate, seed)
MUTATED: dict[str, tuple[Any, Any, Any, Any, list[str], int]] = {
    "events": (ExecutionEvent, decode_event, FastEvent,
               lambda rng: _event(rng, rng.choice(STATUSES)), FIELDS, 180),
    "job_dues": (JobDue, decode_due, FastDue, _job_due, DUE_FIELDS, 1600),
}


@pytest.mark.parametrize("kind", MUTATED)
def test_no_mutated_record_is_accepted_by_the_fast_path_where_the_model_refuses_it(kind: str) -> None:
    model_type, fast_decode, fast_type, valid, fields, seed = MUTATED[kind]
    rng = random.Random(seed)
    fast_accepts = model_refusals = 0
    for i in range(6000):
        raw = _mutate(rng, valid(rng), fields)
        key = rng.choice([b"job", b"a.b-c_d", b"X" * 128, None]) if i % 10 == 0 else \
            str(json.loads(raw).get("job_id")).encode()
        try:
            model = decode(model_type, raw, key=key, key_field="job_id")
        except DecodeError as refused:
            model_refusals += 1
            with pytest.raises(DecodeError) as also:
                fast_decode(raw, key)
            assert str(also.value) == str(refused), raw
            continue
        got = fast_decode(raw, key)
        if isinstance(got, fast_type):
            fast_accepts += 1
            _same(got, model)
        else:
            assert got == model
    # The mutations reach both sides: many refused, many taken by the fast path.
    assert model_refusals > 1000 and fast_accepts > 500, (model_refusals, fast_accepts)
