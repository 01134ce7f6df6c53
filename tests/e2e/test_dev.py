"""`cronstream dev`, the README's first command, as a person runs it: in a terminal, it
comes up with the example jobs, its live view shows executions with their progress, and
Ctrl-C stops every process it started."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
from pathlib import Path

import psutil

from cronstream.definitions import load_definitions
from cronstream.shared.settings import Settings
from tests.support import env_for, eventually, sql

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|\r")


class Terminal:
    """A pseudo-terminal 200 columns wide, and everything the program wrote to it."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 200, 0, 0))
        # Its own session, with the terminal as its controlling one: Ctrl-C typed there
        # reaches its foreground process group, as in a shell. (One ioctl between fork and
        # exec, which is safe with threads; subprocess has no other way to make it.)
        self.proc = subprocess.Popen(
            args, env=env, cwd=cwd, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))  # noqa: PLW1509
        os.close(slave)
        self.raw = b""

    def read(self) -> str:
        """What was written so far, without escape sequences."""
        while select.select([self.master], [], [], 0.05)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the program and its terminal are gone
                break
            if not chunk:
                break
            self.raw += chunk
        return ANSI.sub("", self.raw.decode(errors="replace"))

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        os.close(self.master)


def test_dev_runs_the_examples_shows_their_progress_and_ctrl_c_stops_everything(
    settings: Settings, tmp_path: Path,
) -> None:
    env = env_for(settings)
    for name in ("CRONSTREAM_HTTP_PORT", "CRONSTREAM_PARENT_PID"):
        env.pop(name)  # as in a person's shell: default ports, no parent to follow
    env |= {"CRONSTREAM_DEV_LOGS": str(tmp_path / "logs"), "TERM": "xterm-256color",
            "COLUMNS": "200", "LINES": "60"}
    terminal = Terminal([sys.executable, "-m", "cronstream", "dev", "--workers", "2"], env, ROOT)
    started: list[psutil.Process] = []
    examples = [d for f in sorted((ROOT / "examples").glob("*.yaml")) for d in load_definitions(f)]
    try:
        eventually(lambda: f"applied {len(examples)} example job(s)" in terminal.read(), 90,
                   message="dev applying the examples")
        # The live view: a sleep job RUNNING, with its progress bar and message.
        eventually(lambda: re.search(r"example\.interval-sleep[ │]+RUNNING[ │].*━.*slept \d\.\ds of 3s",
                                     terminal.read()), 60, message="a running execution's progress")
        ran = eventually(lambda: {r["job_id"] for r in sql(
            settings.database_url, "SELECT DISTINCT job_id FROM job_executions WHERE status = 'COMPLETED'")}
            >= {"example.cron-heartbeat", "example.interval-sleep", "example.report"}, 60,
            message="the examples completing")
        assert ran
        dev = psutil.Process(terminal.proc.pid)
        started = dev.children(recursive=True)
        names = {" ".join(p.cmdline()[3:4]) for p in started if "cronstream" in p.cmdline()}
        assert {"monitor", "scheduler", "dispatcher", "analytics", "worker", "ui"} <= names, names
        assert len([p for p in started if "worker" in p.cmdline()]) == 2

        terminal.type(b"\x03")  # Ctrl-C
        eventually(lambda: terminal.read() and terminal.proc.poll() is not None, 60,
                   message="dev exiting after Ctrl-C")
        assert terminal.proc.returncode == 0, terminal.read()[-3000:]
        output = terminal.read()
        assert "stopping ..." in output
        stopped = re.search(r"stopped: (.*)", output)
        assert stopped and all(code.endswith("=0") for code in stopped[1].split(", ")), output[-2000:]
        # No orphan: every process dev started, handler pools included, is gone.
        _gone, alive = psutil.wait_procs(started, timeout=10)
        assert alive == [], [p.cmdline() for p in alive]
    finally:
        for proc in started:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        terminal.close()
