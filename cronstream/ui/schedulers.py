"""The Schedulers page's source: which scheduler process leads each shard of the clock and
which keeps it warm — read from Kafka, not PostgreSQL.

Who is alive is the scheduler group's coordinator's word, and the roles are what every
scheduler computes from the members (shared/shards.py); nothing projects either into
PostgreSQL, and a row of who was alive a while ago is what this page must not show as
now. So the page asks what `cronstream schedulers` asks (`scheduler_rows`: the group's
members and the partition count of job-definitions), through the dashboard's own Kafka
principal (DESCRIBE on the group and the topic, shared/acls.py).

At most one read every CACHE_SECONDS, however many pages load: requests that come
meanwhile get the last answer (an error too, so an outage costs one wait, not one per
page), and while a read is under way a request waits for that one rather than starting
another. The Admin calls block: they run on a thread of their own.

Whether a leader has taken its shard over, and how far behind a standby is, only the
scheduler itself knows: its metrics (`cronstream_scheduler_shards_led`,
`cronstream_scheduler_standby_lag_records`) and the Grafana panel, not this page.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import click

CACHE_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 10.0

# (one row per live scheduler: scheduler_id, leads, standby), the shard count.
Reader = Callable[[], tuple[list[dict[str, Any]], int]]


class SchedulersUnavailable(RuntimeError):
    """Kafka did not say who the schedulers are (the message says why)."""


@dataclass(frozen=True, slots=True)
class Membership:
    schedulers: list[dict[str, Any]]
    shards: int
    read_at: datetime


def _why(exc: BaseException) -> str:
    if isinstance(exc, click.ClickException):
        return exc.message  # the topic is missing: `cronstream init`
    return str(exc) or type(exc).__name__


class SchedulerRoles:
    """The last answer of `read`, at most CACHE_SECONDS old (see the module's docstring)."""

    def __init__(self, read: Reader, clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._clock = clock
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ui-schedulers")
        self._lock = asyncio.Lock()
        self._running: asyncio.Future[tuple[list[dict[str, Any]], int]] | None = None
        self._answer: Membership | SchedulersUnavailable | None = None
        self._answered_at = 0.0

    async def get(self) -> Membership:
        """The schedulers and their shards; SchedulersUnavailable when Kafka did not say."""
        async with self._lock:
            if self._answer is None or self._clock() - self._answered_at >= CACHE_SECONDS:
                self._answer = await self._ask()
                self._answered_at = self._clock()
            if isinstance(self._answer, SchedulersUnavailable):
                raise self._answer
            return self._answer

    async def _ask(self) -> Membership | SchedulersUnavailable:
        # A read that outlived its request is still the one to wait for: one thread, one
        # read at a time, however long Kafka takes to answer.
        if self._running is None or self._running.done():
            self._running = asyncio.get_running_loop().run_in_executor(self._executor, self._read)
        try:
            rows, shards = await asyncio.wait_for(asyncio.shield(self._running), READ_TIMEOUT_SECONDS)
        except TimeoutError:
            return SchedulersUnavailable(f"Kafka did not answer within {READ_TIMEOUT_SECONDS:g} s")
        except Exception as exc:
            return SchedulersUnavailable(_why(exc))
        return Membership(rows, shards, datetime.now(UTC))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def shard_table(membership: Membership) -> list[dict[str, Any]]:
    """Per shard: its leader (None: no scheduler leads it, so none of its jobs fires) and
    its standbys, from the schedulers' rows."""
    table: list[dict[str, Any]] = [{"shard": n, "leader": None, "standby": []}
                                   for n in range(membership.shards)]
    for row in membership.schedulers:
        for n in row["leads"]:
            if 0 <= n < membership.shards:
                table[n]["leader"] = row["scheduler_id"]
        for n in row["standby"]:
            if 0 <= n < membership.shards:
                table[n]["standby"].append(row["scheduler_id"])
    return table
