"""PostgreSQL roles of least privilege: `cronstream init --roles` (docs/reference/projection.md#roles).

| role | used by | may |
|---|---|---|
| `cronstream_owner` | `cronstream init` (migrations) | own and alter the schema's objects |
| `cronstream_writer` | the monitor, `cronstream prune` | read and write rows, no DDL |
| `cronstream_reader` | the dashboard, Grafana, CLI reads | read; every transaction read-only |

`init --roles` runs with an administrator's URL (a superuser, or a role with CREATEROLE
that owns the database): it creates the roles as LOGIN roles, sets the passwords it is
given (hashed here as SCRAM-SHA-256 verifiers, so that the server — and its log —
never sees them), makes the owner own the objects already there, and applies the
migrations as the owner (`SET ROLE`). The grants live in migration 0008
(`cronstream_grant_roles()`), which every `init` runs after migrating.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Mapping

import asyncpg

from cronstream.shared.db import apply_migrations, query

ROLES = ("cronstream_owner", "cronstream_writer", "cronstream_reader")
SCRAM_ITERATIONS = 4096  # PostgreSQL's own default (scram_iterations)
_ROLES_SQL = "roles.sql"


class RoleError(ValueError):
    """A role's password cannot be used as given; the message says why."""


def scram_verifier(password: str, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS) -> str:
    """What PostgreSQL stores for `password` (RFC 5802, 7677), as `ALTER ROLE ... PASSWORD`
    accepts it ready-made. ASCII only: the server would SASLprep other characters first,
    and a password that changes under it is not one to guess about."""
    if not password or not password.isascii() or not password.isprintable():
        raise RoleError("a role password must be printable ASCII (e.g. `openssl rand -hex 24`)")
    salt = os.urandom(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    b64 = base64.b64encode
    return (f"SCRAM-SHA-256${iterations}:{b64(salt).decode()}$"
            f"{b64(stored_key).decode()}:{b64(server_key).decode()}")


async def create_roles(conn: asyncpg.Connection, passwords: Mapping[str, str]) -> list[str]:
    """Create the roles that do not exist, set the passwords given (role -> password),
    adopt what exists; returns the roles that were missing."""
    unknown = set(passwords) - set(ROLES)
    if unknown:
        raise RoleError(f"no such role: {', '.join(sorted(unknown))}")
    verifiers = {role: scram_verifier(password) for role, password in passwords.items()}
    before = {r["rolname"] for r in await conn.fetch(query("existing_roles", _ROLES_SQL))}
    await conn.execute(query("create_roles", _ROLES_SQL))
    for role, verifier in verifiers.items():
        async with conn.transaction():
            await conn.execute(query("stage_password", _ROLES_SQL), role, verifier)
            await conn.execute(query("set_password", _ROLES_SQL))
    await conn.execute(query("adopt_objects", _ROLES_SQL))
    return [role for role in ROLES if role not in before]


async def migrate_as_owner(conn: asyncpg.Connection) -> list[str]:
    """Apply the migrations as `cronstream_owner` (it then owns what they create)."""
    await conn.execute(query("become_owner", _ROLES_SQL))
    try:
        return await apply_migrations(conn)
    finally:
        await conn.execute(query("stop_being_owner", _ROLES_SQL))
