"""Flow control in the dispatcher, through the in-memory bus (tests/unit/bus.py): held
back executions are WAITING with their reason and QUEUED when a terminal event frees
their limit — on their own partition, or at their pool's partition, across a restart."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Message

from cronstream.shared.records import (
    Concurrency,
    ExecutionEvent,
    ExecutionStatus,
    JobDue,
    JobSnapshot,
)
from cronstream.shared.shards import shard_of
from cronstream.shared.statuses import TERMINAL
from tests.unit.bus import MemoryBus
from tests.unit.test_dispatcher_on_a_bus import SETTINGS, T, dispatcher, process, publish

POOL = "etl"


def due(job_id: str = "job", **job: Any) -> JobDue:
    return JobDue(execution_id=uuid.uuid4(), job_id=job_id, run_id=uuid.uuid4(),
                  scheduled_at=datetime(2026, 11, 30, tzinfo=UTC), reason="MANUAL",
                  idempotency_key="k", job=JobSnapshot(handler="noop", **job))


def events(bus: MemoryBus) -> list[tuple[str, str, str | None]]:
    """(execution_id, status, waiting_reason) of every execution event, in log order."""
    return [(e["execution_id"], e["status"], e.get("waiting_reason"))
            for e in sorted(bus.values(T.execution_events), key=lambda e: e["occurred_at"])]


def queued(bus: MemoryBus) -> list[str]:
    return [e["execution_id"] for e in bus.values(T.work("normal", "default"))]


def ended(bus: MemoryBus, d: JobDue, status: ExecutionStatus = "COMPLETED") -> Message:
    event = ExecutionEvent.for_due(d, status, completed_at=datetime.now(UTC) if status in TERMINAL
                                   else None)
    return bus.append(T.execution_events, d.job_id.encode(), event.to_json())


def new(bus: MemoryBus, topic: str, since: dict[tuple[str, int], int]) -> list[Message]:
    """The records of `topic` appended since `since` was taken (what the group reads next)."""
    out = []
    for p in range(bus.partition_count(topic)):
        out += bus.read(topic, p, since.get((topic, p), 0))
        since[(topic, p)] = bus.end(topic, p)
    return out


def test_a_key_runs_one_at_a_time_and_the_next_is_queued_when_it_ends() -> None:
    bus = MemoryBus()
    service = dispatcher(bus)
    keyed: dict[str, Any] = {"concurrency": Concurrency(key="params.customer", max_running=1),
             "params": {"customer": 42}}
    first, second = due(**keyed), due(**keyed)
    other = due(**{**keyed, "params": {"customer": 7}})
    process(service, publish(bus, first), publish(bus, second), publish(bus, other))
    assert queued(bus) == [str(first.execution_id), str(other.execution_id)]
    waiting = [e for e in events(bus) if e[1] == "WAITING"]
    assert waiting == [(str(second.execution_id), "WAITING", "key customer=42: 1 of 1 running")]
    restarted = dispatcher(bus)  # the holds and the waiting line are read back
    process(restarted, ended(bus, other))
    assert len(queued(bus)) == 2, "another key's end frees nothing of this one"
    process(restarted, ended(bus, first))
    assert queued(bus)[-1] == str(second.execution_id)
    assert restarted.flow.core(0).holds.keys() | restarted.flow.core(1).holds.keys() | \
        restarted.flow.core(2).holds.keys() == {second.execution_id}


def test_a_pool_is_admitted_at_its_partition_and_released_from_the_jobs_own() -> None:
    """Two dispatchers: one owns the jobs' partitions, the other the pool's. Asks and ends
    travel on `admissions`, and the pool's owner decides, across a restart."""
    bus = MemoryBus()
    home = shard_of(POOL, SETTINGS.topic_partitions)
    jobs = [j for j in (f"job{i}" for i in range(20)) if bus.partition_of(j.encode()) != home][:2]
    forwarder, owner = dispatcher(bus, owned={0, 1, 2} - {home}), dispatcher(bus, owned={home})
    owner.flow.pools[POOL] = 1
    a, b = due(jobs[0], pool=POOL), due(jobs[1], pool=POOL)
    since: dict[tuple[str, int], int] = {}
    process(forwarder, publish(bus, a), publish(bus, b))
    assert queued(bus) == [], "forwarded, not decided, on the jobs' partitions"
    requests = new(bus, T.admissions, since)
    assert {r.partition() for r in requests} == {home}
    process(owner, *requests)
    assert queued(bus) == [str(a.execution_id)]
    assert events(bus)[-1] == (str(b.execution_id), "WAITING", "pool etl: 1 of 1 slots in use")
    forwarder = dispatcher(bus, owned={0, 1, 2} - {home})  # its routes are read back
    process(forwarder, ended(bus, a, "FAILED"))  # any terminal status ends the hold
    owner = dispatcher(bus, owned={home})  # and its holds and waiting line
    owner.flow.pools[POOL] = 1
    process(owner, *new(bus, T.admissions, since))
    assert queued(bus) == [str(a.execution_id), str(b.execution_id)]
    assert owner.flow.in_use() == {POOL: 1}
    process(forwarder, ended(bus, b, "CANCELLED"))
    process(owner, *new(bus, T.admissions, since))
    assert owner.flow.in_use() == {}


def test_a_dispatcher_that_owns_the_pools_partition_too_decides_without_a_hop() -> None:
    """Owning the jobs' partitions and the pool's, a dispatcher decides an ask in the
    batch that reads it and settles its end where it reads it: nothing on `admissions`,
    and the holds and routes it wrote are read back after a restart."""
    bus = MemoryBus()
    home = shard_of(POOL, SETTINGS.topic_partitions)
    jobs = [j for j in (f"job{i}" for i in range(20)) if bus.partition_of(j.encode()) != home][:2]
    service = dispatcher(bus)
    service.flow.pools[POOL] = 1
    a, b = due(jobs[0], pool=POOL), due(jobs[1], pool=POOL)
    process(service, publish(bus, a), publish(bus, b))
    assert queued(bus) == [str(a.execution_id)]
    assert events(bus)[-1] == (str(b.execution_id), "WAITING", "pool etl: 1 of 1 slots in use")
    restarted = dispatcher(bus)
    restarted.flow.pools[POOL] = 1
    assert restarted.flow.in_use() == {POOL: 1}
    process(restarted, ended(bus, a))
    assert queued(bus) == [str(a.execution_id), str(b.execution_id)]
    process(restarted, ended(bus, b))
    assert restarted.flow.in_use() == {}
    assert all(bus.end(T.admissions, p) == 0 for p in range(bus.partition_count(T.admissions)))


def test_a_requeue_keeps_its_slot_and_a_rate_limit_wakes_the_dispatcher() -> None:
    bus = MemoryBus()
    service = dispatcher(bus)
    limited = {"rate_limit": "1/h"}
    first = due(**limited)
    process(service, publish(bus, first))
    requeue = first.model_copy(update={"reason": "REQUEUE", "delivery": 2})
    process(service, publish(bus, requeue))
    assert queued(bus) == [str(first.execution_id)] * 2, "a requeue asks nothing again"
    process(service, publish(bus, due(**limited)))
    reason = events(bus)[-1][2]
    assert reason is not None and reason.startswith("rate limit 1/h, next start at ")
    wake = service.flow.next_wakeup()
    assert wake is not None and not service._wakes(wake - 1) and service._wakes(wake)


def test_an_unknown_pool_waits_and_a_new_size_admits() -> None:
    bus = MemoryBus()
    service = dispatcher(bus)
    home = shard_of(POOL, SETTINGS.topic_partitions)
    job = next(j for j in (f"job{i}" for i in range(20)) if bus.partition_of(j.encode()) == home)
    d = due(job, pool=POOL)
    process(service, publish(bus, d))
    assert events(bus)[-1][2] == "pool etl does not exist (cronstream pool set etl --slots N)"
    service.flow.pools[POOL] = 2
    asyncio.run(service._process([]))
    assert queued(bus) == [str(d.execution_id)]



def test_the_projection_keeps_why_an_execution_waited() -> None:
    from cronstream.services.monitor.projection import fold

    d = due(pool=POOL)
    waiting = ExecutionEvent.for_due(d, "WAITING", waiting_reason="pool etl: 2 of 2 slots in use",
                                     queue="default", priority="normal")
    patch = fold([waiting])[d.execution_id]
    assert (patch.status, patch.waiting_reason, patch.queue) == \
        ("WAITING", "pool etl: 2 of 2 slots in use", "default")
    patch = fold([waiting, ExecutionEvent.for_due(d, "QUEUED")])[d.execution_id]
    assert (patch.status, patch.waiting_reason) == ("QUEUED", "pool etl: 2 of 2 slots in use")


def test_the_metrics_count_slots_in_use_and_waiting_by_reason() -> None:
    bus = MemoryBus()
    service = dispatcher(bus)
    home = shard_of(POOL, SETTINGS.topic_partitions)
    job = next(j for j in (f"job{i}" for i in range(20)) if bus.partition_of(j.encode()) == home)
    service.flow.pools[POOL] = 1
    process(service, publish(bus, due(job, pool=POOL)), publish(bus, due(job, pool=POOL)))
    assert service.flow.in_use() == {POOL: 1}
    assert service.flow.waiting_by_kind(0)["pool"] == 1
