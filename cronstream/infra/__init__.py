"""`cronstream infra up|down|status`: a local Kafka broker and PostgreSQL (docs/reference/cli.md).

Each server is started only when nothing answers at its configured address; `up`
returns when both accept connections; `down` stops only what `up` started (it keeps a
marker of what it started); a second `up` is a no-op. State lives in
`CRONSTREAM_INFRA_DIR` (default /var/tmp/cronstream-<uid>): the broker jars, the broker's
data and log, the PostgreSQL cluster and its log.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from cronstream.infra.kafka import KafkaBroker
from cronstream.infra.postgres import PostgresServer, create_database, wait_for_connections
from cronstream.shared.settings import Settings


def infra_dir() -> Path:
    configured = os.environ.get("CRONSTREAM_INFRA_DIR")
    return Path(configured) if configured else Path(f"/var/tmp/cronstream-{os.getuid()}")


def _host_port(address: str, default_port: int) -> tuple[str, int]:
    first = address.split(",", maxsplit=1)[0].strip()
    if "://" in first:
        first = first.split("://", 1)[1]
    host, _, port = first.rpartition(":")
    if not host:
        return first or "localhost", default_port
    return host, int(port)


@dataclass
class Infra:
    kafka: KafkaBroker
    postgres: PostgresServer
    database_url: str

    @classmethod
    def from_settings(cls, settings: Settings, base: Path | None = None) -> Infra:
        base = base or infra_dir()
        k_host, k_port = _host_port(settings.kafka_bootstrap_servers, 9092)
        url = urlsplit(settings.database_url)
        database = (url.path or "/cronstream").lstrip("/") or "cronstream"
        return cls(
            KafkaBroker(base, "127.0.0.1" if k_host == "localhost" else k_host, k_port),
            PostgresServer(base, "127.0.0.1" if (url.hostname or "localhost") == "localhost"
                           else url.hostname or "127.0.0.1", url.port or 5432, database),
            settings.database_url,
        )

    def admin_dsn(self) -> str:
        url = urlsplit(self.database_url)
        return urlunsplit(url._replace(path="/postgres"))

    def up(self, report: Callable[[str], None] = print) -> list[str]:
        """Start what does not answer; return the names of the servers started."""
        started = []
        if self.kafka.answering():
            report(f"kafka: already answering at {self.kafka.address}")
        else:
            report(f"kafka: starting Apache Kafka at {self.kafka.address} ...")
            pid = self.kafka.start()
            started.append("kafka")
            report(f"kafka: ready (pid {pid}, logs {self.kafka.log_file})")
        if self.postgres.answering():
            report(f"postgres: already answering at {self.postgres.host}:{self.postgres.port}")
        else:
            report(f"postgres: starting PostgreSQL at {self.postgres.host}:{self.postgres.port} ...")
            pid = self.postgres.start()
            started.append("postgres")
            report(f"postgres: ready (pid {pid}, logs {self.postgres.log_file})")
        wait_for_connections(self.admin_dsn())
        if create_database(self.admin_dsn(), self.postgres.database):
            report(f"postgres: created database {self.postgres.database}")
        return started

    def down(self, report: Callable[[str], None] = print, only: list[str] | None = None) -> None:
        """Stop the servers `up` started (or only those named), never anything else."""
        for name, server in (("kafka", self.kafka), ("postgres", self.postgres)):
            if only is not None and name not in only:
                continue
            if server.stop():
                report(f"{name}: stopped")
            else:
                report(f"{name}: not started by cronstream; left alone")

    def status(self) -> dict[str, dict[str, object]]:
        return {
            "kafka": {
                "address": self.kafka.address,
                "answering": self.kafka.answering(),
                "started_by_cronstream": self.kafka.started_pid(),
            },
            "postgres": {
                "address": f"{self.postgres.host}:{self.postgres.port}",
                "answering": self.postgres.answering(),
                "started_by_cronstream": self.postgres.started_pid(),
            },
        }
