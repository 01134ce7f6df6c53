"""What every benchmark shares: an isolated system (own topic prefix, own database),
service processes, SQL, percentiles, and writing the figures."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psutil
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from cronstream.infra import Infra
from cronstream.shared.db import apply_migrations, connect
from cronstream.shared.kafka.admin import delete_topics, ensure_topics
from cronstream.shared.kafka.config import client_config, reader_config
from cronstream.shared.settings import Settings
from tests.support import ServiceProcess, sql

RESULTS = Path(__file__).resolve().parent / "results"


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def summary(values: list[float]) -> dict[str, float]:
    return {"p50": percentile(values, 50), "p95": percentile(values, 95),
            "p99": percentile(values, 99), "max": max(values) if values else float("nan"),
            "count": len(values)}


def _stop_on_sigterm() -> None:
    """SIGTERM (a stopped benchmark, `timeout`, CI) unwinds like Ctrl-C: every `finally`
    runs, so the services a benchmark started are stopped, never left orphaned."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(143))


@dataclass
class BenchSystem:
    """A fresh prefix and database; processes stopped by `close`."""

    name: str
    partitions: int = 6
    settings: Settings = field(init=False)
    procs: list[ServiceProcess] = field(default_factory=list)
    log_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        _stop_on_sigterm()
        base = Settings.from_env()
        db = f"bench_{self.name}_{uuid.uuid4().hex[:6]}"
        url = urlunsplit(urlsplit(base.database_url)._replace(path=f"/{db}"))
        admin = urlunsplit(urlsplit(base.database_url)._replace(path="/postgres"))

        async def create() -> None:
            conn = await connect(admin)
            try:
                await conn.execute(f'CREATE DATABASE "{db}"')
            finally:
                await conn.close()
            conn = await connect(url)
            try:
                await apply_migrations(conn)
            finally:
                await conn.close()

        asyncio.run(create())
        self.db_name, self.admin_url = db, admin
        self.settings = base.model_copy(update={
            "database_url": url, "topic_prefix": f"b{uuid.uuid4().hex[:8]}.",
            "topic_partitions": self.partitions, "heartbeat_interval_seconds": 2,
        })
        ensure_topics(self.settings, self.settings.topics.specs())
        # A fresh log per run: services append to their log, and what a run reads from it
        # (readiness, its HTTP port) must be that run's, not an earlier one's.
        self.log_dir = RESULTS / "logs" / self.name
        shutil.rmtree(self.log_dir, ignore_errors=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, *args: str, name: str, env: dict[str, str] | None = None) -> ServiceProcess:
        proc = ServiceProcess(list(args), self.settings, self.log_dir, name, env)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()

        async def drop() -> None:
            conn = await connect(self.admin_url)
            try:
                await conn.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
            finally:
                await conn.close()

        asyncio.run(drop())
        delete_topics(self.settings)


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and all its descendants, the reaped ones included (a
    worker's handler pool, PostgreSQL's backends): the process's own times plus the times
    of the children it has waited for, plus every live descendant's. Across two samples
    the difference counts a child that lived and died in between, once."""
    try:
        root = psutil.Process(pid)
        total = sum(root.cpu_times()[:4])
        for child in root.children(recursive=True):
            try:
                total += sum(child.cpu_times()[:4])
            except psutil.NoSuchProcess:
                continue
        return total
    except psutil.NoSuchProcess:
        return 0.0


def server_pids(settings: Settings) -> dict[str, list[int]]:
    """The broker's and PostgreSQL's root pids: the ones `cronstream infra` started, else
    every broker and postmaster of the machine (a benchmark machine runs one of each). The
    postmaster stands for its whole tree: backends come and go (connections opened during
    the window), and a per-backend list taken once would miss them."""
    infra = Infra.from_settings(settings)
    kafka = [pid] if (pid := infra.kafka.started_pid()) else []
    postgres: list[int] = []
    for proc in psutil.process_iter(["pid", "ppid", "name", "cmdline"]):
        if not kafka and "kafka.Kafka" in " ".join(proc.info["cmdline"] or []):
            kafka.append(proc.info["pid"])
        elif (proc.info["name"] or "").startswith("postgres"):
            try:
                parent = psutil.Process(proc.info["ppid"]).name()
            except psutil.Error:
                parent = ""
            if not parent.startswith("postgres"):
                postgres.append(proc.info["pid"])
    return {"kafka": kafka, "postgres": postgres}


def log_ends(settings: Settings, topic: str, tail: int = 2000) -> dict[int, int]:
    """The offset after the last record (not transaction marker) of each partition of
    `topic`, as a read_committed consumer sees it now: what a projection that has read
    everything stores as its next offset. (The high watermark lies past the markers.)"""
    consumer = Consumer({**reader_config(settings, "bench-log-ends"), "enable.partition.eof": True})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        ends: dict[int, int] = {}
        starts = []
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            ends[p] = low  # nothing read yet: as far as an empty partition goes
            starts.append(TopicPartition(topic, p, max(low, high - tail)))
        consumer.assign(starts)
        pending = set(partitions)
        deadline = time.monotonic() + 30
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 0.5):
                err = msg.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition() or 0)
                elif err is None:
                    ends[msg.partition() or 0] = (msg.offset() or 0) + 1
        if pending:
            raise RuntimeError(f"{topic}: no end of partitions {sorted(pending)} within 30 s")
        return ends
    finally:
        consumer.close()


def projected_through(settings: Settings, topic: str) -> dict[int, int]:
    """The monitor's stored next offset of each partition of `topic` (PostgreSQL)."""
    rows = sql(settings.database_url, "SELECT partition, next_offset FROM consumer_offsets "
                                      "WHERE topic = $1", topic)
    return {int(r["partition"]): int(r["next_offset"]) for r in rows}


def projection_behind(settings: Settings) -> int:
    """How many records of `execution-events` the projection has not stored yet (0: it
    holds everything the log holds now)."""
    topic = settings.topics.execution_events
    done = projected_through(settings, topic)
    return sum(max(0, end - done.get(p, 0)) for p, end in log_ends(settings, topic).items())


def broker_partitions(settings: Settings) -> dict[str, int]:
    """How many partitions the broker holds now (`total`: every topic, the internal ones
    and other systems' included) and how many of them are this system's (`this_run`). Idle
    partitions are not free: 2,268 left by test runs cost this machine about a quarter of
    its end-to-end rate (issue 54), so every run says what the broker carried."""
    admin = AdminClient(client_config(settings, "bench-partitions"))
    topics = admin.list_topics(timeout=10).topics
    return {"total": sum(len(t.partitions) for t in topics.values()),
            "this_run": sum(len(t.partitions) for name, t in topics.items()
                            if name.startswith(settings.topic_prefix))}


def _cpu_model() -> str | None:
    try:
        return next((line.split(":", 1)[1].strip() for line in
                     Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
                    None)
    except OSError:
        return None


def write_result(name: str, figures: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "cpu": _cpu_model(), "python": platform.python_version(),
                    "platform": platform.platform()},
        **figures,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(json.dumps(payload, indent=2, default=str))
    return path


Bench = Callable[[], dict[str, Any]]


def run_benches(prefix: str, benches: dict[str, Bench], names: list[str] | None = None) -> None:
    """Run the named benchmarks (all by default); each writes results/<prefix>_<name>.json."""
    for name in names or list(benches):
        print(f"--- {prefix}.{name}", flush=True)
        write_result(f"{prefix}_{name}", benches[name]())
