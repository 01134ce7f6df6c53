"""`cronstream apply` validates everything before sending anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from cronstream.shared.settings import Settings
from tests.support import cli, read_all

VALID = """\
job_id: good-one
type: INTERVAL
interval_seconds: 60
handler: noop
"""

BAD = {
    "bad cron": ("job_id: j1\ntype: CRON\nschedule: '61 * * * *'\nhandler: noop\n",
                 ["schedule", "minute field", "61"]),
    "unknown timezone": ("job_id: j2\ntype: CRON\nschedule: '0 * * * *'\ntimezone: Mars/Olympus\n"
                         "handler: noop\n", ["timezone", "Mars/Olympus"]),
    "bad job_id": ("job_id: 'has spaces!'\ntype: INTERVAL\ninterval_seconds: 5\nhandler: noop\n",
                   ["job_id", "pattern"]),
    "oversized params": ("job_id: j4\ntype: INTERVAL\ninterval_seconds: 5\nhandler: noop\n"
                         f"params: {{blob: '{'x' * 70_000}'}}\n", ["params", "65536"]),
}



@pytest.mark.parametrize("case", list(BAD))
def test_apply_refuses_invalid_definitions_and_sends_nothing(
    case: str, topics: Settings, tmp_path: Path,
) -> None:
    text, expected = BAD[case]
    path = tmp_path / "jobs.yaml"
    # A valid definition first: the whole file is refused, not just the bad one.
    path.write_text(VALID + "---\n" + text)
    done = cli(topics, "apply", "-f", str(path))
    assert done.returncode != 0
    for needle in expected:
        assert needle in done.stderr, done.stderr
    assert "nothing was sent" in done.stderr
    assert read_all(topics, topics.topics.job_definitions) == []


def test_apply_publishes_valid_definitions(topics: Settings, tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(VALID + "---\njob_id: good-two\ntype: ONE_TIME\n"
                    "run_at: 2030-01-01T00:00:00Z\nhandler: noop\n")
    done = cli(topics, "apply", "-f", str(path))
    assert done.returncode == 0, done.stderr
    keys = sorted(m.key() or b"" for m in read_all(topics, topics.topics.job_definitions))
    assert keys == [b"good-one", b"good-two"]
