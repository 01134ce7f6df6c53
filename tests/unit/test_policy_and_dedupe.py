"""The dispatcher's pure cores: concurrency policies and the memory of queued dues."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

from cronstream.services.dispatcher.dedupe import KEY_PREFIX, SeenDues
from cronstream.services.dispatcher.policy import PolicyState
from cronstream.shared.ids import retry_execution_id
from cronstream.shared.records import ExecutionEvent, JobDue

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def due(policy: str = "FORBID", reason: str = "SCHEDULE", max_retries: int = 0, **fields: Any) -> JobDue:
    values: dict[str, Any] = {
        "execution_id": uuid4(), "job_id": "j", "run_id": uuid4(), "scheduled_at": T0,
        "attempt_number": 1, "reason": reason, "idempotency_key": "k",
        "job": {"handler": "noop", "concurrency_policy": policy, "max_retries": max_retries},
    }
    values.update(fields)
    return JobDue.model_validate(values, strict=False)


def event(d: JobDue, status: str, **fields: Any) -> ExecutionEvent:
    return ExecutionEvent.for_due(d, status, **fields)  # type: ignore[arg-type]


def test_allow_always_queues_and_tracks_nothing() -> None:
    state = PolicyState()
    first = due("ALLOW")
    assert state.decide(first) == "QUEUE"
    state.queued(first, 0)
    assert state.jobs == {}
    assert state.decide(due("ALLOW")) == "QUEUE"


def test_forbid_skips_while_the_previous_run_is_not_terminal() -> None:
    state = PolicyState()
    first = due()
    state.queued(first, 2)
    assert state.decide(due()) == "SKIP"
    state.observe(event(first, "RUNNING"), 2)
    assert state.decide(due()) == "SKIP"
    state.observe(event(first, "COMPLETED"), 2)
    assert state.decide(due()) == "QUEUE"
    assert [(job, partition, value) for job, partition, value in state.drain_dirty()] == [("j", 2, None)]


def test_forbid_holds_while_a_retry_is_pending_and_its_events_take_over() -> None:
    state = PolicyState()
    first = due(max_retries=1)
    state.queued(first, 0)
    state.observe(event(first, "FAILED"), 0)
    assert state.decide(due()) == "SKIP", "a failed attempt with a retry pending keeps the run alive"
    retry_id = retry_execution_id("j", first.run_id, 2)
    retry = due(max_retries=1, reason="RETRY", execution_id=retry_id, run_id=first.run_id,
                attempt_number=2)
    assert state.decide(retry) == "QUEUE", "the retry continues an admitted run"
    state.queued(retry, 0)
    state.observe(event(retry, "FAILED"), 0)  # the last attempt: no more retries
    assert state.decide(due()) == "QUEUE"


def test_a_cancelled_pending_retry_releases_forbid() -> None:
    state = PolicyState()
    first = due(max_retries=3)
    state.queued(first, 0)
    state.observe(event(first, "TIMED_OUT"), 0)
    retry = due(execution_id=retry_execution_id("j", first.run_id, 2), run_id=first.run_id,
                attempt_number=2)
    state.observe(event(retry, "CANCELLED"), 0)
    assert state.decide(due()) == "QUEUE"


def test_stale_reports_of_an_older_delivery_are_ignored() -> None:
    state = PolicyState()
    first = due()
    state.queued(first, 0)
    state.observe(event(first, "REQUEUED", delivery=2), 0)
    state.observe(event(first, "COMPLETED", delivery=1), 0)  # the zombie's report
    assert state.decide(due()) == "SKIP"


def test_replace_decides_replace_and_state_survives_a_reload() -> None:
    state = PolicyState()
    first = due("REPLACE")
    state.queued(first, 1)
    assert state.decide(due("REPLACE")) == "REPLACE"
    reloaded = PolicyState()
    for job_id, partition, value in state.drain_dirty():
        reloaded.load(partition, value, job_id)
    assert reloaded.decide(due("REPLACE")) == "REPLACE"


def test_seen_dues_remember_a_delivery_across_a_reload_and_forget_old_ones() -> None:
    seen = SeenDues(limit=10, max_age_ms=1000)
    requeue = due("ALLOW", reason="REQUEUE", delivery=2)
    assert SeenDues.durable(requeue) and not SeenDues.durable(due("ALLOW"))
    seen.remember(requeue)
    assert seen.seen(requeue)
    assert not seen.seen(requeue.model_copy(update={"delivery": 3}))
    key, value = SeenDues.record(requeue, now_ms=5_000)
    fresh = SeenDues(limit=10, max_age_ms=1000)
    fresh.load(key.decode(), value, 0, now_ms=5_500)
    assert fresh.seen(requeue)
    stale = SeenDues(limit=10, max_age_ms=1000)
    stale.load(key.decode(), value, 4, now_ms=7_000)
    assert not stale.seen(requeue) and stale.expired == [(key.decode(), 4)]
    broken = SeenDues()
    broken.load(f"{KEY_PREFIX}not-a-uuid", b"{}", 0, now_ms=0)
    assert broken.expired and len(broken) == 0


def test_seen_dues_are_bounded() -> None:
    seen = SeenDues(limit=3)
    dues = [due("ALLOW", reason="MANUAL") for _ in range(5)]
    for d in dues:
        seen.remember(d)
    assert len(seen) == 3
    assert not seen.seen(dues[0]) and seen.seen(dues[-1])
