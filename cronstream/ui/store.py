"""The read side: the projection through the named queries of `shared/sql/ui.sql`.

One small asyncpg pool, opened lazily so that the UI starts (and says it is not ready)
while PostgreSQL is away, whose transactions are read-only; every query has a statement
timeout so that a slow one fails the request instead of piling up.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg

from cronstream.shared.db import query
from cronstream.shared.logs import log
from cronstream.shared.redaction import redact_url

logger = logging.getLogger(__name__)

STATEMENT_TIMEOUT_MS = 5000
CONNECT_TIMEOUT_SECONDS = 5.0


class DatabaseUnavailable(RuntimeError):
    """PostgreSQL cannot be reached right now (the page says so with a 503)."""


class Store:
    def __init__(self, dsn: str, max_size: int = 4) -> None:
        self.dsn = dsn
        self.max_size = max_size
        self._pool: asyncpg.Pool | None = None
        self._lock = asyncio.Lock()

    async def pool(self) -> asyncpg.Pool:
        if self._pool is not None:
            return self._pool
        async with self._lock:
            if self._pool is None:
                try:
                    self._pool = await asyncpg.create_pool(
                        self.dsn, min_size=1, max_size=self.max_size,
                        timeout=CONNECT_TIMEOUT_SECONDS,
                        # Read-only whatever role the URL names (cronstream_reader is
                        # read-only by itself: docs/decisions/0034).
                        server_settings={"statement_timeout": str(STATEMENT_TIMEOUT_MS),
                                         "application_name": "cronstream-ui",
                                         "default_transaction_read_only": "on"})
                except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
                    log(logger, "database_unavailable", logging.WARNING,
                        database=redact_url(self.dsn), error=str(exc))
                    raise DatabaseUnavailable(str(exc)) from None
                log(logger, "database_connected", database=redact_url(self.dsn))
        assert self._pool is not None
        return self._pool

    async def fetch(self, name: str, *args: Any) -> list[asyncpg.Record]:
        pool = await self.pool()
        try:
            return await pool.fetch(query(name, "ui.sql"), *args)
        except (OSError, asyncpg.exceptions.ConnectionDoesNotExistError,
                asyncpg.exceptions.CannotConnectNowError) as exc:
            raise DatabaseUnavailable(str(exc)) from None

    async def fetchrow(self, name: str, *args: Any) -> asyncpg.Record | None:
        rows = await self.fetch(name, *args)
        return rows[0] if rows else None

    async def ping(self) -> bool:
        try:
            pool = await self.pool()
            await pool.fetchval(query("ping", "ui.sql"))
        except (DatabaseUnavailable, OSError, asyncpg.PostgresError, TimeoutError):
            return False
        return True

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
