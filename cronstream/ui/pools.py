"""The Pools page's pools: each pool's slots and description, read from the `pools` topic
(what `cronstream pools` reads), not PostgreSQL, which projects the executions but not the
pools.

At most one read every CACHE_SECONDS however many pages load; a read that fails or takes
longer than READ_TIMEOUT_SECONDS leaves the sizes unknown (the page still shows what holds
and what waits, from the projection). The read blocks: it runs on a thread of its own.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from cronstream.client import Client
from cronstream.shared.records import Pool
from cronstream.shared.settings import Settings

CACHE_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 10.0


class PoolSizes:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ui-pools")
        self._lock = asyncio.Lock()
        self._sizes: dict[str, Pool] | None = None
        self._read_at = float("-inf")

    def _read(self) -> dict[str, Pool]:
        with Client(self._settings) as client:
            return client.pools()

    async def get(self) -> dict[str, Pool] | None:
        """The pools by name, or None when Kafka did not say (within the timeout)."""
        async with self._lock:
            if time.monotonic() - self._read_at >= CACHE_SECONDS:
                try:
                    self._sizes = await asyncio.wait_for(
                        asyncio.get_running_loop().run_in_executor(self._executor, self._read),
                        READ_TIMEOUT_SECONDS)
                except Exception:  # an outage shows as unknown sizes, not as an error page
                    self._sizes = None
                self._read_at = time.monotonic()
            return self._sizes

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
