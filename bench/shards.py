"""The clock at scale (issue 55; docs/reference/performance.md): N definitions over S shards
on P scheduler processes with one warm standby each, on this machine with the broker.

    python -m bench.shards                              # 1,000,000 over 32 shards, 3 processes
    BENCH_DEFINITIONS=10000000 python -m bench.shards   # ten million

The mix of an independent benchmark of the single-leader clock: 70 % daily cron (a random
minute and hour, in UTC and Europe/Berlin), 20 % long intervals (1 to 24 h), 10 % one-time
jobs up to ten years ahead — plus 256 probe jobs firing every second, whose fires say
when the clock fires and whether it fires each instant once. In order:

1. publish the definitions; start the processes; time until every shard is led (cold:
   every job's first fire computed by a first leader) and the standbys caught up;
2. RSS of each process (every job is held twice: by its leader and its standby, on disk);
3. steady fire lag of the probes (record timestamp − scheduled_at; negative: committed
   ahead, decision 0027) for BENCH_STEADY_SECONDS;
4. SIGKILL of the process leading most shards: time from the kill to the first fire of
   each of its shards; it is started again (a process joining, warmed before it joins)
   and waited for until ready — its standby shards warm too — as a rolling restart waits
   for each pod (`rejoined_ready_after_seconds`);
5. SIGTERM of another: the latest any probe fired across the handover; started again;
6. a burst of BENCH_BURST jobs due in the same second: from that second until every JobDue
   is committed;
7. every probe instant and every burst job fired exactly once: missed and doubled counted,
   and the missed instants by the phase (above) they fall in (`missed_by_phase`): each gap
   between consecutive fires of a probe, with its shard, its start and its length. Under
   the probes' misfire policy (FIRE_ONCE, grace 60 s) a gap comes of a fire found later
   than the grace (it fires once, then goes on from now); a gap from a clock that was
   never later than that is a bug (`gaps_not_policy`). The probes are published before the
   schedulers start, so a cold start longer than the grace skips their first instants;
   `missed_after_cold_start` counts what is owed once every shard was led.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import psutil
from confluent_kafka import Consumer, KafkaError, TopicPartition

from bench.harness import BenchSystem, run_benches, summary
from bench.scheduler import publish, publisher, scheduled_ms
from cronstream.shared.shards import shard_of
from tests.support import ServiceProcess, eventually

PROBES = 256
PROBE_GRACE_MS = 60_000  # the probes' misfire_grace_seconds (the default), FIRE_ONCE
LEADER_READY = re.compile(r"action=leader_ready .*?shard=(\d+)")
STEPPED_DOWN = re.compile(r"action=leader_stepped_down .*?shard=(\d+)")


def definitions(n: int, seed: int = 7) -> Any:
    """(job_id, definition) of the mix, lazily."""
    rng = random.Random(seed)
    now = datetime.now(UTC)
    for i in range(n):
        job_id = f"j-{i:08d}"
        roll = rng.random()
        if roll < 0.7:
            d: dict[str, Any] = {"type": "CRON", "schedule": f"{rng.randrange(60)} {rng.randrange(24)} * * *",
                 "timezone": "Europe/Berlin" if i % 2 else "UTC"}
        elif roll < 0.9:
            d = {"type": "INTERVAL", "interval_seconds": rng.randrange(3600, 86_400)}
        else:
            ahead = timedelta(seconds=rng.randrange(3600, 10 * 365 * 86_400))
            d = {"type": "ONE_TIME", "run_at": (now + ahead).isoformat()}
        yield job_id, {"job_id": job_id, "handler": "noop", "params": {"i": i}, **d}


def probes() -> list[tuple[str, dict[str, Any]]]:
    return [(f"probe-{i:03d}", {"job_id": f"probe-{i:03d}", "type": "INTERVAL", "interval_seconds": 1,
                                "handler": "noop"}) for i in range(PROBES)]


def led(proc: ServiceProcess) -> set[int]:
    shards: set[int] = set()
    for line in proc.log().splitlines():
        if (m := LEADER_READY.search(line)) is not None:
            shards.add(int(m.group(1)))
        elif (m := STEPPED_DOWN.search(line)) is not None:
            shards.discard(int(m.group(1)))
    return shards


def every_shard_led(procs: list[ServiceProcess], shards: int) -> bool:
    found = [s for p in procs if p.alive() for s in led(p)]
    return sorted(found) == list(range(shards))


def _ready(proc: ServiceProcess) -> bool:
    try:
        return proc.get("/readyz")[0] == 200
    except OSError:
        return False


def metric(proc: ServiceProcess, name: str) -> float | None:
    import httpx

    try:
        text = httpx.get(f"http://127.0.0.1:{proc.http_port()}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def read_due(settings: Any, since_ms: int = 0) -> list[tuple[str, int, int]]:
    """(job_id, scheduled ms, record ts ms) of every first attempt on job-due (from `since_ms`)."""
    topic = settings.topics.job_due
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers, "group.id": "bench-shards",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False})
    try:
        parts = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        starts = consumer.offsets_for_times([TopicPartition(topic, p, since_ms) for p in parts], 10)
        consumer.assign([TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else -1)
                         for tp in starts])
        out: list[tuple[str, int, int]] = []
        done: set[int] = set()
        while len(done) < len(parts):
            for msg in consumer.consume(10_000, 1.0):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(msg.partition() or 0)
                    continue
                value = msg.value() or b"{}"
                if b'"attempt_number":1,' not in value:
                    continue
                job_id = json.loads(value)["job_id"]
                out.append((job_id, scheduled_ms(value), msg.timestamp()[1]))
        return out
    finally:
        consumer.close()


def rss(procs: list[ServiceProcess]) -> dict[str, int]:
    found = {}
    for p in procs:
        if p.alive():
            try:
                found[p.name] = psutil.Process(p.pid).memory_info().rss
            except psutil.Error:
                continue
    return found


def _tree() -> str | None:
    """The commit measured (with a mark when the tree differs from it)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{commit} (with uncommitted changes)" if dirty else commit


class Run:
    """One run of the benchmark: its system, its processes, its figures."""

    def __init__(self) -> None:
        self.n = int(os.environ.get("BENCH_DEFINITIONS", "1000000"))
        self.shards = int(os.environ.get("BENCH_SHARDS", "32"))
        self.count = int(os.environ.get("BENCH_PROCESSES", "3"))
        self.steady = int(os.environ.get("BENCH_STEADY_SECONDS", "60"))
        self.burst = int(os.environ.get("BENCH_BURST", "100000"))
        os.environ["CRONSTREAM_SCHEDULER_SHARDS"] = str(self.shards)
        self.system = BenchSystem(f"shards_{self.n}", partitions=6)
        self.settings = self.system.settings
        self.session_ms = self.settings.scheduler_session_timeout_ms
        self.producer = publisher(self.settings)
        self.procs: list[ServiceProcess] = []
        # (phase, wall-clock ms it started), in order: where a missed fire happened.
        self.phases: list[tuple[str, int]] = []
        self.result: dict[str, Any] = {"params": {
            "definitions": self.n, "shards": self.shards, "processes": self.count, "standbys": 1,
            "probes": PROBES, "session_timeout_ms": self.session_ms}}
        # The tree measured and what the table should say of the run (BENCH_NOTE: a quiet
        # machine or not, what changed), beside its figures in docs/benchmarks.md.
        self.result["tree"] = _tree()
        if os.environ.get("BENCH_NOTE"):
            self.result["note"] = os.environ["BENCH_NOTE"]

    def mark(self, phase: str) -> None:
        self.phases.append((phase, int(time.time() * 1000)))

    def start(self, name: str, shown: str | None = None) -> ServiceProcess:
        return self.system.start("scheduler", "--instance-id", name, "--standbys", "1",
                                 name=shown or name)

    def all_led(self) -> bool:
        return every_shard_led(self.procs, self.shards)

    def publish(self) -> None:
        t0 = time.monotonic()
        topic = self.settings.topics.job_definitions
        batch: list[tuple[str, dict[str, Any]]] = []
        for item in definitions(self.n):
            batch.append(item)
            if len(batch) >= 100_000:
                publish(self.producer, topic, batch)
                batch = []
        publish(self.producer, topic, batch + probes())
        self.result["publish_seconds"] = round(time.monotonic() - t0, 1)
        print(f"published {self.n} in {self.result['publish_seconds']} s", flush=True)

    def cold_start(self) -> None:
        started = time.monotonic()
        self.procs = [self.start(f"s{i}") for i in range(self.count)]
        eventually(self.all_led, 7200, interval=2, message="every shard led")
        self.result["every_shard_led_after_seconds"] = round(time.monotonic() - started, 1)
        print(f"every shard led after {self.result['every_shard_led_after_seconds']} s", flush=True)
        eventually(lambda: all((metric(p, "cronstream_scheduler_standby_lag_records") or 1) < 1000
                               for p in self.procs), 7200, interval=5, message="standbys caught up")
        self.result["standbys_caught_up_after_seconds"] = round(time.monotonic() - started, 1)
        memory = rss(self.procs)
        self.result["rss_mb"] = {k: round(v / 2**20) for k, v in memory.items()}
        self.result["rss_total_mb"] = round(sum(memory.values()) / 2**20)
        self.result["rss_bytes_per_definition"] = round(sum(memory.values()) / self.n, 1)
        self.result["shards_led"] = {p.name: len(led(p)) for p in self.procs}

    def steady_lag(self) -> None:
        since = int(time.time() * 1000) + 5000
        time.sleep(5 + self.steady)
        lags = [float(ts - at) for job, at, ts in read_due(self.settings, since)
                if job.startswith("probe-") and at >= since]
        self.result["steady_fire_lag_ms"] = {k: round(v, 1) for k, v in summary(lags).items()}
        self.result["steady_probe_fires_per_second"] = round(len(lags) / self.steady, 1)

    def sigkill(self) -> None:
        victim = max(self.procs, key=lambda p: len(led(p)))
        lost = led(victim)
        marks = {p.name: len(p.log()) for p in self.procs}
        killed = int(time.time() * 1000)
        victim.kill()
        eventually(self.all_led, 600, interval=0.5, message="taken over")
        time.sleep(3)
        after = read_due(self.settings, killed - 2000)
        firsts = []
        for shard in sorted(lost):
            # Committed after the kill (the victim committed some of them ahead, before it).
            mine = [ts for job, _at, ts in after if job.startswith("probe-")
                    and shard_of(job, self.shards) == shard and ts > killed]
            if mine:
                firsts.append(min(mine) - killed)
        took = [float(x) for p in self.procs if p.alive()
                for x in re.findall(r"action=leader_ready .*?takeover_seconds=([\d.]+)",
                                    p.log()[marks[p.name]:])]
        self.result["sigkill"] = {"shards_lost": len(lost),
                                  "fires_again_after_ms": summary(list(map(float, firsts))),
                                  "bound_ms": self.session_ms + 2000,
                                  "takeover_seconds_max": max(took) if took else None}
        self.rejoin(victim, "sigkill_rejoin")

    def rejoin(self, gone: ServiceProcess, phase: str) -> None:
        self.mark(phase)
        again = self.start(gone.name, f"{gone.name}-again")
        self.procs[self.procs.index(gone)] = again
        eventually(lambda: self.all_led() and bool(led(again)), 1800, interval=1,
                   message=f"{gone.name} rejoined")
        # Ready (/readyz: its standby shards warm too) before the next phase stops another,
        # as a rolling restart waits for each pod: the next handover finds warm standbys.
        started = time.monotonic()
        eventually(lambda: _ready(again), 1800, interval=1, message=f"{gone.name} ready")
        self.result.setdefault("rejoined_ready_after_seconds", {})[phase] = round(
            time.monotonic() - started, 1)

    def sigterm(self) -> None:
        leaving = max((p for p in self.procs if p.alive()), key=lambda p: len(led(p)))
        moved = led(leaving)
        termed = int(time.time() * 1000)
        leaving.stop(timeout=60)
        eventually(self.all_led, 600, interval=0.5, message="handed over")
        time.sleep(3)
        around = [(ts - at) for job, at, ts in read_due(self.settings, termed - 5000)
                  if job.startswith("probe-") and termed - 2000 <= at <= termed + 3000]
        self.result["sigterm"] = {"shards_moved": len(moved),
                                  "latest_fire_ms": max(around) if around else None, "bound_ms": 1000}
        self.rejoin(leaving, "sigterm_rejoin")

    def burst_in_one_second(self) -> None:
        due = (datetime.now(UTC) + timedelta(seconds=150)).replace(microsecond=0)
        publish(self.producer, self.settings.topics.job_definitions, [
            (f"burst-{i:06d}", {"job_id": f"burst-{i:06d}", "type": "ONE_TIME",
                                "run_at": due.isoformat(), "handler": "noop"}) for i in range(self.burst)])
        due_ms = int(due.timestamp() * 1000)
        time.sleep(max(0.0, due_ms / 1000 - time.time()) + 5)

        def fired() -> list[tuple[str, int, int]] | None:
            found = [f for f in read_due(self.settings, due_ms - 5000) if f[0].startswith("burst-")]
            return found if len({j for j, _, _ in found}) >= self.burst else None
        found = eventually(fired, 300, interval=2, message="every burst job fired")
        stamps = sorted(ts for _, _, ts in found)
        self.result["burst"] = {"jobs": self.burst, "all_committed_after_ms": stamps[-1] - due_ms,
                                "half_committed_after_ms": stamps[len(stamps) // 2] - due_ms,
                                "doubled": len(found) - len({j for j, _, _ in found}), "bound_ms": 2000}

    def exactly_once(self) -> None:
        by_probe: dict[str, list[int]] = defaultdict(list)
        for job, at, _ts in read_due(self.settings):
            if job.startswith("probe-"):
                by_probe[job].append(at)
        self.result["probe_fires"] = sum(len(t) for t in by_probe.values())
        self.result["doubled"] = sum(c - 1 for times in by_probe.values()
                                     for c in Counter(times).values() if c > 1)
        self.result["missed"] = sum(max(0, (b - a) // 1000 - 1) for times in by_probe.values()
                                    for a, b in itertools.pairwise(sorted(set(times))))
        by_phase = self.result["missed_by_phase"] = missed_by_phase(by_probe, self.phases, self.shards)
        # The probes are published before any scheduler runs: a cold start longer than their
        # grace skips their first instants (policy). After it, every instant is owed.
        self.result["missed_after_cold_start"] = sum(
            entry["missed"] for phase, entry in by_phase.items()
            if phase not in ("before_publish", "publish", "cold_start"))
        self.result["rss_total_mb_at_end"] = round(sum(rss(self.procs).values()) / 2**20)


def missed_by_phase(by_probe: dict[str, list[int]], phases: list[tuple[str, int]],
                    shards: int) -> dict[str, Any]:
    """The gaps (> 1 s) between consecutive fires of each probe, by the phase their first
    missed instant falls in: how many instants, how many gaps, the longest, and the
    largest gaps with their shard and start (seconds after the phase started)."""
    found: dict[str, dict[str, Any]] = {}
    for job, times in sorted(by_probe.items()):
        for a, b in itertools.pairwise(sorted(set(times))):
            missed = (b - a) // 1000 - 1
            if missed <= 0:
                continue
            first = a + 1000
            name, since = "before_publish", 0
            for phase, at in phases:
                if at <= first:
                    name, since = phase, at
            entry = found.setdefault(name, {"missed": 0, "gaps": 0, "gaps_not_policy": 0, "probes": set(),
                                            "shards": set(), "longest_gap_ms": 0, "largest": []})
            entry["missed"] += missed
            entry["gaps"] += 1
            # FIRE_ONCE skips instants only when the fire is found later than the grace:
            # a shorter gap is no policy's doing.
            entry["gaps_not_policy"] += b - a <= PROBE_GRACE_MS + 1000
            entry["probes"].add(job)
            entry["shards"].add(shard_of(job, shards))
            entry["longest_gap_ms"] = max(entry["longest_gap_ms"], b - a)
            entry["largest"].append({"probe": job, "shard": shard_of(job, shards), "gap_ms": b - a,
                                     "starts_s_into_phase": round((first - since) / 1000, 1)})
    for entry in found.values():
        entry["probes"] = len(entry["probes"])
        entry["shards"] = sorted(entry["shards"])
        entry["largest"] = sorted(entry["largest"], key=lambda g: -g["gap_ms"])[:5]
    return found


def run() -> dict[str, Any]:
    bench = Run()
    try:
        for step in (bench.publish, bench.cold_start, bench.steady_lag, bench.sigkill, bench.sigterm,
                     bench.burst_in_one_second, bench.exactly_once):
            bench.mark(step.__name__)
            step()
        bench.result["phases"] = {name: datetime.fromtimestamp(at / 1000, UTC).isoformat()
                                  for name, at in bench.phases}
        return bench.result
    finally:
        bench.system.close()


BENCHES = {"run": run}


def main(names: list[str] | None = None) -> None:
    n = int(os.environ.get("BENCH_DEFINITIONS", "1000000"))
    run_benches(f"shards_{n}", BENCHES, names)


if __name__ == "__main__":
    main(sys.argv[1:] or None)
