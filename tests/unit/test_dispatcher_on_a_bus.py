"""The dispatcher's batch transaction through an in-memory bus (tests/unit/bus.py): each
JobDue queued once with its work record and offset; repeats dropped across a restart;
garbage dead-lettered with the batch; aborted and hung transactions recovered from what
actually committed."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from typing import Any, cast

from confluent_kafka import Message

from cronstream.services.dispatcher.service import DispatcherService
from cronstream.shared.inbound import DLQ_ERROR
from cronstream.shared.kafka.reading import position
from cronstream.shared.records import JobDue, JobSnapshot
from cronstream.shared.settings import Settings
from tests.support import headers, value
from tests.unit.bus import MemoryBus, clients

SETTINGS = Settings(topic_prefix="u.", topic_partitions=3)
T = SETTINGS.topics


def dispatcher(bus: MemoryBus, owned: set[int] | None = None) -> DispatcherService:
    """A dispatcher on `bus` (its clients opened, none started) owning every job-due
    partition (or `owned`), its state read from the bus."""
    service = DispatcherService(SETTINGS, "d1", clients(bus))

    async def opened() -> None:
        service.open()
        service._queues = {"default"}
        service._owned = {0, 1, 2} if owned is None else owned
        await service._load_state(service._owned)

    asyncio.run(opened())
    return service


def due(job_id: str = "job", reason: str = "SCHEDULE", delivery: int = 1, policy: str = "ALLOW") -> JobDue:
    return JobDue(execution_id=uuid.uuid4(), job_id=job_id, run_id=uuid.uuid4(),
                  scheduled_at=datetime(2026, 11, 30, tzinfo=UTC), reason=reason,  # type: ignore[arg-type]
                  delivery=delivery, idempotency_key="k",
                  job=JobSnapshot(handler="noop", concurrency_policy=policy))  # type: ignore[arg-type]


def publish(bus: MemoryBus, d: JobDue) -> Message:
    return bus.append(T.job_due, d.job_id.encode(), d.to_json())


def process(service: DispatcherService, *messages: Message) -> None:
    asyncio.run(service._process(list(messages)))


def work(bus: MemoryBus) -> list[dict[str, Any]]:
    return bus.values(T.work("normal", "default"))


def statuses(bus: MemoryBus) -> list[str]:
    return [e["status"] for e in bus.values(T.execution_events)]


def reread(bus: MemoryBus, service: DispatcherService) -> list[Message]:
    """What the consumer reads after the dispatcher rewound: from each seek position on."""
    seeks = service._consumer.lane.seeks  # type: ignore[union-attr]
    found = [m for topic, partition, offset in seeks
             for m in bus.read(topic, partition, max(offset, 0))]
    seeks.clear()
    return found


def test_a_jobdue_is_queued_with_its_work_record_and_its_offset_in_one_transaction() -> None:
    bus = MemoryBus()
    service = dispatcher(bus)
    d = due()
    msg = publish(bus, d)
    process(service, msg)
    assert statuses(bus) == ["QUEUED"]
    assert [m.value() for m in bus.records(T.work("normal", "default"))] == [d.to_json()], \
        "the work record is the JobDue, byte for byte"
    _topic, partition, offset = position(msg)
    assert bus.committed[(T.job_due, partition)] == offset + 1
    assert service._producer.transactions == 1  # type: ignore[union-attr]


def test_a_reissued_jobdue_is_dropped_even_by_a_restarted_dispatcher() -> None:
    bus = MemoryBus()
    d = due(reason="REQUEUE", delivery=2)
    process(dispatcher(bus), publish(bus, d))
    restarted = dispatcher(bus)  # a new instance: only what the bus holds
    process(restarted, publish(bus, d))
    assert len(work(bus)) == 1 and statuses(bus) == ["QUEUED"]
    assert restarted._decided == {}  # counted and cleared on commit
    later = d.model_copy(update={"delivery": 3})
    process(restarted, publish(bus, later))
    assert len(work(bus)) == 2, "a later delivery is a new one"


def test_garbage_is_dead_lettered_in_the_batch_transaction_and_the_rest_goes_on() -> None:
    bus = MemoryBus()
    service = dispatcher(bus)
    bad = bus.append(T.job_due, b"job", b'{"not": "a JobDue"}')
    good = publish(bus, due())
    process(service, bad, good)
    dead = bus.records(T.dead_letters)
    assert len(dead) == 1 and dead[0].value() == b'{"not": "a JobDue"}'
    assert "invalid JobDue" in headers(dead[0])[DLQ_ERROR]
    assert len(work(bus)) == 1
    assert service._producer.transactions == 1  # type: ignore[union-attr]


def test_an_aborted_transaction_queues_nothing_and_the_batch_is_read_again() -> None:
    bus = MemoryBus()
    service = dispatcher(bus)
    msg = publish(bus, due(reason="MANUAL"))
    service._producer.fail_next = "abort"  # type: ignore[union-attr]
    process(service, msg)
    assert work(bus) == [] and statuses(bus) == []
    again = reread(bus, service)
    assert [(m.topic(), m.offset()) for m in again] == [(msg.topic(), msg.offset())]
    process(service, *again)
    assert len(work(bus)) == 1 and statuses(bus) == ["QUEUED"]


def test_a_hung_transaction_that_committed_is_not_queued_twice() -> None:
    bus = MemoryBus()
    service = dispatcher(bus)
    msg = publish(bus, due())
    service._producer.fail_next = "unknown-committed"  # type: ignore[union-attr]
    process(service, msg)
    assert reread(bus, service) == [], "the committed offset is past the batch"
    assert len(work(bus)) == 1


def test_a_hung_transaction_that_was_lost_is_queued_when_read_again() -> None:
    bus = MemoryBus()
    service = dispatcher(bus)
    msg = publish(bus, due(reason="DEPENDENCY"))
    service._producer.fail_next = "unknown-lost"  # type: ignore[union-attr]
    process(service, msg)
    assert work(bus) == []
    process(service, *reread(bus, service))
    assert len(work(bus)) == 1


def test_forbid_skips_a_new_run_while_the_last_is_active_across_a_restart() -> None:
    bus = MemoryBus()
    first = due(policy="FORBID")
    process(dispatcher(bus), publish(bus, first))
    restarted = dispatcher(bus)
    process(restarted, publish(bus, due(policy="FORBID")))
    events = bus.values(T.execution_events)
    assert [e["status"] for e in events] == ["QUEUED", "SKIPPED"]
    assert "concurrency_policy FORBID" in events[1]["error_message"]
    assert json.loads(value(bus.records(T.work("normal", "default"))[0]))["execution_id"] == \
        str(first.execution_id)


def test_after_a_batch_of_fires_committed_ahead_the_next_batch_waits_longer() -> None:
    """Fires committed ahead of their time (decision 0027) do not wait on the dispatcher:
    after a batch whose every JobDue is still at least AHEAD_BATCH_GAP_SECONDS ahead, the
    next batch may come that much later, and carries that much more in one transaction.
    One due job that is not that far ahead, or already due, brings the short gap back."""
    from datetime import timedelta

    from cronstream.services.dispatcher.service import AHEAD_BATCH_GAP_SECONDS, BATCH_GAP_SECONDS
    bus = MemoryBus()
    service = dispatcher(bus)
    soon = datetime.now(UTC) + timedelta(seconds=2 * AHEAD_BATCH_GAP_SECONDS)
    ahead = [due(f"a{i}").model_copy(update={"scheduled_at": soon}) for i in range(3)]
    process(service, *[publish(bus, d) for d in ahead])
    assert service._gap == AHEAD_BATCH_GAP_SECONDS
    process(service, publish(bus, due("late")), publish(bus, due("a9").model_copy(update={"scheduled_at": soon})))
    assert service._gap == BATCH_GAP_SECONDS
    assert statuses(bus) == ["QUEUED"] * 5  # every one queued, whatever the gap


async def _open(service: DispatcherService) -> None:
    service.open()


def test_a_stable_instance_joins_as_a_static_member_and_a_fresh_consumer_takes_over_a_dead_one() -> None:
    """With a stable name the dispatcher is a static member (a member whose session ran out
    in a broker outage gets its partitions back at once); a consumer fenced for good is
    closed and a fresh one subscribes in its place, the owned state dropped until the next
    assignment reads it again. hostname-pid, the default, stays a dynamic member."""
    default = DispatcherService(SETTINGS, kafka=clients(MemoryBus()))
    asyncio.run(_open(default))
    assert "group.instance.id" not in default._consumer_conf
    bus = MemoryBus()
    service = DispatcherService(SETTINGS.model_copy(update={"instance_id": "dispatcher-0"}),
                                kafka=clients(bus))

    async def rejoined() -> None:
        service.open()
        await service._subscribe()
        old = bus.consumers[-1]
        service._owned, service._waiting_since = {0, 1, 2}, None  # as an assignment leaves it
        await service._rejoin("the consumer failed for good")
        assert old.closed
        fresh = bus.consumers[-1]
        assert fresh is not old and service._consumer is cast(Any, fresh)
        assert fresh.subscribed == [T.job_due, T.execution_events, T.admissions]
        assert service._owned == set() and service._waiting_since is not None

    asyncio.run(rejoined())
    assert service._consumer_conf["group.instance.id"] == "dispatcher-0"
