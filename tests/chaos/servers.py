"""The chaos suite's own Kafka broker, PostgreSQL and 3-node Kafka cluster.

Never the shared servers: the suite SIGKILLs and restarts what it runs, so everything
here lives on free ports under its own directory (`CRONSTREAM_CHAOS_DIR`, default
/var/tmp/cronstream-chaos-<uid>/<run>), removed when the session ends. Only the Kafka
jars are shared: the cache of `cronstream infra` (downloaded once when missing).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import time
import uuid
from pathlib import Path

import psutil

from cronstream.infra import infra_dir
from cronstream.infra.cluster import KafkaCluster
from cronstream.infra.kafka import KAFKA_VERSION
from cronstream.infra.postgres import PostgresServer, wait_for_connections
from cronstream.infra.process import alive
from cronstream.shared.db import apply_migrations, connect

# The shared development servers: never signalled by this suite.
SHARED_PORTS = frozenset({9092, 9093, 5432})


def chaos_dir() -> Path:
    """A fresh directory for one session's servers, readable by the postgres OS user."""
    root = Path(os.environ.get("CRONSTREAM_CHAOS_DIR") or f"/var/tmp/cronstream-chaos-{os.getuid()}")
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    base = root / f"run-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    base.mkdir(mode=0o755)
    os.chmod(base, 0o755)
    return base


def kafka_libs() -> Path:
    return infra_dir() / f"kafka-libs-{KAFKA_VERSION}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _own(port: int) -> None:
    if port in SHARED_PORTS:
        raise RuntimeError(f"port {port} belongs to the shared servers; the chaos suite never touches it")


def _reap(pid: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not alive(pid):
            return
        time.sleep(0.05)
    raise TimeoutError(f"process {pid} still alive after {timeout}s")


class ChaosKafka:
    """One KRaft broker of our own, its controller in a process of its own (as production
    runs KRaft): `kill` and `start` act on the broker. A combined node that crashes and
    restarts is its own controller, which waits out the registration of its previous life
    while the node already serves as a coordinator at its old leader epoch; when the wait
    ends and the node is fenced, Kafka 4.4 skips the transaction markers it was sending
    ("partitions are likely deleted already") and can still write the transaction
    complete: hanging transactions, which no client can end (decision 0007)."""

    def __init__(self, base: Path) -> None:
        self.cluster = KafkaCluster.split(base / "kafka", kafka_libs())
        for node in self.cluster.nodes.values():
            _own(node.port)
            _own(node.controller_port)
        self.node = self.cluster.brokers[0]

    @property
    def bootstrap_servers(self) -> str:
        return self.node.address

    @property
    def log_file(self) -> Path:
        return self.node.log_file

    def start(self) -> None:
        """Start the pair, or the broker again after `kill` (once it is a broker again)."""
        if not self.cluster.running():
            self.cluster.start(timeout=120)
        else:
            self.cluster.start_node(self.node.node_id)

    def running(self) -> bool:
        return len(self.cluster.running()) == len(self.cluster.nodes)

    def kill(self) -> None:
        """SIGKILL the broker (a crash: no controlled shutdown) and wait until it is gone."""
        assert self.node.pid() is not None, "the chaos broker is not running"
        self.cluster.kill_node(self.node.node_id)

    def stop(self) -> None:
        self.cluster.stop()


class ChaosPostgres:
    """A PostgreSQL cluster of our own (trust auth on 127.0.0.1)."""

    def __init__(self, base: Path) -> None:
        self.server = PostgresServer(base, "127.0.0.1", free_port(), "postgres")
        _own(self.server.port)

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.server.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.server.port}/{database}"

    def start(self) -> None:
        self.server.start(timeout=60)
        wait_for_connections(self.admin_url, timeout=60)

    def running(self) -> bool:
        return self.server.started_pid() is not None

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend (the machine or the pod died), so that
        the next start runs crash recovery."""
        pid = self.server.started_pid()
        assert pid is not None, "the chaos PostgreSQL is not running"
        _own(self.server.port)
        try:
            processes = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            processes = []
        for proc in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(processes, timeout=30)
        _reap(pid)

    def stop(self) -> None:
        self.server.stop()

    def create_database(self, name: str) -> str:
        """A fresh database with the migrations applied; its URL."""

        async def create() -> None:
            admin = await connect(self.admin_url)
            try:
                await admin.execute(f'CREATE DATABASE "{name}"')
            finally:
                await admin.close()
            conn = await connect(self.url(name))
            try:
                await apply_migrations(conn)
            finally:
                await conn.close()

        asyncio.run(create())
        return self.url(name)


class ChaosCluster:
    """Three combined KRaft nodes: replication 3, min.insync.replicas 2."""

    def __init__(self, base: Path) -> None:
        self.cluster = KafkaCluster(base / "cluster", kafka_libs(), size=3, replication=3,
                                    min_insync_replicas=2)
        for node in self.cluster.nodes.values():
            _own(node.port)

    @property
    def bootstrap_servers(self) -> str:
        return self.cluster.bootstrap_servers

    def start(self) -> None:
        self.cluster.start()

    def stop(self) -> None:
        self.cluster.stop()


def remove(base: Path) -> None:
    shutil.rmtree(base, ignore_errors=True)
