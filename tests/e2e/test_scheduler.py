"""The scheduler against a real broker: failover, fencing, misfires, schedule changes,
retry timers and the CLI that shares its code. Only schedulers run here; the test reads
`job-due` directly."""

from __future__ import annotations

import itertools
import signal
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cronstream.shared.records import JobDue, JobSnapshot, RetryRequest
from cronstream.shared.settings import Settings
from cronstream.shared.shards import shard_of
from tests.conftest import Processes
from tests.support import ServiceProcess, cli, eventually, produce, produce_json, read_all, shards_led, value


def dues(settings: Settings, job_id: str | None = None) -> list[tuple[JobDue, int]]:
    """(JobDue, Kafka timestamp ms) of every committed record on job-due."""
    found = []
    for msg in read_all(settings, settings.topics.job_due):
        due = JobDue.model_validate_json(value(msg))
        if job_id is None or due.job_id == job_id:
            found.append((due, msg.timestamp()[1]))
    return found


def first_attempts(settings: Settings, job_id: str) -> list[datetime]:
    return [d.scheduled_at for d, _ in dues(settings, job_id) if d.attempt_number == 1]


def interval_job(job_id: str, seconds: int = 1, **fields: Any) -> dict[str, Any]:
    return {"job_id": job_id, "type": "INTERVAL", "interval_seconds": seconds, "handler": "noop",
            **fields}


def assert_no_duplicates_and_no_gaps(times: list[datetime], step: timedelta) -> None:
    duplicates = [t for t, n in Counter(times).items() if n > 1]
    assert not duplicates, f"duplicate fires: {duplicates}"
    ordered = sorted(times)
    gaps = [(a, b) for a, b in itertools.pairwise(ordered) if b - a != step]
    assert not gaps, f"missing fires between {gaps}"


def leader_of(schedulers: list[ServiceProcess], settings: Settings, key: str,
              exclude: set[int] | None = None) -> ServiceProcess:
    """The scheduler leading the shard of `key` (a job id, or a retry's execution id) and
    not stepped down from it — never one of `exclude`."""
    shard = shard_of(key, settings.scheduler_shards)

    def find() -> ServiceProcess | None:
        for s in schedulers:
            if s.pid not in (exclude or set()) and s.alive() and shard in shards_led(s):
                return s
        return None
    return eventually(find, 60, message=f"a scheduler leads shard {shard}")


def test_sigkill_of_the_leader_loses_and_duplicates_nothing(processes: Processes, topics: Settings) -> None:
    schedulers = [processes.start("scheduler", "--instance-id", f"s{i}", name=f"scheduler-{i}")
                  for i in range(3)]
    leader = leader_of(schedulers, topics, "tick")
    produce_json(topics, topics.topics.job_definitions, "tick", interval_job("tick"))
    eventually(lambda: len(first_attempts(topics, "tick")) >= 4, 30, message="ticks before the kill")
    killed_at_ms = time.time_ns() // 1_000_000
    leader.kill()
    successor = leader_of(schedulers, topics, "tick", exclude={leader.pid})
    eventually(lambda: any(t > datetime.now(UTC) - timedelta(seconds=1)
                           for t in first_attempts(topics, "tick")), 30,
               message="fires after the failover")
    records = dues(topics, "tick")
    assert_no_duplicates_and_no_gaps([d.scheduled_at for d, _ in records], timedelta(seconds=1))
    first_after_kill = min(ts for _, ts in records if ts > killed_at_ms)
    assert first_after_kill - killed_at_ms <= 10_000, "next fire within 10 s of the kill"
    assert successor.alive()


def test_a_paused_leader_is_fenced_when_it_resumes(processes: Processes, topics: Settings) -> None:
    schedulers = [processes.start("scheduler", "--instance-id", f"s{i}", name=f"scheduler-{i}")
                  for i in range(2)]
    zombie = leader_of(schedulers, topics, "tick")
    produce_json(topics, topics.topics.job_definitions, "tick", interval_job("tick"))
    eventually(lambda: len(first_attempts(topics, "tick")) >= 3, 30, message="ticks before the pause")
    zombie.signal(signal.SIGSTOP)
    leader_of(schedulers, topics, "tick", exclude={zombie.pid})  # its session expired
    eventually(lambda: any(t > datetime.now(UTC) - timedelta(seconds=1)
                           for t in first_attempts(topics, "tick")), 30,
               message="the new leader fires")
    zombie.signal(signal.SIGCONT)
    eventually(lambda: "action=leader_stepped_down" in zombie.log(), 30,
               message="the resumed zombie steps down")
    eventually(lambda: any(t > datetime.now(UTC) - timedelta(seconds=1)
                           for t in first_attempts(topics, "tick")), 30,
               message="fires continue after the zombie returned")
    assert_no_duplicates_and_no_gaps(first_attempts(topics, "tick"), timedelta(seconds=1))


def test_misfire_policies_after_an_outage_longer_than_the_grace(
    processes: Processes, topics: Settings,
) -> None:
    scheduler = processes.start("scheduler", name="scheduler-1")
    scheduler.wait_for_log("action=scheduler_ready")
    for policy in ("FIRE_ONCE", "FIRE_ALL", "SKIP"):
        produce_json(topics, topics.topics.job_definitions, policy,
                     interval_job(policy, misfire_policy=policy, misfire_grace_seconds=1))
    eventually(lambda: all(len(first_attempts(topics, p)) >= 2 for p in ("FIRE_ONCE", "FIRE_ALL", "SKIP")),
               30, message="fires before the outage")
    assert scheduler.stop() == 0
    last = {p: max(first_attempts(topics, p)) for p in ("FIRE_ONCE", "FIRE_ALL", "SKIP")}
    time.sleep(5)  # the outage itself (longer than the 1 s grace), not a synchronisation
    restarted_at = datetime.now(UTC)
    processes.start("scheduler", name="scheduler-2").wait_for_log("action=scheduler_ready")
    eventually(lambda: all(max(first_attempts(topics, p)) > restarted_at + timedelta(seconds=1)
                           for p in last), 30, message="fires after the restart")

    fire_all = first_attempts(topics, "FIRE_ALL")
    assert_no_duplicates_and_no_gaps(fire_all, timedelta(seconds=1))
    once = sorted(t for t in first_attempts(topics, "FIRE_ONCE") if t > last["FIRE_ONCE"])
    assert once[0] == last["FIRE_ONCE"] + timedelta(seconds=1), "the first missed instant fires"
    assert once[1] > restarted_at, "once: the rest of the outage is not fired"
    skip = sorted(t for t in first_attempts(topics, "SKIP") if t > last["SKIP"])
    assert skip[0] > restarted_at, "skip: nothing of the outage is fired"


def test_pause_resume_delete_bounds_and_updates(processes: Processes, topics: Settings) -> None:
    processes.start("scheduler", name="scheduler").wait_for_log("action=scheduler_ready")
    defs = topics.topics.job_definitions
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=4)
    produce_json(topics, defs, "bounded", interval_job(
        "bounded", start_at=start.isoformat(), end_at=(start + timedelta(seconds=3)).isoformat()))
    produce_json(topics, defs, "paused", interval_job("paused"))
    produce_json(topics, defs, "deleted", interval_job("deleted"))
    produce_json(topics, defs, "updated", interval_job("updated", seconds=3))
    eventually(lambda: len(first_attempts(topics, "paused")) >= 2, 30, message="first fires")

    produce_json(topics, defs, "paused", interval_job("paused", enabled=False))
    produce(topics, defs, b"deleted", None)
    produce_json(topics, defs, "updated", interval_job("updated", seconds=1))
    changed_at = datetime.now(UTC)
    eventually(lambda: len([t for t in first_attempts(topics, "updated") if t > changed_at]) >= 3,
               30, message="fires of the updated definition")
    paused_fires = first_attempts(topics, "paused")
    assert all(t <= changed_at + timedelta(seconds=1) for t in paused_fires), "paused: no fires"
    assert all(t <= changed_at + timedelta(seconds=1) for t in first_attempts(topics, "deleted"))
    after = sorted(t for t in first_attempts(topics, "updated") if t > changed_at)
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(after))

    resumed_at = datetime.now(UTC)
    produce_json(topics, defs, "paused", interval_job("paused"))
    eventually(lambda: max(first_attempts(topics, "paused")) > resumed_at, 30, message="resumed")
    resumed = [t for t in first_attempts(topics, "paused") if t > changed_at + timedelta(seconds=1)]
    assert min(resumed) >= resumed_at - timedelta(seconds=1), "a pause is not caught up"

    eventually(lambda: len(first_attempts(topics, "bounded")) == 4, 30, message="bounded fires")
    assert first_attempts(topics, "bounded") == [start + timedelta(seconds=s) for s in range(4)]


def retry_request(job_id: str, due_at: datetime) -> RetryRequest:
    return RetryRequest(execution_id=uuid.uuid4(), job_id=job_id, run_id=uuid.uuid4(),
                        scheduled_at=due_at, attempt_number=2, reason="RETRY",
                        idempotency_key=f"{job_id}-key", job=JobSnapshot(handler="noop"),
                        due_at=due_at)


def publish_retry(settings: Settings, request: RetryRequest | None, key: uuid.UUID) -> None:
    produce(settings, settings.topics.retries, str(key).encode(),
            None if request is None else request.to_json())


def test_retry_timers_fire_once_at_their_time_and_survive_a_leader_kill(
    processes: Processes, topics: Settings,
) -> None:
    schedulers = [processes.start("scheduler", "--instance-id", f"s{i}", name=f"scheduler-{i}")
                  for i in range(2)]
    soon = retry_request("soon", datetime.now(UTC) + timedelta(seconds=2))
    cancelled = retry_request("cancelled", datetime.now(UTC) + timedelta(seconds=3))
    later = retry_request("later", datetime.now(UTC) + timedelta(seconds=12))
    for request in (soon, cancelled, later):
        publish_retry(topics, request, request.execution_id)
    publish_retry(topics, None, cancelled.execution_id)  # a tombstone cancels a retry

    eventually(lambda: dues(topics, "soon"), 30, message="the retry fires")
    (due, committed_ms), = dues(topics, "soon")
    assert (due.execution_id, due.reason, due.attempt_number) == (soon.execution_id, "RETRY", 2)
    assert committed_ms >= int(soon.due_at.timestamp() * 1000), "never early"

    leader = leader_of(schedulers, topics, str(later.execution_id))
    leader.kill()  # the pending `later` retry must survive the failover
    leader_of(schedulers, topics, str(later.execution_id), exclude={leader.pid})
    eventually(lambda: dues(topics, "later"), 40, message="the pending retry fires after failover")
    assert len(dues(topics, "later")) == 1
    assert dues(topics, "cancelled") == []
    # Fired retries are tombstoned, so a third leader would not fire them again.
    tombstoned = {m.key() for m in read_all(topics, topics.topics.retries) if m.value() is None}
    assert {str(soon.execution_id).encode(), str(later.execution_id).encode()} <= tombstoned



def test_preview_shows_the_dst_rule(tmp_path: Path, topics: Settings) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text("job_id: ny\ntype: CRON\nschedule: '0 2 * * *'\ntimezone: America/New_York\n"
                    "handler: noop\n---\njob_id: berlin\ntype: CRON\nschedule: '30 2 * * *'\n"
                    "timezone: Europe/Berlin\nhandler: noop\n")
    done = cli(topics, "preview", "-f", str(path), "--from", "2026-03-07T12:00:00Z", "--count", "2")
    assert done.returncode == 0, done.stderr
    assert "2026-03-08T07:00:00.000Z  2026-03-08T03:00:00-04:00 EDT" in done.stdout
    assert "2026-03-09T06:00:00.000Z  2026-03-09T02:00:00-04:00 EDT" in done.stdout
    done = cli(topics, "preview", "-f", str(path), "--from", "2026-03-28T12:00:00Z", "--count", "2")
    assert "2026-03-29T01:00:00.000Z  2026-03-29T03:00:00+02:00 CEST" in done.stdout


def test_trigger_and_backfill(processes: Processes, topics: Settings, tmp_path: Path) -> None:
    produce_json(topics, topics.topics.job_definitions, "daily",
                 {"job_id": "daily", "type": "CRON", "schedule": "0 3 * * *", "handler": "noop"})
    done = cli(topics, "trigger", "daily")
    assert done.returncode == 0, done.stderr
    args = ["backfill", "daily", "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-03T23:00:00Z"]
    preview = cli(topics, *args, "--dry-run")
    assert preview.returncode == 0, preview.stderr
    assert "3 to backfill (dry run)" in preview.stdout
    assert next(d for d, _ in dues(topics, "daily")).reason == "MANUAL"
    assert len(dues(topics, "daily")) == 1, "a dry run sends nothing"
    assert cli(topics, *args).returncode == 0
    backfilled = [d for d, _ in dues(topics, "daily") if d.reason == "BACKFILL"]
    assert [d.scheduled_at.day for d in backfilled] == [1, 2, 3]
    assert all(d.scheduled_at.hour == 3 for d in backfilled)
    too_many = cli(topics, "backfill", "daily", "--from", "2020-01-01T00:00:00Z",
                   "--to", "2026-01-01T00:00:00Z", "--max", "100")
    assert too_many.returncode != 0 and "more than 100 fires" in too_many.stderr

