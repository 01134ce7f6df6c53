"""A worker's heartbeats: who it is, what it runs, whether it takes work.

Heartbeats go through an idempotent producer of their own, outside the transactions, so
that a worker busy committing (or waiting out a broker restart) keeps saying it is alive.
The monitor declares a worker dead after `CRONSTREAM_WORKER_DEAD_AFTER_SECONDS` of silence
and re-queues its RUNNING executions; it also re-queues an execution that a live worker
has not listed for a while (one whose start never committed as far as the worker knows).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from uuid import UUID

from confluent_kafka import KafkaException

from cronstream.shared.lifecycle import wait_or_stop
from cronstream.shared.logs import log
from cronstream.shared.producers import IdempotentProducer, OutRecord
from cronstream.shared.records import Heartbeat, WorkerStatus, now_utc
from cronstream.shared.telemetry import new_headers
from cronstream.shared.topics import Topics

logger = logging.getLogger(__name__)


class Heartbeats:
    def __init__(self, producer: IdempotentProducer, topics: Topics, worker_id: str, *,
                 capacity: int, queues: list[str], running: Callable[[], list[UUID]]) -> None:
        self.producer = producer
        self.topics = topics
        self.worker_id = worker_id
        self.capacity = capacity
        self.queues = queues
        self.running = running
        self.hostname = socket.gethostname()
        self._sent = time.monotonic()  # when the latest heartbeat was produced
        self.longest_gap = 0.0  # the longest time between two heartbeats so far

    def send(self, status: WorkerStatus) -> None:
        beat = Heartbeat(worker_id=self.worker_id, hostname=self.hostname, status=status,
                         sent_at=now_utc(), running=self.running(), capacity=self.capacity,
                         queues=self.queues)
        now = time.monotonic()
        self.longest_gap = max(self.longest_gap, now - self._sent)
        self._sent = now
        self.producer.produce(OutRecord(self.topics.heartbeats, self.worker_id.encode(),
                                        beat.to_json(), new_headers()))

    def silent_for(self) -> float:
        """How long this worker went without producing a heartbeat, at the most: past
        dead_after the monitor may have declared it dead (and fenced it) — a process that
        was paused, a loop that was stuck. (A broker that is away does not count: heartbeats
        produced meanwhile are delivered when it is back, with the time they were sent.)"""
        return max(self.longest_gap, time.monotonic() - self._sent)

    async def loop(self, status: Callable[[], WorkerStatus], interval: float,
                   done: asyncio.Event) -> None:
        """Beat every `interval` seconds until `done` (set after the drain)."""
        while not await wait_or_stop(done, 0):
            self.send(status())
            await wait_or_stop(done, interval)

    async def last(self, status: WorkerStatus, timeout: float = 5.0) -> None:
        """The final word (DRAINING, OFFLINE), delivered if the broker lets us in time. A
        broker that is away at shutdown is not a reason to fail the shutdown."""
        try:
            self.send(status)
            await self.producer.flush_async(timeout)
        except (KafkaException, BufferError, RuntimeError) as exc:
            log(logger, "heartbeat_not_delivered", logging.WARNING, status=status, error=str(exc))
