"""A local Apache Kafka broker from the Maven Central jars, in KRaft mode (no Docker).

`mvn dependency:copy-dependencies` resolves `org.apache.kafka:kafka_2.13` (pinned below)
and a log4j2 backend into the infra cache once; the storage is formatted once with a
static single-voter quorum; the broker runs on the machine's Java 17 with a small heap.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from importlib import resources
from pathlib import Path
from string import Template

from cronstream.infra.process import answers, read_pid, spawn, terminate, wait_until

KAFKA_VERSION = "4.4.0"
HEAP = ["-Xms256m", "-Xmx768m"]


class KafkaBroker:
    def __init__(self, base: Path, host: str, port: int) -> None:
        self.host, self.port = host, port
        # Another configuration (deploy/local/server-sasl.properties: SASL and ACLs), its
        # placeholders, what formatting the storage adds (SCRAM users) and what a client
        # needs to ask whether it is ready (credentials).
        self.template = "server.properties"
        self.values: dict[str, str] = {}
        self.format_args: list[str] = []
        self.client_config: dict[str, str] = {}
        self.home = base / "kafka"
        self.libs = base / f"kafka-libs-{KAFKA_VERSION}"
        self.data = self.home / "data"
        self.pid_file = self.home / "broker.pid"
        self.log_file = self.home / "server.log"
        self.stdout_file = self.home / "stdout.log"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def answering(self) -> bool:
        return answers(self.host, self.port)

    def started_pid(self) -> int | None:
        return read_pid(self.pid_file)

    def ensure_jars(self) -> None:
        if self.libs.is_dir() and any(self.libs.glob("kafka_2.13-*.jar")):
            return
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RuntimeError("Maven (mvn) is needed to fetch the Kafka broker jars")
        pom = resources.files("cronstream.deploy").joinpath("local/pom.xml")
        with resources.as_file(pom) as pom_path:
            tmp = self.libs.with_name(self.libs.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            done = subprocess.run(
                [mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(pom_path),
                 "dependency:copy-dependencies", f"-Dkafka.version={KAFKA_VERSION}",
                 f"-DoutputDirectory={tmp}"],
                capture_output=True, text=True, check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"mvn could not fetch the Kafka jars:\n{done.stdout}{done.stderr}")
            tmp.rename(self.libs)

    def _render(self, name: str, **values: str) -> Path:
        template = resources.files("cronstream.deploy").joinpath(f"local/{name}").read_text()
        target = self.home / name
        target.write_text(Template(template).safe_substitute(values))
        target.chmod(0o600)  # may hold a password (server-sasl.properties)
        return target

    def start(self, timeout: float = 90.0) -> int:
        self.ensure_jars()
        self.home.mkdir(parents=True, exist_ok=True)
        props = self._render(
            self.template, host=self.host, port=str(self.port),
            controller_port=str(self.port + 1), data_dir=str(self.data), **self.values,
        )
        log4j = self._render("log4j2.properties", log_file=str(self.log_file))
        classpath = f"{self.libs}/*"
        java = shutil.which("java") or "java"
        logging_opt = f"-Dlog4j2.configurationFile=file:{log4j}"
        if not (self.data / "meta.properties").exists():
            cluster_id = subprocess.run(
                [java, "-cp", classpath, "kafka.tools.StorageTool", "random-uuid"],
                check=True, capture_output=True, text=True,
            ).stdout.strip() or uuid.uuid4().hex[:22]
            subprocess.run(
                [java, logging_opt, "-cp", classpath, "kafka.tools.StorageTool", "format",
                 "-t", cluster_id, "-c", str(props), "-g", *self.format_args],
                check=True, capture_output=True,
            )
        pid = spawn(
            [java, *HEAP, "-XX:+UseG1GC", "-Djava.awt.headless=true", logging_opt,
             "-cp", classpath, "kafka.Kafka", str(props)],
            self.stdout_file, self.pid_file,
        )
        try:
            wait_until(self._ready, timeout, f"Kafka at {self.address}")
        except TimeoutError:
            terminate(pid)
            raise
        return pid

    def _ready(self) -> bool:
        if self.started_pid() is None:
            raise RuntimeError(f"the Kafka broker exited; see {self.stdout_file} and {self.log_file}")
        if not self.answering():
            return False
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.address, "socket.timeout.ms": 2000,
                             **self.client_config})
        try:
            metadata = admin.list_topics(timeout=2)
        except KafkaException:
            return False
        return bool(metadata.brokers)

    def stop(self) -> bool:
        pid = self.started_pid()
        if pid is None:
            return False
        terminate(pid, timeout=60)
        self.pid_file.unlink(missing_ok=True)
        return True
