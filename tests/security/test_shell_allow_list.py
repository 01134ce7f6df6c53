"""`--allow-shell` names the executables a `shell` job may run (issue 49, item 3).

Whoever can publish a definition or a JobDue chooses a job's params; with the `shell`
handler on, that was any command on every worker. Now the worker takes an allow-list and
runs nothing else: not another path to an allowed name, not an interpreter that was not
named, and a bare `--allow-shell` (any command, as before) is refused with what to write
instead. The whole path through a worker's handler processes runs in
tests/security/test_kafka_principals.py (`echo` runs, `sh` does not).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from cronstream.handlers import REGISTRY, Context, NonRetryableError
from cronstream.services.worker import builtins


def context(command: Any) -> Context:
    return Context(execution_id=uuid.uuid4(), job_id="j", run_id=uuid.uuid4(), attempt_number=1,
                   idempotency_key="k", scheduled_at=datetime.now(UTC), params={"command": command})


@pytest.fixture
def allowed() -> Iterator[None]:
    builtins.enable_shell(["echo", "/usr/bin/true"])
    yield
    builtins.enable_shell([])


def test_only_the_named_executables_run(allowed: None) -> None:
    spec = REGISTRY.get("shell")
    assert spec is not None
    assert spec.func(context(["echo", "hi"]))["stdout"] == "hi\n"
    assert spec.func(context(["/usr/bin/true"]))["exit_code"] == 0
    for command in (["sh", "-c", "echo pwned"], ["/bin/echo", "hi"], ["true"], ["./echo"],
                    ["/usr/bin/../bin/true"]):
        with pytest.raises(NonRetryableError, match="not an executable this worker allows"):
            spec.func(context(command))


def test_a_bare_or_wildcard_allow_shell_is_refused_with_what_to_write() -> None:
    for args in (["--allow-shell"], ["--allow-shell", "*"], ["--allow-shell", "--import", "os"]):
        done = subprocess.run([sys.executable, "-m", "cronstream", "worker", *args],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 2, (args, done.stderr)
        assert "--allow-shell" in done.stderr or "CRONSTREAM_WORKER_ALLOW_SHELL" in done.stderr, done.stderr
