"""A local multi-node Apache Kafka cluster in KRaft mode, for fault tests (no Docker).

Every node is a combined broker + controller with a static voter set of all nodes, so
the cluster keeps its quorum and stays writable when one node is lost (3 nodes,
replication 3, min.insync.replicas 2). The nodes run from the same Maven Central jars as
the single development broker (`kafka.py`), with small heaps and a C1-only JIT: three
JVMs share a developer's machine with everything else.

Unlike `KafkaBroker`, a cluster never adopts servers it did not start: it is always
started on ports chosen for it and stopped whole (`stop`), and single nodes can be
killed and started again (`kill_node`, `start_node`).

`KafkaCluster.split` runs one broker and its controller in processes of their own (the
topology of production KRaft): a broker that crashes and restarts is then fenced by a
live controller while it is away, instead of being its own controller, which waits out
the registration of its previous life with the restarted node already serving as a
coordinator (docs/decisions/0007).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from cronstream.infra.kafka import HEAP as BROKER_HEAP
from cronstream.infra.kafka import KafkaBroker
from cronstream.infra.process import alive, answers, read_pid, spawn, terminate, wait_until

HEAP = ["-Xms128m", "-Xmx384m"]
COMBINED, CONTROLLER, BROKER = "cluster.properties", "controller.properties", "broker.properties"
# Small, quick JVMs: serial GC and the C1 compiler only (a test cluster's throughput is
# bounded by the machine, not by the JIT).
JVM_FLAGS = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]


def free_port_pair(host: str = "127.0.0.1", attempts: int = 50) -> int:
    """A port p such that p and p + 1 are both free (a node's client and controller ports)."""
    for _ in range(attempts):
        with socket.socket() as probe:
            probe.bind((host, 0))
            port = int(probe.getsockname()[1])
        if port >= 65535:
            continue
        with contextlib.ExitStack() as stack:
            try:
                for candidate in (port, port + 1):
                    sock = stack.enter_context(socket.socket())
                    sock.bind((host, candidate))
            except OSError:
                continue
            return port
    raise RuntimeError("no two consecutive free ports found")


@dataclass
class KafkaNode:
    node_id: int
    host: str
    port: int
    home: Path

    @property
    def controller_port(self) -> int:
        return self.port + 1

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def pid_file(self) -> Path:
        return self.home / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "server.log"

    @property
    def stdout_file(self) -> Path:
        return self.home / "stdout.log"

    def pid(self) -> int | None:
        return read_pid(self.pid_file)


class KafkaCluster:
    """`size` combined nodes on free ports under `base`; jars from the shared cache `libs`."""

    def __init__(self, base: Path, libs: Path, *, size: int = 3, replication: int = 3,
                 min_insync_replicas: int = 2, host: str = "127.0.0.1",
                 templates: dict[int, str] | None = None) -> None:
        if not 1 <= min_insync_replicas <= replication <= size:
            raise ValueError("need 1 <= min_insync_replicas <= replication <= size")
        self.base, self.libs, self.host = base, libs, host
        self.replication, self.min_isr = replication, min_insync_replicas
        self.nodes = {i: KafkaNode(i, host, free_port_pair(host), base / f"node-{i}")
                      for i in range(1, size + 1)}
        # Each node's configuration (deploy/local/): combined nodes by default.
        self.templates = templates or dict.fromkeys(self.nodes, COMBINED)
        self._cluster_id: str | None = None

    @classmethod
    def split(cls, base: Path, libs: Path, host: str = "127.0.0.1") -> KafkaCluster:
        """One broker (node 2) and its controller (node 1), each a process of its own."""
        return cls(base, libs, size=2, replication=1, min_insync_replicas=1, host=host,
                   templates={1: CONTROLLER, 2: BROKER})

    @property
    def brokers(self) -> list[KafkaNode]:
        return [n for i, n in self.nodes.items() if self.templates[i] != CONTROLLER]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.address for node in self.brokers)

    def _voters(self) -> str:
        return ",".join(f"{n.node_id}@{n.host}:{n.controller_port}" for i, n in self.nodes.items()
                        if self.templates[i] != BROKER)

    def _java(self) -> str:
        return shutil.which("java") or "java"

    def _logging_opt(self, node: KafkaNode) -> str:
        return f"-Dlog4j2.configurationFile=file:{node.home / 'log4j2.properties'}"

    def write_config(self, node: KafkaNode) -> Path:
        """Render the node's server.properties and log4j2.properties; return the former."""
        node.home.mkdir(parents=True, exist_ok=True)
        files = resources.files("cronstream.deploy")
        props = node.home / "server.properties"
        template = files.joinpath(f"local/{self.templates[node.node_id]}").read_text()
        props.write_text(Template(template)
                         .safe_substitute(node_id=str(node.node_id), voters=self._voters(),
                                          host=node.host, port=str(node.port),
                                          controller_port=str(node.controller_port),
                                          data_dir=str(node.data),
                                          replication=str(self.replication),
                                          min_isr=str(self.min_isr)))
        (node.home / "log4j2.properties").write_text(
            Template(files.joinpath("local/log4j2.properties").read_text())
            .safe_substitute(log_file=str(node.log_file)))
        return props

    def _format(self, node: KafkaNode, props: Path) -> None:
        classpath = f"{self.libs}/*"
        if self._cluster_id is None:
            self._cluster_id = subprocess.run(
                [self._java(), "-cp", classpath, "kafka.tools.StorageTool", "random-uuid"],
                check=True, capture_output=True, text=True,
            ).stdout.strip()
        subprocess.run(
            [self._java(), self._logging_opt(node), "-cp", classpath, "kafka.tools.StorageTool",
             "format", "-t", self._cluster_id, "-c", str(props), "-g"],
            check=True, capture_output=True,
        )

    def start(self, timeout: float = 180.0) -> None:
        """Format (once) and start every node; return when all are registered brokers."""
        # The jars: the same cache as the development broker (downloaded once).
        KafkaBroker(self.libs.parent, self.host, 0).ensure_jars()
        for node in self.nodes.values():
            props = self.write_config(node)
            if not (node.data / "meta.properties").exists():
                self._format(node, props)
        for node_id in self.nodes:
            self._spawn(self.nodes[node_id])
        try:
            wait_until(lambda: self._brokers() == {n.node_id for n in self.brokers}, timeout,
                       f"Kafka cluster at {self.bootstrap_servers}", interval=0.5)
        except TimeoutError:
            self.stop()
            raise

    def _spawn(self, node: KafkaNode) -> int:
        return spawn(
            [self._java(), *self._jvm(node), self._logging_opt(node), "-cp", f"{self.libs}/*",
             "kafka.Kafka", str(node.home / "server.properties")],
            node.stdout_file, node.pid_file,
        )

    def _jvm(self, node: KafkaNode) -> list[str]:
        """A split pair's broker runs as the development broker does (the chaos suite's
        figures were measured on it); every other node small and quick."""
        if self.templates[node.node_id] == BROKER:
            return [*BROKER_HEAP, "-XX:+UseG1GC", "-Djava.awt.headless=true"]
        return [*HEAP, *JVM_FLAGS]

    def _brokers(self) -> set[int]:
        """The node ids the cluster's metadata lists as live brokers (empty if no answer)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        live = [n for n in self.brokers if n.pid() is not None and answers(n.host, n.port)]
        if not live:
            return set()
        admin = AdminClient({"bootstrap.servers": ",".join(n.address for n in live),
                             "socket.timeout.ms": 2000})
        try:
            metadata = admin.list_topics(timeout=3)
        except KafkaException:
            return set()
        return set(metadata.brokers)

    def running(self) -> list[int]:
        return [i for i, node in self.nodes.items() if node.pid() is not None]

    def kill_node(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        """Signal one node (SIGKILL by default: a crash) and wait until it is gone."""
        node = self.nodes[node_id]
        pid = node.pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not alive(pid):
                break
            time.sleep(0.05)
        node.pid_file.unlink(missing_ok=True)

    def start_node(self, node_id: int, timeout: float = 120.0) -> None:
        """Start a node that was killed; return once the cluster lists it as a broker again."""
        node = self.nodes[node_id]
        if node.pid() is None:
            self._spawn(node)
        wait_until(lambda: node_id in self._brokers(), timeout, f"Kafka node {node_id}",
                   interval=0.5)

    def leaders(self, topics: list[str]) -> dict[tuple[str, int], int]:
        """The leader node of every partition of `topics` (-1: none)."""
        return {tp: leader for tp, (leader, _replicas) in self._partitions(topics).items()}

    def replicas(self, topics: list[str]) -> dict[tuple[str, int], int]:
        """How many replicas every partition of `topics` has."""
        return {tp: len(replicas) for tp, (_leader, replicas) in self._partitions(topics).items()}

    def _partitions(self, topics: list[str]) -> dict[tuple[str, int], tuple[int, list[int]]]:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "socket.timeout.ms": 2000})
        metadata = admin.list_topics(timeout=10)
        return {(name, p.id): (p.leader, list(p.replicas)) for name in topics
                if name in metadata.topics for p in metadata.topics[name].partitions.values()}

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every node: SIGTERM to all at once (one by one, the last nodes would wait
        for a quorum that is leaving), SIGKILL what is left after `timeout`. Broker-only
        nodes go first: their controlled shutdown needs the controllers."""
        for wave in ([i for i in self.nodes if self.templates[i] == BROKER],
                     [i for i in self.nodes if self.templates[i] != BROKER]):
            self._stop_nodes(wave, timeout)

    def _stop_nodes(self, node_ids: list[int], timeout: float) -> None:
        nodes = [self.nodes[i] for i in node_ids]
        pids = [pid for node in nodes if (pid := node.pid()) is not None]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(alive(pid) for pid in pids):
            for pid in pids:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)
        for pid in pids:
            terminate(pid, timeout=0)
        for node in nodes:
            node.pid_file.unlink(missing_ok=True)
