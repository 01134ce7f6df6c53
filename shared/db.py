"""PostgreSQL access: named queries from `sql/queries.sql` and versioned migrations.

SQL lives in `.sql` files, never in Python strings. `queries.sql` holds named blocks
(`-- name: x`); `sql/migrations/NNNN_name.sql` are applied in order by `cronstream init`,
each once, in its own transaction, under an advisory lock so that concurrent `init`s
are safe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import asyncpg

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")
_LOCK_KEY = 0x63726F6E  # "cron"


@lru_cache(maxsize=8)
def queries(file: str = "queries.sql") -> dict[str, str]:
    """The named blocks of one file in `sql/` (a module with many queries of its own, e.g.
    retention, keeps them in a file of their own)."""
    text = resources.files("cronstream.shared").joinpath(f"sql/{file}").read_text()
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
    finally:
        await conn.execute(query("unlock_migrations"), _LOCK_KEY)
    return applied
