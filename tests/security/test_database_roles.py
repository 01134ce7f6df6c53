"""One PostgreSQL role per part (issue 49, item 2): `cronstream init --roles` makes
cronstream_owner (migrations), cronstream_writer (the monitor) and cronstream_reader
(dashboard, Grafana, CLI reads), and the database holds each to its part: the reader
cannot write even when it asks for a read-write transaction, the writer cannot change
the schema, and a table a later migration adds is granted without anyone remembering to.

The test server trusts local connections (pg_hba), so each role is reached by name;
the passwords `init --roles` sets are checked as stored (SCRAM verifiers, never the
password itself).
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys

import asyncpg
import pytest

from cronstream.shared.db_roles import scram_verifier
from cronstream.shared.settings import Settings
from cronstream.ui.store import Store
from tests.support import as_role, env_for, sql

PASSWORDS = {"CRONSTREAM_DB_OWNER_PASSWORD": "owner-pw-0123456789",
             "CRONSTREAM_DB_WRITER_PASSWORD": "writer-pw-0123456789",
             "CRONSTREAM_DB_READER_PASSWORD": "reader-pw-0123456789"}


def init(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**env_for(Settings(database_url=url)), **env}
    return subprocess.run([sys.executable, "-m", "cronstream", "init", "--no-topics", *args],
                          env=environment, capture_output=True, text=True, timeout=120, check=False)


async def _refused(url: str, statement: str, error: type[Exception], *prelude: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for line in prelude:
            await conn.execute(line)
        with pytest.raises(error):
            await conn.execute(statement)
    finally:
        await conn.close()


def refused(url: str, statement: str, error: type[Exception], *prelude: str) -> None:
    asyncio.run(_refused(url, statement, error, *prelude))


def tables(url: str) -> list[str]:
    return [r["tablename"] for r in sql(url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]


def test_init_roles_gives_each_role_its_part_and_nothing_more(database_url: str) -> None:
    made = init(database_url, "--roles", **PASSWORDS)
    assert made.returncode == 0, made.stderr
    assert "roles:" in made.stdout and "passwords set" in made.stdout
    owner, writer, reader = (as_role(database_url, f"cronstream_{r}") for r in ("owner", "writer", "reader"))

    # The owner owns every table (the test database was migrated by a superuser before).
    assert sql(database_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                             "AND tableowner <> 'cronstream_owner'") == []
    stored = {r["rolname"]: r["rolpassword"] for r in sql(
        database_url, "SELECT rolname, rolpassword FROM pg_authid WHERE rolname LIKE 'cronstream_%'")}
    for variable, password in PASSWORDS.items():
        role = "cronstream_" + variable.split("_")[2].lower()
        iterations, salt = stored[role].split("$")[1].split(":")
        assert stored[role] == scram_verifier(password, base64.b64decode(salt), int(iterations))

    # The reader reads everything, and writes nothing, whatever it asks for.
    for table in tables(database_url):
        sql(reader, f'SELECT count(*) FROM "{table}"')
    assert sql(reader, "SHOW default_transaction_read_only")[0][0] == "on"
    insert = "INSERT INTO workers (worker_id, hostname, status, last_heartbeat, capacity, updated_at) " \
             "VALUES ('w', 'h', 'ACTIVE', now(), 1, now())"
    refused(reader, insert, asyncpg.ReadOnlySQLTransactionError)
    refused(reader, insert, asyncpg.InsufficientPrivilegeError, "SET default_transaction_read_only = off")
    sql(reader, "LISTEN cronstream_executions")  # the dashboard's live view

    # The writer writes rows and nothing else.
    sql(writer, insert)
    sql(writer, "UPDATE workers SET status = 'OFFLINE' WHERE worker_id = 'w'")
    sql(writer, "DELETE FROM workers WHERE worker_id = 'w'")
    sql(writer, "CREATE TEMP TABLE staged (a int)")  # the monitor's staging tables
    for ddl in ("CREATE TABLE sneaky (a int)", "ALTER TABLE job_executions ADD COLUMN sneaky int",
                "DROP TABLE workers", "TRUNCATE workers", "CREATE INDEX sneaky ON workers (hostname)",
                "INSERT INTO schema_migrations (version, name) VALUES (9999, 'skip')"):
        refused(writer, ddl, asyncpg.InsufficientPrivilegeError)

    # The owner migrates; a table a later migration adds is granted with no grant of its own.
    again = init(owner)
    assert again.returncode == 0 and "migrations: up to date" in again.stdout, again.stderr
    sql(owner, "CREATE TABLE later_migration (a int)")
    sql(writer, "INSERT INTO later_migration VALUES (1)")
    assert sql(reader, "SELECT a FROM later_migration")[0]["a"] == 1
    refused(writer, "DROP TABLE later_migration", asyncpg.InsufficientPrivilegeError)

    # Running it again changes nothing and fails nothing.
    assert init(database_url, "--roles").returncode == 0


def test_a_role_password_that_is_not_printable_ascii_is_refused(database_url: str) -> None:
    refusal = init(database_url, "--roles", CRONSTREAM_DB_READER_PASSWORD="pässwörd-0123456789")
    assert refusal.returncode == 2 and "printable ASCII" in refusal.stderr
    assert "pässwörd" not in refusal.stderr


def test_the_dashboards_pool_is_read_only_whatever_role_it_is_given(database_url: str) -> None:
    """Even given a superuser's URL (an old single-URL install), the dashboard cannot write."""
    async def attempt() -> None:
        store = Store(database_url)
        try:
            pool = await store.pool()
            with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
                await pool.execute("DELETE FROM job_executions")
        finally:
            await store.close()

    asyncio.run(attempt())
