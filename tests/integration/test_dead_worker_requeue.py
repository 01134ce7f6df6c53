"""The monitor's re-queue of a dead worker's executions, against the real broker and
database: only what the fenced incarnation started is re-queued, never what the worker,
restarted under its id meanwhile, has started since (the chaos suite caught a monitor
re-queueing, after its fence and while it waited for the projection, an execution the
restarted worker had just started: it ran twice)."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy
from confluent_kafka import Message, Producer

from cronstream.services.monitor.housekeeping import Housekeeping
from cronstream.shared.db import query
from cronstream.shared.records import JobDue, JobSnapshot
from cronstream.shared.settings import Settings
from tests.support import read_all, sql, standalone_housekeeping

WORKER = "w-dead"


def _produce_at(settings: Settings, topic: str, value: bytes) -> int:
    """One record on partition 0; its offset."""
    delivered: list[Message] = []
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                         "enable.idempotence": True})
    producer.produce(topic, value, b"job", partition=0,
                     on_delivery=lambda err, msg: delivered.append(msg) if err is None else None)
    assert producer.flush(30) == 0 and len(delivered) == 1
    offset = delivered[0].offset()
    assert offset is not None
    return offset


async def _running(conn: PoolConnectionProxy[asyncpg.Record], execution_id: uuid.UUID, offset: int | None) -> None:
    """A RUNNING execution of the worker, as the projection holds it (and its RUNNING
    event at `offset` of partition 0, when given)."""
    now = datetime.now(UTC)
    job = JobSnapshot(handler="noop").model_dump_json()
    await conn.execute(
        """INSERT INTO job_executions (execution_id, job_id, run_id, status, scheduled_at,
               started_at, worker_id, attempt_number, delivery, reason, idempotency_key, job,
               last_event, updated_at)
           VALUES ($1, 'job', $2, 'RUNNING', $3, $3, $4, 1, 1, 'SCHEDULE', 'k', $5::jsonb,
                   'RUNNING', $3)""",
        execution_id, uuid.uuid4(), now, WORKER, job)
    if offset is not None:
        await _running_event(conn, execution_id, offset)


async def _running_event(conn: PoolConnectionProxy[asyncpg.Record], execution_id: uuid.UUID, offset: int) -> None:
    now = datetime.now(UTC)
    await conn.execute(
        """INSERT INTO execution_events (event_id, execution_id, job_id, run_id, status,
               attempt_number, delivery, scheduled_at, occurred_at, worker_id, started_at,
               kafka_partition, kafka_offset)
           VALUES ($1, $2, 'job', $3, 'RUNNING', 1, 1, $4, $4, $5, $4, 0, $6)""",
        uuid.uuid4(), execution_id, uuid.uuid4(), now, WORKER, offset)


async def requeue_dead(housekeeping: Housekeeping,
                       caught_up: Callable[..., Coroutine[Any, Any, bool]]) -> None:
    """Re-queue the dead workers' executions once `caught_up` says the projection holds
    what they committed (it stands for the wait on the projection), then close."""
    housekeeping.projection_caught_up = caught_up  # type: ignore[method-assign]
    try:
        await housekeeping.requeue_dead_workers()
    finally:
        await housekeeping.close()


def test_a_dead_workers_requeue_spares_what_its_restarted_incarnation_started(topics: Settings) -> None:
    events = topics.topics.execution_events
    before, since = uuid.uuid4(), uuid.uuid4()

    async def scenario() -> None:
        pool = await asyncpg.create_pool(topics.database_url, min_size=1, max_size=2)
        try:
            async with pool.acquire() as conn:
                await conn.execute(
                    """INSERT INTO workers (worker_id, hostname, status, last_heartbeat, capacity,
                           updated_at) VALUES ($1, 'host', 'ACTIVE', $2, 4, $2)""",
                    WORKER, datetime.now(UTC) - timedelta(minutes=5))
                # Started by the incarnation that died: its RUNNING is in the log already.
                await _running(conn, before, _produce_at(topics, events, b'{"started":"before"}'))
                # Started by the worker restarted under its id, after the fence (below).
                await _running(conn, since, None)
            housekeeping = standalone_housekeeping(topics, pool)

            async def caught_up(ends: list[int], patience: float = 0) -> bool:
                # While the monitor waits for the projection, the new incarnation (which
                # took the transactional.id after the fence) commits a start, projected.
                offset = _produce_at(topics, events, b'{"started":"since"}')
                async with pool.acquire() as conn:
                    await _running_event(conn, since, offset)
                return True

            await requeue_dead(housekeeping, caught_up)
        finally:
            await pool.close()

    asyncio.run(scenario())
    requeued = [JobDue.model_validate_json(m.value() or b"") for m in read_all(topics, topics.topics.job_due)]
    assert [(d.execution_id, d.delivery, d.reason) for d in requeued] == [(before, 2, "REQUEUE")]
    statuses = [json.loads(m.value() or b"{}").get("status") for m in read_all(topics, events)]
    assert statuses.count("REQUEUED") == 1
    assert sql(topics.database_url, "SELECT status FROM workers WHERE worker_id = $1",
               WORKER)[0]["status"] == "OFFLINE"


def test_a_projection_that_keeps_up_under_load_has_caught_up_with_a_fence(topics: Settings) -> None:
    """Under a steady stream of events the log always holds a few the projection has not
    read yet, so "nothing left to read" never holds: a dead worker's executions were never
    re-queued while the load lasted. What the re-queue needs is narrower: every event
    below the ends read after the fence is projected — which a projection that keeps up
    reaches within a batch."""
    events = topics.topics.execution_events
    stop, flowing = threading.Event(), threading.Event()

    reached: set[int] = set()

    def delivered(err: object, msg: Message) -> None:
        if err is None:  # every partition has a leader and takes events
            reached.add(msg.partition() or 0)
            if len(reached) == topics.topic_partitions:
                flowing.set()

    def stream() -> None:  # events keep arriving, as under load
        producer = Producer({"bootstrap.servers": topics.kafka_bootstrap_servers, "linger.ms": 5})
        while not stop.is_set():
            for p in range(topics.topic_partitions):
                producer.produce(events, b"{}", b"job", partition=p, on_delivery=delivered)
            producer.poll(0.005)
        producer.flush(10)

    async def scenario() -> tuple[bool, bool]:
        pool = await asyncpg.create_pool(topics.database_url, min_size=1, max_size=2)
        housekeeping = standalone_housekeeping(topics, pool)
        try:
            ends = await housekeeping.event_ends()
            assert any(ends)  # the stream is flowing

            async def store_at(offsets: list[int]) -> None:
                await pool.execute(query("store_offsets"), "test", [events] * len(offsets),
                                   list(range(len(offsets))), offsets)

            await store_at([max(0, e - 1) for e in ends])  # one event short of the fence
            short = await housekeeping.projection_caught_up(ends, patience=1.0)
            await store_at(ends)  # the projection has read past the fence meanwhile
            past = await housekeeping.projection_caught_up(ends, patience=1.0)
            return short, past
        finally:
            await housekeeping.close()
            await pool.close()

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        assert flowing.wait(30), "the stream never reached the broker"
        short, past = asyncio.run(scenario())
    finally:
        stop.set()
        thread.join()
    assert short is False
    assert past is True
