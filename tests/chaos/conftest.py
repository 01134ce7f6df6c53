"""Fixtures of the chaos suite: its own servers, and one supervised system per test.

The servers are the session's own (servers.py), never the shared ones: a test kills and
restarts them. A test that fails while its broker or database is down leaves them down;
the next test's fixture starts them again. Everything started here is stopped by
finalisers, on failure too.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.chaos.harness import RESULTS, ChaosRun
from tests.chaos.servers import ChaosCluster, ChaosKafka, ChaosPostgres, chaos_dir, remove

# Each test runs a window of load, a fault and the settling after it.
CHAOS_TIMEOUT = 900


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/chaos/" in str(item.path):
            item.add_marker(pytest.mark.chaos)
            # The servers are detached on purpose (cronstream.infra.process.spawn drops its
            # Popen while the server runs); they are stopped by their own fixtures.
            item.add_marker(pytest.mark.filterwarnings(
                r"ignore:subprocess \d+ is still running:ResourceWarning"))
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(CHAOS_TIMEOUT))


@pytest.fixture(scope="session")
def chaos_base() -> Iterator[Path]:
    base = chaos_dir()
    yield base
    if os.environ.get("CRONSTREAM_CHAOS_KEEP"):  # the servers' logs, to read after a failure
        print(f"\nchaos servers' files kept in {base}")
    else:
        remove(base)


@pytest.fixture(scope="session")
def chaos_kafka(chaos_base: Path) -> Iterator[ChaosKafka]:
    kafka = ChaosKafka(chaos_base)
    kafka.start()
    yield kafka
    kafka.stop()


@pytest.fixture(scope="session")
def chaos_postgres(chaos_base: Path) -> Iterator[ChaosPostgres]:
    postgres = ChaosPostgres(chaos_base)
    postgres.start()
    yield postgres
    postgres.stop()


@pytest.fixture(scope="module")
def chaos_cluster(chaos_base: Path) -> Iterator[ChaosCluster]:
    cluster = ChaosCluster(chaos_base)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


RunFactory = Callable[..., ChaosRun]


@pytest.fixture
def chaos_run(chaos_kafka: ChaosKafka,
              chaos_postgres: ChaosPostgres) -> Iterator[RunFactory]:
    """make(name, bootstrap_servers=None, replication=None): a ChaosRun on the session's
    broker (or the given cluster) with a fresh database, closed at teardown. Service logs
    go to bench/results/chaos/logs/<name>/<service>.<incarnation>.log."""
    for server in (chaos_kafka, chaos_postgres):
        if not server.running():  # a previous test failed mid-fault
            server.start()
    runs: list[ChaosRun] = []

    def make(name: str, bootstrap_servers: str | None = None,
             replication: int | None = None) -> ChaosRun:
        url = chaos_postgres.create_database(f"chaos_{uuid.uuid4().hex[:10]}")
        # The logs outlive the test (pytest's tmp dirs rotate): the last run of each fault.
        log_dir = RESULTS / "logs" / name
        shutil.rmtree(log_dir, ignore_errors=True)
        log_dir.mkdir(parents=True)
        run = ChaosRun(name, bootstrap_servers or chaos_kafka.bootstrap_servers, url, log_dir,
                       replication)
        if bootstrap_servers is None:
            run.broker_log = chaos_kafka.log_file
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.close()
    for server in (chaos_kafka, chaos_postgres):
        if not server.running():
            server.start()
