"""The clock in shards against a real broker (issue 55): eight shards on three scheduler
processes with a warm standby each; a process SIGKILLed, SIGTERMed, frozen and thawed, a
new one joining — and every fire of every job exactly once, on time. Only schedulers run
here; the test reads `job-due` directly (each record's timestamp: when it was produced,
inside its transaction)."""

from __future__ import annotations

import itertools
import json
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cronstream.shared.kafka.admin import ensure_topics, partition_counts
from cronstream.shared.records import JobDue
from cronstream.shared.settings import Settings
from cronstream.shared.shards import shard_of
from tests.conftest import Processes
from tests.support import ServiceProcess, cli, eventually, produce_json, read_all, shards_led, value

SHARDS = 8
JOBS = [f"tick-{i:02d}" for i in range(24)]


@pytest.fixture
def sharded(settings: Settings) -> Settings:
    """Eight shards (the other tests run two)."""
    made = settings.model_copy(update={"scheduler_shards": SHARDS})
    ensure_topics(made, made.topics.specs())
    return made


@pytest.fixture
def processes_of(settings: Settings, tmp_path: Path) -> Iterator[Callable[[Settings], Processes]]:
    """Service processes of settings a test makes itself; stopped at teardown (before the
    topics of `settings` are deleted)."""
    made: list[Processes] = []

    def of(settings: Settings) -> Processes:
        made.append(Processes(settings, tmp_path))
        return made[-1]

    yield of
    for procs in made:
        procs.stop_all()


def fires(settings: Settings) -> dict[str, list[tuple[datetime, int]]]:
    """(scheduled_at, record timestamp ms) of every first attempt, by job."""
    found: dict[str, list[tuple[datetime, int]]] = defaultdict(list)
    for msg in read_all(settings, settings.topics.job_due):
        due = JobDue.model_validate_json(value(msg))
        if due.attempt_number == 1:
            found[due.job_id].append((due.scheduled_at, msg.timestamp()[1]))
    return found


def per_job(settings: Settings) -> list[list[tuple[datetime, int]]]:
    """Each job's fires, read once for all of them."""
    found = fires(settings)
    return [found[job_id] for job_id in JOBS]


def assert_each_fire_once(found: dict[str, list[tuple[datetime, int]]]) -> None:
    """Every job: no instant fired twice, no second of its run missed."""
    for job_id in JOBS:
        times = [t for t, _ in found[job_id]]
        doubled = [t for t, n in Counter(times).items() if n > 1]
        assert not doubled, f"{job_id} fired twice at {doubled}"
        gaps = [(a, b) for a, b in itertools.pairwise(sorted(times)) if b - a != timedelta(seconds=1)]
        assert not gaps, f"{job_id} missed fires between {gaps}"


def ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def start(processes: Processes, name: str) -> ServiceProcess:
    return processes.start("scheduler", "--instance-id", name, "--standbys", "1", name=name)


def every_shard_led(procs: list[ServiceProcess]) -> bool:
    live = [p for p in procs if p.alive()]
    led = [s for p in live for s in shards_led(p)]
    return sorted(led) == list(range(SHARDS))


def schedulers(settings: Settings) -> list[dict[str, object]]:
    done = cli(settings, "schedulers", "-o", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def processes(processes_of: Callable[[Settings], Processes], sharded: Settings) -> Processes:
    return processes_of(sharded)


@pytest.fixture
def running(processes: Processes, sharded: Settings) -> list[ServiceProcess]:
    """Three schedulers leading every shard, with 24 one-second jobs firing."""
    procs = [start(processes, f"s{i}") for i in range(3)]
    for job_id in JOBS:
        produce_json(sharded, sharded.topics.job_definitions, job_id,
                     {"job_id": job_id, "type": "INTERVAL", "interval_seconds": 1, "handler": "noop"})
    eventually(lambda: every_shard_led(procs), 90, message="every shard led")
    eventually(lambda: all(len(f) >= 3 for f in per_job(sharded)), 60, message="every job fires")
    # Then two seconds of steady state: the last process to join has only just taken its
    # standbys, and a fault in that moment is a fault of the start, not of a running
    # system (the tests below time what happens to a running one).
    settle = datetime.now(UTC) + timedelta(seconds=2)
    eventually(lambda: all(f and max(t for t, _ in f) > settle for f in per_job(sharded)), 30,
               message="every job fires in the steady state")
    return procs


def busiest(procs: list[ServiceProcess]) -> ServiceProcess:
    return max((p for p in procs if p.alive()), key=lambda p: len(shards_led(p)))


def test_every_shard_has_one_leader_and_a_standby_on_another_process(
        running: list[ServiceProcess], sharded: Settings) -> None:
    listed = schedulers(sharded)
    assert sorted(str(r["scheduler_id"]) for r in listed) == ["s0", "s1", "s2"]
    leads = [s for r in listed for s in r["leads"]]  # type: ignore[attr-defined]
    assert sorted(leads) == list(range(SHARDS))
    for row in listed:
        assert not set(row["leads"]) & set(row["standby"])  # type: ignore[call-overload]
    standbys = Counter(s for r in listed for s in r["standby"])  # type: ignore[attr-defined]
    assert standbys == dict.fromkeys(range(SHARDS), 1)
    # What the processes do is what the command says.
    by_id = {str(r["scheduler_id"]): set(r["leads"]) for r in listed}  # type: ignore[call-overload]
    assert {p.name: shards_led(p) for p in running} == by_id


def test_a_killed_process_loses_its_shards_and_they_fire_again_within_the_session_and_2s(
        running: list[ServiceProcess], sharded: Settings) -> None:
    victim = busiest(running)
    lost = shards_led(victim)
    killed = time.time_ns() // 1_000_000
    victim.kill()
    eventually(lambda: every_shard_led(running), 60, message="its shards taken over")
    settle = datetime.now(UTC) + timedelta(seconds=2)
    eventually(lambda: all(f and max(t for t, _ in f) > settle for f in per_job(sharded)), 30,
               message="every job fires after the takeover")
    found = fires(sharded)
    assert_each_fire_once(found)
    bound = sharded.scheduler_session_timeout_ms + 2000
    for job_id in JOBS:
        if shard_of(job_id, SHARDS) in lost:
            first = min(ts for t, ts in found[job_id] if ms(t) > killed)
            assert first - killed <= bound, f"{job_id}: fired again {first - killed} ms after the kill"
    # The takeovers were warm: each read only the tail of its shard.
    for proc in running:
        if proc.alive():
            for line in proc.log().splitlines():
                if "action=leader_ready" in line and int(line.split(" shard=")[1].split()[0]) in lost:
                    assert float(line.split("takeover_seconds=")[1].split()[0]) < 2.0, line


def test_a_sigterm_hands_its_shards_over_with_no_fire_later_than_a_second(
        running: list[ServiceProcess], sharded: Settings) -> None:
    leaving = busiest(running)
    moved = shards_led(leaving)
    stopped = datetime.now(UTC)
    assert leaving.stop() == 0
    eventually(lambda: every_shard_led(running), 30, message="its shards taken over")
    settle = datetime.now(UTC) + timedelta(seconds=2)
    eventually(lambda: all(f and max(t for t, _ in f) > settle for f in per_job(sharded)), 30,
               message="every job fires after the handover")
    found = fires(sharded)
    assert_each_fire_once(found)
    window = [(j, t, ts) for j in JOBS for t, ts in found[j]
              if stopped - timedelta(seconds=2) <= t <= settle]
    assert any(shard_of(j, SHARDS) in moved for j, _, _ in window)
    late = [(j, t.isoformat(), ts - ms(t)) for j, t, ts in window if ts - ms(t) > 1000]
    assert not late, f"fires later than 1 s across the handover: {late[:5]}"


def test_a_frozen_process_is_fenced_when_it_wakes_and_nothing_fires_twice(
        running: list[ServiceProcess], sharded: Settings) -> None:
    zombie = busiest(running)
    zombie.signal(signal.SIGSTOP)
    others = [p for p in running if p is not zombie]
    frozen = shards_led(zombie)
    eventually(lambda: sorted(s for p in others for s in shards_led(p)) == list(range(SHARDS)), 60,
               message="the frozen process's shards taken over")
    zombie.signal(signal.SIGCONT)
    eventually(lambda: "action=leader_stepped_down" in zombie.log(), 60,
               message="the thawed process steps down from what it led")
    settle = datetime.now(UTC) + timedelta(seconds=3)
    eventually(lambda: all(f and max(t for t, _ in f) > settle for f in per_job(sharded)), 60,
               message="every job fires after the thaw")
    assert frozen
    assert_each_fire_once(fires(sharded))


def test_a_process_joining_takes_shards_warm_and_every_fire_stays_on_time(
        processes: Processes, running: list[ServiceProcess], sharded: Settings) -> None:
    joined = datetime.now(UTC)
    newcomer = start(processes, "s3")
    eventually(lambda: shards_led(newcomer), 60, message="the new process leads a shard")
    eventually(lambda: every_shard_led([*running, newcomer]), 60, message="every shard led")
    settle = datetime.now(UTC) + timedelta(seconds=2)
    eventually(lambda: all(f and max(t for t, _ in f) > settle for f in per_job(sharded)), 30,
               message="every job fires after the join")
    found = fires(sharded)
    assert_each_fire_once(found)
    late = [(j, t.isoformat(), ts - ms(t)) for j in JOBS for t, ts in found[j]
            if joined <= t <= settle and ts - ms(t) > 1000]
    assert not late, f"fires later than 1 s across the join: {late[:5]}"
    assert "action=scheduler_warmed_up" in newcomer.log()


def test_a_deployment_made_with_one_partition_runs_as_one_shard(
        processes_of: Callable[[Settings], Processes], settings: Settings) -> None:
    one = settings.model_copy(update={"scheduler_shards": 1})
    processes = processes_of(one)
    done = cli(one, "init", "--scheduler-shards", "1")
    assert done.returncode == 0, done.stderr
    again = cli(one, "init", "--scheduler-shards", "8")
    assert again.returncode == 0 and "scheduler shards: 1" in again.stdout, again.stdout
    t = one.topics
    assert partition_counts(one, [t.job_definitions, t.scheduler_state, t.retries]) == {
        t.job_definitions: 1, t.scheduler_state: 1, t.retries: 1}, "init never changes the shards"
    procs = [processes.start("scheduler", "--instance-id", f"s{i}", name=f"s{i}") for i in range(2)]
    produce_json(one, t.job_definitions, "tick-00",
                 {"job_id": "tick-00", "type": "INTERVAL", "interval_seconds": 1, "handler": "noop"})
    leader = eventually(lambda: next((p for p in procs if shards_led(p) == {0}), None), 60,
                        message="one process leads the one shard")
    eventually(lambda: len(fires(one)["tick-00"]) >= 3, 30, message="it fires")
    leader.kill()
    other = next(p for p in procs if p is not leader)
    eventually(lambda: shards_led(other) == {0}, 30, message="the standby takes over")
    settle = datetime.now(UTC) + timedelta(seconds=1)
    eventually(lambda: max(t for t, _ in fires(one)["tick-00"]) > settle, 30, message="fires again")
    times = [t for t, _ in fires(one)["tick-00"]]
    assert len(times) == len(set(times)), "nothing fired twice"
