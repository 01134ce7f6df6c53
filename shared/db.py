"""PostgreSQL access: named queries from `sql/queries.sql` and versioned migrations.

SQL lives in `.sql` files, never in Python strings. `queries.sql` holds named blocks
(`-- name: x`); `sql/migrations/NNNN_name.sql` are applied in order by `cronstream init`,
each once, in its own transaction, under an advisory lock so that concurrent `init`s
are safe; then the roles of least privilege are granted what every table needs
(migration 0008, `db_roles.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from importlib import resources
from typing import Any

import asyncpg

# A session that ended under the statement: the connection is gone (the pool discards
# it), and so may be the server's last commits. Besides the lost connection itself:
# - the server ending the session, at a shutdown (57P01) or while it restarts after
#   another backend crashed (57P02, crash recovery: pg_postmaster_start_time() does not
#   move, so only this error tells);
# - asyncpg's InternalClientError "cannot switch to state N; another operation (2) is in
#   progress": a session terminated mid-transaction leaves the protocol consuming the
#   error when the rollback comes (MagicStack/asyncpg#784, sqlalchemy#13241). Seen in the
#   chaos suite's PostgreSQL SIGKILL, where it stopped the monitor.
SESSION_LOST: tuple[type[Exception], ...] = (
    asyncpg.PostgresConnectionError, asyncpg.InterfaceError, asyncpg.InternalClientError,
    asyncpg.AdminShutdownError, asyncpg.CrashShutdownError)

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")
_LOCK_KEY = 0x63726F6E  # "cron"


@lru_cache(maxsize=4)
def queries(file: str = "queries.sql") -> dict[str, str]:
    """The named blocks of `sql/<file>` (queries.sql: services and CLI; ui.sql: the web UI)."""
    return named_blocks(resources.files("cronstream.shared").joinpath(f"sql/{file}").read_text())


def named_blocks(text: str) -> dict[str, str]:
    """`-- name: x` blocks of a .sql text, by name."""
    parts = _NAME.split(text)
    # parts: [preamble, name1, body1, name2, body2, ...]
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts), 2)}


def query(name: str, file: str = "queries.sql") -> str:
    return queries(file)[name]


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    folder = resources.files("cronstream.shared").joinpath("sql/migrations")
    found = []
    for entry in folder.iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    return sorted(found, key=lambda m: m.version)


async def connect(dsn: str, **kwargs: Any) -> asyncpg.Connection:
    return await asyncpg.connect(dsn, **kwargs)


# -- timestamptz without asyncpg's generic path -----------------------------------------

_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_INFINITY, _NEGATIVE_INFINITY = 0x7FFF_FFFF_FFFF_FFFF, -0x8000_0000_0000_0000
_MAX_MICROS = (datetime.max.replace(tzinfo=UTC) - _PG_EPOCH) // _MICROSECOND
_MIN_MICROS = (datetime.min.replace(tzinfo=UTC) - _PG_EPOCH) // _MICROSECOND


def timestamptz_to_wire(value: object) -> tuple[int]:
    """A timestamptz as PostgreSQL's microseconds since 2000-01-01 UTC, taking what
    asyncpg's own encoder takes: a UTC datetime in a third of its time (it converts each to
    UTC and compares it with two infinities first, about a microsecond, and the monitor
    COPYs four to six of them per row); anything else the way asyncpg does (naive and
    `date` values in local time; `datetime.max` and `min`, naive, or their instants in
    any zone, as ±infinity)."""
    if type(value) is datetime and value.tzinfo is UTC:
        micros = (value - _PG_EPOCH) // _MICROSECOND
    elif isinstance(value, datetime):
        if value == datetime.max:
            return (_INFINITY,)
        if value == datetime.min:
            return (_NEGATIVE_INFINITY,)
        micros = (value.astimezone(UTC) - _PG_EPOCH) // _MICROSECOND
    elif isinstance(value, date):
        midnight = datetime(value.year, value.month, value.day).astimezone(UTC)
        micros = (midnight - _PG_EPOCH) // _MICROSECOND
    else:
        raise TypeError(f"expected a datetime.date or datetime.datetime instance, "
                        f"got {type(value).__name__!r}")
    if micros == _MAX_MICROS:
        return (_INFINITY,)
    if micros == _MIN_MICROS:
        return (_NEGATIVE_INFINITY,)
    return (micros,)


def timestamptz_from_wire(value: tuple[int]) -> datetime:
    """What asyncpg decodes: an aware UTC datetime, ±infinity as `datetime.max`/`min`."""
    (micros,) = value
    if micros == _INFINITY:
        return datetime.max
    if micros == _NEGATIVE_INFINITY:
        return datetime.min
    return _PG_EPOCH + timedelta(microseconds=micros)


async def fast_timestamps(conn: asyncpg.Connection) -> None:
    """Give `conn` the timestamptz codec above (a connection-level setting: pools set it
    on each connection they open)."""
    await conn.set_type_codec("timestamptz", schema="pg_catalog", encoder=timestamptz_to_wire,
                              decoder=timestamptz_from_wire, format="tuple")


async def apply_migrations(conn: asyncpg.Connection) -> list[str]:
    """Apply pending migrations; return the names applied (empty when up to date)."""
    applied: list[str] = []
    await conn.execute(query("lock_migrations"), _LOCK_KEY)
    try:
        await conn.execute(query("create_migrations_table"))
        done = {r["version"] for r in await conn.fetch(query("applied_migrations"))}
        for migration in migrations():
            if migration.version in done:
                continue
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(query("record_migration"), migration.version, migration.name)
            applied.append(f"{migration.version:04d}_{migration.name}")
        await conn.execute(query("grant_roles"))
    finally:
        await conn.execute(query("unlock_migrations"), _LOCK_KEY)
    return applied
