"""Definition versions without a database: what each changed, and the diff of two."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from cronstream.cli.history_cmds import history_rows
from cronstream.versions import DefinitionVersion, changed_fields, yaml_diff

T0 = datetime(2026, 5, 1, 10, 0, tzinfo=UTC)
BASE = {"job_id": "export", "type": "CRON", "schedule": "0 2 * * *", "handler": "noop",
        "params": {"region": "all"}, "enabled": True}


def version(n: int, document: dict[str, Any] | None, by: str = "alice@host") -> DefinitionVersion:
    stamped = None if document is None else {**document, "created_by": by,
                                             "created_at": f"2026-05-0{n}T00:00:00Z"}
    return DefinitionVersion("export", n, stamped, by, T0 + timedelta(days=n), 100 + n)


def test_each_version_says_what_it_changed_from_the_one_before() -> None:
    v1 = version(1, BASE)
    v2 = version(2, {**BASE, "params": {"region": "eu"}, "schedule": "0 3 * * *"}, by="bob@host")
    v3 = version(3, {**v2.compared(), "enabled": False})  # type: ignore[dict-item]
    v4 = version(4, {**v2.compared(), "enabled": True})  # type: ignore[dict-item]
    v5 = version(5, None, by="carol@host")
    v6 = version(6, BASE)
    v7 = version(7, BASE, by="ci@runner")
    assert [changed_fields(None, v1), changed_fields(v1, v2), changed_fields(v2, v3),
            changed_fields(v3, v4), changed_fields(v4, v5), changed_fields(v5, v6),
            changed_fields(v6, v7)] == [
        "created", "schedule, params", "paused", "resumed", "deleted", "re-created", "no change"]


def test_the_diff_of_two_versions_is_their_yaml_without_the_stamps() -> None:
    v1 = version(1, BASE)
    v2 = version(2, {**BASE, "params": {"region": "eu"}}, by="bob@host")
    lines = yaml_diff(v1, v2)
    assert lines[0] == "--- export v1 (alice@host, 2026-05-02T10:00:00Z)"
    assert lines[1] == "+++ export v2 (bob@host, 2026-05-03T10:00:00Z)"
    assert "-  region: all" in lines and "+  region: eu" in lines
    assert not any("created_" in line for line in lines), "who and when are in the header"
    assert yaml_diff(v1, version(2, BASE, by="ci")) == [], "only the stamps differ"
    deleted = yaml_diff(v2, version(3, None))
    assert all(line.startswith(("-", "@@")) for line in deleted[2:])


def test_history_marks_versions_past_retention() -> None:
    rows = history_rows([version(3, BASE), version(4, {**BASE, "enabled": False})])
    assert [(r["version"], r["change"]) for r in rows] == [
        (3, "(earlier versions past retention)"), (4, "paused")]
    assert rows[1]["definition"]["enabled"] is False and rows[1]["created_by"] == "alice@host"
