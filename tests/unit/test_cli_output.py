"""Output formats of the CLI lists (output.py), without servers."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
import yaml

from cronstream.cli.output import Column, plain, show

LONG = "a-very-long-job-id-" + "x" * 120
ROWS = [{"job_id": LONG, "enabled": True, "at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
         "id": uuid.UUID(int=1), "rate": None},
        {"job_id": "short", "enabled": False, "at": None, "id": uuid.UUID(int=2), "rate": 0.5}]
COLUMNS = [Column("job", lambda r: r["job_id"]), Column("enabled", lambda r: r["enabled"]),
           Column("rate", lambda r: r["rate"], wide_only=True)]


def test_plain_table_keeps_long_values_whole(capsys: pytest.CaptureFixture[str]) -> None:
    show(ROWS, COLUMNS, "table")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["JOB", "ENABLED"]
    assert lines[1].split() == [LONG, "yes"] and lines[2].split() == ["short", "no"]


def test_wide_adds_columns(capsys: pytest.CaptureFixture[str]) -> None:
    show(ROWS, COLUMNS, "wide")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["JOB", "ENABLED", "RATE"] and lines[2].split()[-1] == "0.5"


def test_json_and_yaml_are_data(capsys: pytest.CaptureFixture[str]) -> None:
    show(ROWS, COLUMNS, "json")
    data = json.loads(capsys.readouterr().out)
    assert data[0] == {"job_id": LONG, "enabled": True, "at": "2026-01-02T03:04:05Z",
                       "id": "00000000-0000-0000-0000-000000000001", "rate": None}
    show(ROWS, COLUMNS, "yaml")
    assert yaml.safe_load(capsys.readouterr().out) == data


def test_plain_converts_nested_values() -> None:
    assert plain({"a": [uuid.UUID(int=3), {"t": datetime(2026, 1, 1, tzinfo=UTC)}]}) == \
        {"a": ["00000000-0000-0000-0000-000000000003", {"t": "2026-01-01T00:00:00Z"}]}
