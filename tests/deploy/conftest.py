"""Fixtures of the deployment tests (the servers come from tests/conftest.py)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from cronstream.shared.db import connect


def _with_db(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


@pytest.fixture
def empty_database(servers: tuple[str, str]) -> Iterator[str]:
    """A database with nothing in it (not from the migrated template): the init Job must
    apply the migrations, as on a new installation."""
    _, url = servers
    name = f"k8s_{uuid.uuid4().hex[:12]}"

    async def admin(statement: str) -> None:
        conn = await connect(_with_db(url, "postgres"))
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    yield _with_db(url, name)
    asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
