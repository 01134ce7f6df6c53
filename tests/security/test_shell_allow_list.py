"""`--allow-shell` allows commands the operator wrote; a record names one and fills its
typed placeholders, and never builds an argv (issue 53, item 1; decision 0038).

The probe this answers: with `--allow-shell find,env,date`, `["env","sh","-c",…]` and
`["find",…,"-exec","sh","-c",…,";"]` ran any shell command, `["date","-f","/etc/passwd"]`
printed the file in its error and `["env"]` returned the worker's environment — its
database URL with the password — as the execution's result. Each is refused or harmless
here; the whole path through a worker's handler processes runs in
tests/security/test_kafka_principals.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cronstream.handlers import REGISTRY, Context, NonRetryableError
from cronstream.services.worker import shell


def context(params: dict[str, Any]) -> Context:
    return Context(execution_id=uuid.uuid4(), job_id="j", run_id=uuid.uuid4(), attempt_number=1,
                   idempotency_key="k", scheduled_at=datetime.now(UTC), params=params)


def run(params: dict[str, Any]) -> Any:
    spec = REGISTRY.get("shell")
    assert spec is not None
    return spec.func(context(params))


@pytest.fixture
def allow() -> Iterator[Any]:
    def enable(*entries: str) -> None:
        shell.enable(list(entries))

    yield enable
    shell.enable([])


def test_a_record_names_a_command_and_its_args_fill_the_operators_argv(allow: Any) -> None:
    allow("greet=echo hello {who:word} --count={n:int} {mood:calm|glad}", "true")
    assert run({"command": "greet", "args": {"who": "ada", "n": 3, "mood": "glad"}})["stdout"] \
        == "hello ada --count=3 glad\n"
    assert run({"command": "true"})["exit_code"] == 0


def test_an_argv_from_the_record_is_refused_whatever_it_names(allow: Any) -> None:
    allow("env", "find", "date")
    for argv in (["env", "sh", "-c", "echo pwned"], ["find", ".", "-exec", "sh", "-c", "id", ";"],
                 ["date", "-f", "/etc/passwd"], ["env"]):
        with pytest.raises(NonRetryableError, match="an argv list is not accepted"):
            run({"command": argv})


def test_a_bare_executable_runs_with_no_argument_at_all(allow: Any) -> None:
    allow("date")
    with pytest.raises(NonRetryableError, match=r"params.args.f: command 'date' has no such placeholder"):
        run({"command": "date", "args": {"f": "/etc/passwd"}})
    assert run({"command": "date"})["exit_code"] == 0


def test_a_placeholder_admits_no_option_no_path_and_no_second_argument(allow: Any) -> None:
    allow("show=date -d {when:word}", "say=echo {msg:text}", "count=echo {n:int}")
    for when in ("-f/etc/passwd", "/etc/passwd", "now -f /etc/passwd", "..", "a\nb", ""):
        with pytest.raises(NonRetryableError, match=r"params.args.when: a word"):
            run({"command": "show", "args": {"when": when}})
    for msg in ("-n", "\x1b]0;pwned\x07", "x" * 2000, 42):
        with pytest.raises(NonRetryableError, match=r"params.args.msg"):
            run({"command": "say", "args": {"msg": msg}})
    for n in (-1, "1 2", "0x10", True, 1.5):
        with pytest.raises(NonRetryableError, match=r"params.args.n: a non-negative integer"):
            run({"command": "count", "args": {"n": n}})
    # Text with spaces and shell syntax stays one argument, never parsed by a shell.
    assert run({"command": "say", "args": {"msg": "a b; rm -rf / $(id)"}})["stdout"] \
        == "a b; rm -rf / $(id)\n"


def test_missing_unknown_and_unlisted_names_say_what_the_command_takes(allow: Any) -> None:
    allow("greet=echo {who:word}")
    with pytest.raises(NonRetryableError, match=r"params.args.who: missing \(command 'greet' takes who: word\)"):
        run({"command": "greet"})
    with pytest.raises(NonRetryableError, match=r"params.args.x: command 'greet' has no such placeholder"):
        run({"command": "greet", "args": {"who": "a", "x": "b"}})
    with pytest.raises(NonRetryableError, match=r"'sh' is not a command this worker allows \(greet\)"):
        run({"command": "sh"})


@pytest.mark.parametrize("entry, why", [
    ("run=env {program:word}", "'env' runs code or commands named in its arguments"),
    ("run=/usr/bin/find . -name {n:word}", "'find' runs code or commands"),
    ("run=sh -c 'echo {msg:text}'", "'sh' runs code or commands"),
    ("run=python3.11 {script:word}", "'python3.11' runs code or commands"),
    ("run=xargs {n:int}", "'xargs' runs code or commands"),
    ("run={exe:word} -v", "the executable is the operator's to write"),
    ("run=echo {x:path}", "type 'path' is not word, int, text or a|b|c"),
    ("run=echo {x:a||b}", "empty choice"),
    ("run=echo {x-y:word}", "needs a name"),
    ("bad name=echo", "command name 'bad name'"),
    ("run=no-such-executable-here", "not an executable on the worker's PATH"),
    ("*", "not a pattern"),
])
def test_an_entry_that_would_let_a_record_choose_the_code_is_refused_at_start(
        entry: str, why: str) -> None:
    with pytest.raises(shell.ShellConfigError, match=why.replace("(", r"\(").replace("|", r"\|")):
        shell.parse([entry])


def test_a_fixed_argv_may_be_any_program_since_the_record_chooses_nothing_in_it(allow: Any) -> None:
    allow("hello=sh -c 'echo fixed'", "vacuum=env true")
    assert run({"command": "hello"})["stdout"] == "fixed\n"
    assert run({"command": "vacuum"})["exit_code"] == 0


def test_the_command_sees_none_of_the_workers_secrets(allow: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRONSTREAM_DATABASE_URL", "postgresql://cronstream:hunter2-db@db/cronstream")
    monkeypatch.setenv("CRONSTREAM_KAFKA_SASL_PASSWORD", "hunter2-kafka")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2-aws")
    allow("printenv=env")
    out = run({"command": "printenv"})["stdout"]
    assert "hunter2" not in out and "CRONSTREAM" not in out
    names = {line.split("=", 1)[0] for line in out.splitlines()}
    assert names <= set(shell.CHILD_ENVIRONMENT) and "PATH" in names


def test_the_executable_is_resolved_at_start_so_a_later_path_cannot_swap_it(
        allow: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    allow("who=echo {x:word}")
    fake = tmp_path / "echo"
    fake.write_text("#!/bin/sh\necho swapped\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert run({"command": "who", "args": {"x": "real"}})["stdout"] == "real\n"


def test_a_cancelled_command_is_killed_not_left_running(allow: Any, tmp_path: Any) -> None:
    marker = tmp_path / "pid"
    allow(f"nap=sh -c 'echo $$ > {marker}; exec sleep 30'")
    ctx = context({"command": "nap"})
    spec = REGISTRY.get("shell")
    assert spec is not None
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(spec.func(ctx)))
    thread.start()
    deadline = time.monotonic() + 10
    while not (marker.exists() and marker.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.02)
    pid = int(marker.read_text())
    ctx._cancel.set()
    thread.join(10)
    assert result == {"command": "nap", "cancelled": True}
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().split()[2] == "Z"


def test_a_bare_or_wildcard_allow_shell_is_refused_with_what_to_write() -> None:
    for args in (["--allow-shell"], ["--allow-shell", "*"], ["--allow-shell", "--import", "os"],
                 ["--allow-shell", "run=env {x:word}"]):
        done = subprocess.run([sys.executable, "-m", "cronstream", "worker", *args],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 2, (args, done.stderr)
        assert "--allow-shell" in done.stderr or "CRONSTREAM_WORKER_ALLOW_SHELL" in done.stderr, done.stderr
