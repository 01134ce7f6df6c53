"""Test helpers: polling with a deadline, service processes, Kafka and SQL shortcuts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from cronstream.services.monitor.housekeeping import Housekeeping
from cronstream.services.monitor.outbound import Outbound
from cronstream.services.monitor.store import ProjectionStore
from cronstream.shared.health import serving_port
from cronstream.shared.kafka.config import producer_config
from cronstream.shared.kafka.errors import settling
from cronstream.shared.kafka.reading import position
from cronstream.shared.producers import IdempotentProducer
from cronstream.shared.settings import Settings

T = TypeVar("T")


def eventually(condition: Callable[[], T | Literal[False] | None], timeout: float = 30.0,
               interval: float = 0.2, message: str = "condition") -> T:
    """Poll `condition` until it returns something truthy (`x and y` conditions return
    the last value); fail after `timeout`."""
    deadline = time.monotonic() + timeout
    last: T | Literal[False] | None = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{message} not met within {timeout}s (last value: {last!r})")


def sql(url: str, statement: str, *args: Any) -> list[asyncpg.Record]:
    async def run() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(url)
        try:
            return await conn.fetch(statement, *args)
        finally:
            await conn.close()

    return asyncio.run(run())


def env_for(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "CRONSTREAM_KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
        "CRONSTREAM_DATABASE_URL": settings.database_url,
        "CRONSTREAM_TOPIC_PREFIX": settings.topic_prefix,
        "CRONSTREAM_TOPIC_PARTITIONS": str(settings.topic_partitions),
        "CRONSTREAM_HEARTBEAT_INTERVAL_SECONDS": str(settings.heartbeat_interval_seconds),
        "CRONSTREAM_WORKER_DEAD_AFTER_SECONDS": str(settings.worker_dead_after_seconds),
        "CRONSTREAM_SCHEDULER_SESSION_TIMEOUT_MS": str(settings.scheduler_session_timeout_ms),
        "CRONSTREAM_SCHEDULER_SHARDS": str(settings.scheduler_shards),
        "CRONSTREAM_SCHEDULER_DATA_DIR": settings.scheduler_data_dir,
        "CRONSTREAM_WORKER_DRAIN_GRACE_SECONDS": str(settings.worker_drain_grace_seconds),
        "CRONSTREAM_LOG_LEVEL": "INFO",
        # Any free port: tests run many services side by side (ServiceProcess.http_port).
        "CRONSTREAM_HTTP_PORT": "0",
        "CRONSTREAM_HTTP_BIND": "127.0.0.1",
        "PYTHONUNBUFFERED": "1",
        # Services stop by themselves if the test (or benchmark) process dies.
        "CRONSTREAM_PARENT_PID": str(os.getpid()),
    })
    return env


class ServiceProcess:
    """A `python -m cronstream ...` child process with its output in a log file."""

    def __init__(self, args: list[str], settings: Settings, log_dir: Path, name: str,
                 extra_env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._terminated = False
        env = env_for(settings)
        env.update(extra_env or {})
        self._out = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cronstream", *args], env=env, stdout=self._out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, needle: str, timeout: float = 60.0, count: int = 1) -> None:
        def seen() -> bool:
            if not self.alive():
                raise AssertionError(f"{self.name} exited ({self.proc.returncode}):\n"
                                     f"{self.log()[-3000:]}")
            return self.log().count(needle) >= count
        eventually(seen, timeout, message=f"{self.name} logging {needle!r}")

    def http_port(self, timeout: float = 30.0) -> int:
        """The port this service serves /metrics, /healthz and /readyz on (from its log)."""
        return eventually(lambda: serving_port(self.log()), timeout, message=f"{self.name} serving HTTP")

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """GET http://127.0.0.1:<http_port><path>: (status, body)."""
        url = f"http://127.0.0.1:{self.http_port()}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def signal(self, sig: int) -> None:
        if sig == signal.SIGTERM:
            self._terminated = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)

    def terminate(self) -> None:
        """SIGTERM (SIGCONT first, for a paused one), without waiting: `stop` waits.

        Once: a second SIGTERM that lands after a service has stopped and given the signal
        back its default action kills it (exit -15). `stop_all` signals every process and
        then stops each, which sent two, and failed the principals test on its ui."""
        if self.alive():
            self.signal(signal.SIGCONT)
            if not self._terminated:
                self.signal(signal.SIGTERM)

    def stop(self, timeout: float = 40.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.alive():
            self.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        if not self._out.closed:
            self._out.close()
        return self.proc.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def shards_led(proc: ServiceProcess) -> set[int]:
    """The shards a process has taken over and not stepped down from (its log)."""
    led: set[int] = set()
    for line in proc.log().splitlines():
        if "action=leader_ready" in line:
            led.add(int(line.split(" shard=")[1].split()[0]))
        elif "action=leader_stepped_down" in line:
            led.discard(int(line.split(" shard=")[1].split()[0]))
    return led


def as_role(url: str, role: str) -> str:
    """A database URL as `role` instead of its user (the test server trusts local
    connections: the PostgreSQL roles of least privilege are reached by name)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rsplit('@', 1)[-1]}"))


def start_ui(processes: Any, name: str, **env: str) -> str:
    """Start `cronstream ui` among the test's processes (tests.conftest.Processes) with
    `env`; its base URL once it serves."""
    proc: ServiceProcess = processes.start("ui", name=name, extra_env=env)
    proc.wait_for_log("action=http_serving")
    return f"http://127.0.0.1:{proc.http_port()}"


def csrf_of(client: httpx.Client, base: str, path: str = "/login") -> str:
    """The CSRF token of the form on `path`, as `client` (a browser's cookies) gets it."""
    page = client.get(base + path)
    assert page.status_code == 200, page.status_code
    match = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page.text)
    assert match, "every form carries a CSRF token"
    return match[1]


def standalone_housekeeping(settings: Settings, pool: asyncpg.Pool) -> Housekeeping:
    """The monitor's housekeeping on its own, over the projection of consumer group "test"."""
    return Housekeeping(settings, pool, ProjectionStore(pool, "test", settings.topics),
                        producer=IdempotentProducer(producer_config(settings, "test-monitor")),
                        outbound=Outbound(settings.topics), instance="t")


def cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the `cronstream` CLI against the test's servers and topics."""
    return subprocess.run([sys.executable, "-m", "cronstream", *args], env=env_for(settings),
                          capture_output=True, text=True, timeout=60, check=False)


def run_now(settings: Settings, job_id: str, handler: str, **fields: Any) -> None:
    """Publish a ONE_TIME job due now, as any Kafka client would."""
    produce_json(settings, settings.topics.job_definitions, job_id, {
        "job_id": job_id, "type": "ONE_TIME", "run_at": datetime.now(UTC).isoformat(),
        "handler": handler, **fields})


def projection_equals_log(settings: Settings) -> bool:
    """Whether `execution_events` holds exactly the events of the topic, each once. (The
    topic may hold one event twice, byte for byte: a worker re-sends what it built when a
    lost broker left its commit's outcome unknown — docs/consuming-events.md. The chaos
    ledger counts such repeats and fails on any that differ.)"""
    on_topic = {json.loads(value(m))["event_id"]
                for m in read_all(settings, settings.topics.execution_events)}
    in_db = {str(r["event_id"]) for r in sql(settings.database_url,
                                             "SELECT event_id FROM execution_events")}
    return in_db == on_topic  # event_id is the table's key: each is there once


# One idempotent producer per broker, kept: a new one waits ~0.5 s for its producer id
# before its first record (a test publishing 24 definitions waited 12 s for them).
_PRODUCERS: dict[str, Producer] = {}


def produce(settings: Settings, topic: str, key: bytes | None, value: bytes | None,
            headers: list[tuple[str, str | bytes | None]] | None = None) -> None:
    """Publish one record as any plain Kafka client would, acknowledged before it returns."""
    servers = settings.kafka_bootstrap_servers
    failed: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failed.append(err)

    for attempt in range(2):
        producer = _PRODUCERS.get(servers)
        if producer is None:
            # The Java client's partitioner, as every producer of definitions must use (a
            # job's shard is the partition murmur2 gives its job_id: shared/shards.py).
            producer = _PRODUCERS[servers] = Producer({
                "bootstrap.servers": servers, "enable.idempotence": True,
                "partitioner": "murmur2_random"})
        failed.clear()
        producer.produce(topic, value, key, headers=headers, on_delivery=delivered)
        if producer.flush(30) == 0 and not failed:
            return
        # A broker restarted under a kept producer can leave it fenced or stuck: once
        # more with a new one.
        del _PRODUCERS[servers]
        if attempt == 1:
            raise AssertionError(f"producing to {topic} failed: {failed or 'not acknowledged in 30 s'}")


def produce_json(settings: Settings, topic: str, key: str, value: dict[str, Any]) -> None:
    produce(settings, topic, key.encode(), json.dumps(value).encode())


def high_watermark(consumer: Consumer, partition: TopicPartition, timeout: float) -> tuple[int, int]:
    """A partition's watermarks, asked again while the broker settles (a topic created a
    moment ago may not have elected its partitions' leader yet: NOT_LEADER, which librdkafka
    does not mark retriable, failed a CI run here)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return consumer.get_watermark_offsets(partition, timeout)
        except KafkaException as exc:
            if not settling(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def read_all(settings: Settings, topic: str, timeout: float = 10.0) -> list[Message]:
    """Every committed record of `topic`, read to its current end."""
    consumer = Consumer({
        "bootstrap.servers": settings.kafka_bootstrap_servers,
        "group.id": "tests-reader", "enable.auto.commit": False,
        "isolation.level": "read_committed", "enable.partition.eof": True,
    })
    try:
        metadata = consumer.list_topics(topic, timeout=timeout).topics[topic]
        ends = {}
        for p in metadata.partitions:
            _low, high = high_watermark(consumer, TopicPartition(topic, p), timeout)
            if high > 0:
                ends[p] = high
        if not ends:
            return []
        consumer.assign([TopicPartition(topic, p, -2) for p in ends])
        records: list[Message] = []
        pending = set(ends)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            # consume(n, t) returns after t unless n arrived: short waits, or every read
            # of a small topic took its whole timeout.
            for msg in consumer.consume(1000, 0.05):
                _topic, partition, offset = position(msg)
                if msg.error() is not None:
                    if partition in pending and offset >= ends[partition]:
                        pending.discard(partition)
                    continue
                records.append(msg)
                if offset + 1 >= ends[partition]:
                    pending.discard(partition)
        return records
    finally:
        consumer.close()


@contextlib.contextmanager
def holding_the_workers_group(settings: Settings, instance_id: str | None = None) -> Iterator[None]:
    """A member of the workers' group that owns every partition of the default queue and
    never answers the rebalance another member's join starts (it stops polling): until it
    leaves (on exit), no worker gets an assignment. With `instance_id`, a static member
    under that group.instance.id: it fences the member that had it, and on exit it does
    not leave (the next join under that id replaces it)."""
    conf = {
        "bootstrap.servers": settings.kafka_bootstrap_servers,
        "group.id": f"{settings.topics.prefix}workers", "enable.auto.commit": False,
        "partition.assignment.strategy": "range",
        "session.timeout.ms": 60_000, "max.poll.interval.ms": 120_000,
    }
    if instance_id is not None:
        conf["group.instance.id"] = instance_id
    holder = Consumer(conf)
    try:
        assigned: list[TopicPartition] = []
        holder.subscribe(settings.topics.work_topics(["default"]),
                         on_assign=lambda _c, parts: assigned.extend(parts))
        eventually(lambda: holder.poll(0.2) is None and bool(assigned), 30,
                   message="the holder owns the partitions")
        yield
    finally:
        holder.close()  # leaves the group: the rebalance completes without it


def header(msg: Message, name: str) -> str | None:
    return headers(msg).get(name)


def headers(msg: Message) -> dict[str, str]:
    """A consumed record's headers (bytes, as Kafka gives them), decoded."""
    found = msg.headers() or []
    return {k: v.decode() if isinstance(v, bytes) else str(v) for k, v in found} \
        if isinstance(found, list) else {}


def value(msg: Message) -> bytes:
    """A consumed record's value, which the test knows is there (not a tombstone)."""
    found = msg.value()
    assert isinstance(found, bytes), f"a tombstone at {position(msg)}"
    return found


def most_at_once(spans: list[tuple[datetime, datetime]]) -> int:
    """The most [start, end] spans that overlap at one instant (an end before a start at
    the same instant: a slot released and taken again)."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def pool_slots_in_use(metrics_text: str, pool: str) -> float | None:
    """cronstream_pool_slots_in_use of `pool` in a dispatcher's /metrics."""
    match = re.search(rf'^cronstream_pool_slots_in_use\{{pool="{re.escape(pool)}"\}} (\S+)$',
                      metrics_text, re.MULTILINE)
    return None if match is None else float(match[1])
