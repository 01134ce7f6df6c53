"""Text a handler or a record controls never drives the terminal it is read on (issue 53,
items 2 and 3 of the probe).

The probe: a failed handler's message `\\x1b]0;pwned\\x07\\x1b[2J` retitled and cleared the
terminal of whoever ran `describe execution`, `runs`, `tail`, `describe job` (the job's
name) or the `dev` live view (kubectl's CVE-2021-25743 class; with OSC 52, a clipboard
write); through a pipe click strips CSI but not OSC. `[/bogus]` in a message made `runs` on
a terminal exit with Rich's MarkupError, `[link=...]` became a clickable OSC 8 hyperlink.

Here one system runs a job whose name and failure carry all of it; every command that
shows them runs on a pseudo-terminal and through a pipe, and prints them as data.
"""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from rich.console import Console

from cronstream.cli.view_cmds import runs_table
from cronstream.shared.settings import Settings
from tests.conftest import Processes
from tests.support import cli, env_for, eventually, produce_json, sql

# OSC title + BEL, clear screen, C1 CSI (U+009B), an OSC 8 hyperlink, an OSC 52 clipboard
# write, Rich markup (closing a tag never opened, a link, reverse video), a bidi override.
PAYLOAD = ("\x1b]0;pwned\x07\x1b[2J\u009b31m\x1b]8;;https://evil.example/\x1b\\x\x1b]8;;\x1b\\"
           "\x1b]52;c;cHduZWQ=\x07[/bogus][link=https://evil.example/]CLICK[/link][reverse]OK\u202e")
MARKUP = "[/bogus][link=https://evil.example/]CLICK[/link][reverse]OK"
# What Rich itself writes on a terminal: colours and styles (SGR), nothing else.
SGR = re.compile(r"\x1b\[[0-9;]*m")


def assert_inert(output: str, *, terminal: bool) -> None:
    """Nothing in `output` a terminal acts on, and the markup shown as the text it is."""
    text = SGR.sub("", output) if terminal else output
    for raw in ("\x1b", "\x07", "\u009b", "\u202e"):
        assert raw not in text, (raw, output[:2000])
    # Shown, escaped: as text (\x1b), in JSON (\u001b) or in YAML (\e).
    assert any(shown in text for shown in ("\\x1b]0;pwned", "\\u001b]0;pwned", "\\e]0;pwned")), \
        output[:2000]
    flat = re.sub(r"[\s│|┃]+", "", text)  # a table on a terminal may fold a long cell
    assert re.sub(r"\s+", "", MARKUP) in flat, output[:2000]


def on_a_terminal(settings: Settings, *args: str, timeout: float = 60) -> tuple[int, str]:
    """Run the CLI on a pseudo-terminal 400 columns wide; its exit code and all it wrote."""
    env = env_for(settings) | {"COLUMNS": "400", "LINES": "100", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    parent, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "cronstream", *args], stdin=child,
                            stdout=child, stderr=child, env=env, close_fds=True)
    os.close(child)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([parent], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(parent, 65536)
                except OSError:  # the terminal closed: the command has ended
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        code = proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(parent)
    return code, out.decode("utf-8", "replace")


def through_a_pipe(settings: Settings, *args: str) -> tuple[int, str]:
    done = cli(settings, *args)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture
def poisoned(processes: Processes, topics: Settings) -> dict[str, Any]:
    """A job named with the payload whose one run failed with it."""
    processes.system()
    produce_json(topics, topics.topics.job_definitions, "evil", {
        "job_id": "evil", "name": PAYLOAD, "type": "ONE_TIME", "handler": "fail",
        "run_at": datetime.now(UTC).isoformat(), "params": {"message": PAYLOAD}})
    rows = eventually(lambda: sql(topics.database_url, "SELECT execution_id FROM job_executions "
                                  "WHERE job_id = 'evil' AND status = 'PERMANENTLY_FAILED'"),
                      60, message="the poisoned run failed")
    execution_id = str(rows[0]["execution_id"])
    eventually(lambda: sql(topics.database_url, "SELECT 1 FROM execution_logs "
                           "WHERE execution_id = $1", uuid.UUID(execution_id)),
               30, message="its traceback is kept")
    return {"execution_id": execution_id}


def test_every_command_prints_a_poisoned_run_as_data(poisoned: dict[str, Any],
                                                      topics: Settings) -> None:
    execution_id = poisoned["execution_id"]
    commands = [
        ("runs",), ("runs", "-o", "wide"), ("runs", "-o", "json"), ("runs", "-o", "yaml"),
        ("describe", "execution", execution_id), ("describe", "job", "evil"),
        ("get", "execution", execution_id), ("get", "job", "evil", "-o", "json"),
        ("logs", execution_id), ("tail", "--from-beginning", "--job", "evil", "--count", "3"),
        ("jobs", "-o", "wide"), ("history", "evil"),
    ]
    for command in commands:
        for where, run in (("pipe", through_a_pipe), ("terminal", on_a_terminal)):
            code, output = run(topics, *command)
            assert code == 0, (command, where, output[-2000:])
            if command[0] in ("jobs", "history"):  # the name is not in these: only no escape
                assert "\x1b]" not in output, (command, where)
                continue
            assert_inert(output, terminal=where == "terminal")
        if "json" in command:
            json.loads(through_a_pipe(topics, *command)[1])  # escaped, and still JSON


def test_the_dev_live_view_shows_a_poisoned_row_as_data() -> None:
    row = {"job_id": "evil", "status": "FAILED", "attempt_number": 1,
           "scheduled_at": datetime.now(UTC), "worker_id": "w1\x1b]0;x\x07", "progress": None,
           "error_message": PAYLOAD[:80], "progress_message": None}
    out = io.StringIO()
    Console(file=out, force_terminal=True, width=400, color_system="truecolor").print(runs_table([row]))
    text = SGR.sub("", out.getvalue())
    for raw in ("\x1b", "\x07", "\u009b"):
        assert raw not in text
    assert "\\x1b]0;pwned" in text


def test_a_created_by_with_control_characters_is_refused_naming_the_field(
        topics: Settings, tmp_path: Any) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({"job_id": "who", "type": "INTERVAL", "interval_seconds": 60,
                                "handler": "noop", "created_by": "ops\x1b]0;pwned\x07"}))
    done = cli(topics, "apply", "-f", str(path))
    assert done.returncode == 1, done  # refused before anything is sent
    assert "created_by" in done.stderr and "control characters" in done.stderr
    assert "\x1b" not in done.stderr
