"""Run inputs and data flow through the real CLI, services, broker and database: a trigger's
params overlay the job's and the execution records them (and who asked, and the version of
the definition it ran); every apply, pause, delete and re-create is a version with who
changed it; a DAG step's handler sees its upstreams' results (after a retry too, and with
what does not fit marked); a job with `max_concurrent_runs: 2` never runs a third at once."""

from __future__ import annotations

import getpass
import json
import socket
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cronstream.client import Client
from cronstream.shared.settings import Settings
from cronstream.shared.statuses import FINAL
from tests.conftest import Processes
from tests.support import cli, eventually, sql

ME = f"{getpass.getuser()}@{socket.gethostname()}"


def execution(settings: Settings, execution_id: str) -> Any:
    rows = sql(settings.database_url, "SELECT *, job->'params' AS run_params FROM job_executions "
               "WHERE execution_id = $1", uuid.UUID(execution_id))
    return rows[0] if rows else None


def finished(settings: Settings, execution_id: str, timeout: float = 30) -> Any:
    return eventually(lambda: (row := execution(settings, execution_id)) is not None
                      and row["status"] in FINAL and row, timeout,
                      message=f"execution {execution_id} ends")


def executions_of(settings: Settings, job_id: str) -> list[Any]:
    return sql(settings.database_url, "SELECT * FROM job_executions WHERE job_id = $1 "
               "ORDER BY scheduled_at, attempt_number", job_id)


def apply(settings: Settings, path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document))
    done = cli(settings, "apply", "-f", str(path))
    assert done.returncode == 0, done.stderr


def triggered(done: Any) -> str:
    assert done.returncode == 0, done.stderr
    return str(done.stdout.strip().rsplit(" ", 1)[-1])


def test_params_overlay_the_jobs_and_every_change_of_the_job_is_a_version(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    processes.system()
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat()  # fires only when triggered
    first = {"job_id": "export", "type": "ONE_TIME", "run_at": later, "handler": "noop",
             "params": {"region": "all", "limit": 10}}
    apply(topics, tmp_path / "v1.json", first)
    apply(topics, tmp_path / "v2.json", {**first, "params": {"region": "all", "limit": 20},
                                         "created_by": "bob@example.com"})
    eventually(lambda: len(sql(topics.database_url, "SELECT 1 FROM job_definition_versions "
                                                     "WHERE job_id = 'export'")) == 2,
               30, message="two versions projected")

    # A malformed --param is a usage error that names it; nothing is sent.
    bad = cli(topics, "trigger", "export", "--param", "region")
    assert bad.returncode == 2 and "'region'" in bad.stderr and "KEY=VALUE" in bad.stderr, bad.stderr
    too_big = cli(topics, "trigger", "export", "--param", "blob=" + "x" * 70_000)
    assert too_big.returncode == 2 and "the limit is 65536" in too_big.stderr, too_big.stderr

    run = triggered(cli(topics, "trigger", "export", "--param", "region=eu",
                        "--param", 'tags=["a","b"]'))
    row = finished(topics, run)
    want = {"region": "eu", "limit": 20, "tags": ["a", "b"]}
    assert row["status"] == "COMPLETED" and json.loads(row["result"]) == want, "noop returns its params"
    assert json.loads(row["run_params"]) == want, "the execution records the params it ran with"
    assert (row["triggered_by"], row["definition_version"]) == (ME, 2)
    described = cli(topics, "describe", "execution", run)
    assert described.returncode == 0, described.stderr
    assert f"Triggered by:   {ME}" in described.stdout
    assert '"region": "eu"' in described.stdout and "version 2" in described.stdout

    # The history: who changed it and when; a past version as it was; their difference.
    history = cli(topics, "history", "export", "-o", "json")
    assert history.returncode == 0, history.stderr
    versions = json.loads(history.stdout)
    assert [(v["version"], v["created_by"], v["change"]) for v in versions] == [
        (1, ME, "created"), (2, "bob@example.com", "params")]
    old = cli(topics, "get", "job", "export", "--version", "1", "-o", "json")
    assert old.returncode == 0, old.stderr
    assert json.loads(old.stdout)["params"] == {"region": "all", "limit": 10}
    diff = cli(topics, "diff", "export", "1", "2")
    assert diff.returncode == 0, diff.stderr
    assert "-  limit: 10" in diff.stdout and "+  limit: 20" in diff.stdout, diff.stdout
    assert "bob@example.com" in diff.stdout
    missing = cli(topics, "get", "job", "export", "--version", "9")
    assert missing.returncode == 4 and "no version 9" in missing.stderr

    # A pause, a delete and a re-create are versions too, each with who did it.
    assert cli(topics, "pause", "export").returncode == 0
    assert cli(topics, "delete", "export").returncode == 0
    eventually(lambda: len(sql(topics.database_url, "SELECT 1 FROM job_definition_versions "
                                                     "WHERE job_id = 'export'")) == 4,
               30, message="the pause and the delete projected")
    apply(topics, tmp_path / "v5.json", first)
    eventually(lambda: len(sql(topics.database_url, "SELECT 1 FROM job_definition_versions "
                                                     "WHERE job_id = 'export'")) == 5,
               30, message="the re-create projected")
    history = cli(topics, "history", "export")
    assert history.returncode == 0, history.stderr
    lines = [line.split() for line in history.stdout.splitlines()[1:]]
    assert [(cells[0], cells[2], cells[3]) for cells in lines] == [
        ("1", ME, "created"), ("2", "bob@example.com", "params"), ("3", ME, "paused"),
        ("4", ME, "deleted"), ("5", ME, "re-created")], history.stdout
    deleted = cli(topics, "get", "job", "export", "--version", "4")
    assert deleted.returncode == 1 and "is its deletion" in deleted.stderr


def test_a_dag_steps_handler_sees_its_upstreams_results_and_the_runs_params(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    """Two branches join: `load` fails its first attempt and its retry sees the same view;
    `big-join` joins three results of ~50 KiB, more together than a step carries: the
    first two come, the third is marked omitted (decision 0035), and the step still runs."""
    processes.system()
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    blob = {"blob": "x" * 50_000}

    def step(job_id: str, depends_on: list[str], **fields: Any) -> dict[str, Any]:
        return {"job_id": job_id, "type": "DEPENDENT", "depends_on": depends_on, "handler": "noop",
                **fields}

    jobs = [
        {"job_id": "extract", "type": "ONE_TIME", "run_at": later, "handler": "noop",
         "params": {"rows": 3, "region": "all"}},
        step("load", ["extract"], handler="test.upstream", params={"fail_before_attempt": 2},
             max_retries=1, retry_delay_seconds=0.2),
        *(step(name, ["extract"], params=blob) for name in ("big-a", "big-b", "big-c")),
        step("big-join", ["big-a", "big-b", "big-c"], handler="test.upstream"),
    ]
    path = tmp_path / "dag.yaml"
    path.write_text("\n---\n".join(json.dumps(j) for j in jobs))
    done = cli(topics, "apply", "-f", str(path))
    assert done.returncode == 0, done.stderr
    eventually(lambda: len(sql(topics.database_url, "SELECT 1 FROM job_dependencies")) == 7, 30,
               message="the DAG is projected")

    root = triggered(cli(topics, "trigger", "extract", "--param", "region=eu"))
    loads = eventually(lambda: [r for r in executions_of(topics, "load") if r["status"] == "COMPLETED"],
                       60, message="load completes on its retry")
    result = json.loads(loads[0]["result"])
    assert result == {
        "upstream": {"extract": {"status": "COMPLETED", "execution_id": root,
                                 "result": {"rows": 3, "region": "eu"}}},
        "root_params": {"rows": 3, "region": "eu"}, "params": {"fail_before_attempt": 2},
        "attempt": 2}
    assert [r["status"] for r in executions_of(topics, "load")] == ["FAILED", "COMPLETED"]

    join = eventually(lambda: [r for r in executions_of(topics, "big-join") if r["status"] in FINAL],
                      60, message="big-join ends")[0]
    assert join["status"] == "COMPLETED", join["error_message"]
    seen = json.loads(join["result"])["upstream"]
    assert [seen[j]["result"] for j in ("big-a", "big-b")] == [{"bytes": 50_012}] * 2
    assert seen["big-c"]["result"] == "<omitted>" and seen["big-c"]["status"] == "COMPLETED"
    big_c = executions_of(topics, "big-c")[0]
    assert seen["big-c"]["execution_id"] == str(big_c["execution_id"])
    with Client(topics) as client:  # where the handler is told to read what was left out
        assert client.execution(big_c["execution_id"]).result == blob  # type: ignore[union-attr]


def test_max_concurrent_runs_never_lets_a_third_run_start_and_records_each_skip(
    processes: Processes, topics: Settings, tmp_path: Path,
) -> None:
    """A burst of triggers of a job limited to 2 runs, and another after a dispatcher
    restart: never three at once; each refused run is SKIPPED with the reason and who
    asked, and never starts; once the runs end (cancelled), the next one runs."""
    services = processes.system(worker_args=("--concurrency", "8"))
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    apply(topics, tmp_path / "limited.json", {
        "job_id": "limited", "type": "ONE_TIME", "run_at": later, "handler": "sleep",
        "params": {"seconds": 60}, "max_concurrent_runs": 2})
    now = datetime.now(UTC)

    def count(status: str) -> int:
        return sum(r["status"] == status for r in executions_of(topics, "limited"))

    with Client(topics) as client:
        for i in range(6):  # at distinct instants: six runs asked for
            client.trigger("limited", now + timedelta(milliseconds=i), by="burst@test")
        eventually(lambda: count("RUNNING") == 2 and count("SKIPPED") == 4, 30,
                   message="two run, four are skipped")
        assert services["dispatcher"].stop() == 0
        processes.start("dispatcher", name="dispatcher-2").wait_for_log("action=partitions_assigned")
        for i in range(6, 9):  # the restarted dispatcher reads what runs from its state
            client.trigger("limited", now + timedelta(milliseconds=i), by="burst@test")
        eventually(lambda: count("SKIPPED") == 7, 30, message="the second burst is skipped")
        assert count("RUNNING") == 2
        for row in executions_of(topics, "limited"):
            if row["status"] == "RUNNING":
                client.cancel(row["execution_id"], "make room")
        eventually(lambda: count("CANCELLED") == 2, 30, message="the two runs end")
        last = client.trigger("limited", by="after@test", params={"seconds": 0.2})
        finished(topics, str(last))
    rows = executions_of(topics, "limited")
    ran = [r for r in rows if r["started_at"] is not None]
    skipped = [r for r in rows if r["status"] == "SKIPPED"]
    assert sorted(r["status"] for r in ran) == ["CANCELLED", "CANCELLED", "COMPLETED"]
    assert len(skipped) == 7 and len(rows) == 10
    for run in ran:  # never three at once
        alongside = [o for o in ran if o is not run
                     and o["started_at"] <= run["started_at"] < o["completed_at"]]
        assert len(alongside) <= 1, f"{run['execution_id']} started with {len(alongside)} others running"
    first_two = [r for r in ran if r["status"] == "CANCELLED"]
    assert first_two[0]["started_at"] < first_two[1]["completed_at"] \
        and first_two[1]["started_at"] < first_two[0]["completed_at"], "two at once: the limit is 2"
    for row in skipped:
        assert "max_concurrent_runs is 2" in row["error_message"], row["error_message"]
        assert row["triggered_by"] == "burst@test"
    runs = cli(topics, "runs", "--job", "limited", "--status", "SKIPPED", "-o", "json")
    assert runs.returncode == 0, runs.stderr
    shown = json.loads(runs.stdout)
    assert len(shown) == 7 and all("max_concurrent_runs" in r["error_message"] for r in shown)
