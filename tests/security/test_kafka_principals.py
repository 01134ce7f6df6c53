"""Each part of cronstream holds only its own Kafka keys (issue 49, items 1 and 3).

On a broker of its own with SASL/SCRAM and KRaft's StandardAuthorizer, where nothing is
allowed but the ACLs `cronstream kafka-acls --apply` creates: `cronstream init` creates
the topics as the `init` principal (and the PostgreSQL roles), two schedulers (sharing
the shards of the clock: the group on `scheduler-members`, a transactional id per
shard), the dispatcher, worker, monitor (as the database's writer), analytics and the
dashboard (as its reader) run each under its own principal, a job published by the CLI's
principal runs to COMPLETED, the dashboard's trigger runs it again, `cronstream
schedulers` (as the CLI) and the dashboard's Schedulers page list both schedulers, and a
worker's `shell` handler runs only the commands of its `--allow-shell`, never an argv a
record wrote. No process is refused anything on the way.
Then every principal tries to write every topic: exactly its footprint's writes succeed
(a worker cannot publish a job definition, the dashboard cannot write an execution
event, nobody writes `scheduler-members`, ...), and a principal cannot take another's
transactional id (a shard's) or consumer group (the schedulers').
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from cronstream.shared.acls import FOOTPRINTS, PRINCIPALS
from cronstream.shared.settings import Settings
from tests.conftest import Processes
from tests.security.sasl_broker import SaslBroker
from tests.support import ServiceProcess, as_role, env_for, eventually, sql

# The broker is detached on purpose (cronstream.infra.process.spawn drops its Popen while
# it runs); the fixture stops it.
pytestmark = pytest.mark.filterwarnings(r"ignore:subprocess \d+ is still running:ResourceWarning")

UI_TOKEN = "principals-ui-token-0123456789"
TOPICS = ("job-definitions", "job-due", "execution-events", "execution-logs", "heartbeats", "retries",
          "dead-letters", "scheduler-state", "scheduler-members", "dispatcher-state", "commands", "alerts", "calendars",
          "trigger-state", "pools", "admissions", "work.normal.default")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslBroker]:
    started = SaslBroker(tmp_path_factory.mktemp("sasl-kafka"))
    started.start()
    try:
        yield started
    finally:
        started.stop()


def cronstream(settings: Settings, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cronstream", *args], env={**env_for(settings), **env},
                          capture_output=True, text=True, timeout=120, check=False)


def write_outcomes(broker: SaslBroker, part: str, settings: Settings) -> dict[str, str]:
    """Topic -> 'ok' or the broker's error, for one record written as `part`."""
    producer = Producer({**broker.client_config(part), "acks": "all", "message.timeout.ms": 10_000})
    outcomes: dict[str, str] = {}

    def delivered(err: KafkaError | None, msg: Any) -> None:
        outcomes[msg.topic()[len(settings.topic_prefix):]] = "ok" if err is None else err.name()

    for topic in TOPICS:
        producer.produce(settings.topic_prefix + topic, b"probe: not a record", b"probe",
                         on_delivery=delivered)
    assert producer.flush(30) == 0
    return outcomes


def start_each_as_itself(procs: Processes, broker: SaslBroker, settings: Settings) -> dict[str, ServiceProcess]:
    """Every service and the dashboard, each with its principal's credentials; the monitor
    as the database's writer, the dashboard as its reader."""
    writer = as_role(settings.database_url, "cronstream_writer")
    reader = as_role(settings.database_url, "cronstream_reader")
    started = {
        "monitor": procs.start("monitor", extra_env={**broker.env("monitor"),
                                                     "CRONSTREAM_DATABASE_URL": writer}),
        "dispatcher": procs.start("dispatcher", extra_env=broker.env("dispatcher")),
        "scheduler": procs.start("scheduler", "--instance-id", "s1", extra_env=broker.env("scheduler")),
        "worker": procs.start("worker", "--worker-id", "w1", "--allow-shell", "say=echo {msg:word}",
                              extra_env=broker.env("worker")),
        "analytics": procs.start("analytics", extra_env=broker.env("analytics")),
        "ui": procs.start("ui", extra_env={**broker.env("ui"), "CRONSTREAM_DATABASE_URL": reader,
                                           "CRONSTREAM_UI_TOKEN": UI_TOKEN}),
    }
    started["scheduler"].wait_for_log("action=scheduler_ready")
    # A second scheduler joins the first: they share the shards (with two, one may lead
    # both while the other keeps both warm), every shard led.
    started["scheduler-2"] = procs.start("scheduler", "--instance-id", "s2", name="scheduler-2",
                                         extra_env=broker.env("scheduler"))
    schedulers = [started["scheduler"], started["scheduler-2"]]
    eventually(lambda: sum(shards_led(p) for p in schedulers) == settings.scheduler_shards
               and all(ready(p) for p in schedulers), 90, 0.5, message="every shard led, both ready")
    started["dispatcher"].wait_for_log("action=dispatcher_started")
    started["worker"].wait_for_log("action=partitions_assigned")
    started["monitor"].wait_for_log("action=partitions_assigned")
    return started


def shards_led(scheduler: ServiceProcess) -> int:
    try:
        status, body = scheduler.get("/metrics")
    except OSError:  # not serving yet
        return 0
    found = re.search(r"^cronstream_scheduler_shards_led (\S+)$", body, re.MULTILINE)
    return int(float(found[1])) if status == 200 and found else 0


def ready(service: ServiceProcess) -> bool:
    try:
        return service.get("/readyz")[0] == 200
    except OSError:
        return False


def refused(call: Any, *args: Any) -> str:
    try:
        call(*args)
    except KafkaException as exc:
        return str(exc.args[0].name())
    return "ok"


def test_every_part_runs_under_its_own_principal_and_nothing_more(
    broker: SaslBroker, settings: Settings, tmp_path: Path,
) -> None:
    sasl = settings.model_copy(update={"kafka_bootstrap_servers": broker.bootstrap_servers})
    applied = cronstream(sasl, broker.env("admin"), "kafka-acls", "--apply")
    assert applied.returncode == 0, applied.stderr
    made = cronstream(sasl, broker.env("init"), "init", "--roles")
    assert made.returncode == 0, made.stdout + made.stderr
    assert "topics:" in made.stdout and "created" in made.stdout

    procs = Processes(sasl, tmp_path)
    try:
        started = start_each_as_itself(procs, broker, sasl)

        now = datetime.now(UTC).isoformat()
        jobs = [{"job_id": "hello", "type": "ONE_TIME", "run_at": now, "handler": "noop",
                 "params": {"from": "the cli principal"}},
                {"job_id": "echo-allowed", "type": "ONE_TIME", "run_at": now, "handler": "shell",
                 "params": {"command": "say", "args": {"msg": "allowed"}}},
                {"job_id": "shell-refused", "type": "ONE_TIME", "run_at": now, "handler": "shell",
                 "params": {"command": ["sh", "-c", "echo pwned"]}}]
        (tmp_path / "jobs.json").write_text(json.dumps(jobs))
        published = cronstream(sasl, broker.env("cli"), "apply", "-f", str(tmp_path / "jobs.json"))
        assert published.returncode == 0, published.stderr

        def finished(job_id: str, count: int = 1) -> list[Any]:
            rows = sql(sasl.database_url, "SELECT status, result, error_message FROM job_executions "
                                          "WHERE job_id = $1 AND completed_at IS NOT NULL", job_id)
            return rows if len(rows) >= count else []

        (hello,) = eventually(lambda: finished("hello"), 90, message="hello finished")
        assert hello["status"] == "COMPLETED" and json.loads(hello["result"]) == {"from": "the cli principal"}
        (echo,) = eventually(lambda: finished("echo-allowed"), 30, message="echo finished")
        assert echo["status"] == "COMPLETED" and json.loads(echo["result"])["stdout"] == "allowed\n"
        (shell,) = eventually(lambda: finished("shell-refused"), 30, message="sh finished")
        assert shell["status"] != "COMPLETED"
        assert "an argv list is not accepted" in shell["error_message"]

        # The dashboard, as its own principal and the database's reader, runs it again.
        base = f"http://127.0.0.1:{started['ui'].http_port()}"
        triggered = httpx.post(f"{base}/jobs/hello/trigger", headers={"Authorization": f"Bearer {UI_TOKEN}"},
                               timeout=30)
        assert triggered.status_code == 200, triggered.text
        eventually(lambda: finished("hello", 2), 90, message="the dashboard's trigger ran")

        # Who leads which shard, as the CLI's principal and as the dashboard's: both only
        # describe the scheduler group.
        listed = cronstream(sasl, broker.env("cli"), "schedulers", "-o", "json")
        assert listed.returncode == 0, listed.stderr
        rows = json.loads(listed.stdout)
        assert sorted(r["scheduler_id"] for r in rows) == ["s1", "s2"], rows
        assert sorted(n for r in rows for n in r["leads"]) == sorted(n for r in rows for n in r["standby"]) \
            == list(range(sasl.scheduler_shards)), rows
        page = httpx.get(f"{base}/schedulers", headers={"Authorization": f"Bearer {UI_TOKEN}"}, timeout=30)
        assert page.status_code == 200, page.text
        assert 'data-scheduler-id="s1"' in page.text and 'data-scheduler-id="s2"' in page.text
        assert 'class="unled"' not in page.text
        eventually(lambda: started["analytics"].get("/readyz")[0] == 200, 60, message="analytics ready")

        for name, proc in started.items():
            assert "AUTHORIZATION_FAILED" not in proc.log(), f"{name} was refused something it needs"
    finally:
        procs.stop_all()
    failed = {p.name: (p.proc.returncode, p.log()[-3000:]) for p in procs.started
              if p.proc.returncode != 0}
    assert not failed, failed  # each with the end of its log

    only_their_own_writes(broker, sasl)

    # A part given another's credentials stops with the reason instead of waiting forever,
    # and the CLI says what is wrong.
    (tmp_path / "one.json").write_text(json.dumps(jobs[:1]))
    as_worker = cronstream(sasl, broker.env("worker"), "apply", "-f", str(tmp_path / "one.json"))
    assert as_worker.returncode == 1 and "not authorized" in as_worker.stderr, as_worker.stderr
    misplaced = cronstream(sasl, broker.env("ui"), "scheduler", "--instance-id", "s9", "--http-port", "0")
    assert misplaced.returncode != 0 and "action=kafka_not_authorized" in misplaced.stdout + misplaced.stderr, \
        (misplaced.returncode, (misplaced.stdout + misplaced.stderr)[-4000:])


def only_their_own_writes(broker: SaslBroker, sasl: Settings) -> None:
    """Every principal, every topic: only its own writes go through; nor can one take
    another's transactional id or consumer group."""
    for part in PRINCIPALS:
        allowed = set(FOOTPRINTS[part].writes) | ({"work.normal.default"} if "WRITE" in FOOTPRINTS[part].work
                                                   else set())
        outcomes = write_outcomes(broker, part, sasl)
        assert {t for t, o in outcomes.items() if o == "ok"} == allowed, (part, outcomes)
        assert set(outcomes.values()) <= {"ok", "TOPIC_AUTHORIZATION_FAILED"}, (part, outcomes)

    for transactional_id in ("worker-w1", "scheduler-shard-0"):
        ui_as_another = Producer({**broker.client_config("ui"),
                                  "transactional.id": f"{sasl.topic_prefix}{transactional_id}"})
        assert refused(ui_as_another.init_transactions, 10) == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", \
            transactional_id
    # Describing the scheduler group (the Schedulers page) is not joining it.
    for group, topic in (("workers", "work.normal.default"), ("scheduler", "scheduler-members")):
        thief = Consumer({**broker.client_config("ui"), "group.id": f"{sasl.topic_prefix}{group}"})
        try:
            thief.subscribe([f"{sasl.topic_prefix}{topic}"])
            message = thief.poll(10)
            assert message is not None, group
            error = message.error()
            assert error is not None and error.code() in (KafkaError.GROUP_AUTHORIZATION_FAILED,
                                                          KafkaError.TOPIC_AUTHORIZATION_FAILED), (group, error)
        finally:
            thief.close()
