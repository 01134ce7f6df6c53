"""The analytics service through an in-memory bus (tests/unit/bus.py): its replay at start
reads definitions and events to the end before it judges anything and reports ready;
garbage on execution-events is skipped, never dead-lettered, and the rest still counts;
an alert raised before a restart is restored from `alerts`, not raised again, and
resolved under its id; the replay ends at each partition's end, whatever lies there.

The bus hands out one record a poll and the service judges at every poll (not once a
second), so a replay takes many polls and a judgement made before its end would show:
in the counts of the alert it raised."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import Message

from cronstream.services.analytics import service as analytics
from cronstream.services.analytics.service import AnalyticsService
from cronstream.shared.records import ExecutionEvent, ExecutionStatus, JobDefinition, JobDue
from cronstream.shared.settings import Settings
from tests.unit.bus import MemoryBus, clients

SETTINGS = Settings(topic_prefix="u.", topic_partitions=3)
T = SETTINGS.topics
# A job whose own thresholds (not the defaults: 99 % over at least 10 runs) its alerts
# follow; a schedule that makes no fire the ledger could call late during a test.
NIGHTLY = JobDefinition.model_validate({
    "job_id": "nightly", "type": "CRON", "schedule": "0 0 29 2 *", "handler": "noop",
    "alerts": {"success_rate_percent": 50, "min_runs": 3}})
FIRES = itertools.count()


@pytest.fixture(autouse=True)
def judge_at_every_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(analytics, "TICK_SECONDS", 0.0)


def new_bus() -> MemoryBus:
    return MemoryBus.of(T, fetch_max=1)


def define(bus: MemoryBus, definition: JobDefinition = NIGHTLY) -> Message:
    return bus.append(T.job_definitions, definition.job_id.encode(), definition.to_json())


def run(bus: MemoryBus, status: ExecutionStatus, ago: timedelta = timedelta(minutes=5),
        definition: JobDefinition = NIGHTLY, partition: int | None = None) -> ExecutionEvent:
    """A run of the job that ended `ago` (stamped then on the bus); each run a second
    before the last, so that each has a fire time, hence an execution, of its own."""
    ended = datetime.now(UTC).replace(microsecond=0) - ago - timedelta(seconds=next(FIRES))
    scheduled = ended - timedelta(seconds=30)
    due = JobDue.first(definition, scheduled, "SCHEDULE")
    e = ExecutionEvent.for_due(due, status, occurred_at=ended, started_at=scheduled, completed_at=ended)
    bus.append(T.execution_events, e.job_id.encode(), e.to_json(), partition=partition,
               timestamp_ms=int(ended.timestamp() * 1000))
    return e


def alerts(bus: MemoryBus) -> list[dict[str, Any]]:
    return bus.values(T.alerts)


def ready(service: AnalyticsService) -> bool:
    return service.health.ready()[1]["replay"] == "ready"


async def until(condition: Callable[[], object], what: str) -> None:
    try:
        async with asyncio.timeout(10):
            while not condition():
                await asyncio.sleep(0.001)
    except TimeoutError:
        raise AssertionError(f"not within 10 s: {what}") from None


@asynccontextmanager
async def started(bus: MemoryBus) -> AsyncIterator[AnalyticsService]:
    """An analytics service on `bus`, its replay read and its live loop running (its queue
    sampler, which reads the workers' group offsets through a Kafka client of its own,
    is not started)."""
    service = AnalyticsService(SETTINGS, "a1", clients(bus))
    reader, _ = service.open()
    ends = await service._start(reader)
    assert not ready(service), "not ready before the replay is read"
    stopping = asyncio.Event()
    loop = asyncio.create_task(service._consume(reader, ends, stopping))
    try:
        yield service
    finally:
        stopping.set()
        await loop
        await reader.close()
        service._flusher.shutdown(wait=True)


def test_it_replays_definitions_and_events_to_the_end_before_it_judges_and_reports_ready() -> None:
    async def scenario() -> None:
        bus = new_bus()
        define(bus)
        failed = [run(bus, "PERMANENTLY_FAILED") for _ in range(5)]
        async with started(bus) as service:
            await until(lambda: ready(service) and alerts(bus), "ready, and the first judgement")
        [alert] = alerts(bus)
        assert (alert["kind"], alert["state"], alert["job_id"]) == ("SUCCESS_RATE_LOW", "FIRING", "nightly")
        assert alert["evidence"]["finished"] == len(failed), "judged on the whole replay, not part of it"
        assert alert["evidence"]["min_runs"] == 3, "with the thresholds of the replayed definition"

    asyncio.run(scenario())


def test_garbage_on_execution_events_is_skipped_not_dead_lettered_and_the_rest_still_counts(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        bus = new_bus()
        define(bus)
        run(bus, "PERMANENTLY_FAILED")
        replayed = bus.append(T.execution_events, b"nightly", b"\xff{not an event")
        run(bus, "PERMANENTLY_FAILED")
        async with started(bus) as service:
            await until(lambda: ready(service), "ready")
            assert alerts(bus) == [], "two runs are fewer than the job's three"
            live = bus.append(T.execution_events, b"nightly", b"[]")  # JSON, but no event
            run(bus, "PERMANENTLY_FAILED")
            await until(lambda: alerts(bus), "the third run judged")
        [alert] = alerts(bus)
        assert alert["state"] == "FIRING" and alert["evidence"]["finished"] == 3
        assert bus.records(T.dead_letters) == [], "analytics dead-letters nothing"
        skipped = [r for r in caplog.records if getattr(r, "action", None) == "record_skipped"]
        assert [(r.partition, r.offset) for r in skipped] == [  # type: ignore[attr-defined]
            (replayed.partition(), replayed.offset()), (live.partition(), live.offset())]

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())


def test_an_alert_raised_before_a_restart_is_not_raised_again_and_resolves_under_its_id() -> None:
    async def scenario() -> None:
        bus = new_bus()
        define(bus)
        for _ in range(3):
            run(bus, "PERMANENTLY_FAILED")
        async with started(bus):
            await until(lambda: alerts(bus), "the alert raised")
        [firing] = alerts(bus)
        async with started(bus) as after:  # a new instance: only what the bus holds
            await until(lambda: ready(after), "the restarted service ready")
            polls = bus.consumer("analytics").consumes
            await until(lambda: bus.consumer("analytics").consumes > polls + 2, "judged again, twice")
            assert alerts(bus) == [firing], "the same failing runs raise nothing new"
            for _ in range(3):
                run(bus, "COMPLETED", ago=timedelta(0))
            await until(lambda: len(alerts(bus)) == 2, "the alert resolved")
        resolved = alerts(bus)[1]
        assert (firing["state"], resolved["state"]) == ("FIRING", "RESOLVED")
        assert resolved["alert_id"] == firing["alert_id"], "the episode keeps its id across the restart"

    asyncio.run(scenario())


def test_the_replay_ends_at_each_partitions_end_whatever_lies_there() -> None:
    """Transaction markers after the last record, a partition holding nothing since the
    lookback, empty topics: none holds the replay up, and none is miscounted."""
    async def scenario() -> None:
        bus = new_bus()
        define(bus)
        bus.marker(T.job_definitions, 0)  # published in a transaction: its marker follows
        recent = [run(bus, "PERMANENTLY_FAILED", partition=p) for p in (0, 0, 0, 1, 1)]
        bus.marker(T.execution_events, 0)
        bus.marker(T.execution_events, 1)
        archived = JobDefinition.model_validate({**NIGHTLY.model_dump(mode="json"), "job_id": "archived"})
        run(bus, "PERMANENTLY_FAILED", ago=timedelta(days=2), definition=archived, partition=2)
        assert bus.end(T.alerts, 0) == bus.end(T.scheduler_state, 0) == 0
        async with started(bus) as service:
            await until(lambda: ready(service) and alerts(bus), "ready, and judged")
        [alert] = alerts(bus)
        assert (alert["job_id"], alert["evidence"]["finished"]) == ("nightly", len(recent))

    asyncio.run(scenario())


def test_an_execution_waiting_longer_than_its_jobs_interval_raises_an_alert_until_it_starts() -> None:
    from cronstream.services.analytics.waits import Waits, interval_of

    every_minute = JobDefinition.model_validate({
        "job_id": "export", "type": "INTERVAL", "interval_seconds": 60, "handler": "noop",
        "pool": "etl"})
    assert interval_of(every_minute) == 60
    assert interval_of(NIGHTLY.model_copy(update={"schedule": "*/5 * * * *"})) == 300
    waits = Waits()
    waits.definition("export", every_minute)
    due = JobDue.first(every_minute, datetime(2026, 1, 1, tzinfo=UTC), "SCHEDULE")
    waits.event("export", due.execution_id, "WAITING", 0, "pool etl: 2 of 2 slots in use")
    assert not waits.judge("export", 60_000).too_long
    late = waits.judge("export", 61_000)
    assert late.too_long and late.reason == "pool etl: 2 of 2 slots in use" and late.waiting == 1
    waits.event("export", due.execution_id, "QUEUED", 62_000, None)
    assert waits.jobs() == set() and not waits.judge("export", 120_000).too_long

    async def scenario() -> None:
        bus = new_bus()
        define(bus, every_minute)
        long_ago = datetime.now(UTC) - timedelta(minutes=3)
        waiting = ExecutionEvent.for_due(due, "WAITING", occurred_at=long_ago,
                                         waiting_reason="pool etl: 2 of 2 slots in use")
        bus.append(T.execution_events, b"export", waiting.to_json(),
                   timestamp_ms=int(long_ago.timestamp() * 1000))
        async with started(bus) as service:
            await until(lambda: ready(service) and alerts(bus), "the wait judged")
            queued = ExecutionEvent.for_due(due, "QUEUED")
            bus.append(T.execution_events, b"export", queued.to_json())
            await until(lambda: len(alerts(bus)) == 2, "the wait over")
        firing, resolved = alerts(bus)
        assert (firing["kind"], firing["state"], firing["job_id"]) == ("WAITING_TOO_LONG", "FIRING", "export")
        assert "longer than the job's interval of 60s (pool etl: 2 of 2 slots in use)" in firing["summary"]
        assert (resolved["state"], resolved["alert_id"]) == ("RESOLVED", firing["alert_id"])

    asyncio.run(scenario())
