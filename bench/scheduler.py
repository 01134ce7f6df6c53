"""Scheduler benchmarks (docs/reference/performance.md).

    python -m bench.scheduler                  # all four
    python -m bench.scheduler fire_lag burst   # some

- fire_lag: 1,000 INTERVAL jobs spread over each second (1,000 fires/s); fire lag is
  scheduled_at → the JobDue visible to a read_committed consumer. Target p99 ≤ 100 ms.
  Measured with `scheduler_fire_ahead_ms` 0 (BENCH_FIRE_AHEAD_MS): the timer path
  itself. With the default (150 ms) fires are committed before they are due
  (docs/decisions/0027), and the lag is negative.
- burst: 10,000 ONE_TIME jobs due in the same second, through scheduler and dispatcher;
  time until every QUEUED event is visible. Target ≤ 2 s.
- takeover: 1,000,000 CRON definitions; SIGKILL the leader; time until the standby is
  ready, and its RSS. Target ≤ 30 s, ≤ 2 GB.
- failover: SIGKILL the leader 5 times; time from kill to the next committed fire, and
  duplicate / missed fires of a 1-second INTERVAL job. Target ≤ 10 s, 0 and 0.
- cpu_per_fire: the clock alone (no Kafka): CPU per fire — planning, rendering the JobDue
  and state records, committing — of BENCH_CPU_JOBS jobs (100) firing together, for
  BENCH_CPU_FIRES fires (20,000), by kind of job: plain INTERVAL and CRON, each with a
  calendar (weekends and US holidays), CRON with NEXT_DAY, INTERVAL and CRON with a
  jitter, INTERVAL with max_runs (BENCH_CPU_KINDS: some, by name, comma-separated). Best
  of BENCH_CPU_ROUNDS (5). Target: a calendar-bound
  job ≤ 2× its plain kind (docs/decisions/0055); the plain kinds unchanged. Not a part of
  `all` (run it by name); kinds the clock cannot compute (an older tree) are left out.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psutil
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from bench.harness import BenchSystem, run_benches, summary
from cronstream.shared.settings import Settings
from tests.support import ServiceProcess, eventually


def publisher(settings: Settings) -> Producer:
    # murmur2: a definition's partition is its job's shard (shared/shards.py).
    return Producer({"bootstrap.servers": settings.kafka_bootstrap_servers, "partitioner": "murmur2_random",
                     "enable.idempotence": True, "linger.ms": 20, "batch.size": 1_000_000,
                     "compression.type": "lz4", "queue.buffering.max.messages": 2_000_000})


def publish(producer: Producer, topic: str, items: list[tuple[str, dict[str, Any]]]) -> None:
    for key, value in items:
        while True:
            try:
                producer.produce(topic, json.dumps(value, separators=(",", ":")).encode(), key.encode())
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0


def tail_topic(settings: Settings, topic: str, seconds: float,
               on_record: Callable[[Any, float], None], stop: Callable[[], bool] | None = None) -> None:
    """Read `topic` from its current end for `seconds` (or until `stop()`), calling
    `on_record(message, receive_time)`."""
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                         "group.id": "bench-tail", "isolation.level": "read_committed",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    # Explicit end offsets: OFFSET_END is resolved lazily and could skip early records.
    ends = [eventually(functools.partial(_high, consumer, topic, p), 30, interval=0.5, message="offsets")
            for p in partitions]
    consumer.assign([TopicPartition(topic, p, end - 1)
                     for p, end in zip(partitions, ends, strict=True)])
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and not (stop and stop()):
            msg = consumer.poll(0.05)
            if msg is None or msg.error() is not None:
                continue
            on_record(msg, time.time())
            for more in consumer.consume(10_000, 0):
                if more.error() is None:
                    on_record(more, time.time())
    finally:
        consumer.close()


def _high(consumer: Consumer, topic: str, partition: int) -> int | None:
    """The high watermark + 1 (so that 0 is truthy for `eventually`), or None on an error."""
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), 5)[1] + 1
    except KafkaException:
        return None


def first_record_after(settings: Settings, topic: str) -> float:
    """When the first record appended from now on became visible (read_committed)."""
    seen: list[float] = []
    tail_topic(settings, topic, 60, lambda _msg, now: seen.append(now), stop=lambda: bool(seen))
    return seen[0] if seen else float("nan")


def scheduled_ms(value: bytes) -> int:
    due = json.loads(value)
    return int(datetime.fromisoformat(due["scheduled_at"].replace("Z", "+00:00")).timestamp() * 1000)


def fire_lag() -> dict[str, Any]:
    jobs, seconds = int(os.environ.get("BENCH_JOBS", "1000")), int(os.environ.get("BENCH_SECONDS", "30"))
    ahead = os.environ.get("BENCH_FIRE_AHEAD_MS", "0")
    system = BenchSystem("fire_lag")
    try:
        scheduler = system.start("scheduler", name="scheduler",
                                 env={"CRONSTREAM_SCHEDULER_FIRE_AHEAD_MS": ahead})
        scheduler.wait_for_log("action=scheduler_ready")
        base = datetime(2026, 1, 1, tzinfo=UTC)
        items = [(f"lag-{i:05d}", {"job_id": f"lag-{i:05d}", "type": "INTERVAL", "interval_seconds": 1,
                                   "start_at": (base + timedelta(milliseconds=i * 1000 // jobs)).isoformat(),
                                   "handler": "noop"}) for i in range(jobs)]
        publish(publisher(system.settings), system.settings.topics.job_definitions, items)
        time.sleep(5)  # let every job reach its steady state before measuring
        lags: list[float] = []
        tail_topic(system.settings, system.settings.topics.job_due, seconds,
                   lambda msg, now: lags.append(now * 1000 - scheduled_ms(msg.value())))
        stats = summary(lags)
        return {"params": {"jobs": jobs, "fires_per_second": jobs, "seconds": seconds,
                           "fire_ahead_ms": int(ahead)},
                "observed_fires_per_second": round(len(lags) / seconds, 1),
                "fire_lag_ms": {k: round(v, 1) for k, v in stats.items()}}
    finally:
        system.close()


def burst() -> dict[str, Any]:
    jobs = int(os.environ.get("BENCH_BURST_JOBS", "10000"))
    system = BenchSystem("burst")
    try:
        scheduler = system.start("scheduler", name="scheduler")
        system.start("dispatcher", name="dispatcher").wait_for_log("action=dispatcher_started")
        scheduler.wait_for_log("action=scheduler_ready")
        due = (datetime.now(UTC) + timedelta(seconds=25)).replace(microsecond=0)
        items = [(f"burst-{i:05d}", {"job_id": f"burst-{i:05d}", "type": "ONE_TIME",
                                     "run_at": due.isoformat(), "handler": "noop"}) for i in range(jobs)]
        publish(publisher(system.settings), system.settings.topics.job_definitions, items)
        queued: list[float] = []
        tail_topic(system.settings, system.settings.topics.execution_events, 60,
                   lambda msg, now: queued.append(now), stop=lambda: len(queued) >= jobs)
        due_s = due.timestamp()
        return {"params": {"jobs": jobs, "due_at": due.isoformat()},
                "queued": len(queued),
                "all_queued_after_seconds": round(max(queued) - due_s, 3) if queued else None,
                "half_queued_after_seconds": round(sorted(queued)[len(queued) // 2] - due_s, 3)
                if queued else None}
    finally:
        system.close()


def takeover() -> dict[str, Any]:
    jobs = int(os.environ.get("BENCH_DEFINITIONS", "1000000"))
    system = BenchSystem("takeover", partitions=3)
    try:
        first = system.start("scheduler", "--instance-id", "first", name="scheduler-first")
        first.wait_for_log("action=scheduler_ready")
        started = time.monotonic()
        producer = publisher(system.settings)
        batch = 50_000
        for lo in range(0, jobs, batch):
            publish(producer, system.settings.topics.job_definitions, [
                (f"cron-{i:07d}", {"job_id": f"cron-{i:07d}", "type": "CRON",
                                   "schedule": f"{i % 60} {(i // 60) % 24} * * *",
                                   "timezone": "Europe/Berlin" if i % 2 else "UTC",
                                   "handler": "noop", "params": {"i": i}})
                for i in range(lo, min(jobs, lo + batch))])
        published = time.monotonic() - started
        applied = re.compile(r"action=definitions_applied count=\d+ last_offset=(\d+)")

        def caught_up() -> bool:
            offsets = [int(m) for m in applied.findall(first.log())]
            return bool(offsets) and max(offsets) >= jobs - 1
        eventually(caught_up, 1800, interval=2, message="the first leader processed every definition")
        processed = time.monotonic() - started
        second = system.start("scheduler", "--instance-id", "second", name="scheduler-second")
        second.wait_for_log("action=scheduler_standby")
        time.sleep(3)  # let the standby join the group before the kill
        killed = time.monotonic()
        first.kill()
        second.wait_for_log("action=leader_ready", timeout=300)
        ready_after = time.monotonic() - killed
        rss = psutil.Process(second.pid).memory_info().rss
        took = re.findall(r"action=leader_ready .*takeover_seconds=([\d.]+)", second.log())
        return {"params": {"definitions": jobs,
                           "session_timeout_ms": system.settings.scheduler_session_timeout_ms},
                "publish_seconds": round(published, 1),
                "first_leader_processed_all_after_seconds": round(processed, 1),
                "ready_after_kill_seconds": round(ready_after, 2),
                "takeover_seconds_after_assignment": float(took[-1]) if took else None,
                "leader_rss_mb": round(rss / 2**20)}
    finally:
        system.close()


def failover() -> dict[str, Any]:
    kills = int(os.environ.get("BENCH_KILLS", "5"))
    system = BenchSystem("failover")
    try:
        schedulers: list[ServiceProcess] = [
            system.start("scheduler", "--instance-id", f"s{i}", name=f"scheduler-{i}") for i in range(2)]
        eventually(lambda: any("action=leader_ready" in s.log() for s in schedulers), 60)
        publish(publisher(system.settings), system.settings.topics.job_definitions,
                [("tick", {"job_id": "tick", "type": "INTERVAL", "interval_seconds": 1, "handler": "noop"})])
        times: list[float] = []
        fires: list[int] = []
        generation = 2
        for _ in range(kills):
            time.sleep(4)
            leader = next(s for s in schedulers if s.alive() and s.log().count("action=leader_ready")
                          > s.log().count("action=leader_stepped_down"))
            killed_at = time.time()
            leader.kill()
            times.append(first_record_after(system.settings, system.settings.topics.job_due) - killed_at)
            schedulers.remove(leader)
            schedulers.append(system.start("scheduler", "--instance-id", f"s{generation}",
                                           name=f"scheduler-{generation}"))
            generation += 1
        time.sleep(3)
        consumer = Consumer({"bootstrap.servers": system.settings.kafka_bootstrap_servers,
                             "group.id": "bench-read", "isolation.level": "read_committed",
                             "enable.partition.eof": True})
        topic = system.settings.topics.job_due
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, -2) for p in partitions])
        eof: set[int] = set()
        while len(eof) < len(partitions):
            for msg in consumer.consume(1000, 1):
                value = msg.value() or b"{}"
                if msg.error() is not None:
                    eof.add(msg.partition() or 0)
                elif json.loads(value)["attempt_number"] == 1:
                    fires.append(scheduled_ms(value))
        consumer.close()
        counts = Counter(fires)
        missed = sum((b - a) // 1000 - 1 for a, b in itertools.pairwise(sorted(counts)))
        return {"params": {"kills": kills,
                           "session_timeout_ms": system.settings.scheduler_session_timeout_ms},
                "next_fire_after_kill_seconds": [round(t, 2) for t in times],
                "max_seconds": round(max(times), 2),
                "fires": len(fires), "duplicate_fires": sum(n - 1 for n in counts.values()),
                "missed_fires": missed}
    finally:
        system.close()


# (kind, the definition's fields): every job of a kind fires at the same instants.
CPU_KINDS: dict[str, dict[str, Any]] = {
    "interval": {"type": "INTERVAL", "interval_seconds": 60},
    "interval+calendar": {"type": "INTERVAL", "interval_seconds": 60, "calendar": "bench"},
    "cron": {"type": "CRON", "schedule": "* * * * *"},
    "cron+calendar": {"type": "CRON", "schedule": "* * * * *", "calendar": "bench"},
    "cron+calendar NEXT_DAY": {"type": "CRON", "schedule": "* * * * *", "calendar": "bench",
                               "on_excluded": "NEXT_DAY"},
    "interval+jitter": {"type": "INTERVAL", "interval_seconds": 60, "jitter_seconds": 30},
    "cron+jitter": {"type": "CRON", "schedule": "* * * * *", "jitter_seconds": 30},
    "interval+max_runs": {"type": "INTERVAL", "interval_seconds": 60, "max_runs": 1_000_000},
}
CPU_CALENDAR = {"calendar_id": "bench", "timezone": "UTC", "exclude_weekdays": ["SAT", "SUN"],
                "holidays": {"country": "US"}}


def _clock_of(fields: dict[str, Any], jobs: int, start: datetime) -> Any:
    """A clock holding `jobs` jobs of one kind, ready to fire (fragments rendered, as the
    leader's prepare loop has them), or None when this tree cannot compute the kind."""
    from cronstream.services.scheduler.clock import Clock
    from cronstream.shared.records import JobDefinition

    try:
        if "calendar" in fields:
            from cronstream.services.scheduler.calendars import CalendarTable
            from cronstream.shared.records import Calendar

            calendars = CalendarTable(ready=True)
            calendars.put(Calendar.from_dict(CPU_CALENDAR), 0, int(start.timestamp() * 1000))
            clock = Clock(calendars=calendars)
        else:
            clock = Clock()
        for i in range(jobs):
            d = JobDefinition.from_dict({"job_id": f"cpu-{i:05d}", "handler": "noop", **fields})
            clock.apply_definition(d.job_id, d, d.to_json(), offset=i,
                                   observed_ms=int(start.timestamp() * 1000))
        if clock.suspended or len([j for j in clock if j.next_fire_ms is not None]) != jobs:
            return None
        for job in clock:
            job.fragments()
        return clock
    except Exception:  # a kind this tree does not know
        return None


def cpu_per_fire() -> dict[str, Any]:
    fires = int(os.environ.get("BENCH_CPU_FIRES", "20000"))
    jobs = int(os.environ.get("BENCH_CPU_JOBS", "100"))
    rounds = int(os.environ.get("BENCH_CPU_ROUNDS", "5"))
    start = datetime(2026, 12, 21, 8, 0, tzinfo=UTC)  # a Monday; Christmas (a Friday) is excluded
    figures: dict[str, float] = {}
    only = [k.strip() for k in os.environ.get("BENCH_CPU_KINDS", "").split(",") if k.strip()]
    for kind, fields in CPU_KINDS.items():
        if only and kind not in only:
            continue
        best = float("inf")
        for _ in range(rounds):
            clock = _clock_of(fields, jobs, start)
            if clock is None:
                break
            fired = 0
            began = time.process_time()
            while fired < fires:
                due = clock.next_due_ms()
                if due is None:
                    break
                plan = clock.plan(due, 5000)
                clock.commit(plan)
                fired += len(plan.dues)
            best = min(best, (time.process_time() - began) / max(fired, 1))
        if best != float("inf"):
            figures[kind] = round(best * 1e6, 2)
    ratios = {f"{kind} / {plain}": round(figures[kind] / figures[plain], 2)
              for kind in figures for plain in ("interval", "cron")
              if kind != plain and kind.startswith(plain) and plain in figures}
    return {"params": {"fires": fires, "jobs": jobs, "rounds": rounds, "calendar": CPU_CALENDAR},
            "cpu_us_per_fire": figures, "ratio_to_plain": ratios}


BENCHES = {"fire_lag": fire_lag, "burst": burst, "takeover": takeover, "failover": failover}
# Run by name only (`python -m bench.scheduler cpu_per_fire`): no servers, not in `all`.
BY_NAME_ONLY = {"cpu_per_fire": cpu_per_fire}


def main(names: list[str] | None = None) -> None:
    run_benches("scheduler", {**BENCHES, **BY_NAME_ONLY} if names else BENCHES, names)


if __name__ == "__main__":
    main(sys.argv[1:] or None)
