"""The machine's PostgreSQL (15+) server, started for development and tests.

The server refuses to run as root, so when we are root its data directory belongs to the
`postgres` OS user and its commands run through `runuser`. The cluster is a throwaway
development one: trust authentication on localhost, `synchronous_commit=off`.
"""

from __future__ import annotations

import asyncio
import glob
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from cronstream.infra.process import answers, read_pid, wait_until

MIN_VERSION = 15


def _bindir() -> Path:
    candidates = sorted(
        (Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin") if Path(p, "pg_ctl").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    for path in reversed(candidates):
        if path.parent.name.isdigit() and int(path.parent.name) >= MIN_VERSION:
            return path
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    raise RuntimeError(f"PostgreSQL {MIN_VERSION}+ server binaries (pg_ctl) not found")


class PostgresServer:
    def __init__(self, base: Path, host: str, port: int, database: str) -> None:
        self.host, self.port, self.database = host, port, database
        self.home = base / "postgres"
        self.data = self.home / "data"
        self.log_file = self.home / "server.log"
        self.pid_file = self.home / "started-by-cronstream"

    def answering(self) -> bool:
        return answers(self.host, self.port)

    def started_pid(self) -> int | None:
        return read_pid(self.pid_file)

    def _as_owner(self, argv: list[str]) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *argv]
        return argv

    def _chown(self, path: Path) -> None:
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def start(self, timeout: float = 60.0) -> int:
        bindir = _bindir()
        self.home.mkdir(parents=True, exist_ok=True)
        os.chmod(self.home.parent, 0o755)
        os.chmod(self.home, 0o755)
        self._chown(self.home)
        if not (self.data / "PG_VERSION").exists():
            subprocess.run(
                self._as_owner([str(bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
                                "--auth=trust", "-E", "UTF8", "--no-instructions"]),
                check=True, capture_output=True,
            )
        options = (
            f"-p {self.port} -k {self.home} -c listen_addresses={self.host} "
            "-c synchronous_commit=off -c max_connections=200 -c shared_buffers=256MB"
        )
        subprocess.run(
            self._as_owner([str(bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log_file),
                            "-o", options, "-w", "-t", str(int(timeout)), "start"]),
            check=True, capture_output=True,
        )
        pid = int((self.data / "postmaster.pid").read_text().splitlines()[0])
        self.pid_file.write_text(str(pid))
        wait_until(self.answering, timeout, f"PostgreSQL at {self.host}:{self.port}")
        return pid

    def stop(self) -> bool:
        if self.started_pid() is None:
            return False
        subprocess.run(
            self._as_owner([str(_bindir() / "pg_ctl"), "-D", str(self.data), "-m", "fast",
                            "-w", "stop"]),
            check=False, capture_output=True,
        )
        self.pid_file.unlink(missing_ok=True)
        return True


async def ensure_database(dsn_admin: str, database: str) -> bool:
    """Create `database` if it does not exist; return whether it was created."""
    import asyncpg

    conn = await asyncpg.connect(dsn_admin)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database)
        if exists:
            return False
        await conn.execute(f'CREATE DATABASE "{database}"')
        return True
    finally:
        await conn.close()


def create_database(dsn_admin: str, database: str) -> bool:
    return asyncio.run(ensure_database(dsn_admin, database))


def wait_for_connections(dsn: str, timeout: float = 30.0) -> None:
    import asyncpg

    async def _try() -> bool:
        try:
            conn = await asyncpg.connect(dsn, timeout=2)
        except (OSError, asyncpg.PostgresError):
            return False
        await conn.close()
        return True

    wait_until(lambda: asyncio.run(_try()), timeout, "PostgreSQL connections")
