"""The scheduler service: one process among any number, leading some shards of the clock
and standing by for others (docs/decisions/0039-the-clock-in-shards.md).

1. Membership: every process joins the consumer group `<prefix>scheduler` (on the
   one-partition `scheduler-members` topic): the group's coordinator says who is alive,
   drops a process that stops heartbeating after `CRONSTREAM_SCHEDULER_SESSION_TIMEOUT_MS`,
   and tells every member of every change at once (a rebalance).
2. Roles: from the members, every process computes the same roles (shared/shards.py):
   which process leads each shard, and which stand by for it — the processes that would
   lead it should its leader go. So a takeover lands where the shard is kept warm.
3. Warm standbys: the follower (follower.py) keeps the store of every shard the process
   leads or stands by for current from Kafka. A new process warms the shards it will
   lead before it joins the group.
4. Leading: a shard leader (leader.py) fences the shard's previous leader through the
   shard's own transactional.id, reads the tail, and fires. Its definitions come through
   the process's definitions reader, which this loop routes by partition.

5. Calendars: one reader per process reads the whole `calendars` topic (calendars are not
   sharded) into a table its leaders share, to its end before any of them fires, and
   follows it; a change re-plans the jobs naming it in every shard the process leads
   (calendars.py).

Correctness never rests on the roles being agreed at every instant: two processes that
both believe they lead a shard cannot both commit — the later one's init_transactions()
fences the other, which steps down (and waits a session before trying again).

SIGTERM hands over: each leader commits a last round (its ALLOW jobs' fires of the next
second included: docs/decisions/0027), then the process leaves the group, and the standby
takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import fcntl
import logging
import os
import time
from collections.abc import Awaitable
from functools import partial
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Message, TopicPartition

from cronstream.services.scheduler.calendars import CalendarReader, CalendarTable
from cronstream.services.scheduler.follower import Follower
from cronstream.services.scheduler.leader import ShardLeader
from cronstream.services.scheduler.store import ShardStore
from cronstream.shared import metrics
from cronstream.shared.clients import REAL, KafkaClients
from cronstream.shared.health import Health
from cronstream.shared.inbound import Inbound
from cronstream.shared.kafka.config import END_FETCH_WAIT_MS, consumer_config, reader_config
from cronstream.shared.kafka.consumer import ConsumerThread, OnLane
from cronstream.shared.kafka.errors import (
    NOT_AUTHORIZED_HINT,
    NotAuthorized,
    kafka_error,
    not_authorized,
    settled,
)
from cronstream.shared.kafka.reading import position
from cronstream.shared.logs import log
from cronstream.shared.producers import TransactionOutcomeUnknown
from cronstream.shared.settings import Settings
from cronstream.shared.shards import roles

logger = logging.getLogger(__name__)

# How often the members are asked for even without a rebalance (a missed callback).
MEMBERSHIP_SECONDS = 2.0
METRICS_SECONDS = 5.0
JOBS_COUNT_SECONDS = 30.0  # how old the count of a led shard's jobs may be
# A process joining warms the shards it will lead for at most this long before it joins.
WARM_UP_PATIENCE = 600.0
# A process is ready (/readyz) once every shard it stands by for is warm: read to within
# this many records of its end. A rolling restart that waits for readiness then never
# hands a shard to a standby still reading it whole (at ten million jobs, a standby shard
# is ~600,000 records: a handover to a cold one took 14 to 47 s).
STANDBY_READY_LAG = 10_000
# Definitions read and not processed yet by this process's first leaders of shards, at
# most (then it reads no more until they shrink): a cold start of millions of jobs would
# otherwise hold every record read ahead of its leader, and the process keeps the memory
# it peaked at (the heaps fragment).
DEFINITIONS_BACKLOG = 20_000
# librdkafka reads ahead up to queued.min.messages (100,000) or queued.max.messages.kbytes
# (64 MiB) *per partition* (rdkafka_fetcher.c: the partition's fetch queue). A scheduler
# process reads dozens of partitions (a standby shard's definitions, state and retries;
# its led shards' definitions) and processes them far slower than the broker sends them:
# at a catch-up every partition's queue filled, ~30 MiB each at ten million jobs, and the
# process kept what it peaked at. Bounded per partition, a catch-up reads as fast (a batch
# is 5,000 records; 2 MiB holds ~8,000 definitions), provided a full queue is fetched for
# again soon after it is read (librdkafka waits fetch.queue.backoff.ms, 1 s by default).
READ_AHEAD = {"queued.min.messages": 5_000, "queued.max.messages.kbytes": 2_048,
              "fetch.queue.backoff.ms": 20}
# glibc keeps the memory a process freed in its heaps, and a takeover or a standby's
# catch-up frees a lot (batches of records read, parsed and committed): a process kept the
# ~40 % of its RSS it peaked at for ever. Handed back to the system (malloc_trim, from a
# thread) at once when the roles settle, and after a warm-up, a catch-up or a burst: RSS
# looked at this often, trimmed when it grew by TRIM_GROWTH since the last trim.
TRIM_SECONDS = 30.0
TRIM_GROWTH = 32 * 2**20  # ...when RSS grew by this since the last trim


class SchedulerService:
    name = "scheduler"

    def __init__(self, settings: Settings, instance: str | None = None,
                 kafka: KafkaClients = REAL) -> None:
        self.settings = settings
        self.kafka = kafka
        self.topics = settings.topics
        self.instance = settings.instance(instance)
        self.member = f"scheduler-{self.instance}"
        self.group = f"{self.topics.prefix}scheduler"
        self.health = Health(self.name)
        # Ready once the group answered, every shard it leads has taken over and every
        # shard it stands by for is warm (_check_standbys).
        self.health.require("membership")
        self.health.require("standbys")
        self.inbound = Inbound(self.name, self.topics)
        self.shards = 0
        self.leaders: dict[int, ShardLeader] = {}
        self.standby: set[int] = set()
        self.stores: dict[int, ShardStore] = {}
        self.calendars = CalendarTable()
        # shard -> (when its term ended plus the wait, `_member_changes` then): a shard
        # whose term ended is led again after the wait, or as soon as the members change.
        self._retry_after: dict[int, tuple[float, int]] = {}
        self._membership_changed = asyncio.Event()
        self._members: list[str] = []
        # How many times the members seen changed. Counted, not compared: one that joins
        # and leaves again changes them twice, back to the list seen before.
        self._member_changes = 0
        self._lock_file: Any = None
        self._follower: Follower | None = None
        self._definitions: ConsumerThread | None = None
        self._membership: ConsumerThread | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._ready_roles: tuple[frozenset[int], frozenset[int]] | None = None
        self._trim_now = asyncio.Event()
        # The standby shards found warm since the roles last changed (readiness).
        self._warm: frozenset[int] = frozenset()

    # -- lifecycle --------------------------------------------------------------------

    async def run(self, stopping: asyncio.Event) -> None:
        self._event_loop = asyncio.get_running_loop()
        self._data_dir().mkdir(parents=True, exist_ok=True)
        self._lock()
        follower = self._follower = Follower(self.topics, self.kafka.consumer(
            {**reader_config(self.settings, f"{self.member}-follower"), **READ_AHEAD}, "follower"))
        calendars = CalendarReader(self.topics, self.kafka.consumer(
            {**reader_config(self.settings, f"{self.member}-calendars"), **READ_AHEAD}, "calendars"),
            self.calendars)
        # The definitions of the shards this process leads: assigned by hand, in the
        # scheduler group (for its committed offsets), never subscribed.
        definitions = self._definitions = self.kafka.consumer(consumer_config(
            self.settings, f"{self.member}-definitions", self.group,
            **{"enable.partition.eof": True, "fetch.wait.max.ms": END_FETCH_WAIT_MS}, **READ_AHEAD),
            "definitions")
        self.shards = await self._shard_count(definitions)
        # Everything that writes the shard of a job counts as many shards as the topics hold.
        self.topics = dataclasses.replace(self.topics, shards=self.shards)
        tasks = [asyncio.create_task(follower.run(stopping), name="scheduler-follower"),
                 asyncio.create_task(self._read_calendars(calendars, stopping), name="scheduler-calendars"),
                 asyncio.create_task(self._trim(stopping), name="scheduler-trim")]
        try:
            await self._warm_up(stopping)
            membership = self._membership = self.kafka.consumer(self._membership_config(), "membership")
            await membership.subscribe([self.topics.scheduler_members], on_assign=self._on_rebalance,
                                       on_revoke=self._on_rebalance, on_lost=self._on_rebalance)
            tasks += [asyncio.create_task(self._poll_membership(membership, stopping), name="membership"),
                      asyncio.create_task(self._report(stopping), name="scheduler-metrics")]
            log(logger, "scheduler_started", instance=self.instance, shards=self.shards,
                standbys=self.settings.scheduler_standbys)
            while not stopping.is_set():
                await self._follow_roles()
                batch = self.inbound.batch(await self._read_definitions(definitions))
                self._route(batch)
                await self._follow_leadership()
        finally:
            await self._hand_over()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if self._membership is not None:
                await self._membership.close()  # leaves the group: the standbys take over
            await definitions.close()
            await follower.reader.close()
            await calendars.reader.close()
            for store in self.stores.values():
                store.close()
            self._lock_file.close()  # releases the data directory

    async def _read_calendars(self, reader: CalendarReader, stopping: asyncio.Event) -> None:
        """The calendar reader; should it fail, the process stops (its leaders would wait
        for calendars for ever, or fire with a stale one)."""
        try:
            await reader.run(stopping)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("calendar reader failed", extra={"action": "calendars_failed"})
            stopping.set()

    async def _hand_over(self) -> None:
        """Stop every leader after a last round that fires its ALLOW jobs of the next
        second ahead: the standby that takes over has them committed already."""
        leaders, self.leaders = list(self.leaders.values()), {}
        await asyncio.gather(*(leader.stop(hand_over=True) for leader in leaders),
                             return_exceptions=True)
        if leaders:
            log(logger, "shards_handed_over", instance=self.instance,
                shards=",".join(str(leader.shard) for leader in leaders))

    def _data_dir(self) -> Path:
        return Path(self.settings.scheduler_data_dir) / self.topics.prefix.rstrip(".") / self.instance

    def _lock(self) -> None:
        """One process per data directory: two would corrupt each other's stores."""
        path = self._data_dir() / "lock"
        self._lock_file = path.open("a+")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another scheduler uses {path.parent} (give each process its own "
                               "--instance-id or CRONSTREAM_SCHEDULER_DATA_DIR)") from None

    def _store(self, shard: int) -> ShardStore:
        if shard not in self.stores:
            self.stores[shard] = ShardStore(self._data_dir() / f"shard-{shard}.sqlite", shard)
        return self.stores[shard]

    async def _shard_count(self, reader: ConsumerThread) -> int:
        """The clock's shards, as its topics hold them (they must agree: `cronstream init`)."""
        t = self.topics
        counts = {}
        for topic in (t.job_definitions, t.scheduler_state, t.retries, t.scheduler_members):
            found = await settled(partial(reader.partitions, topic), f"partitions of {topic}")
            if not found:
                raise RuntimeError(f"topic {topic} does not exist: run `cronstream init`")
            counts[topic] = len(found)
        shards = counts[t.job_definitions]
        if counts[t.scheduler_state] != shards or counts[t.retries] != shards:
            raise RuntimeError(f"{t.job_definitions}, {t.scheduler_state} and {t.retries} must have as many "
                               f"partitions (one per shard of the clock); they have {shards}, "
                               f"{counts[t.scheduler_state]} and {counts[t.retries]}")
        return shards

    async def _members_now(self) -> list[str]:
        """The scheduler group's members, once its coordinator answers (a broker that starts
        or moves the coordinator is waited out; a refused principal stops the service with
        the reason)."""
        def ask() -> Awaitable[list[str]]:
            return asyncio.get_running_loop().run_in_executor(
                None, self.kafka.group_members, self.settings, self.group)

        try:
            return await settled(ask, "members of the scheduler group")
        except KafkaException as exc:
            if not_authorized(kafka_error(exc)):
                log(logger, "kafka_not_authorized", logging.ERROR, consumer="scheduler-membership",
                    error=str(exc), hint=NOT_AUTHORIZED_HINT)
                raise NotAuthorized(f"describing the scheduler group: {exc}: {NOT_AUTHORIZED_HINT}") from None
            raise

    def _membership_config(self) -> dict[str, Any]:
        session = self.settings.scheduler_session_timeout_ms
        # A member hears of a change (one stopped, one joined) at its next heartbeat: 0.1 s,
        # not 0.5 s, of a SIGTERM's handover. A few schedulers' heartbeats cost nothing.
        return consumer_config(
            self.settings, self.member, self.group,
            **{"partition.assignment.strategy": "range",  # eager: every member hears every change
               "session.timeout.ms": session,
               "heartbeat.interval.ms": max(10, min(session // 10, 100))})

    # -- membership and roles -----------------------------------------------------------

    def _on_rebalance(self, _consumer: OnLane, _partitions: list[TopicPartition]) -> None:
        # On the membership consumer's lane: the group changed. The roles are computed on
        # the event loop, from the members the coordinator lists.
        if self._event_loop is not None:
            self._event_loop.call_soon_threadsafe(self._membership_changed.set)

    async def _poll_membership(self, membership: ConsumerThread, stopping: asyncio.Event) -> None:
        """Serve the membership consumer (its heartbeats and rebalances run inside
        consume), and ask the coordinator who the members are whenever the group changed."""
        last_asked = 0.0
        while not stopping.is_set():
            await membership.consume(10, 0.1)
            if self._membership_changed.is_set() or time.monotonic() - last_asked > MEMBERSHIP_SECONDS:
                self._membership_changed.clear()
                last_asked = time.monotonic()
                with contextlib.suppress(KafkaException):
                    members = await self._members_now()
                    if sorted(members) != self._members:
                        self._members_seen(members)
                    self.health.set("membership", self.member in self._members, "joining the group")

    def _members_seen(self, members: list[str]) -> None:
        self._members = sorted(members)
        self._member_changes += 1
        log(logger, "scheduler_members", members=",".join(self._members))

    def _roles(self, members: list[str]) -> tuple[set[int], set[int]]:
        mine = roles(members, self.shards, self.settings.scheduler_standbys).get(self.member)
        if mine is None:
            return set(), set()
        return set(mine.leads), set(mine.standby)

    async def _warm_up(self, stopping: asyncio.Event) -> None:
        """Before joining: keep warm what this process will lead once it is a member, so
        that the shards it takes from others are taken over warm."""
        members = await self._members_now()
        leads, standby = self._roles([*members, self.member])
        if not members:
            return  # the first process: nobody to take over from, nothing to wait for
        assert self._follower is not None
        for shard in leads | standby:
            self._follower.follow(shard, self._store(shard), "standby")
        self.standby = leads | standby
        started = time.monotonic()
        for shard in sorted(leads):
            if stopping.is_set() or time.monotonic() - started > WARM_UP_PATIENCE:
                break
            await self._follower.caught_up(shard)
        log(logger, "scheduler_warmed_up", instance=self.instance, shards=len(leads),
            seconds=round(time.monotonic() - started, 3))

    async def _follow_roles(self) -> None:
        """Start leading what the roles give this process, stop leading what they take away,
        and keep warm what it stands by for."""
        assert self._follower is not None
        leads, standby = self._roles(self._members) if self.member in self._members else (set(), set())
        # A shard the roles move to another process is handed over as at a SIGTERM: a
        # member that joins or leaves moves a few shards between the others too (10M: the
        # fires of two such shards 1.3 s late, the new leader 0.4 s behind the old).
        await asyncio.gather(*(self._stop_leader(shard, "moved", hand_over=True)
                               for shard in sorted(set(self.leaders) - leads)))
        for shard in sorted(leads - set(self.leaders)):
            if self._may_lead(shard):
                await self._start_leader(shard)
        for shard in sorted(self.standby - standby - set(self.leaders)):
            self._follower.forget(shard)
        self.standby &= standby - set(self.leaders)
        if any(not leader.ready.is_set() for leader in self.leaders.values()):
            # Takeovers first: a new standby shard is read whole, and on the one reader it
            # would hold back the tail each takeover waits for (a SIGKILL at 1M jobs: 7 to
            # 17 s of tail for three of twelve shards, behind the new standbys' reads).
            return
        for shard in sorted(standby - self.standby - set(self.leaders)):
            self._follower.follow(shard, self._store(shard), "standby")
        self.standby = standby - set(self.leaders)

    def _may_lead(self, shard: int) -> bool:
        """Whether a shard whose last term here ended may be led again: after its wait, or
        once the members changed since (the roles that give it are then new: a process
        fenced by one that joined is given its shards back at once when that one leaves,
        not a session later — a SIGTERM right after a rejoin at 10M: fires 4.7 s late).
        Fenced before it saw the other join, it sees the same members again once that one
        leaves: a change all the same (at 100,000 jobs: fires 4 s late)."""
        ended = self._retry_after.get(shard)
        return ended is None or time.monotonic() >= ended[0] or self._member_changes != ended[1]

    async def _start_leader(self, shard: int) -> None:
        assert self._follower is not None and self._definitions is not None
        store = self._store(shard)
        self._follower.follow(shard, store, "taking_over")
        leader = ShardLeader(self.settings, shard, election=self._definitions, store=store,
                             follower=self._follower, instance=self.instance, kafka=self.kafka,
                             group_metadata=self._group_metadata, calendars=self.calendars)
        self.leaders[shard] = leader
        log(logger, "leader_elected", instance=self.instance, shard=shard)
        leader.start()

    async def _stop_leader(self, shard: int, reason: str, hand_over: bool = False) -> None:
        leader = self.leaders.pop(shard, None)
        if leader is None:
            return
        await leader.stop(hand_over=hand_over)
        assert self._follower is not None
        self._follower.forget(shard)
        log(logger, "leader_stepped_down", instance=self.instance, shard=shard, reason=reason)

    def _group_metadata(self) -> Any:
        assert self._membership is not None
        return self._membership.group_metadata()

    async def _follow_leadership(self) -> None:
        """A term that failed ends; a fenced leader waits a session before trying again (by
        then the members say whether it still leads; sooner if they change: _may_lead), a
        failed one a second — unless it failed on a transaction whose outcome its replaced
        producer has settled (a broker restart): then it takes the shard again at once,
        reading back what committed."""
        for shard, leader in list(self.leaders.items()):
            if leader.active:
                continue
            self.leaders.pop(shard)
            await leader.stop()
            if leader.fenced:
                wait = self.settings.scheduler_session_timeout_ms / 1000
            elif isinstance(leader.failed, TransactionOutcomeUnknown):
                wait = 0.0
            else:
                wait = 1.0
            self._retry_after[shard] = (time.monotonic() + wait, self._member_changes)
            log(logger, "leader_stepped_down", instance=self.instance, shard=shard,
                reason="fenced" if leader.fenced else "failed")
        ready = all(leader.ready.is_set() for leader in self.leaders.values())
        self.health.set("takeover", ready, "taking over shards")
        roles = (frozenset(self.leaders), frozenset(self.standby))
        if ready and self.member in self._members and roles != self._ready_roles:
            self._ready_roles = roles
            self._trim_now.set()
            self._publish_metrics()
            log(logger, "scheduler_ready", instance=self.instance, leads=len(self.leaders),
                standby=len(self.standby), members=len(self._members))

    async def _read_definitions(self, definitions: ConsumerThread) -> list[Message]:
        """The next definitions, unless the leaders' backlogs are full: then they drain them."""
        if sum(leader.backlog for leader in self.leaders.values()) < DEFINITIONS_BACKLOG:
            # Taking over, the leaders call on this consumer's lane (their committed
            # offset, their partition's assignment) between these polls: short ones then,
            # or each takeover waits a poll per call (~150 ms a shard, one after another).
            taking_over = any(not leader.ready.is_set() for leader in self.leaders.values())
            return await definitions.consume(5000, 0.005 if taking_over else 0.05)
        for leader in self.leaders.values():
            leader.drain()
        await asyncio.sleep(0.05)
        return []

    def _route(self, batch: Any) -> None:
        """The definitions batch, to the leader of each record's shard."""
        by_shard: dict[int, list[Message]] = {}
        for msg in batch.records:
            by_shard.setdefault(position(msg)[1], []).append(msg)
        for shard in set(by_shard) | {p for _t, p in batch.ended}:
            leader = self.leaders.get(shard)
            if leader is not None:
                leader.feed(batch, by_shard.get(shard, []),
                            (self.topics.job_definitions, shard) in batch.ended)

    async def _trim(self, stopping: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        trimmed = 0  # RSS after the last trim
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._trim_now.wait(), TRIM_SECONDS)
            before, started = rss_bytes(), time.monotonic()
            if not self._trim_now.is_set() and before - trimmed < TRIM_GROWTH:
                continue  # steady: nothing worth a trim (it locks each heap while it walks it)
            self._trim_now.clear()
            if not await loop.run_in_executor(None, release_free_memory):
                return  # not glibc: nothing to do
            trimmed = rss_bytes()
            freed = before - trimmed
            if freed > 16 * 2**20:
                log(logger, "memory_released", instance=self.instance, freed_mb=freed // 2**20,
                    rss_mb=trimmed // 2**20, ms=round(1000 * (time.monotonic() - started)))

    # -- visible ------------------------------------------------------------------------

    async def _report(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            self._publish_metrics()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), METRICS_SECONDS)

    def _publish_metrics(self) -> None:
        """The gauges, every few seconds and at once when the roles settle (a scrape right
        after `scheduler_ready` sees the shards led)."""
        assert self._follower is not None
        led = [leader for leader in self.leaders.values() if leader.ready.is_set()]
        # Every scheduler says how many shards there are, so that an alert compares
        # the shards led, summed over the schedulers, with it (deploy/prometheus).
        metrics.SCHEDULER_SHARDS.set(self.shards)
        metrics.SCHEDULER_SHARDS_LED.set(len(led))
        metrics.SCHEDULER_SHARDS_STANDBY.set(len(self.standby))
        metrics.SCHEDULER_LEADER.set(1 if led else 0)
        # One store counted again per report, the one counted longest ago: a count scans
        # its table, and a process may lead a dozen shards of 300,000 jobs.
        stalest = min(led, key=lambda leader: leader.store.counted[0] if leader.store.counted else 0.0,
                      default=None)
        if stalest is not None and (stalest.store.counted is None
                                    or time.monotonic() - stalest.store.counted[0] > JOBS_COUNT_SECONDS):
            stalest.store.count()
        metrics.SCHEDULER_JOBS.set(sum(leader.store.last_count() for leader in led))
        metrics.SCHEDULER_PENDING_RETRIES.set(sum(leader.store.retry_count() for leader in led))
        metrics.SCHEDULER_SUSPENDED.set(sum(len(leader.clock.suspended) for leader in led))
        metrics.SCHEDULER_WAITING.set(sum(leader.waiting() for leader in led))
        metrics.SCHEDULER_HELD.set(sum(leader.jobs for leader in led))
        metrics.SCHEDULER_STANDBY_LAG.set(self._follower.lag())
        metrics.TRIGGER_LAG.set(sum(leader.triggers.lag() for leader in led))
        self._check_standbys()

    def _check_standbys(self) -> None:
        """Ready once every shard the roles give this process to stand by for is followed
        and was read to within STANDBY_READY_LAG records of its end; it stays ready while
        the roles stay (a burst's lag does not make it unready)."""
        assert self._follower is not None
        follower = self._follower
        wanted: set[int] = set()
        if self.member in self._members:
            wanted = self._roles(self._members)[1] - set(self.leaders)

        def warm(shard: int) -> bool:
            lag = follower.lag_of(shard) if shard in self.standby else None
            return lag is not None and lag <= STANDBY_READY_LAG

        self._warm = frozenset(s for s in wanted if s in self._warm or warm(s))
        cold = len(wanted - self._warm)
        self.health.set("standbys", not cold or self.member not in self._members,
                        f"{cold} standby shards still reading")



def release_free_memory() -> bool:
    """Hand the free pages of the C heaps back to the system (glibc's malloc_trim); False
    where there is no glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


def rss_bytes() -> int:
    """This process's resident memory (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
