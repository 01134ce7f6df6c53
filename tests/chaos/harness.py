"""One chaos run: an isolated system under supervision and load, a fault, the verdict.

A test asks its `ChaosRun` to start the four services (two workers) under the
`Supervisor`, publishes the load for a window, injects its fault at a planned instant
of the window, lets the window's fires settle, then calls `verdict`, which asserts the
ledger (ledger.py), the services' record (alive and ready; every exit the test did not
cause came after a clear error line) and the recovery times, and records the figures
(bench/results/chaos/<fault>.jsonl, one line per run, and the test's output).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from cronstream.shared.kafka.admin import ensure_topics
from cronstream.shared.settings import Settings
from cronstream.shared.topics import TopicSpec
from tests.chaos import ledger
from tests.chaos.load import (
    EVENT_JOB,
    HANDLER_MODULE,
    POOL,
    EventStream,
    Fire,
    LoadShape,
    expected_fires,
    publish,
)
from tests.chaos.supervisor import Exit, Supervisor
from tests.support import cli, env_for, eventually, pool_slots_in_use

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "chaos"
SHORT = os.environ.get("CRONSTREAM_CHAOS_SHORT", "") not in ("", "0")

HEARTBEAT_SECONDS = 1.0
DEAD_AFTER_SECONDS = 5.0
DRAIN_GRACE_SECONDS = 3.0
# Slots per worker. An outage leaves a backlog of its fires (FIRE_ALL): the outage plus
# the broker's own restart (8-10 s here on a slower machine), a quarter of it the pool's
# 2 s and 4 s sleep jobs. With 16 slots a worker chewed through that backlog for ~6 s
# before the first fire scheduled after the fault could start, and `first` measured the
# catch-up, not the recovery (10.4 s on such a machine, 8 s on a faster one). 32 slots
# drain it in half the time; the sleep jobs cost the pool processes nothing but memory.
WORKER_CONCURRENCY = 32
# Recovery targets (issue 9, "Done when").
RESTART_TARGET_SECONDS = 10.0
WORKER_DEATH_TARGET_SECONDS = DEAD_AFTER_SECONDS + 5.0
# docs/reference/performance.md#recovery: a dead worker's executions are re-queued within dead_after + 2 s (the first
# completion after its death, above, also waits for a dispatch and a run).
REQUEUE_TARGET_SECONDS = DEAD_AFTER_SECONDS + 2.0
# A node that dies and stays down keeps leading its partitions (job-due, the transaction
# and group coordinators among them) until the controller fences it: Kafka's
# broker.session.timeout.ms, 9 s by default (the chaos cluster sets 3 s, and 3 s of
# replica.lag.time.max.ms: deploy/local/cluster.properties). Like a worker's death
# (dead_after + 5 s), the target counts from what a default cluster must wait.
BROKER_SESSION_TIMEOUT_SECONDS = 9.0
NODE_LOSS_TARGET_SECONDS = BROKER_SESSION_TIMEOUT_SECONDS + 5.0
# After the window, settling stops early when no execution became terminal for this long.
STALL_SECONDS = 45.0


def short_or_full(short: float, full: float) -> float:
    return short if SHORT else full


def utcnow() -> datetime:
    return datetime.now(UTC)


def hold_until(instant: datetime) -> None:
    """Let the load run until `instant` of the window (the workload's duration, not a
    wait for a condition: faults are placed at planned points of the window)."""
    time.sleep(max(0.0, (instant - utcnow()).total_seconds()))


def hold_for(seconds: float) -> None:
    """Keep a fault in place for `seconds` (an outage's planned length)."""
    hold_until(utcnow() + timedelta(seconds=seconds))


@dataclass
class Recovery:
    fault: str
    ended_at: datetime
    target: float
    seconds: dict[str, float | None] = field(default_factory=dict)


class ChaosRun:
    def __init__(self, name: str, bootstrap_servers: str, database_url: str, log_dir: Path,
                 replication: int | None = None) -> None:
        self.name = name
        self.log_dir = log_dir
        self.replication = replication
        self.settings = Settings(
            kafka_bootstrap_servers=bootstrap_servers,
            database_url=database_url,
            topic_prefix=f"c{uuid4().hex[:8]}.",
            topic_partitions=3,
            topic_replication_factor=replication or -1,
            topic_min_insync_replicas=2 if replication else None,
            heartbeat_interval_seconds=HEARTBEAT_SECONDS,
            worker_dead_after_seconds=DEAD_AFTER_SECONDS,
            scheduler_session_timeout_ms=3000,
            worker_drain_grace_seconds=DRAIN_GRACE_SECONDS,
        )
        self.supervisor = Supervisor(log_dir)
        self.shape = LoadShape.from_env()
        self.fires: dict[Any, Fire] = {}
        self.job_ids: list[str] = []
        self.window: tuple[datetime, datetime] | None = None
        self.recoveries: list[Recovery] = []
        self.figures: dict[str, Any] = {}
        self.started = time.monotonic()
        self._admin: AdminClient | None = None
        self._partitions: list[TopicPartition] = []
        self.events: EventStream | None = None
        # The broker's own log (a run on the session's broker): read when a run fails.
        self.broker_log: Path | None = None

    # -- the system ---------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        env = env_for(self.settings)
        env["CRONSTREAM_WORKER_CONCURRENCY"] = str(WORKER_CONCURRENCY)
        if self.replication:
            env["CRONSTREAM_TOPIC_REPLICATION_FACTOR"] = str(self.replication)
            env["CRONSTREAM_TOPIC_MIN_INSYNC_REPLICAS"] = "2"
        return env

    def start_system(self, workers: int = 2, schedulers: int = 1) -> None:
        """Topics and migrations (`cronstream init`), then every service, ready."""
        args = ["init"]
        if self.replication:
            args += ["--replication-factor", str(self.replication), "--min-insync-replicas", "2"]
        done = cli(self.settings, *args)
        assert done.returncode == 0, f"cronstream init failed: {done.stdout}{done.stderr}"
        env = self.env()
        # Stable instance names, as a StatefulSet gives them: a restarted process takes its
        # predecessor's transactional id (and so fences it).
        self.supervisor.add("monitor", ["monitor", "--instance-id", "monitor-1"], env)
        self.supervisor.add("dispatcher", ["dispatcher", "--instance-id", "dispatcher-1"], env)
        self.supervisor.add("scheduler", ["scheduler", "--instance-id", "scheduler-1"], env)
        for i in range(2, schedulers + 1):  # more processes share the clock's shards
            self.supervisor.add(f"scheduler-{i}", ["scheduler", "--instance-id", f"scheduler-{i}"], env)
        for i in range(1, workers + 1):
            self.supervisor.add(f"worker-{i}", ["worker", "--worker-id", f"worker-{i}",
                                                "--import", HANDLER_MODULE], env)
        self.supervisor.wait_ready(timeout=120)

    def start_load(self, seconds: float, lead: float = 4.0) -> tuple[datetime, datetime]:
        """Publish the load: every job fires each second of [start, start + seconds]."""
        start = (utcnow() + timedelta(seconds=lead)).replace(microsecond=0)
        end = start + timedelta(seconds=seconds)
        definitions = self.shape.definitions(start, end)
        self.fires = expected_fires(definitions)
        self.job_ids = [d["job_id"] for d in definitions]
        if self.shape.pooled:
            done = cli(self.settings, "pool", "set", POOL, "--slots", str(self.shape.pool_slots))
            assert done.returncode == 0, f"cronstream pool set failed: {done.stdout}{done.stderr}"
        if self.shape.event_rate:
            topic = f"{self.settings.topic_prefix}chaos-orders"
            ensure_topics(self.settings, [TopicSpec(topic, 3, {})])
            self.events = EventStream(self.settings, topic, self.shape.event_rate)
            definitions_sent = [*definitions, self.shape.event_definition(topic)]
        else:
            definitions_sent = definitions
        publish(self.settings, definitions_sent)
        if self.events is not None:
            self.events.start(start, end)
        self.window = (start, end)
        self.figures.update(window_seconds=seconds, fires_per_second=self.shape.fires_per_second,
                            workers=2, worker_concurrency=WORKER_CONCURRENCY)
        return start, end

    def at(self, seconds_into_window: float) -> datetime:
        assert self.window is not None
        return self.window[0] + timedelta(seconds=seconds_into_window)

    def settle(self, timeout: float | None = None) -> None:
        """Wait until every fire of the window is terminal in PostgreSQL (or the deadline:
        the verdict then says what is missing)."""
        assert self.window is not None
        hold_until(self.window[1])
        timeout = timeout or short_or_full(90, 120)
        deadline = time.monotonic() + timeout
        count, last_count, moved = 0, -1, time.monotonic()
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # the database may still be recovering
                count = ledger.terminal_count(self.settings.database_url, self.fires)
            if count >= len(self.fires):
                break
            if count != last_count:
                last_count, moved = count, time.monotonic()
            elif time.monotonic() - moved > STALL_SECONDS:
                break  # nothing settles any more: the verdict says what is stuck
            time.sleep(1.0)
        self.figures["settled_seconds_after_window"] = round(
            (utcnow() - self.window[1]).total_seconds(), 1)

    # -- faults ---------------------------------------------------------------------------

    def fault_ended(self, fault: str, target: float, at: datetime | None = None) -> Recovery:
        recovery = Recovery(fault, at or utcnow(), target)
        self.recoveries.append(recovery)
        return recovery

    def open_transactions(self, topics: list[str]) -> dict[tuple[str, int], int]:
        """The partitions of `topics` with a transaction open now: their last stable offset
        is below their high watermark. {(topic, partition): last stable offset}."""
        admin = self._admin_client()
        if not self._partitions:
            metadata = admin.list_topics(timeout=10)
            self._partitions = [TopicPartition(t, p) for t in topics
                                for p in metadata.topics[t].partitions]
        tps = [tp for tp in self._partitions if tp.topic in topics]

        def offsets(level: IsolationLevel) -> dict[tuple[str, int], int]:
            futures = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps},  # type: ignore[no-untyped-call]
                                         isolation_level=level, request_timeout=10)
            return {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}

        lso = offsets(IsolationLevel.READ_COMMITTED)
        hw = offsets(IsolationLevel.READ_UNCOMMITTED)
        return {k: v for k, v in lso.items() if v < hw[k]}

    def still_open(self, found: dict[tuple[str, int], int], topics: list[str]) -> bool:
        """Whether a transaction seen by `open_transactions` still pins its partition: no
        live producer keeps one open for long, a stopped or dead one does."""
        now = self.open_transactions(topics)
        return any(now.get(k) == lso for k, lso in found.items())

    # -- the verdict ----------------------------------------------------------------------

    def verdict(self, *, crash_restarts_allowed: bool = True,
                extra_problems: list[str] | None = None) -> None:
        """Assert the ledger, the services' record and the recovery targets; record figures."""
        problems = list(extra_problems or [])
        result = ledger.check(self.settings, self.fires, self.job_ids)
        if result.problems and not result.figures.get("projection_equals_log", True):
            # The projection may trail the last terminal event by a batch: give it time.
            with contextlib.suppress(AssertionError):
                eventually(lambda: ledger.projection_matches_log(self.settings), timeout=30,
                           interval=2, message="projection catching up")
                result = ledger.check(self.settings, self.fires, self.job_ids)
        problems += result.problems
        problems += self._services_record(crash_restarts_allowed)
        problems += self._flow_record(result)
        problems += self._event_record(result)
        for recovery in self.recoveries:
            recovery.seconds = ledger.recovery(self.settings.database_url,
                                               self.shape.recovery_job_ids(self.job_ids),
                                               recovery.ended_at)
            for kind in ("first", "all_jobs_moving"):
                value = recovery.seconds[kind]
                if value is None:
                    what = "completion of a fire scheduled" if kind == "first" else "start of every job"
                    problems.append(f"{recovery.fault}: no {what} after the fault ended ({kind})")
                elif value > recovery.target:
                    problems.append(f"{recovery.fault}: recovery ({kind}) took {value:.1f}s, "
                                    f"target {recovery.target:.0f}s")
        if problems:
            self.figures["diagnosis"] = self.diagnose()
        self._record(result, problems)
        assert not problems, "chaos run failed:\n- " + "\n- ".join(problems)

    def diagnose(self) -> dict[str, Any]:
        """What a failed run leaves to read in its output (CI keeps nothing else): the
        run's partitions a transaction holds open now (their last stable offset below their
        high watermark), whether the broker hands out a new producer id (a fresh
        transactional id's InitProducerId), and the broker's warnings since the first fault."""
        found: dict[str, Any] = {}
        try:
            topics = [t for t in self._admin_client().list_topics(timeout=10).topics
                      if t.startswith(self.settings.topic_prefix)]
            self._partitions = []
            found["open_transactions"] = {f"{t}[{p}]": lso for (t, p), lso
                                          in sorted(self.open_transactions(topics).items())}
        except Exception as exc:  # a diagnosis never hides the verdict
            found["open_transactions"] = f"{type(exc).__name__}: {exc}"
        found["new_producer_id"] = _probe_producer_id(self.settings.kafka_bootstrap_servers)
        if self.broker_log is not None and self.recoveries:
            found["broker_warnings"] = _broker_warnings(self.broker_log, self.recoveries[0].ended_at)
        return found

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.settings.kafka_bootstrap_servers})
        return self._admin

    def _event_record(self, result: ledger.LedgerResult) -> list[str]:
        """Every matching record of the event trigger's source in exactly one run."""
        if self.events is None:
            return []
        self.events.finish()
        problems = [f"the event source's writer: {_sample_text(self.events.failed)}"] \
            if self.events.failed else []
        matching = self.events.matching

        def settled() -> bool:
            runs = ledger.event_runs(self.settings, EVENT_JOB)
            return {p for r in runs for p in r["positions"]} >= matching

        with contextlib.suppress(AssertionError):  # the ledger below says what is missing
            eventually(settled, timeout=60, interval=2, message="every matching record in a run")
        with contextlib.suppress(AssertionError):  # ... and which runs did not end
            eventually(lambda: not ledger.event_ledger(self.settings, EVENT_JOB, matching,
                                                       self.shape.event_batch)[0],
                       timeout=30, interval=2, message="every event run ended")
        found, figures = ledger.event_ledger(self.settings, EVENT_JOB, matching, self.shape.event_batch)
        result.figures.update(figures)
        return problems + found

    def _flow_record(self, result: ledger.LedgerResult) -> list[str]:
        """The limits held under the fault, and no slot leaked: once every execution ended,
        the dispatcher counts none of the pool's slots in use (decision 0056)."""
        problems, figures = ledger.flow_limits(self.settings.database_url, self.shape)
        result.figures.update(figures)
        if self.shape.pooled:
            def released() -> bool:
                status, body = self.supervisor.get("dispatcher", "/metrics")
                return status == 200 and pool_slots_in_use(body, POOL) == 0

            try:
                eventually(released, timeout=30, interval=1, message="the pool's slots released")
                result.figures["pool_slots_in_use_at_end"] = 0
            except AssertionError:
                status, body = self.supervisor.get("dispatcher", "/metrics")
                left = pool_slots_in_use(body, POOL) if status == 200 else None
                result.figures["pool_slots_in_use_at_end"] = left
                problems.append(f"pool {POOL}: {left} slots still in use once every execution "
                                f"ended (a leak), /metrics answered {status}")
        return problems

    def _services_record(self, crash_restarts_allowed: bool) -> list[str]:
        problems = []
        exits = self.supervisor.exits()
        for exit_ in exits:
            if exit_.induced is not None:
                continue
            if not crash_restarts_allowed:
                problems.append(f"{exit_.describe()}: a service restarted where it must ride the "
                                f"fault out; last error: {_last_error(exit_)}")
            elif not exit_.error_lines():
                problems.append(f"{exit_.describe()}: restarted without a clear error line")
        try:
            self.supervisor.wait_ready(timeout=60)
        except AssertionError as exc:
            problems.append(f"services not alive and ready at the end: {exc}")
        self.figures["exits"] = [{"service": e.service, "incarnation": e.incarnation, "code": e.code,
                                  "induced": e.induced, "reason": e.reason,
                                  "ran_seconds": round(e.ran_seconds, 1),
                                  "last_error": _last_error(e)} for e in exits]
        return problems

    def _record(self, result: ledger.LedgerResult, problems: list[str]) -> None:
        payload = {
            "fault": self.name,
            "at": utcnow().isoformat(timespec="seconds"),
            "short": SHORT,
            "passed": not problems,
            "recovery": [{"fault": r.fault, "target_seconds": r.target, **r.seconds}
                         for r in self.recoveries],
            "ledger": result.figures,
            **self.figures,
            "problems": problems,
            "duration_seconds": round(time.monotonic() - self.started, 1),
        }
        RESULTS.mkdir(parents=True, exist_ok=True)
        with (RESULTS / f"{self.name}.jsonl").open("a") as out:
            out.write(json.dumps(payload, default=str) + "\n")
        print(f"\nchaos {self.name}: " + json.dumps(payload, indent=2, default=str))

    def close(self) -> None:
        """Stop every service (recorded), print the tail of each log."""
        self.supervisor.stop()
        self._admin = None  # its broker may go away with the session: no reconnect noise
        for name in self.supervisor.names:
            for path in self.supervisor.all_logs(name)[-2:]:
                tail = "\n".join(path.read_text(errors="replace").splitlines()[-25:])
                print(f"\n----- {path.name} -----\n{tail[-6000:]}")


@dataclass(frozen=True)
class Requeue:
    """What a killed worker ran when it died, and how much of it was re-queued, how soon."""

    worker: str
    running: int
    requeued: int
    seconds: float | None


def worker_kill_problems(kills: int, inside: int, requeues: list[Requeue]) -> list[str]:
    """What the worker-kill test holds a run to, beyond the ledger: at least one kill made
    inside an open transaction (what the test exists for), and every execution of a killed
    worker re-queued, within dead_after + 2 s (docs/reference/performance.md#recovery)."""
    problems = []
    if inside == 0:
        problems.append(f"none of the {kills} kills was caught inside an open transaction")
    for r in requeues:
        if r.requeued < r.running:
            problems.append(f"{r.worker} was running {r.running} executions when it died; "
                            f"{r.running - r.requeued} were never re-queued")
        if r.seconds is not None and r.seconds > REQUEUE_TARGET_SECONDS:
            problems.append(f"{r.worker}'s executions re-queued {r.seconds:.1f}s after its death, "
                            f"target dead_after + 2 = {REQUEUE_TARGET_SECONDS:.0f}s (docs/reference/performance.md#recovery)")
    return problems


def _sample_text(items: list[str], n: int = 3) -> str:
    return "; ".join(items[:n]) + (f" (+{len(items) - n})" if len(items) > n else "")


def _last_error(exit_: Exit) -> str | None:
    lines = exit_.error_lines()
    return lines[-1] if lines else None


def _probe_producer_id(bootstrap_servers: str) -> str:
    """Whether the broker gives a new transactional id its producer id within 15 s (its
    coordinator loaded, its producer-id block at hand): "ok in N s", or the error it gave."""
    from confluent_kafka import KafkaException, Producer

    producer = Producer({"bootstrap.servers": bootstrap_servers, "log_level": 0,
                         "transactional.id": f"chaos-probe-{uuid4().hex[:8]}"})
    started = time.monotonic()
    try:
        producer.init_transactions(15)
        return f"ok in {time.monotonic() - started:.1f}s"
    except KafkaException as exc:
        return f"{exc.args[0]}"
    finally:
        producer.flush(1)


def _broker_warnings(log: Path, since: datetime, limit: int = 25) -> list[str]:
    """The broker's WARN and ERROR lines from a minute before `since` on (its restart and
    the settling after it), each distinct message once, with how often it came."""
    counts: dict[str, int] = {}
    first: dict[str, str] = {}
    start = (since - timedelta(seconds=60)).strftime("%Y-%m-%d %H:%M:%S")
    for path in sorted(log.parent.glob(log.name + "*"), reverse=True):  # rotated ones first
        for line in path.read_text(errors="replace").splitlines():
            if not line.startswith("[") or line[1:20] < start:
                continue
            if "] WARN " not in line and "] ERROR " not in line:
                continue
            message = line[26:].split(" (", 1)[0][:240]
            key = "".join(c for c in message if not c.isdigit())
            counts[key] = counts.get(key, 0) + 1
            first.setdefault(key, line[1:24] + " " + message)
    return [f"{first[k]} (×{n})" for k, n in list(counts.items())[:limit]]
