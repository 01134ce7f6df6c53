"""Event triggers end to end (issue 56): records written to a topic, gathered into runs by
the scheduler's trigger, run by the workers and projected into PostgreSQL.

    python -m bench.triggers                                    # both cells below
    BENCH_TRIGGER_CELLS=1000x1 BENCH_SECONDS=30 python -m bench.triggers

A cell `RATExMAX_EVENTS` runs on a fresh system (scheduler, dispatcher, two workers of 64
slots, monitor; topics of 6 partitions): a source topic of 6 partitions whose timestamps
are the broker's (`LogAppendTime`: the moment a record is written), one EVENT job on it
(`batch: {max_events: MAX_EVENTS, max_wait_seconds: 1}`, the `noop` handler), and this
process writing RATE records a second (keyed, spread evenly in 10 ms steps) for a warm-up
and then the window. Figures:
- `trigger_lag_ms`: for every record written in the window, the moment its run's JobDue
  became visible to a read_committed consumer of `job-due` (one in this process, following
  the topic's end) minus the record's timestamp: written → its run committed. p50, p99,
  max, and p99 over the window's last 5 s (a trigger falling behind grows it);
- `carried_per_second`: records of the window in runs committed inside the window, over
  the window; `written_per_second`: what this process wrote;
- exactly once: every record written (its delivered position) is in exactly one run
  (`missing`, `in_two_runs`: both must be 0);
- end to end: every run COMPLETED in PostgreSQL, and how long after the last record;
- CPU per record: every service process, the broker and PostgreSQL over the window.
Targets (issue 56): 10,000 records/s carried; trigger lag p99 ≤ 250 ms at 1,000/s with
`max_events: 1`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from datetime import datetime
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from bench.harness import BenchSystem, percentile, server_pids, tree_cpu, write_result
from cronstream.client import Client
from cronstream.shared.kafka.admin import ensure_topics
from cronstream.shared.kafka.config import reader_config
from cronstream.shared.settings import Settings
from cronstream.shared.topics import TopicSpec
from tests.support import ServiceProcess, eventually, sql

CELLS = os.environ.get("BENCH_TRIGGER_CELLS", "1000x1,10000x100")
SECONDS = int(os.environ.get("BENCH_SECONDS", "30"))
WARMUP_SECONDS = 5
SOURCE_PARTITIONS = 6
MAX_WAIT_SECONDS = 1.0
CONCURRENCY = 64
JOB = "bench-trigger"
STEP_SECONDS = 0.01
# How long the runs of every record may take to be committed, and then completed, after
# the last record is written, before the cell fails.
DRAIN_SECONDS = 120


class DueWatcher:
    """Reads `job-due` as it is committed (read_committed, from the end when started) and
    notes, for every source record in a run of JOB, when that run became visible."""

    def __init__(self, settings: Settings) -> None:
        conf = reader_config(settings, "bench-trigger-dues")
        conf.update({"fetch.wait.max.ms": 5, "enable.partition.eof": False})
        self.consumer = Consumer(conf)
        topic = settings.topics.job_due
        partitions = self.consumer.list_topics(topic, timeout=10).topics[topic].partitions
        self.consumer.assign([TopicPartition(topic, p, -1) for p in partitions])  # the end
        # (partition, offset) of a source record -> (its timestamp ms, seen ms) per run.
        self.seen: list[tuple[int, int, int, int]] = []
        self.runs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-dues", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            # The first record as soon as it is fetched, then what is already there: a
            # consume(n, t) would wait t for n records and stamp them late.
            first = self.consumer.poll(0.05)
            if first is None:
                continue
            messages = [first, *self.consumer.consume(999, 0)]
            seen_ms = time.time_ns() // 1_000_000
            for msg in messages:
                if msg.error() is None:
                    self._note(msg, seen_ms)

    def _note(self, msg: Message, seen_ms: int) -> None:
        due = json.loads(msg.value() or b"{}")
        if due.get("job_id") != JOB or due.get("reason") != "EVENT" or due.get("attempt_number") != 1:
            return
        self.runs += 1
        for event in due["job"]["events"]:
            written = int(datetime.fromisoformat(event["timestamp"]).timestamp() * 1000)
            self.seen.append((event["partition"], event["offset"], written, seen_ms))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()


def _write(producer: Producer, topic: str, rate: int, seconds: float, *, first: int,
           delivered: list[tuple[int, int, int]]) -> int:
    """`rate` records a second for `seconds`, numbered from `first`; returns the count."""
    def done(err: KafkaError | None, msg: Message) -> None:
        if err is None:
            delivered.append((msg.partition() or 0, msg.offset() or 0, time.time_ns() // 1_000_000))

    began = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - began) < seconds:
        target = int(elapsed * rate)
        while sent < target:
            n = first + sent
            producer.produce(topic, json.dumps({"order": n, "amount": n % 977}).encode(),
                             f"order-{n}".encode(), on_delivery=done)
            sent += 1
        producer.poll(0)
        time.sleep(STEP_SECONDS)  # the pace of the load, not a synchronisation
    producer.flush(30)
    return sent


def _cpu(procs: dict[str, ServiceProcess], servers: dict[str, list[int]]) -> dict[str, float]:
    cpu = {name: tree_cpu(p.pid) for name, p in procs.items()}
    for name, pids in servers.items():
        cpu[name] = sum(tree_cpu(pid) for pid in pids)
    return cpu


def _ms(values: list[int]) -> dict[str, float | int | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None, "count": 0}
    as_float = [float(v) for v in values]
    return {"p50": percentile(as_float, 50), "p99": percentile(as_float, 99), "max": max(values),
            "count": len(values)}


def run_cell(rate: int, max_events: int, seconds: int = SECONDS) -> dict[str, Any]:
    system = BenchSystem(f"triggers_{rate}x{max_events}")
    try:
        settings = system.settings
        source = f"{settings.topic_prefix}orders"
        ensure_topics(settings, [TopicSpec(source, SOURCE_PARTITIONS,
                                           {"message.timestamp.type": "LogAppendTime"})])
        procs = {"scheduler": system.start("scheduler", name="scheduler"),
                 "dispatcher": system.start("dispatcher", name="dispatcher"),
                 "monitor": system.start("monitor", name="monitor")}
        for i in range(2):
            procs[f"worker-{i}"] = system.start("worker", "--worker-id", f"bench-w{i}",
                                                "--concurrency", str(CONCURRENCY), name=f"worker-{i}")
        procs["scheduler"].wait_for_log("action=scheduler_ready")
        for name, proc in procs.items():
            if name != "scheduler":
                proc.wait_for_log("action=partitions_assigned")
        batch: dict[str, Any] = {"max_events": max_events}
        if max_events > 1:
            batch["max_wait_seconds"] = MAX_WAIT_SECONDS
        with Client(settings) as client:
            client.apply([{"job_id": JOB, "type": "EVENT", "handler": "noop",
                           "event": {"topic": source, "batch": batch}}])
        procs["scheduler"].wait_for_log("action=trigger_started shard=", timeout=60)
        watcher = DueWatcher(settings)
        producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                             "enable.idempotence": True, "linger.ms": 5,
                             "partitioner": "murmur2_random"})
        delivered: list[tuple[int, int, int]] = []
        servers = server_pids(settings)
        warm = _write(producer, source, rate, WARMUP_SECONDS, first=0, delivered=delivered)
        warm_positions = {(p, o) for p, o, _ in delivered}
        before, window_start_ms = _cpu(procs, servers), time.time_ns() // 1_000_000
        written = _write(producer, source, rate, seconds, first=warm, delivered=delivered)
        window_end_ms = time.time_ns() // 1_000_000
        after = _cpu(procs, servers)
        span = (window_end_ms - window_start_ms) / 1000
        positions = {(p, o) for p, o, _ in delivered}
        last_written = time.monotonic()
        eventually(lambda: positions <= {(p, o) for p, o, _, _ in list(watcher.seen)}, DRAIN_SECONDS,
                   message="every record in a committed run")
        in_runs_after = time.monotonic() - last_written
        watcher.close()
        runs = watcher.runs
        eventually(lambda: sql(settings.database_url, "SELECT count(*) AS n FROM job_executions "
                                                      "WHERE job_id = $1 AND status = 'COMPLETED'",
                               JOB)[0]["n"] >= runs, DRAIN_SECONDS, message="every run completed")
        completed_after = time.monotonic() - last_written
        times = Counter((p, o) for p, o, _, _ in watcher.seen)
        window = [(written_ms, seen_ms) for p, o, written_ms, seen_ms in watcher.seen
                  if (p, o) not in warm_positions]
        lags = [seen_ms - written_ms for written_ms, seen_ms in window]
        late = [seen_ms - written_ms for written_ms, seen_ms in window
                if written_ms >= window_end_ms - 5000]
        carried = sum(1 for written_ms, seen_ms in window if seen_ms <= window_end_ms)
        cpu = {k: round(after[k] - before[k], 2) for k in after}
        total = sum(cpu.values())
        return {
            "offered_per_second": rate, "max_events": max_events,
            "max_wait_seconds": MAX_WAIT_SECONDS if max_events > 1 else 0,
            "source_partitions": SOURCE_PARTITIONS, "window_seconds": round(span, 1),
            "written": written, "written_per_second": round(written / span, 1),
            "carried_per_second": round(carried / span, 1),
            "trigger_lag_ms": _ms(lags), "trigger_lag_last_5s_ms": _ms(late),
            "runs": runs, "records_per_run": round(len(watcher.seen) / runs, 1) if runs else None,
            "missing": len(positions - set(times)),
            "in_two_runs": sum(1 for n in times.values() if n > 1),
            "all_in_committed_runs_after_last_record_s": round(in_runs_after, 2),
            "all_runs_completed_after_last_record_s": round(completed_after, 2),
            "cpu_seconds": cpu,
            "cpu_us_per_record": {"total": round(total / written * 1e6, 1),
                                  **{k: round(v / written * 1e6, 1) for k, v in cpu.items()}},
            "machine_cpu_utilisation": round(total / (span * (os.cpu_count() or 1)), 3),
        }
    finally:
        system.close()


def main() -> dict[str, Any]:
    cells = []
    for cell in CELLS.split(","):
        rate, max_events = (int(x) for x in cell.split("x"))
        print(f"--- triggers {rate}/s, max_events {max_events}", flush=True)
        cells.append(run_cell(rate, max_events))
        print(json.dumps(cells[-1], indent=2), flush=True)
    figures = {"cells": cells}
    write_result("triggers", figures)
    return figures


if __name__ == "__main__":
    main()
