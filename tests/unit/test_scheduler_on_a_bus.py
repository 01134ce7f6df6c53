"""A shard's leader on the in-memory bus (tests/unit/bus.py), with its store on disk and
the follower that keeps it warm: takeover (fenced first, the tail read, unprocessed
definitions validated, a poison one dead-lettered), the end of an empty shard, fencing
by a newer leader of the same shard, and a second term that reads only the tail."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from confluent_kafka import TopicPartition

from cronstream.services.scheduler.follower import Follower
from cronstream.services.scheduler.leader import ShardLeader, transactional_id
from cronstream.services.scheduler.store import ShardStore
from cronstream.shared.clients import KafkaClients
from cronstream.shared.inbound import DLQ_ERROR
from cronstream.shared.producers import OutRecord, ProducerFenced
from cronstream.shared.settings import Settings
from cronstream.shared.shards import shard_of
from tests.support import headers
from tests.unit.bus import MemoryBus, MemoryConsumerThread, clients

SETTINGS = Settings(topic_prefix="u.", topic_partitions=3, scheduler_shards=4,
                    scheduler_fire_ahead_ms=0)
T = SETTINGS.topics
SHARD = 2


@dataclass
class Epochs:
    """The broker's side of transactional ids: the newest init owns one."""

    current: dict[str, int] = field(default_factory=dict)


@dataclass
class FencedProducer:
    """A TransactionalProducer on the bus whose init fences the previous owner of its
    transactional.id, as the broker does."""

    bus: MemoryBus
    epochs: Epochs
    tid: str
    epoch: int = 0
    transactions: int = 0

    async def init(self) -> None:
        self.epoch = self.epochs.current[self.tid] = self.epochs.current.get(self.tid, 0) + 1

    async def commit(self, records: Iterable[OutRecord], offsets: list[TopicPartition] | None = None,
                     group_metadata: Any = None, attempts: int = 3) -> None:
        if self.epochs.current[self.tid] != self.epoch:
            raise ProducerFenced(f"{self.tid}: fenced by a newer epoch")
        for r in records:
            self.bus.append(r.topic, r.key, r.value, r.headers, r.partition)
        for tp in offsets or []:
            self.bus.committed[(tp.topic, tp.partition)] = tp.offset
        self.transactions += 1

    async def close(self) -> None:
        return None


@dataclass
class Shard:
    bus: MemoryBus
    store: ShardStore
    follower: Follower
    election: MemoryConsumerThread
    kafka: KafkaClients
    stopping: asyncio.Event
    task: asyncio.Task[None]

    def leader(self) -> ShardLeader:
        return ShardLeader(SETTINGS, SHARD, election=cast(Any, self.election), store=self.store,
                           follower=self.follower, instance="s1", kafka=self.kafka,
                           group_metadata=lambda: "memory-group")

    async def close(self) -> None:
        self.stopping.set()
        await self.task


async def shard(bus: MemoryBus, tmp_path: Path, epochs: Epochs) -> Shard:
    kafka = clients(bus)
    kafka = KafkaClients(consumer=kafka.consumer, idempotent=kafka.idempotent,
                         transactional=lambda conf: cast(Any, FencedProducer(bus, epochs,
                                                                             conf["transactional.id"])),
                         ensure_topics=kafka.ensure_topics, partition_counts=kafka.partition_counts)
    store = ShardStore(tmp_path / f"shard-{SHARD}.sqlite", SHARD)
    follower = Follower(T, cast(Any, MemoryConsumerThread(bus, "follower")))
    stopping = asyncio.Event()
    task = asyncio.create_task(follower.run(stopping))
    election = MemoryConsumerThread(bus, "definitions", eof=True)
    follower.follow(SHARD, store, "taking_over")
    return Shard(bus, store, follower, election, kafka, stopping, task)


async def feed_until_ready(s: Shard, leader: ShardLeader) -> None:
    """Play the service's loop: hand the leader its definitions until it is ready."""
    async with asyncio.timeout(20):
        while not leader.ready.is_set():
            if leader.failed is not None:
                raise leader.failed
            batch = leader.inbound.batch(await s.election.consume(100, 0))
            leader.feed(batch, batch.records, (T.job_definitions, SHARD) in batch.ended)
            await asyncio.sleep(0.001)


def on_shard(name: str) -> str:
    """A job id that starts with `name` and hashes to SHARD (murmur2: shared/shards.py)."""
    return next(f"{name}-{i}" for i in range(1000) if shard_of(f"{name}-{i}", SETTINGS.scheduler_shards) == SHARD)


DUE, POISON, LATER = on_shard("due-now"), on_shard("poison"), on_shard("later")
MANY = [on_shard(f"j{i}") for i in range(51)]


def one_time(job_id: str, at: datetime) -> bytes:
    return json.dumps({"job_id": job_id, "type": "ONE_TIME", "run_at": at.isoformat(),
                       "handler": "noop"}).encode()


def bus_of() -> MemoryBus:
    return MemoryBus.of(T)


def test_a_new_leader_fences_validates_the_unprocessed_dead_letters_poison_and_fires(tmp_path: Path) -> None:
    async def scenario() -> None:
        bus, epochs = bus_of(), Epochs()
        now = datetime.now(UTC)
        bus.append(T.job_definitions, DUE.encode(), one_time(DUE, now - timedelta(seconds=1)),
                   partition=SHARD)
        bus.append(T.job_definitions, POISON.encode(), b"\xff not json", partition=SHARD)
        bus.append(T.job_definitions, LATER.encode(), one_time(LATER, now + timedelta(days=3650)),
                   partition=SHARD)
        stray = bus.append(T.job_definitions, b"elsewhere", one_time("elsewhere", now), partition=SHARD)
        s = await shard(bus, tmp_path, epochs)
        leader = s.leader()
        leader.start()
        await feed_until_ready(s, leader)
        assert epochs.current[transactional_id("u.", SHARD)] == 1, "fenced before it read anything"
        async with asyncio.timeout(10):
            while not bus.records(T.job_due):
                await asyncio.sleep(0.01)
        fired = bus.values(T.job_due)
        assert [d["job_id"] for d in fired] == [DUE]
        dead = {m.key(): headers(m)[DLQ_ERROR] for m in bus.records(T.dead_letters)}
        assert dead.keys() == {POISON.encode(), b"elsewhere"}
        assert "invalid JobDefinition" in dead[POISON.encode()]
        # A definition another partitioner put on this shard: two shards could hold its job.
        assert stray.key() == b"elsewhere" and "murmur2" in dead[b"elsewhere"]
        assert bus.committed[(T.job_definitions, SHARD)] == 4, "every definition processed"
        states = {m.key(): m.partition() for m in bus.records(T.scheduler_state)}
        # The poison one is suspended (a state without a next fire); the stray one is not its.
        assert states.keys() == {DUE.encode(), POISON.encode(), LATER.encode()}
        assert set(states.values()) == {SHARD}
        # The ten-years-ahead job waits on disk, not in memory.
        assert LATER not in leader.clock.jobs and s.store.job(LATER) is not None
        await leader.stop()
        await s.close()

    asyncio.run(scenario())


def test_an_empty_shard_is_taken_over_at_the_end_of_its_partitions(tmp_path: Path) -> None:
    async def scenario() -> None:
        s = await shard(bus_of(), tmp_path, Epochs())
        leader = s.leader()
        leader.start()
        await feed_until_ready(s, leader)
        assert leader.store.count() == 0 and leader.took_over_seconds is not None
        await leader.stop()
        await s.close()

    asyncio.run(scenario())


def test_a_leader_fenced_by_a_newer_one_of_its_shard_stops_without_firing(tmp_path: Path) -> None:
    async def scenario() -> None:
        bus, epochs = bus_of(), Epochs()
        s = await shard(bus, tmp_path, epochs)
        old = s.leader()
        old.start()
        await feed_until_ready(s, old)
        epochs.current[transactional_id("u.", SHARD)] += 1  # another process took the shard
        bus.append(T.job_definitions, DUE.encode(),
                   one_time(DUE, datetime.now(UTC) - timedelta(seconds=1)), partition=SHARD)
        async with asyncio.timeout(10):
            while old.active:
                batch = old.inbound.batch(await s.election.consume(100, 0))
                old.feed(batch, batch.records, False)
                await asyncio.sleep(0.01)
        assert old.fenced and bus.records(T.job_due) == []
        await old.stop()
        await s.close()

    asyncio.run(scenario())


def test_a_second_term_reads_only_what_came_after_the_first(tmp_path: Path) -> None:
    async def scenario() -> None:
        bus, epochs = bus_of(), Epochs()
        for job_id in MANY[:50]:
            bus.append(T.job_definitions, job_id.encode(),
                       one_time(job_id, datetime.now(UTC) + timedelta(days=1)), partition=SHARD)
        s = await shard(bus, tmp_path, epochs)
        first = s.leader()
        first.start()
        await feed_until_ready(s, first)
        await first.stop()
        states = len(bus.records(T.scheduler_state))
        bus.append(T.job_definitions, MANY[50].encode(),
                   one_time(MANY[50], datetime.now(UTC) + timedelta(days=1)), partition=SHARD)
        s.follower.follow(SHARD, s.store, "taking_over")
        second = s.leader()
        second.start()
        await feed_until_ready(s, second)
        assert second._committed_offset == 50
        assert len(bus.records(T.scheduler_state)) == states + 1, "one new job computed, none again"
        assert s.store.count() == 51
        await second.stop()
        await s.close()

    asyncio.run(scenario())


FAR, WAITER = on_shard("far"), on_shard("waiter")


def test_a_calendar_change_replans_stored_jobs_and_a_new_term_trusts_only_the_current_version(
        tmp_path: Path) -> None:
    """A job not held in memory (its fire is hours away: only the store has it) is planned
    again when its calendar changes, its new timing committed with the calendar version;
    a leader of a later term recomputes a timing made with an older version. A job naming
    a calendar nobody applied waits (counted), it is not suspended."""
    from cronstream.services.scheduler.calendars import CalendarTable
    from cronstream.shared.records import Calendar

    async def scenario() -> None:
        bus, epochs = bus_of(), Epochs()
        now = datetime.now(UTC)
        hour = (now.hour + 12) % 24  # the job's next fire is about 12 hours away
        bus.append(T.job_definitions, FAR.encode(), json.dumps(
            {"job_id": FAR, "type": "CRON", "schedule": f"0 {hour} * * *", "handler": "noop",
             "calendar": "ops"}).encode(), partition=SHARD)
        bus.append(T.job_definitions, WAITER.encode(), json.dumps(
            {"job_id": WAITER, "type": "INTERVAL", "interval_seconds": 1, "handler": "noop",
             "calendar": "nope"}).encode(), partition=SHARD)
        calendars = CalendarTable(ready=True)
        day_ms = 86_400_000
        calendars.put(Calendar.from_dict({"calendar_id": "ops"}), 0, int(now.timestamp() * 1000) - day_ms)
        s = await shard(bus, tmp_path, epochs)
        leader = ShardLeader(SETTINGS, SHARD, election=cast(Any, s.election), store=s.store,
                             follower=s.follower, instance="s1", kafka=s.kafka,
                             group_metadata=lambda: "memory-group", calendars=calendars)
        leader.start()
        await feed_until_ready(s, leader)
        row = s.store.job(FAR)
        assert row is not None and row.cal_offset == 0 and row.next_fire_ms is not None
        assert FAR not in leader.clock.jobs, "only the store holds it"
        assert leader.waiting() == 1 and not leader.clock.suspended
        first = datetime.fromtimestamp(row.next_fire_ms / 1000, UTC)

        # Its next fire's day is excluded from now on: planned a day later, at once.
        calendars.put(Calendar.from_dict({"calendar_id": "ops", "exclude_dates": [first.date().isoformat()]}),
                      1, int(datetime.now(UTC).timestamp() * 1000))
        async with asyncio.timeout(10):
            while (row := s.store.job(FAR)) is None or row.cal_offset != 1:
                await asyncio.sleep(0.01)
        assert row.next_fire_ms == int((first + timedelta(days=1)).timestamp() * 1000)
        committed = [json.loads(m.value() or b"null") for m in bus.records(T.scheduler_state)
                     if m.key() == FAR.encode()]
        assert committed[-1]["calendar_offset"] == 1 and committed[-1]["next_fire_ms"] == row.next_fire_ms
        await leader.stop()

        # The next term reads a newer version (the day after excluded too): it recomputes.
        newer = CalendarTable(ready=True)
        later = first + timedelta(days=1)
        newer.put(Calendar.from_dict({"calendar_id": "ops", "exclude_dates": [
            first.date().isoformat(), later.date().isoformat()]}), 2, int(datetime.now(UTC).timestamp() * 1000))
        successor = ShardLeader(SETTINGS, SHARD, election=cast(Any, s.election), store=s.store,
                                follower=s.follower, instance="s1", kafka=s.kafka,
                                group_metadata=lambda: "memory-group", calendars=newer)
        successor.start()
        await feed_until_ready(s, successor)
        row = s.store.job(FAR)
        assert row is not None and row.cal_offset == 2
        assert row.next_fire_ms == int((first + timedelta(days=2)).timestamp() * 1000)
        assert bus.records(T.job_due) == [] and bus.records(T.alerts) == []
        await successor.stop()
        await s.close()

    asyncio.run(scenario())


def test_a_first_leader_drains_its_backlog_when_the_service_stops_reading(tmp_path: Path) -> None:
    """Fewer definitions than a round, the end not reached yet: the leader waits for more,
    until the service (its backlog of definitions read full) tells it to drain."""
    async def scenario() -> None:
        bus = bus_of()
        for job_id in MANY:
            bus.append(T.job_definitions, job_id.encode(), one_time(job_id, datetime.now(UTC)
                                                                    + timedelta(days=1)), partition=SHARD)
        s = await shard(bus, tmp_path, Epochs())
        leader = s.leader()
        leader.start()
        async with asyncio.timeout(20):
            while leader.backlog < len(MANY):
                batch = leader.inbound.batch(await s.election.consume(100, 0))
                leader.feed(batch, batch.records, False)  # the end not seen
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            assert (T.job_definitions, SHARD) not in bus.committed, "waits for a full round"
            leader.drain()
            while leader.backlog:
                await asyncio.sleep(0.01)
            assert bus.committed[(T.job_definitions, SHARD)] == len(MANY)
            leader.feed(leader.inbound.batch([]), [], True)  # the end, seen before
            await leader.ready.wait()
        assert leader.store.count() == len(MANY)
        await leader.stop()
        await s.close()

    asyncio.run(scenario())


def test_the_service_reads_no_definitions_while_its_leaders_backlogs_are_full() -> None:
    """A cold start of millions of jobs reads no further ahead of its first leaders than
    DEFINITIONS_BACKLOG records: memory stays bounded whatever the shard holds."""
    from cronstream.services.scheduler import service as module

    @dataclass
    class Leader:
        backlog: int
        drained: int = 0
        ready: asyncio.Event = field(default_factory=asyncio.Event)

        def drain(self) -> None:
            self.drained += 1

    class Reader:
        def __init__(self) -> None:
            self.consumed = 0
            self.timeouts: list[float] = []

        async def consume(self, n: int, timeout: float) -> list[Any]:
            self.consumed += 1
            self.timeouts.append(timeout)
            return []

    async def scenario() -> None:
        svc = module.SchedulerService(SETTINGS, instance="s1")
        reader = Reader()
        full = [Leader(module.DEFINITIONS_BACKLOG // 2), Leader(module.DEFINITIONS_BACKLOG // 2)]
        svc.leaders = cast(Any, dict(enumerate(full)))
        assert await svc._read_definitions(cast(Any, reader)) == []
        assert reader.consumed == 0 and [leader.drained for leader in full] == [1, 1]
        full[0].backlog = 0
        await svc._read_definitions(cast(Any, reader))
        assert reader.consumed == 1 and [leader.drained for leader in full] == [1, 1]
        # Polls are short while a leader takes over (it calls on the same lane between
        # them), longer once every leader is ready.
        for leader in full:
            leader.ready.set()
        await svc._read_definitions(cast(Any, reader))
        assert reader.timeouts[0] < 0.01 <= reader.timeouts[1]

    asyncio.run(scenario())


def test_the_service_hands_freed_memory_back_to_the_system() -> None:
    """After a takeover the heaps hold what the batches freed: malloc_trim (glibc) returns
    it; RSS is read from /proc. On this platform (Linux, glibc) both work."""
    from cronstream.services.scheduler.service import release_free_memory, rss_bytes

    garbage = [bytes(1000) for _ in range(20_000)]
    del garbage
    assert release_free_memory() is True
    assert rss_bytes() > 10 * 2**20


class Monotonic:
    """The follower's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_a_burst_holds_the_standby_reading_but_never_a_takeover(tmp_path: Path, monkeypatch: Any) -> None:
    """A leader that fires a burst holds its process's standby reading (its records wait in
    the broker) for as long as it says, at most HOLD_AT_MOST_SECONDS in a row (then a batch
    is read); a takeover's tail is read whatever the hold."""
    from cronstream.services.scheduler import follower as module

    clock = Monotonic()
    monkeypatch.setattr(module, "time", clock)
    later = datetime.now(UTC) + timedelta(days=1)

    async def applied(store: ShardStore, n: int) -> None:
        async with asyncio.timeout(10):
            while store.count() < n:
                await asyncio.sleep(0.01)

    async def assigned(reader: MemoryConsumerThread, shard: int) -> None:
        async with asyncio.timeout(10):
            while (T.job_definitions, shard) not in {(tp.topic, tp.partition)
                                                     for tp in await reader.assignment()}:
                await asyncio.sleep(0.01)

    async def scenario() -> None:
        bus = bus_of()
        reader = MemoryConsumerThread(bus, "follower")
        follower = Follower(T, cast(Any, reader))
        standby = ShardStore(tmp_path / "standby.sqlite", 1)
        follower.follow(1, standby, "standby")
        stopping = asyncio.Event()
        task = asyncio.create_task(follower.run(stopping))
        bus.append(T.job_definitions, b"a", one_time("a", later), partition=1)
        await applied(standby, 1)

        # Held (the clock stands still): the loop goes round — it takes a new standby
        # shard's partitions — and reads nothing.
        follower.hold(0.3)
        bus.append(T.job_definitions, b"b", one_time("b", later), partition=1)
        reads = reader.consumes
        follower.follow(3, ShardStore(tmp_path / "other.sqlite", 3), "standby")
        await assigned(reader, 3)
        assert reader.consumes == reads and standby.count() == 1

        # Held again and again (burst after burst), HOLD_AT_MOST_SECONDS in a row: a batch
        # is read.
        while clock.now < 1000.0 + module.HOLD_AT_MOST_SECONDS:
            clock.now += 0.2
            follower.hold(0.3)
        await applied(standby, 2)

        # Held again; a takeover's tail is read all the same.
        follower.hold(0.3)
        bus.append(T.job_definitions, b"c", one_time("c", later), partition=1)
        bus.append(T.scheduler_state, b"x", json.dumps({"definition_offset": 0, "next_fire_ms": None}).encode(),
                   partition=SHARD)
        follower.follow(SHARD, ShardStore(tmp_path / "taken.sqlite", SHARD), "taking_over")
        async with asyncio.timeout(10):
            await follower.caught_up(SHARD)

        # The hold over, the rest is read.
        bus.append(T.job_definitions, b"d", one_time("d", later), partition=1)
        clock.now += 0.31
        await applied(standby, 4)
        stopping.set()
        await task

    asyncio.run(scenario())


def test_a_standby_shard_s_lag_is_what_its_store_has_not_applied(tmp_path: Path) -> None:
    """`lag_of` (what readiness waits on): the records of a standby shard's partitions its
    store has not applied yet; None for a shard the process does not stand by for."""
    async def scenario() -> None:
        bus = bus_of()
        later = datetime.now(UTC) + timedelta(days=1)
        for job_id in ("a", "b", "c"):
            bus.append(T.job_definitions, job_id.encode(), one_time(job_id, later), partition=1)
        bus.append(T.scheduler_state, b"a", json.dumps({"definition_offset": 0, "next_fire_ms": None}).encode(),
                   partition=1)
        follower = Follower(T, cast(Any, MemoryConsumerThread(bus, "follower")))
        standby = ShardStore(tmp_path / "standby.sqlite", 1)
        follower.follow(1, standby, "standby")
        follower.follow(SHARD, ShardStore(tmp_path / "led.sqlite", SHARD), "leading")
        assert follower.lag_of(1) == 4 and follower.lag() == 4
        assert follower.lag_of(SHARD) is None and follower.lag_of(0) is None
        stopping = asyncio.Event()
        task = asyncio.create_task(follower.run(stopping))
        async with asyncio.timeout(10):
            while follower.lag_of(1) != 0:
                await asyncio.sleep(0.01)
        assert standby.count() == 3
        stopping.set()
        await task

    asyncio.run(scenario())


def test_a_scheduler_is_ready_once_the_shards_it_stands_by_for_are_warm() -> None:
    """Readiness (what a rolling restart waits for) includes the standbys: every shard the
    roles give the process to stand by for read to within STANDBY_READY_LAG records of its
    end (an end not known yet is not warm). Once warm it stays ready while the roles stay:
    a burst's lag does not make it unready."""
    from cronstream.services.scheduler import service as module

    class Lags:
        def __init__(self) -> None:
            self.lags: dict[int, int | None] = {}

        def lag_of(self, shard: int) -> int | None:
            return self.lags.get(shard)

        def lag(self) -> int:
            return sum(v or 0 for v in self.lags.values())

    svc = module.SchedulerService(SETTINGS, instance="s1")
    lags = Lags()
    svc._follower = cast(Any, lags)
    svc.shards = SETTINGS.scheduler_shards
    svc._members = sorted([svc.member, "another-member"])
    standby = svc._roles(svc._members)[1]
    assert standby, "two members, one standby each: this one stands by for some shards"

    def standbys_state() -> str:
        svc._publish_metrics()
        return svc.health.ready()[1]["standbys"]

    svc.standby = set(standby)
    lags.lags = dict.fromkeys(standby, None)  # nothing fetched yet
    assert standbys_state() != "ready"
    lags.lags = dict.fromkeys(standby, module.STANDBY_READY_LAG + 1)
    assert standbys_state() != "ready"
    lags.lags = dict.fromkeys(standby, module.STANDBY_READY_LAG)
    assert standbys_state() == "ready"
    lags.lags = dict.fromkeys(standby, 10 * module.STANDBY_READY_LAG)  # a burst
    assert standbys_state() == "ready"
    # The roles change (a third member): the shards new to it are read first.
    svc._members = sorted([svc.member, "another-member", "a-third"])
    now = svc._roles(svc._members)[1]
    assert now - standby, "a third member gives it a shard it did not stand by for"
    svc.standby = now
    lags.lags.update(dict.fromkeys(now - standby, 50_000))
    assert standbys_state() == f"{len(now - standby)} standby shards still reading"
    lags.lags.update(dict.fromkeys(now - standby, 0))
    assert standbys_state() == "ready"


def test_a_shard_whose_term_ended_is_led_again_after_its_wait_or_once_the_members_change() -> None:
    """A fenced leader waits a session before it leads the shard again (the members then
    say who leads it) — unless the members change before that: the roles that give it the
    shard are new then (a process fenced by one that joined gets its shards back at once
    when that one leaves, even fenced before it saw that one join)."""
    import time as clock

    from cronstream.services.scheduler import service as module

    svc = module.SchedulerService(SETTINGS, instance="s1")
    svc._members_seen(["scheduler-s0", "scheduler-s1"])
    assert svc._may_lead(3)
    svc._retry_after[3] = (clock.monotonic() + 60, svc._member_changes)
    assert not svc._may_lead(3)
    svc._members_seen(["scheduler-s1"])  # s0 left
    assert svc._may_lead(3)
    svc._retry_after[3] = (clock.monotonic() - 1, svc._member_changes)  # the wait is over
    assert svc._may_lead(3)

    # Fenced by s0, which joined again before this process saw it join: it sees s0 join,
    # then leave — the members it knew when fenced, changed twice since.
    svc._retry_after[3] = (clock.monotonic() + 60, svc._member_changes)
    svc._members_seen(["scheduler-s0", "scheduler-s1"])
    svc._members_seen(["scheduler-s1"])
    assert svc._may_lead(3)


def test_a_shard_the_roles_move_elsewhere_is_handed_over_as_at_a_sigterm() -> None:
    """A member that joins or leaves moves a few shards between the processes that stay:
    each leader such a move takes away stops after a last round that commits the next
    HAND_OVER_AHEAD_MS of fires (as at a SIGTERM), all at once, not one after another."""
    from cronstream.services.scheduler import service as module

    stops: list[tuple[int, bool]] = []
    both_stopping = asyncio.Event()

    class Leading:
        def __init__(self, shard: int) -> None:
            self.shard = shard

        async def stop(self, hand_over: bool = False) -> None:
            stops.append((self.shard, hand_over))
            if len(stops) == 2:
                both_stopping.set()
            await asyncio.wait_for(both_stopping.wait(), 5)  # one after another: times out

    class Forgets:
        def forget(self, shard: int) -> None:
            pass

        def follow(self, shard: int, store: Any, role: str) -> None:
            pass

    svc = module.SchedulerService(SETTINGS, instance="s1")
    svc._follower = cast(Any, Forgets())
    svc.shards = SETTINGS.scheduler_shards
    # The members as this process sees them once it is out of the group: its roles are none.
    svc._members_seen(["scheduler-s0", "scheduler-s2"])
    moved = [1, 3]
    svc.leaders = {shard: cast(Any, Leading(shard)) for shard in moved}

    asyncio.run(svc._follow_roles())
    assert sorted(stops) == [(shard, True) for shard in moved]
    assert svc.leaders == {}
