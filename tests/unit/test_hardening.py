"""One record, one slow call, one bad value never stops a service (issue 9, items 1-4):
dead letters for anything a record raises, bounded copies, deadlines on blocking calls,
limits in the model, suspension instead of a crashed leader, bounded logs, no secrets."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime

import asyncpg
import pytest
from confluent_kafka import KafkaError, KafkaException, Message
from pydantic import ValidationError

from cronstream.services.monitor.housekeeping import Sight
from cronstream.services.scheduler.clock import Clock
from cronstream.shared.codec import DecodeError, decode
from cronstream.shared.condition import ConditionError, parse_condition
from cronstream.shared.inbound import (
    DLQ_ERROR,
    DLQ_ORIGINAL_SIZE,
    DLQ_TRUNCATED,
    MAX_DEAD_LETTER_VALUE,
    SKIP,
    Inbound,
)
from cronstream.shared.kafka.admin import _PENDING, group_members
from cronstream.shared.lanes import CallTimedOut, Lane, abandoned_lanes
from cronstream.shared.logs import MAX_VALUE, LogfmtFormatter, log
from cronstream.shared.records import JobDefinition, JobDue
from cronstream.shared.redaction import redact_url
from cronstream.shared.settings import Settings
from cronstream.shared.topics import Topics

TOPICS = Topics("t.", 3)


def message(value: bytes | None, key: bytes | None = b"j", topic: str = "t.job-due",
            offset: int = 7) -> Message:
    return Message(topic=topic, partition=1, offset=offset, key=key, value=value, headers=[])


def headers(record: object) -> dict[str, bytes]:
    return dict(record.headers)  # type: ignore[attr-defined]


def test_any_failure_while_decoding_dead_letters_the_record_and_names_it() -> None:
    inbound = Inbound("dispatcher", TOPICS)
    bad = [message(b"not json"), message(None), message(json.dumps({"job_id": "j"}).encode()),
           message(b'{"a":' * 100_000 + b"1" + b"}" * 100_000)]
    batch = inbound.batch(bad)
    assert [batch.decode(JobDue, m, key_field="job_id") for m in batch.records] == [None] * 4
    assert len(batch.dead) == 4
    reasons = [headers(r)[DLQ_ERROR].decode() for r in batch.dead]
    assert "invalid JobDue" in reasons[0] and "null value" in reasons[1]
    assert "job_id" in reasons[2] or "execution_id" in reasons[2]
    assert batch.next_offsets == {("t.job-due", 1): 8}


def test_a_reader_whose_policy_is_skip_logs_a_bad_record_and_dead_letters_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inbound = Inbound("analytics", TOPICS, SKIP)
    end = Message(topic="t.job-due", partition=2, offset=9, error=KafkaError(KafkaError._PARTITION_EOF))
    batch = inbound.batch([message(b"not json"), end])
    with caplog.at_level(logging.WARNING):
        assert batch.decode(JobDue, batch.records[0], key_field="job_id") is None
    assert batch.dead == []
    skipped = [r for r in caplog.records if getattr(r, "action", None) == "record_skipped"]
    assert len(skipped) == 1 and "invalid JobDue" in str(skipped[0].__dict__)
    assert batch.ended == {("t.job-due", 2)}, "the end of a partition is told, not a record"
    quiet = Inbound("scheduler", TOPICS).batch([message(b"not json")])
    assert quiet.decode(JobDue, quiet.records[0], reject=False) is None and quiet.dead == []


def test_a_poison_condition_is_a_validation_error_not_a_crash() -> None:
    nested = "(" * 300 + 'a.status == "COMPLETED"' + ")" * 300
    with pytest.raises(DecodeError, match="condition"):
        decode(JobDefinition, json.dumps({
            "job_id": "d", "type": "DEPENDENT", "depends_on": ["a"], "handler": "noop",
            "condition": nested}).encode())
    with pytest.raises(ConditionError, match="deeper than"):
        parse_condition("(" * 40 + "a.status" + ")" * 40, ["a"])
    with pytest.raises(ConditionError, match="tokens"):
        parse_condition(" or ".join(["a.status"] * 200), ["a"])
    assert parse_condition("((a.result.x > 1))", ["a"]).evaluate({"a": {"result": {"x": 2}}})


def test_dead_letter_copies_are_truncated_with_their_original_size() -> None:
    huge = b"x" * (1024 * 1024)
    batch = Inbound("scheduler", TOPICS).batch([message(huge, topic="t.job-definitions")])
    batch.reject(batch.records[0], "too big")
    copy = batch.dead[0]
    assert copy.value is not None and len(copy.value) == MAX_DEAD_LETTER_VALUE
    assert headers(copy)[DLQ_ORIGINAL_SIZE] == str(len(huge)).encode()
    assert headers(copy)[DLQ_TRUNCATED] == b"true"


@pytest.mark.parametrize("field", ["start_at", "end_at"])
def test_datetimes_outside_what_computations_handle_are_refused(field: str) -> None:
    with pytest.raises(ValidationError, match="less than or equal to 2999-12-31"):
        JobDefinition.model_validate_json(json.dumps({
            "job_id": "c", "type": "CRON", "schedule": "0 * * * *", "handler": "noop",
            field: "9999-12-31T23:00:00Z"}))


def test_a_cron_that_never_fires_is_refused_and_a_rare_one_computes_quickly() -> None:
    with pytest.raises(ValidationError, match="never fires"):
        JobDefinition(job_id="c", type="CRON", schedule="0 0 31 2 *", handler="noop")
    rare = JobDefinition(job_id="c", type="CRON", schedule="0 0 29 2 *", handler="noop")
    from cronstream.shared.schedule import next_fire
    started = time.perf_counter()
    fire = next_fire(rare, datetime(2029, 3, 1, tzinfo=UTC))
    assert fire == datetime(2032, 2, 29, tzinfo=UTC)
    assert time.perf_counter() - started < 0.5


def test_a_job_the_clock_cannot_compute_is_suspended_and_the_others_keep_firing() -> None:
    clock = Clock()
    good = JobDefinition(job_id="good", type="INTERVAL", interval_seconds=60, handler="noop")
    clock.apply_definition("good", good, good.to_json(), 1, 0)
    # A record that validated once but no longer does (e.g. written by an older version):
    clock.load_definition("poison", b'{"job_id": "poison", "type": "CRON"}', 2, 0)
    state = {"definition_offset": 1, "next_fire_ms": 60_000, "last_fire_ms": None}
    clock.load_state("poison", json.dumps({**state, "definition_offset": 2}).encode())
    clock.reconcile()
    plan = clock.plan(now_ms=60_000)
    assert {f.job_id for f in plan.dues} == {"good"}
    assert "poison" in clock.suspended
    assert clock.suspensions and clock.suspensions[0][0] == "poison"


def test_a_call_that_hangs_is_given_up_at_its_deadline() -> None:
    lane = Lane("test-hang")
    release = threading.Event()
    before = abandoned_lanes()

    async def main() -> None:
        with pytest.raises(CallTimedOut, match=r"did not return within 0\.2s"):
            await lane.call(release.wait, deadline=0.2)

    started = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - started < 2
    lane.abandon()
    assert abandoned_lanes() == before + 1
    release.set()


def test_asking_a_groups_members_of_an_absent_broker_keeps_each_request_to_its_end() -> None:
    # A coordinator request that times out while the broker is away aborts the process
    # in librdkafka when the broker returns (a scheduler, through a chaos broker restart):
    # the caller stops waiting, the request and its client stay, each call asks anew.
    away = Settings(kafka_bootstrap_servers="127.0.0.1:9")
    before = len(_PENDING)
    for _ in range(2):
        with pytest.raises(KafkaException) as raised:
            group_members(away, "unit-group", timeout=0.2)
        assert raised.value.args[0].code() == KafkaError._TIMED_OUT and raised.value.args[0].retriable()
    assert len(_PENDING) == before + 2 and not any(asked.done() for _client, asked in _PENDING)


def test_log_lines_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    formatter = LogfmtFormatter("test")
    logger = logging.getLogger("bounded")
    with caplog.at_level(logging.INFO, logger="bounded"):
        log(logger, "big", value="x" * 100_000)
    line = formatter.format(caplog.records[-1])
    assert len(line) < MAX_VALUE + 300


def test_no_secret_survives_redaction() -> None:
    url = "postgresql://app:hunter2@db:5432/cronstream?sslpassword=s3cret&sslmode=require"
    shown = redact_url(url)
    assert "hunter2" not in shown and "s3cret" not in shown and "sslmode=require" in shown
    settings = Settings(database_url=url, kafka_config={
        "sasl.password": "p", "sasl.oauthbearer.config": "clientSecret=abc",
        "ssl.key.pem": "-----BEGIN", "sasl.username": "me"})
    text = json.dumps(settings.redacted(), default=str)
    for secret in ("hunter2", "s3cret", "clientSecret=abc", "BEGIN", '"p"'):
        assert secret not in text
    assert '"me"' in text


def test_json_logs_carry_the_same_keys(caplog: pytest.LogCaptureFixture) -> None:
    from cronstream.shared.logs import JsonFormatter

    logger = logging.getLogger("json-logs")
    with caplog.at_level(logging.INFO, logger="json-logs"):
        log(logger, "job_fired", job_id="etl", fired=3, note="a b")
    line = json.loads(JsonFormatter("scheduler").format(caplog.records[-1]))
    assert {k: line[k] for k in ("level", "service", "action", "job_id", "fired", "note")} == {
        "level": "info", "service": "scheduler", "action": "job_fired", "job_id": "etl",
        "fired": 3, "note": "a b"}


def test_silence_counts_only_while_the_monitor_watched_it() -> None:
    """A broker restart cuts the monitor off as much as the workers: their silence during
    it is no evidence, and every worker gets dead_after again from when the monitor can
    see (issue 9: a broker restart had the monitor fence and re-queue the whole fleet)."""
    now = [0.0]
    sight = Sight(dead_after=5.0, clock=lambda: now[0])
    assert not sight.observe(True)  # a monitor that just started has watched nothing
    now[0] = 5.0
    assert sight.observe(True)
    now[0] = 6.0
    assert not sight.observe(False)  # the broker is unreachable
    now[0] = 20.0
    assert not sight.observe(True)  # back: the 14 s of silence do not count
    now[0] = 24.9
    assert not sight.observe(True)
    now[0] = 25.0
    assert sight.observe(True)


def test_params_that_grow_past_the_limit_when_re_encoded_are_refused_from_a_small_record() -> None:
    """The decoder skips re-encoding params only for records far under the limit; exponent
    numbers, which grow the most when re-encoded, still meet the limit."""
    from cronstream.shared.records import MAX_PARAMS_BYTES, REENCODE_GROWTH
    count = 4000  # "1e15" re-encodes as "1000000000000000.0": 4.5 times longer
    raw = ('{"job_id":"x","type":"ONE_TIME","handler":"noop","run_at":"2026-01-01T00:00:00Z",'
           '"params":{"v":[' + ",".join(["1e15"] * count) + "]}}").encode()
    assert len(raw) < MAX_PARAMS_BYTES < len(raw) * REENCODE_GROWTH
    with pytest.raises(DecodeError, match="params: is 76007 bytes of JSON"):
        decode(JobDefinition, raw)
    assert len(b"1e15,") * REENCODE_GROWTH >= len(b"1000000000000000.0,")  # the bound holds


def test_a_finished_execution_reported_again_after_an_unknown_outcome_is_the_same_record() -> None:
    """A turn whose transaction outcome is unknown (a broker lost mid-commit) may have
    committed; its finished executions are reported again. The repeat must be the same
    event (same event_id) and the same retry, so the projection and every consumer drop it
    instead of seeing a second terminal event (seen in the chaos suite's leader loss)."""
    import uuid

    from cronstream.services.worker.executions import Finished, Reporter, Running
    from cronstream.services.worker.runner import Outcome
    from cronstream.shared.records import ExecutionEvent, JobSnapshot
    from cronstream.shared.telemetry import Hop

    reporter = Reporter(TOPICS, "w1")
    for outcome in (Outcome("COMPLETED", result={"ok": 1}), Outcome("FAILED", error="boom")):
        due = JobDue(execution_id=uuid.uuid4(), job_id="j", run_id=uuid.uuid4(),
                     scheduled_at=datetime(2026, 11, 30, tzinfo=UTC), reason="SCHEDULE",
                     delivery=1, idempotency_key="k",
                     job=JobSnapshot(handler="noop", max_retries=2))
        done = Finished(Running(due, Hop("cronstream.run", []), datetime(2026, 11, 30, tzinfo=UTC)),
                        outcome, datetime(2026, 11, 30, 0, 0, 1, tzinfo=UTC))
        first, again = reporter.finished(done), reporter.finished(done)
        assert [(r.topic, r.key, r.value) for r in again] == [(r.topic, r.key, r.value) for r in first]
        assert first[0].value is not None
        event = ExecutionEvent.model_validate_json(first[0].value)
        assert event.status == outcome.status
        assert len(first) == (2 if outcome.status == "FAILED" else 1)  # FAILED: its retry too


STUCK_AT_EXIT = """
import asyncio, sys, time
from cronstream.shared.health import Health
from cronstream.shared.lifecycle import run_service
from cronstream.shared.settings import Settings

def stuck_for_an_hour():
    time.sleep(3600)

class Fenced:
    name = "worker"
    shutdown_seconds = 1.0
    def __init__(self):
        self.health = Health("worker")
    async def run(self, stopping):
        asyncio.get_running_loop().run_in_executor(None, stuck_for_an_hour)
        raise RuntimeError("fenced")

sys.exit(run_service(Fenced(), Settings(http_port=0, http_bind="127.0.0.1")))
"""


def test_a_service_that_fails_with_a_thread_stuck_still_exits_and_says_where() -> None:
    """asyncio.run joins the executor's threads at exit without a deadline (Python 3.11):
    a service whose run failed must not hang there. The watchdog armed by the failure ends
    the process and logs every thread's stack, the stuck one included."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", STUCK_AT_EXIT], capture_output=True, text=True,
                          check=False, timeout=60)
    assert done.returncode == 3, done.stderr
    assert time.monotonic() - started < 30
    output = done.stdout + done.stderr
    assert "action=shutdown_overdue" in output and "reason=RuntimeError" in output
    assert "stuck_for_an_hour" in output, "the stuck thread's stack is in the log"


STUCK_HOLDING_THE_GIL = """
import asyncio, ctypes, sys, time
from cronstream.shared.health import Health
from cronstream.shared.lifecycle import run_service
from cronstream.shared.settings import Settings

def stuck_holding_the_gil():
    time.sleep(0.5)  # the watchdog is armed meanwhile
    ctypes.PyDLL(None).sleep(3600)  # a C call that keeps the GIL (PyDLL does not release it)

class Fenced:
    name = "worker"
    shutdown_seconds = 1.0
    def __init__(self):
        self.health = Health("worker")
    async def run(self, stopping):
        asyncio.get_running_loop().run_in_executor(None, stuck_holding_the_gil)
        raise RuntimeError("fenced")

sys.exit(run_service(Fenced(), Settings(http_port=0, http_bind="127.0.0.1")))
"""


def test_a_service_stuck_in_a_call_that_holds_the_gil_still_exits() -> None:
    """The watchdog's timer is Python: a C call that never returns and keeps the GIL (a
    fenced producer's destruction) stops it too. The kernel's alarm, armed with it, still
    ends the process a few seconds after the watchdog should have."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", STUCK_HOLDING_THE_GIL], capture_output=True,
                          text=True, check=False, timeout=60)
    assert done.returncode == -signal.SIGALRM, done.stderr
    assert time.monotonic() - started < 30


class _SessionEnds:
    """A projection store whose every transaction ends with `error` (the monitor's
    ProjectionStore interface: `transaction(batch)`), counting the attempts."""

    def __init__(self, error: Exception) -> None:
        self.error, self.attempts = error, 0

    def transaction(self, batch: object) -> object:
        store = self

        class _Transaction:
            async def __aenter__(self) -> None:
                store.attempts += 1
                raise store.error

            async def __aexit__(self, *exc: object) -> None:
                return None

        return _Transaction()


@pytest.mark.parametrize("error", [
    asyncpg.InternalClientError("cannot switch to state 15; another operation (2) is in progress"),
    asyncpg.AdminShutdownError("terminating connection due to administrator command"),
    asyncpg.CrashShutdownError("terminating connection because of crash of another server process"),
    asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
], ids=lambda e: type(e).__name__)
def test_a_database_session_that_ends_mid_batch_resyncs_the_projection(error: Exception) -> None:
    # Each of these ends the session, and may have lost the server's last commits: the
    # batch is given up at once and the projection resumes from what PostgreSQL holds.
    # asyncpg's InternalClientError, seen when PostgreSQL was killed, stopped the monitor.
    from cronstream.services.monitor.decoding import MonitorBatch
    from cronstream.services.monitor.service import MonitorService

    monitor = MonitorService(Settings(topic_prefix="t.", topic_partitions=3))
    store = _SessionEnds(error)
    monitor._store, monitor._producer = store, object()  # type: ignore[assignment]
    offsets = asyncio.run(monitor._project_patiently(MonitorBatch()))
    assert offsets == [] and store.attempts == 1
    assert monitor._database_lost and monitor.health.live()[0]


def test_a_services_log_line_carries_a_records_escape_sequences_as_text(
        caplog: pytest.LogCaptureFixture) -> None:
    from cronstream.shared.logs import JsonFormatter

    payload = "RuntimeError: \x1b]0;pwned\x07\x1b[2J\u009b31m bidi\u202e"
    logger = logging.getLogger("escapes")
    with caplog.at_level(logging.INFO, logger="escapes"):
        log(logger, "execution_finished", error=payload, job_id="evil\x1b[2J")
        try:
            raise RuntimeError(payload)
        except RuntimeError:
            logger.exception("handler_failed")
    for record in caplog.records[-2:]:
        for line in (LogfmtFormatter("worker").format(record), JsonFormatter("worker").format(record)):
            assert not any(c in line for c in "\x1b\x07\u009b\u202e"), line
            assert "\\x1b]0;pwned" in line or "\\u001b]0;pwned" in line, line
    assert json.loads(JsonFormatter("worker").format(caplog.records[-2]))["error"] == payload
