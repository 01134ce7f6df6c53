"""A job's history (docs/reference/operations.md#definition-history): each accepted definition, a version.

The monitor numbers them per job, 1, 2, ..., in the order of `job-definitions`, and keeps
them in PostgreSQL (`job_definition_versions`): a change, a pause, a delete and a re-create
each make one. `DefinitionVersion` is one of them as the SDK reads it
(`Client.history`, `Client.version`); `yaml_diff` and `changed_fields` compare two, as
`cronstream diff` and the dashboard's job page show them.

What `job-definitions` keeps is only each job's latest record (it is compacted), so the
history lives in PostgreSQL: a projection rebuilt from the topic alone starts from what the
topic still holds (decision 0036).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import yaml
from pydantic import ValidationError

from cronstream.definitions import document
from cronstream.shared.records import JobDefinition

__all__ = ["CalendarVersion", "DefinitionVersion", "changed_fields", "document_diff", "to_yaml",
           "with_changes", "yaml_diff"]

# Stamped by `apply` on every publication: who and when are the version's own columns, so
# comparing two versions leaves them out.
STAMPS = ("created_by", "created_at")


def to_yaml(data: Any) -> str:
    """`data` (JSON-compatible) as YAML, keys in their order."""
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=10_000)


@dataclass(frozen=True, slots=True)
class DefinitionVersion:
    """Version `version` of a job's definition: what was published (`document`, None for a
    delete), by whom (`created_by`: the definition's, or who deleted it) and when (the
    record's time), and where on `job-definitions` (None for versions seeded from a
    projection older than history)."""

    job_id: str
    version: int
    document: dict[str, Any] | None
    created_by: str | None
    recorded_at: datetime
    kafka_offset: int | None

    @property
    def deleted(self) -> bool:
        return self.document is None

    @classmethod
    def from_row(cls, row: Mapping[str, Any] | Any) -> DefinitionVersion:
        """From a `definition_history` / `definition_version` row."""
        raw = row["definition"]
        return cls(row["job_id"], row["version"], None if raw is None else _document(raw),
                   row["created_by"], row["recorded_at"], row["kafka_offset"])

    def compared(self) -> dict[str, Any] | None:
        """The document without the fields every publication stamps."""
        if self.document is None:
            return None
        return {k: v for k, v in self.document.items() if k not in STAMPS}

    def label(self) -> str:
        """`v3 (alice@host, 2026-05-01T10:00:00Z)`."""
        when = self.recorded_at.isoformat(timespec="seconds").replace("+00:00", "Z")
        return f"v{self.version} ({self.created_by or 'unknown'}, {when})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible: the version, who, when, the definition (null: deleted)."""
        return {"job_id": self.job_id, "version": self.version,
                "recorded_at": self.recorded_at.isoformat().replace("+00:00", "Z"),
                "created_by": self.created_by, "deleted": self.deleted,
                "kafka_offset": self.kafka_offset, "definition": self.document}


def _document(raw: str) -> dict[str, Any]:
    """A stored definition in the form `get job` prints (the fields in their order: jsonb
    keeps its own); as stored, unset fields left out, if today's model refuses it."""
    try:
        return document(JobDefinition.model_validate_json(raw))
    except ValidationError:
        return {k: v for k, v in json.loads(raw).items() if v is not None}


def changed_fields(before: DefinitionVersion | None, after: DefinitionVersion) -> str:
    """What `after` changed from `before` (its previous version), in a few words:
    `created`, `deleted`, `re-created`, `no change`, or the fields that differ."""
    new = after.compared()
    if new is None:
        return "deleted"
    old = None if before is None else before.compared()
    if before is None:
        return "created"
    if old is None:
        return "re-created"
    fields = [k for k in dict.fromkeys([*old, *new]) if old.get(k) != new.get(k)]
    if fields == ["enabled"]:
        return "resumed" if new.get("enabled", True) else "paused"
    return ", ".join(fields) if fields else "no change"


def with_changes(versions: list[DefinitionVersion]) -> list[tuple[DefinitionVersion, str]]:
    """Each version (oldest first) with what it changed from the one before it; a version
    whose predecessor is past retention says so."""
    changes = []
    previous: DefinitionVersion | None = None
    for version in versions:
        if previous is not None and previous.version == version.version - 1:
            change = changed_fields(previous, version)
        elif version.version == 1:
            change = changed_fields(None, version)
        else:
            change = "(earlier versions past retention)"
        changes.append((version, change))
        previous = version
    return changes


def document_diff(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None,
                  old_name: str, new_name: str) -> list[str]:
    """A unified diff of the YAML forms of two definition documents (None: none)."""
    return list(difflib.unified_diff(
        [] if old is None else to_yaml(dict(old)).splitlines(),
        [] if new is None else to_yaml(dict(new)).splitlines(), old_name, new_name, lineterm=""))


def yaml_diff(before: DefinitionVersion | None, after: DefinitionVersion) -> list[str]:
    """A unified diff of the YAML forms of two versions (the stamps left out: the header
    lines name who and when); a deleted version is empty."""
    name = f"{after.job_id} "
    return document_diff(None if before is None else before.compared(), after.compared(),
                         name + (before.label() if before is not None else "(none)"),
                         name + after.label())


@dataclass(frozen=True, slots=True)
class CalendarVersion:
    """Version `version` of a calendar (`calendar_versions`): what was published (None for
    a delete), by whom, when, and where on `calendars`."""

    calendar_id: str
    version: int
    document: dict[str, Any] | None
    created_by: str | None
    recorded_at: datetime
    kafka_offset: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any] | Any) -> CalendarVersion:
        raw = row["definition"]
        return cls(row["calendar_id"], row["version"], None if raw is None else json.loads(raw),
                   row["created_by"], row["recorded_at"], row["kafka_offset"])

    def to_dict(self) -> dict[str, Any]:
        return {"calendar_id": self.calendar_id, "version": self.version,
                "created_by": self.created_by, "recorded_at": self.recorded_at,
                "kafka_offset": self.kafka_offset, "deleted": self.document is None,
                "calendar": self.document}
