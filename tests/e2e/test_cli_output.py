"""The CLI as scripts use it: machine-readable output, pipes, exit codes, apply from
directories and stdin, dry-run diffs, get → apply round trips (issue 14)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import yaml

from cronstream.shared.settings import Settings
from tests.conftest import Processes
from tests.support import cli, env_for, eventually, produce_json, read_all, value

ROOT = Path(__file__).resolve().parents[2]


def shell(settings: Settings, script: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a bash pipeline (pipefail) with `cronstream` meaning this checkout's CLI."""
    return subprocess.run(["bash", "-c", f"set -o pipefail; cronstream() {{ {sys.executable} -m "
                                         f"cronstream \"$@\"; }}; {script}"],
                          env=env_for(settings), input=stdin, capture_output=True, text=True,
                          timeout=60, check=False)


def definitions_on_topic(settings: Settings) -> list[tuple[str, dict[str, object] | None]]:
    """Every definition record, by job (the topic has a partition per shard: the order holds
    within a job, not across jobs)."""
    records = [((m.key() or b"").decode(), json.loads(value(m)) if m.value() else None)
               for m in read_all(settings, settings.topics.job_definitions)]
    return sorted(records, key=lambda record: record[0])


def test_unreachable_database_exits_3_with_one_line(topics: Settings) -> None:
    done = cli(topics, "--database-url", "postgresql://postgres@127.0.0.1:1/nowhere", "jobs")
    assert done.returncode == 3, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach PostgreSQL at postgresql://postgres@127.0.0.1:1" in lines[0]
    assert done.stdout == ""


def test_unreachable_kafka_exits_3_with_one_line(topics: Settings) -> None:
    done = cli(topics, "--bootstrap-servers", "127.0.0.1:1", "--timeout", "1", "pause", "x")
    assert done.returncode == 3, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: cannot reach Kafka at 127.0.0.1:1: "), lines


def test_a_closed_pipe_is_not_an_error(topics: Settings) -> None:
    done = shell(topics, f"cronstream preview -f {ROOT / 'examples' / 'jobs.yaml'} --count 5000 | head -1")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.count("\n") == 1


def test_usage_errors_exit_2(topics: Settings) -> None:
    assert cli(topics, "jobs", "-o", "xml").returncode == 2
    assert cli(topics, "no-such-command").returncode == 2


def test_apply_directories_stdin_and_dry_run_diffs(topics: Settings, tmp_path: Path) -> None:
    tree = tmp_path / "jobs"
    (tree / "team-a" / "etl").mkdir(parents=True)
    (tree / "team-a" / "hourly.yaml").write_text(
        "job_id: hourly\ntype: CRON\nschedule: '0 * * * *'\nhandler: noop\n")
    (tree / "team-a" / "etl" / "pair.yml").write_text(
        "job_id: extract\ntype: INTERVAL\ninterval_seconds: 60\nhandler: noop\n---\n"
        "job_id: load\ntype: DEPENDENT\ndepends_on: [extract]\nhandler: noop\n")
    (tree / "once.json").write_text(json.dumps(
        {"job_id": "once", "type": "ONE_TIME", "run_at": "2030-01-01T00:00:00Z", "handler": "noop"}))
    (tree / "notes.txt").write_text("not a definition")
    done = cli(topics, "apply", "-f", str(tree))
    assert done.returncode == 0, done.stderr
    assert sorted(k for k, _ in definitions_on_topic(topics)) == ["extract", "hourly", "load", "once"]

    # From stdin, among files.
    done = shell(topics, f"cronstream apply -f - -f {tree / 'once.json'}",
                 stdin="job_id: piped\ntype: INTERVAL\ninterval_seconds: 5\nhandler: noop\n")
    assert done.returncode == 0, done.stderr
    assert "applied piped" in done.stdout

    # A dry run against what is live: one change, one new job, the rest unchanged.
    (tree / "team-a" / "etl" / "pair.yml").write_text(
        "job_id: extract\ntype: INTERVAL\ninterval_seconds: 30\nhandler: noop\n---\n"
        "job_id: load\ntype: DEPENDENT\ndepends_on: [extract]\nhandler: noop\n")
    (tree / "new.yaml").write_text("job_id: brand-new\ntype: INTERVAL\ninterval_seconds: 9\nhandler: noop\n")
    before = definitions_on_topic(topics)
    done = cli(topics, "apply", "--dry-run", "-f", str(tree))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "extract: would change" in out
    assert "-interval_seconds: 60\n+interval_seconds: 30" in out
    assert "brand-new: would be created" in out and "+job_id: brand-new" in out
    for unchanged in ("hourly", "load", "once"):
        assert f"{unchanged}: unchanged" in out
    assert "dry run: 1 to create, 1 to change, 3 unchanged; nothing sent" in out
    assert definitions_on_topic(topics) == before

    # A typo anywhere refuses everything, naming the file, the job and the field.
    (tree / "typo.yaml").write_text("job_id: typo\ntype: INTERVAL\ninterval_seconds: 9\n"
                                    "handler: noop\nmax_retry: 3\n")
    done = cli(topics, "apply", "-f", str(tree))
    assert done.returncode == 1
    assert "typo.yaml: definition #1 (job_id 'typo'): max_retry: Extra inputs are not permitted" \
        in done.stderr
    assert definitions_on_topic(topics) == before


def test_lists_get_and_describe_with_a_monitor(processes: Processes, topics: Settings,
                                               tmp_path: Path) -> None:
    monitor = processes.start("monitor")
    monitor.wait_for_log("action=partitions_assigned")
    long_id = "team-with-a-long-name.nightly-report-for-the-whole-region-" + "x" * 40
    path = tmp_path / "jobs.yaml"
    path.write_text(f"job_id: {long_id}\ntype: CRON\nschedule: '30 2 * * *'\n"
                    "timezone: Europe/Berlin\nhandler: reports.daily\nparams: {format: pdf}\n"
                    "max_retries: 2\n---\n"
                    "job_id: downstream\ntype: DEPENDENT\n"
                    f"depends_on: [{long_id}]\nhandler: noop\n")
    assert cli(topics, "apply", "-f", str(path)).returncode == 0

    def listed() -> list[dict[str, object]]:
        done = shell(topics, "cronstream jobs -o json | python3 -m json.tool")
        assert done.returncode == 0, done.stderr
        rows: list[dict[str, object]] = json.loads(done.stdout)
        return rows if len(rows) == 2 else []
    rows = eventually(listed, message="both jobs projected")
    assert {r["job_id"] for r in rows} == {long_id, "downstream"}
    assert all(isinstance(r["next_execution_at"], str | None) for r in rows)

    # Not a terminal: plain columns, nothing cut, so grep finds long ids.
    table = cli(topics, "jobs")
    assert table.returncode == 0 and long_id in table.stdout
    assert table.stdout.splitlines()[0].split()[:3] == ["JOB", "TYPE", "SCHEDULE"]
    assert "reports.daily" in cli(topics, "jobs", "-o", "wide").stdout
    assert yaml.safe_load(cli(topics, "jobs", "-o", "yaml").stdout)[0]["job_id"] in (long_id, "downstream")
    for command in ("runs", "workers", "alerts"):
        done = cli(topics, command, "-o", "json")
        assert done.returncode == 0 and json.loads(done.stdout) == [], (command, done.stderr)

    # get → apply round trip: the same definition, field for field.
    done = shell(topics, f"cronstream get job {long_id} -o yaml | cronstream apply -f -")
    assert done.returncode == 0, done.stderr
    mine = [v for k, v in definitions_on_topic(topics) if k == long_id]
    assert len(mine) == 2 and mine[0] == mine[1]
    dry = shell(topics, f"cronstream get job {long_id} -o yaml | cronstream apply --dry-run -f -")
    assert f"{long_id}: unchanged" in dry.stdout, dry.stdout + dry.stderr
    assert json.loads(cli(topics, "get", "job", long_id, "-o", "json").stdout)["params"] == {"format": "pdf"}

    described = cli(topics, "describe", "job", long_id)
    assert described.returncode == 0, described.stderr
    for needle in (f"Job:            {long_id}", "cron '30 2 * * *' in Europe/Berlin",
                   "downstream:   downstream", "Next fires:", "Recent runs:\n  none"):
        assert needle in described.stdout, described.stdout

    check_execution_views(topics, long_id)


def check_execution_views(topics: Settings, long_id: str) -> None:
    """get / describe / runs / --watch of one execution, and exit 4 for what is missing."""
    # An execution, as any producer of execution-events would report it.
    execution, run = uuid.uuid4(), uuid.uuid4()
    now = datetime.now(UTC).isoformat()
    for status in ("QUEUED", "RUNNING", "COMPLETED"):
        produce_json(topics, topics.topics.execution_events, long_id, {
            "event_id": str(uuid.uuid4()), "execution_id": str(execution), "job_id": long_id,
            "run_id": str(run), "status": status, "attempt_number": 1, "scheduled_at": now,
            "occurred_at": now, "worker_id": "w1", "result": {"pages": 3} if status == "COMPLETED" else None})
    eventually(lambda: cli(topics, "get", "execution", str(execution)).returncode == 0,
               message="execution projected")
    got = yaml.safe_load(cli(topics, "get", "execution", str(execution)).stdout)
    assert (got["status"], got["result"], got["job_id"]) == ("COMPLETED", {"pages": 3}, long_id)
    described = cli(topics, "describe", "execution", str(execution)).stdout
    assert described.count("attempt 1  w1") == 3 and "Result:         {\"pages\": 3}" in described
    assert json.loads(cli(topics, "runs", "--job", long_id, "-o", "json").stdout)[0]["execution_id"] == \
        str(execution)

    # Not found is exit 4, for reads and for changes.
    for args in (("get", "job", "missing"), ("describe", "job", "missing"),
                 ("get", "execution", str(uuid.uuid4())), ("pause", "missing")):
        done = cli(topics, *args)
        assert done.returncode == 4, (args, done)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: no "), (args, lines)

    # --watch streams JSON lines of what changes, and stops cleanly on SIGTERM.
    with subprocess.Popen([sys.executable, "-m", "cronstream", "runs", "--watch", "-o", "json",
                           "--interval", "0.3"], env=env_for(topics), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as watcher:
        try:
            assert watcher.stdout is not None and watcher.stderr is not None
            first = json.loads(watcher.stdout.readline())
            assert first["execution_id"] == str(execution)
        finally:
            watcher.send_signal(signal.SIGTERM)
            assert watcher.wait(20) == 0
        assert watcher.stderr.read() == ""

def test_tail_prints_json_lines(topics: Settings) -> None:
    now = datetime.now(UTC).isoformat()
    for status in ("QUEUED", "RUNNING"):
        produce_json(topics, topics.topics.execution_events, "j", {
            "event_id": str(uuid.uuid4()), "execution_id": str(uuid.uuid4()), "job_id": "j",
            "run_id": str(uuid.uuid4()), "status": status, "attempt_number": 1,
            "scheduled_at": now, "occurred_at": now})
    done = cli(topics, "tail", "--from-beginning", "--count", "2", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert sorted(json.loads(line)["status"] for line in done.stdout.splitlines()) == ["QUEUED", "RUNNING"]


def test_completion_scripts(topics: Settings) -> None:
    for shell_name, needle in (("bash", "complete -o nosort -F"), ("zsh", "#compdef cronstream"),
                               ("fish", "complete --no-files --command cronstream")):
        done = cli(topics, "completion", shell_name)
        assert done.returncode == 0 and needle in done.stdout, (shell_name, done.stdout[:200])
    env = {**env_for(topics), "_CRONSTREAM_COMPLETE": "bash_complete", "COMP_WORDS": "cronstream des",
           "COMP_CWORD": "1"}
    done = subprocess.run([sys.executable, "-m", "cronstream"], env=env, capture_output=True,
                          text=True, timeout=30, check=False)
    assert "describe" in done.stdout
