"""Settings from the environment, the retry policy, and the pinned public API."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

import cronstream
from cronstream.shared.records import JobDue, JobSnapshot
from cronstream.shared.retry import attempts_left, next_attempt, retry_delay
from cronstream.shared.settings import Settings, SettingsError


def test_settings_read_the_environment_and_pass_librdkafka_properties_through() -> None:
    s = Settings.from_env(environ={
        "CRONSTREAM_KAFKA_BOOTSTRAP_SERVERS": "k1:9092,k2:9092",
        "CRONSTREAM_WORKER_CONCURRENCY": "16",
        "CRONSTREAM_WORKER_QUEUES": "default,gpu",
        "CRONSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "CRONSTREAM_KAFKA_SASL_PASSWORD": "hunter2",
        "CRONSTREAM_DATABASE_URL": "postgresql://u:secret@db:5432/x",
    }, overrides={"worker_concurrency": 4})
    assert s.kafka_bootstrap_servers == "k1:9092,k2:9092"
    assert s.worker_concurrency == 4, "flags win over the environment"
    assert s.worker_queues == ["default", "gpu"]
    assert s.kafka_config == {"security.protocol": "SASL_SSL", "sasl.password": "hunter2"}
    shown = str(s.redacted())
    assert "hunter2" not in shown and "secret" not in shown


def test_invalid_settings_name_the_variable() -> None:
    with pytest.raises(SettingsError, match="CRONSTREAM_WORKER_CONCURRENCY"):
        Settings.from_env(environ={"CRONSTREAM_WORKER_CONCURRENCY": "lots"})


def due(attempt: int, max_retries: int, delay: float = 1.0, cap: float = 3600) -> JobDue:
    return JobDue(execution_id=uuid.uuid4(), job_id="j", run_id=uuid.uuid4(),
                  scheduled_at=datetime(2026, 1, 1, tzinfo=UTC), attempt_number=attempt,
                  reason="SCHEDULE", idempotency_key="k",
                  job=JobSnapshot(handler="fail", max_retries=max_retries,
                                  retry_delay_seconds=delay, max_retry_delay_seconds=cap))


def test_backoff_doubles_with_jitter_and_is_capped() -> None:
    rng = random.Random(7)
    for attempt, (low, high) in {1: (0.8, 1.2), 2: (1.6, 2.4), 3: (3.2, 4.8)}.items():
        delays = [retry_delay(due(attempt, 5).job, attempt, rng) for _ in range(500)]
        assert low <= min(delays) and max(delays) <= high
        assert max(delays) - min(delays) > 0.3 * (high - low), "jitter spreads"
    assert retry_delay(due(10, 20, cap=30).job, 10, rng) == 30


def test_next_attempt_keeps_run_and_key_and_is_deterministic() -> None:
    first = due(1, 2)
    failed_at = datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
    a = next_attempt(first, failed_at, random.Random(1))
    b = next_attempt(first, failed_at, random.Random(2))
    assert a.execution_id == b.execution_id != first.execution_id
    assert (a.attempt_number, a.run_id, a.idempotency_key, a.reason) == (2, first.run_id, "k", "RETRY")
    assert failed_at + timedelta(seconds=0.8) <= a.due_at <= failed_at + timedelta(seconds=1.2)
    assert attempts_left(due(2, 2)) and not attempts_left(due(3, 2))


def test_public_api_is_pinned() -> None:
    assert sorted(cronstream.__all__) == [
        "AsyncClient", "Calendar", "Client", "Context", "CronstreamError", "DefinitionError", "Execution",
        "ExecutionEvent", "JobDefinition", "LogEntry", "NonRetryableError", "NotFoundError",
        "UnavailableError", "events", "handler"]
    assert all(hasattr(cronstream, name) for name in cronstream.__all__)
    assert cronstream.events.__all__ == ["ExecutionEvent", "Subscription", "subscribe"]
