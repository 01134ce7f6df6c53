"""The scheduler service: leader election through the `job-definitions` consumer group.

Every instance joins the group `<prefix>scheduler` on the single-partition
`job-definitions` topic (cooperative-sticky, so a joining standby never steals the
partition); the instance holding partition 0 leads. Leadership is only *detected* this
way: correctness comes from the leader's fenced transactional producer (leader.py).
On revoke or loss the leader stops acting before the callback returns.
"""

from __future__ import annotations

import asyncio
import logging
import time

from confluent_kafka import TopicPartition

from cronstream.services.scheduler.leader import Leader
from cronstream.shared.clients import REAL, KafkaClients
from cronstream.shared.health import Health
from cronstream.shared.inbound import Inbound
from cronstream.shared.kafka.config import END_FETCH_WAIT_MS, consumer_config
from cronstream.shared.kafka.consumer import ConsumerThread, OnLane
from cronstream.shared.logs import log
from cronstream.shared.settings import Settings

logger = logging.getLogger(__name__)

OFFSET_BEGINNING = -2


class SchedulerService:
    name = "scheduler"

    def __init__(self, settings: Settings, instance: str | None = None,
                 kafka: KafkaClients = REAL) -> None:
        self.settings = settings
        self.kafka = kafka
        self.topics = settings.topics
        self.instance = settings.instance(instance)
        self.health = Health(self.name)
        # Ready once the election group answered: as leader (after takeover) or standby.
        self.health.require("election")
        self.leader: Leader | None = None
        self._assigned = False
        self._retry_after = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._election: ConsumerThread | None = None
        self.inbound = Inbound(self.name, self.topics)

    async def run(self, stopping: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        session = self.settings.scheduler_session_timeout_ms
        conf = consumer_config(
            self.settings,
            f"scheduler-{self.instance}",
            f"{self.topics.prefix}scheduler",
            **{
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": session,
                "heartbeat.interval.ms": max(100, session // 5),
                # Taking over waits for the end of the definitions (EOF): told promptly.
                "enable.partition.eof": True,
                "fetch.wait.max.ms": END_FETCH_WAIT_MS,
            },
        )
        election = self._election = self.kafka.consumer(conf, "election")
        await election.subscribe([self.topics.job_definitions], on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_lost)
        log(logger, "scheduler_standby", instance=self.instance)
        try:
            while not stopping.is_set():
                batch = self.inbound.batch(await election.consume(5000, 0.05))
                await self._follow_leadership()
                if self.leader is not None:
                    self.leader.feed(batch)  # a standby reads nothing but errors (logged)
        finally:
            await self._stop_leader("shutdown")
            await election.close()

    async def _follow_leadership(self) -> None:
        leader = self.leader
        if leader is not None and not leader.active:
            await self._stop_leader("fenced" if leader.fenced else "failed")
            # A fenced leader that still holds the partition waits a session before
            # trying again: by then the group has told it whether it still leads. A failed
            # term (a transaction that did not commit, a broker away) is retried soon: the
            # new term's takeover rebuilds everything from Kafka.
            wait = self.settings.scheduler_session_timeout_ms / 1000 if leader.fenced else 1.0
            self._retry_after = time.monotonic() + wait
        if self.leader is not None:
            # A leader is ready once it has fenced its predecessor and read its state.
            self.health.set("takeover", self.leader.ready.is_set(), "taking over leadership")
        if self.leader is None and self._assigned and time.monotonic() >= self._retry_after:
            assert self._election is not None
            log(logger, "leader_elected", instance=self.instance)
            self.leader = Leader(self.settings, self._election, self.instance, self.kafka)
            self.leader.start()

    async def _stop_leader(self, reason: str) -> None:
        leader, self.leader = self.leader, None
        self.health.set("takeover", True)
        if leader is not None:
            await leader.stop()
            log(logger, "leader_stepped_down", instance=self.instance, reason=reason)

    # -- rebalance callbacks: run on the election thread, inside consume() --------------

    def _on_assign(self, consumer: OnLane, partitions: list[TopicPartition]) -> None:
        self.health.set("election", True)
        for tp in partitions:
            tp.offset = OFFSET_BEGINNING  # the leader replays definitions from the start
        consumer.incremental_assign(partitions)
        if partitions:
            # Held until the new leader has fenced its predecessor and read its state.
            consumer.pause(partitions)
            self._assigned = True
            self._retry_after = 0.0

    def _on_revoke(self, consumer: OnLane, partitions: list[TopicPartition]) -> None:
        self._lose(partitions, "revoked")
        consumer.incremental_unassign(partitions)

    def _on_lost(self, consumer: OnLane, partitions: list[TopicPartition]) -> None:
        self._lose(partitions, "lost")
        consumer.incremental_unassign(partitions)

    def _lose(self, partitions: list[TopicPartition], why: str) -> None:
        if not partitions:
            return
        self._assigned = False
        log(logger, "leadership_" + why, instance=self.instance)
        if self.leader is not None and self._loop is not None:
            # Stop acting before returning: the next leader may start right after.
            future = asyncio.run_coroutine_threadsafe(self._stop_leader(why), self._loop)
            future.result(timeout=60)
