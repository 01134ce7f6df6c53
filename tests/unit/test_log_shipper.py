"""The worker's side of execution logs without Kafka (tests/unit/bus.py): lines batched per
execution and numbered per delivery, the last batch for the transaction that reports the
end, the worker-wide rate bound, and nothing at all for a handler that writes nothing."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from cronstream.services.worker.executions import Running
from cronstream.services.worker.logs import LogShipper
from cronstream.shared.records import LOG_BATCH_TEXT_BYTES, JobDue, JobSnapshot, LogBatch
from cronstream.shared.telemetry import Hop
from cronstream.shared.topics import Topics
from tests.unit.bus import MemoryBus, MemoryIdempotentProducer

TOPICS = Topics("u.")


def running(delivery: int = 1) -> Running:
    due = JobDue(execution_id=uuid.uuid4(), job_id="job", run_id=uuid.uuid4(),
                 scheduled_at=datetime(2026, 12, 4, tzinfo=UTC), reason="SCHEDULE",
                 delivery=delivery, idempotency_key="k", job=JobSnapshot(handler="h"))
    return Running(due, Hop("test", None), datetime(2026, 12, 4, tzinfo=UTC))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def shipper(bus: MemoryBus, rate: int = 1 << 20, clock: Clock | None = None
            ) -> tuple[LogShipper, list[int]]:
    made: list[int] = []

    def producer() -> Any:
        made.append(1)
        return MemoryIdempotentProducer(bus)

    return LogShipper(TOPICS, "w1", rate, producer, clock or Clock()), made


def batches(bus: MemoryBus) -> list[LogBatch]:
    return [LogBatch.model_validate_json(m.value() or b"") for m in bus.records(TOPICS.execution_logs)]


def line(text: str, stream: str = "stdout") -> tuple[float, str, str | None, str]:
    return time.time(), stream, None, text


def test_lines_ship_per_execution_numbered_and_the_last_batch_is_final() -> None:
    bus = MemoryBus()
    logs, _ = shipper(bus)
    run = running(delivery=2)
    logs.add(run, [line("one"), line("two")])
    assert logs.ship() == 1
    logs.add(run, [line("three")])
    final = logs.final(run, traceback="Traceback ...\nKeyError: 'x'")
    for record in final:
        bus.append(record.topic, record.key, record.value)
    shipped = batches(bus)
    assert [[(ln.seq, ln.stream, ln.text) for ln in b.lines] for b in shipped] == [
        [(0, "stdout", "one"), (1, "stdout", "two")],
        [(2, "stdout", "three"), (3, "traceback", "Traceback ...\nKeyError: 'x'")]]
    assert [b.final for b in shipped] == [False, True]
    assert all(b.delivery == 2 and b.execution_id == run.due.execution_id for b in shipped)
    assert bus.records(TOPICS.execution_logs)[0].key() == str(run.due.execution_id).encode()
    assert logs.ship() == 0  # an ended execution ships nothing more


def test_a_handler_that_writes_nothing_sends_nothing_and_makes_no_producer() -> None:
    bus = MemoryBus()
    logs, made = shipper(bus)
    run = running()
    assert logs.ship() == 0
    assert logs.final(run, note="[TIMED_OUT] timed out") == []
    assert made == [] and bus.records(TOPICS.execution_logs) == []


def test_a_large_log_is_split_into_records_that_fit_the_topic() -> None:
    bus = MemoryBus()
    logs, _ = shipper(bus, rate=1 << 30)
    run = running()
    text = "x" * 16_000
    logs.add(run, [line(text) for _ in range(40)])  # 640 KB
    final = logs.final(run)
    assert len(final) >= 3
    sizes = [sum(len(ln["text"]) for ln in json.loads(r.value or b"")["lines"]) for r in final]
    assert all(size <= LOG_BATCH_TEXT_BYTES for size in sizes)
    decoded = [LogBatch.model_validate_json(r.value or b"") for r in final]
    assert [ln.seq for b in decoded for ln in b.lines] == list(range(40))
    assert [b.final for b in decoded] == [False] * (len(decoded) - 1) + [True]


def test_the_worker_wide_rate_bound_drops_lines_and_says_so() -> None:
    bus = MemoryBus()
    clock = Clock()
    logs, _ = shipper(bus, rate=10_000, clock=clock)
    chatty, quiet = running(), running()
    logs.add(chatty, [line("y" * 1000) for _ in range(100)])  # 100 KB at once: over the bound
    final = logs.final(chatty)
    decoded = [LogBatch.model_validate_json(r.value or b"") for r in final]
    kept = [ln for b in decoded for ln in b.lines if ln.stream == "stdout"]
    assert 0 < len(kept) < 100
    note = [ln.text for b in decoded for ln in b.lines if ln.stream == "cronstream"]
    assert note and f"{100 - len(kept)} lines" in note[0] and "10000 bytes" in note[0]
    # The bucket refills: another execution's lines a moment later get through.
    clock.now += 0.2  # the bucket refills at the rate
    logs.add(quiet, [line("a short line")])
    assert [ln.text for r in logs.final(quiet)
            for ln in LogBatch.model_validate_json(r.value or b"").lines] == ["a short line"]
