"""The events every execution goes through — the dispatcher's QUEUED, the worker's RUNNING
and COMPLETED — rendered without the model, are byte for byte what the model writes, for
any job id, time, attempt, delivery, queue, snapshot and result."""

from __future__ import annotations

import json
import math
import os
import random
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from cronstream.services.worker.runner import returned
from cronstream.shared.fast_records import FastDue, decode_due
from cronstream.shared.ids import fast_uuid4, fast_uuid7, new_event_id
from cronstream.shared.records import ExecutionEvent, JobDue, render_event

RESULTS: list[Any] = [
    None, True, 0, -7, 2**70, 0.1, 1e-7, 1.5e300, "", "plain", 'quote " back \\ slash',
    "tab\tnew\nline \x00 \u2028 é ✓ 𝄞", [1, "two", None, [3.25]], {"nested": {"k": [1, 2]}},
    {"é": "ü", "": 0}, {"tuple": (1, 2)}, {"bool": False, "float": -0.0},
]


def _due(rng: random.Random) -> JobDue:
    offset = timezone(timedelta(hours=rng.choice([0, 2, -5])))
    scheduled = datetime(2026, rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 23),
                         rng.randint(0, 59), rng.randint(0, 59),
                         rng.choice([0, 1000, 123456]), tzinfo=offset)
    raw: dict[str, Any] = {
        "execution_id": str(uuid.uuid4()), "job_id": rng.choice(["job", "a.b-c_d", "X" * 128]),
        "run_id": str(uuid.uuid4()), "scheduled_at": scheduled.isoformat(),
        "reason": rng.choice(["SCHEDULE", "RETRY", "MANUAL", "REQUEUE"]),
        "attempt_number": rng.randint(1, 1000), "delivery": rng.randint(1, 1_000_000),
        "idempotency_key": rng.choice(["k", 'quoted "key" é']),
        "approved_by": rng.choice([None, "alice", "policy \\ ✓"]),
        "triggered_by": rng.choice([None, "bob@host", 'ui/"token" ✓']),
        "job": {"handler": "noop", "queue": rng.choice(["default", "q-1_x"]),
                "priority": rng.choice(["high", "normal", "low"]),
                "params": rng.choice([{}, {"i": 1, "é": [1.5, None, "x\ny"]}]),
                "timeout_seconds": rng.choice([3600, 0.25]), "max_retries": rng.randint(0, 100),
                "max_concurrent_runs": rng.choice([None, 1, 3]),
                "definition_offset": rng.choice([None, 0, 12345])},
    }
    if rng.random() < 0.2:
        raw["job"]["from_a_newer_version"] = {"kept": True}  # extra fields travel on
    return JobDue.model_validate_json(json.dumps(raw))


def test_running_and_completed_events_render_as_the_model_writes_them() -> None:
    rng = random.Random(16)
    for i in range(300):
        due = _due(rng)
        event_id = str(uuid.uuid4())
        occurred = datetime.now(UTC) + timedelta(microseconds=rng.choice([0, 1, 999_999]) * i)
        started = occurred.replace(microsecond=0) if i % 3 == 0 else occurred
        worker = rng.choice(["w1", "host.example:8080@pod-7"])
        running = render_event(due, "RUNNING", event_id, occurred, worker_id=worker,
                               started_at=started)
        assert running == ExecutionEvent.for_due(
            due, "RUNNING", event_id=uuid.UUID(event_id), occurred_at=occurred, worker_id=worker,
            started_at=started).to_json()
        result = RESULTS[i % len(RESULTS)]
        assert returned(result, cancelled=False).status == "COMPLETED"
        completed_at = started + timedelta(milliseconds=i)
        completed = render_event(due, "COMPLETED", event_id, occurred, worker_id=worker,
                                 started_at=started, completed_at=completed_at, result=result,
                                 progress=100.0, priority=due.job.priority, queue=due.job.queue)
        model = ExecutionEvent.for_due(
            due, "COMPLETED", event_id=uuid.UUID(event_id), occurred_at=occurred, worker_id=worker,
            started_at=started, completed_at=completed_at, result=result, progress=100.0,
            priority=due.job.priority, queue=due.job.queue)
        assert completed == model.to_json(), result
        assert ExecutionEvent.model_validate_json(completed) == ExecutionEvent.model_validate_json(
            model.to_json())


def test_queued_events_render_as_the_model_writes_them() -> None:
    rng = random.Random(9)
    fast_renders = 0
    for _ in range(300):
        due = _due(rng)
        event_id, occurred = str(uuid.uuid4()), datetime.now(UTC)
        job = due.job
        rendered = render_event(due, "QUEUED", event_id, occurred, priority=job.priority,
                                queue=job.queue, reason=due.reason,
                                idempotency_key=due.idempotency_key, job=job,
                                approved_by=due.approved_by, triggered_by=due.triggered_by)
        assert rendered == ExecutionEvent.for_due(
            due, "QUEUED", event_id=uuid.UUID(event_id), occurred_at=occurred, priority=job.priority,
            queue=job.queue, reason=due.reason, idempotency_key=due.idempotency_key, job=job,
            approved_by=due.approved_by, triggered_by=due.triggered_by).to_json()
        # The dispatcher renders from the fast record of the JobDue's bytes (one with
        # fields of a newer version stays the model): the same.
        fast = decode_due(due.to_json(), due.job_id.encode())
        if not isinstance(fast, FastDue):
            assert fast == due and due.job.model_extra
            continue
        fast_renders += 1
        assert render_event(fast, "QUEUED", event_id, occurred, priority=fast.job.priority,
                            queue=fast.job.queue, reason=fast.reason,
                            idempotency_key=fast.idempotency_key, job=fast.job,
                            approved_by=fast.approved_by, triggered_by=fast.triggered_by) == rendered
    assert fast_renders > 200


def test_a_result_json_cannot_hold_is_refused_before_it_is_rendered() -> None:
    assert returned({"when": datetime.now(UTC)}, cancelled=False).status == "FAILED"
    assert returned("x" * 70_000, cancelled=False).status == "FAILED"
    assert returned(math.pi, cancelled=False).status == "COMPLETED"


def test_fast_random_ids_are_version_4_uuids() -> None:
    ids = {fast_uuid4() for _ in range(1000)}
    assert len(ids) == 1000
    for value in ids:
        parsed = uuid.UUID(value)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, value)


def test_event_ids_are_version_7_uuids_in_the_order_they_were_made() -> None:
    before = time.time_ns() // 1_000_000
    first = [fast_uuid7() for _ in range(1000)]
    last_ms = max(uuid.UUID(value).int >> 80 for value in first)
    while time.time_ns() // 1_000_000 <= last_ms:
        pass  # into a later millisecond than any of them
    later = fast_uuid7()
    after = time.time_ns() // 1_000_000
    assert len(set(first)) == 1000
    for value in [*first, later]:
        parsed = uuid.UUID(value)
        assert (parsed.version, parsed.variant, str(parsed)) == (7, uuid.RFC_4122, value)
        assert before <= parsed.int >> 80 <= after, "the first 48 bits are Unix milliseconds"
    assert all(uuid.UUID(value).bytes < uuid.UUID(later).bytes for value in first)
    assert new_event_id().version == 7


def test_event_ids_do_not_follow_the_random_module_or_repeat_in_a_forked_child() -> None:
    # An inline handler runs in the worker's process: seeding `random` there must not make
    # two workers (or two runs) write the same event ids.
    random.seed(42)
    first = fast_uuid7()
    random.seed(42)
    assert fast_uuid7()[14:] != first[14:], "the random part follows random.seed"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.write(write, " ".join(fast_uuid7() for _ in range(100)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        theirs = {value[14:] for value in pipe.read().split()}
    ours = {fast_uuid7()[14:] for _ in range(100)}
    assert len(theirs) == 100 and not theirs & ours, "a forked child repeats its parent's ids"
