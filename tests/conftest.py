"""Fixtures: real Kafka and PostgreSQL, a unique topic prefix and a fresh database per test.

Where servers come from, in order: the addresses configured in the environment
(CRONSTREAM_KAFKA_BOOTSTRAP_SERVERS / CRONSTREAM_DATABASE_URL); the defaults when
something answers there (`make test` starts them with `cronstream infra up`); else
testcontainers when a Docker engine answers. Missing servers fail the run in CI and skip
the test elsewhere.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import pytest

from cronstream.infra.process import answers
from cronstream.shared.db import apply_migrations, connect
from cronstream.shared.kafka.admin import delete_topics, ensure_topics
from cronstream.shared.settings import Settings
from tests.support import ServiceProcess

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer

CI = bool(os.environ.get("CI"))
DEFAULT_KAFKA = "localhost:9092"
DEFAULT_DB = "postgresql://postgres@localhost:5432/cronstream"
# One template per test session: sessions of different checkouts may run side by side
# against the same server, each with its own migrations.
TEMPLATE_DB = f"cronstream_test_template_{os.getpid()}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = str(item.path)
        if "/integration/" in path:
            item.add_marker(pytest.mark.integration)
        elif "/e2e/" in path:
            item.add_marker(pytest.mark.e2e)


def _unavailable(what: str) -> None:
    message = f"{what} is not available (start it with `cronstream infra up`)"
    if CI:
        pytest.fail(message)
    pytest.skip(message)


def _docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def servers() -> Iterator[tuple[str, str]]:
    kafka = os.environ.get("CRONSTREAM_KAFKA_BOOTSTRAP_SERVERS")
    database = os.environ.get("CRONSTREAM_DATABASE_URL")
    containers: list[DockerContainer] = []
    if kafka is None and answers("127.0.0.1", 9092):
        kafka = DEFAULT_KAFKA
    if database is None and answers("127.0.0.1", 5432):
        database = DEFAULT_DB
    if (kafka is None or database is None) and _docker_answers():
        from testcontainers.kafka import KafkaContainer
        from testcontainers.postgres import PostgresContainer

        if kafka is None:
            k = KafkaContainer("apache/kafka:4.1.0").with_kraft()
            k.start()
            containers.append(k)
            kafka = k.get_bootstrap_server()
        if database is None:
            pg = PostgresContainer("postgres:15", driver=None)
            pg.start()
            containers.append(pg)
            database = pg.get_connection_url()
    if kafka is None:
        _unavailable("Kafka")
    if database is None:
        _unavailable("PostgreSQL")
    assert kafka is not None and database is not None
    yield kafka, database
    for container in containers:
        container.stop()


def _with_db(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


async def _create_template(url: str) -> None:
    admin = await connect(_with_db(url, "postgres"))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}"')
        await admin.execute(f'CREATE DATABASE "{TEMPLATE_DB}"')
    finally:
        await admin.close()
    conn = await connect(_with_db(url, TEMPLATE_DB))
    try:
        await apply_migrations(conn)
    finally:
        await conn.close()


async def _drop_template(url: str) -> None:
    admin = await connect(_with_db(url, "postgres"))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture(scope="session")
def template_db(servers: tuple[str, str]) -> Iterator[str]:
    _, url = servers
    asyncio.run(_create_template(url))
    yield url
    asyncio.run(_drop_template(url))


@pytest.fixture
def database_url(template_db: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"

    async def create() -> None:
        admin = await connect(_with_db(template_db, "postgres"))
        try:
            await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE_DB}"')
        finally:
            await admin.close()

    async def drop() -> None:
        admin = await connect(_with_db(template_db, "postgres"))
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()

    asyncio.run(create())
    yield _with_db(template_db, name)
    asyncio.run(drop())


@pytest.fixture
def settings(servers: tuple[str, str], database_url: str) -> Iterator[Settings]:
    """A unique topic prefix (its topics are deleted afterwards: a broker keeps files open
    for every partition, and a run creates thousands) and a fresh database."""
    kafka, _ = servers
    made = Settings(
        kafka_bootstrap_servers=kafka,
        database_url=database_url,
        topic_prefix=f"t{uuid.uuid4().hex[:10]}.",
        topic_partitions=3,
        heartbeat_interval_seconds=1,
        worker_dead_after_seconds=5,
        scheduler_session_timeout_ms=3000,
        worker_drain_grace_seconds=10,
        # Two shards: every test runs the sharded clock (tests of one shard say so).
        scheduler_shards=2,
        scheduler_data_dir=SCHEDULER_DATA_DIR,
    )
    yield made
    delete_topics(made)
    shutil.rmtree(Path(SCHEDULER_DATA_DIR) / made.topic_prefix.rstrip("."), ignore_errors=True)


@pytest.fixture
def topics(settings: Settings) -> Settings:
    """The settings, with every topic of their prefix created."""
    ensure_topics(settings, settings.topics.specs())
    return settings


# The shards' stores of the schedulers tests start (one folder per topic prefix).
SCHEDULER_DATA_DIR = os.path.join(tempfile.gettempdir(), f"cronstream-test-{os.getuid()}", "scheduler")


class Processes:
    """Service processes started by a test; all are stopped at teardown."""

    def __init__(self, settings: Settings, log_dir: Path) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.started: list[ServiceProcess] = []

    def start(self, *args: str, name: str | None = None,
              extra_env: dict[str, str] | None = None) -> ServiceProcess:
        name = name or args[0]
        proc = ServiceProcess(list(args), self.settings, self.log_dir, name, extra_env)
        self.started.append(proc)
        return proc

    def worker(self, worker_id: str, *args: str, extra_env: dict[str, str] | None = None,
               wait: bool = True) -> ServiceProcess:
        proc = self.start("worker", "--worker-id", worker_id, "--import",
                          "tests.e2e.handlers_for_tests", *args, name=f"worker-{worker_id}",
                          extra_env=extra_env)
        if wait:
            proc.wait_for_log("action=partitions_assigned")
        return proc

    def system(self, workers: int = 1, worker_args: tuple[str, ...] = ()) -> dict[str, ServiceProcess]:
        """All four services, ready: the scheduler leading, the others consuming."""
        procs = {
            "monitor": self.start("monitor"),
            "dispatcher": self.start("dispatcher"),
            "scheduler": self.start("scheduler", "--instance-id", "s1", name="scheduler"),
        }
        for i in range(1, workers + 1):
            procs[f"worker-{i}"] = self.worker(f"w{i}", *worker_args, wait=False)
        procs["scheduler"].wait_for_log("action=scheduler_ready")
        procs["dispatcher"].wait_for_log("action=dispatcher_started")
        for i in range(1, workers + 1):
            procs[f"worker-{i}"].wait_for_log("action=partitions_assigned")
        procs["monitor"].wait_for_log("action=partitions_assigned")
        return procs

    def stop_all(self) -> None:
        # Every process is told at once, then each is waited for: their shutdowns overlap
        # (one after another, a teardown took the sum of them).
        for proc in self.started:
            proc.terminate()
        for proc in reversed(self.started):
            proc.stop()


@pytest.fixture
def processes(topics: Settings, tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(topics, tmp_path)
    yield procs
    procs.stop_all()
    for proc in procs.started:
        tail = "\n".join(proc.log().splitlines()[-40:])
        print(f"\n----- {proc.name} (exit {proc.proc.returncode}) -----\n{tail}")
