"""Every service comes up on topics created a moment before (issue 45): the broker answers
NOT_LEADER_FOR_PARTITION and the like for a while after a topic is created, and a
service that exits on it at start counts towards a CrashLoopBackOff on Kubernetes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from cronstream.services.analytics.service import AnalyticsService
from cronstream.services.dispatcher.service import DispatcherService
from cronstream.services.monitor.service import MonitorService
from cronstream.services.scheduler.service import SchedulerService
from cronstream.services.worker.runner import CancelSignal, Outcome
from cronstream.services.worker.service import WorkerService
from cronstream.shared.fast_records import DueRecord
from cronstream.shared.kafka.admin import ensure_topics
from cronstream.shared.kafka.config import reader_config
from cronstream.shared.kafka.consumer import ConsumerThread
from cronstream.shared.kafka.reading import offsets_since
from cronstream.shared.lifecycle import Service
from cronstream.shared.settings import Settings


class NoRunner:
    """The worker's runner seam, for a worker that is only started and stopped."""

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def run_now(self, due: DueRecord, progress: Any, trace: Any = None,
                lines: Any = None) -> Outcome | None:
        return Outcome("COMPLETED")

    async def run(self, due: DueRecord, progress: Any, cancel: CancelSignal, trace: Any = None,
                  lines: Any = None) -> Outcome:
        return Outcome("COMPLETED")


SERVICES: dict[str, Callable[[Settings], Service]] = {
    "scheduler": lambda s: SchedulerService(s, "s1"),
    "dispatcher": lambda s: DispatcherService(s, "d1"),
    "worker": lambda s: WorkerService(s, NoRunner()),
    "monitor": lambda s: MonitorService(s, "m1"),
    "analytics": lambda s: AnalyticsService(s, "a1"),
}


@pytest.mark.parametrize("name", list(SERVICES))
def test_a_service_comes_up_on_topics_created_a_moment_before(settings: Settings, name: str) -> None:
    ensure_topics(settings, settings.topics.specs())
    service = SERVICES[name](settings)

    async def run() -> None:
        stopping = asyncio.Event()
        task = asyncio.create_task(service.run(stopping))
        deadline = time.monotonic() + 60
        while not service.health.ready()[0]:
            if task.done():
                task.result()  # raises what stopped it
                raise AssertionError(f"{name} returned before it was ready")
            assert time.monotonic() < deadline, f"{name} not ready: {service.health.ready()[1]}"
            await asyncio.sleep(0.1)
        stopping.set()
        await asyncio.wait_for(task, 30)

    asyncio.run(run())


def test_where_a_replay_starts_is_read_on_topics_created_a_moment_before(settings: Settings) -> None:
    # What analytics asks first at start (issue 45: it died on NOT_LEADER_FOR_PARTITION
    # from offsets_for_times right after `cronstream init`).
    ensure_topics(settings, settings.topics.specs())

    async def run() -> tuple[list[TopicPartition], dict[tuple[str, int], int]]:
        reader = ConsumerThread(reader_config(settings, "fresh"), "fresh")
        try:
            return await offsets_since(reader, settings.topics.execution_events,
                                       int(time.time() * 1000) - 60_000)
        finally:
            await reader.close()

    starts, ends = asyncio.run(run())
    assert sorted(tp.partition for tp in starts) == list(range(settings.topic_partitions))
    assert all(tp.offset == 0 for tp in starts) and set(ends.values()) == {0}
