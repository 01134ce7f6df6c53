"""Job definitions as people write them: YAML or JSON files, directories, stdin, dicts.

Everything is validated before anything is sent, with `JobDefinition.from_dict`: times
as ISO 8601 strings, no other coercion, and an unknown field is a typo that is named.
A file may hold one definition, several YAML documents, a list, or `{jobs: [...]}`.

`document(definition)` is the inverse: the plain form that `cronstream get job -o yaml`
prints and that `apply -f` reads back unchanged.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import ValidationError

from cronstream.errors import DefinitionError, DefinitionProblem
from cronstream.shared.codec import describe
from cronstream.shared.dag import dag_problem
from cronstream.shared.records import MAX_DEFINITION_BYTES, Calendar, JobDefinition, Pool

__all__ = [
    "DEFINITION_SUFFIXES",
    "check_calendars",
    "check_dags",
    "document",
    "documents_of",
    "load_definitions",
    "load_sources",
    "parse_definitions",
]

DEFINITION_SUFFIXES = (".yaml", ".yml", ".json")
# Stamped by `apply` when absent: not part of what a person edits, so a diff ignores them
# unless the file sets them.
STAMPED = ("created_by", "created_at")


def _plain(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON data")


def parse_definitions(documents: Iterable[Any], source: str = "input") -> list[JobDefinition]:
    """Validate raw definitions (mappings or JobDefinitions); raise DefinitionError
    listing every problem with its place, or return them all."""
    items: list[Any] = []
    for doc in documents:
        if doc is None:
            continue
        inner = doc["jobs"] if isinstance(doc, Mapping) and set(doc) == {"jobs"} else doc
        items.extend(inner if isinstance(inner, list) else [inner])
    lines: list[str] = []
    problems: list[DefinitionProblem] = []
    definitions: list[JobDefinition] = []
    for index, item in enumerate(items, start=1):
        job = item.get("job_id") if isinstance(item, Mapping) else getattr(item, "job_id", None)
        where = f"{source}: definition #{index}" + (f" (job_id {job!r})" if job else "")
        named = job if isinstance(job, str) and job else None
        try:
            definitions.append(_one(item))
        except DefinitionError as exc:
            lines.append(f"{where}: {exc}")
            problems += [replace(p, job_id=named, source=source, index=index) for p in exc.problems]
        except (TypeError, ValueError) as exc:
            lines.append(f"{where}: {exc}")
            problems.append(DefinitionProblem(str(exc), named, None, source, index))
    seen: set[str] = set()
    for definition in definitions:
        if definition.job_id in seen:
            lines.append(f"{source}: job_id {definition.job_id!r} is defined more than once")
            problems.append(DefinitionProblem("defined more than once", definition.job_id,
                                              "job_id", source))
        seen.add(definition.job_id)
    if lines:
        raise DefinitionError("\n".join(lines), problems)
    if not definitions:
        raise DefinitionError(f"{source}: no definitions found",
                              [DefinitionProblem("no definitions found", source=source)])
    return definitions


def _one(item: Any) -> JobDefinition:
    """`item` as a definition; DefinitionError naming the fields at fault (the place is
    the caller's to add)."""
    if isinstance(item, JobDefinition):
        # Built in code: the wire model keeps unknown fields, but a person's typo must
        # not pass silently.
        if item.model_extra:
            names = sorted(item.model_extra)
            raise DefinitionError(f"{', '.join(names)}: unknown field(s) of JobDefinition",
                                  [DefinitionProblem("unknown field of JobDefinition", field=name)
                                   for name in names])
        return item
    if not isinstance(item, Mapping):
        raise TypeError(f"expected a mapping of fields, got {type(item).__name__}")
    size = len(json.dumps(item, default=_plain).encode())
    if size > MAX_DEFINITION_BYTES:
        raise ValueError(f"definition is {size} bytes; the limit is {MAX_DEFINITION_BYTES}")
    try:
        return JobDefinition.from_dict(item)
    except ValidationError as exc:
        raise DefinitionError(describe(exc), [
            DefinitionProblem(error["msg"].removeprefix("Value error, "),
                              field=".".join(str(p) for p in error["loc"]) or _named(error["msg"]))
            for error in exc.errors(include_url=False)]) from None


def _named(message: str) -> str | None:
    """The field a rule spanning fields names first (`pool_slots: 2 needs a pool`)."""
    head = message.removeprefix("Value error, ").split(":", 1)[0]
    return head if head in JobDefinition.model_fields else None


def _documents(text: str, source: str, as_json: bool) -> list[Any]:
    try:
        return [json.loads(text)] if as_json else list(yaml.safe_load_all(text))
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        kind = "JSON" if as_json else "YAML"
        raise DefinitionError(f"{source}: not valid {kind}: {exc}",
                              [DefinitionProblem(f"not valid {kind}: {exc}", source=source)]) from None


def documents_of(name: str, stdin: TextIO | None = None) -> tuple[str, list[Any]]:
    """The YAML or JSON documents of the file `name` (`-`: stdin) and how to name it in an
    error; DefinitionError when it cannot be read or parsed."""
    try:
        if name == "-":
            text, source = (stdin or sys.stdin).read(), "<stdin>"
        else:
            text, source = Path(name).read_text(), name
    except OSError as exc:
        raise DefinitionError(f"{name}: cannot read: {exc.strerror}") from None
    return source, [doc for doc in _documents(text, source, source.endswith(".json")) if doc is not None]


def load_definitions(path: str | Path) -> list[JobDefinition]:
    """Read one or many definitions from a YAML (multi-document allowed) or JSON file."""
    path = Path(path)
    return parse_definitions(_documents(path.read_text(), str(path), path.suffix == ".json"),
                             str(path))


def files_in(paths: Iterable[str]) -> list[str]:
    """Expand directories (recursively, like `kubectl apply -f dir/`) into their YAML and
    JSON files, sorted; `-` (stdin) and files pass as given."""
    found: list[str] = []
    for given in paths:
        path = Path(given)
        if given != "-" and path.is_dir():
            found += sorted(str(p) for p in path.rglob("*")
                            if p.is_file() and p.suffix in DEFINITION_SUFFIXES
                            and not any(part.startswith(".") for part in p.relative_to(path).parts))
        else:
            found.append(given)
    return found


def load_sources(paths: Iterable[str], stdin: TextIO | None = None) -> list[JobDefinition]:
    """Definitions from files, directories and `-` (stdin), validated together: a job_id
    defined twice anywhere is an error, and any problem anywhere refuses the whole set."""
    documents: list[Any] = []
    lines: list[str] = []
    problems: list[DefinitionProblem] = []
    files = files_in(paths)
    if not files:
        raise DefinitionError("no definition files found (.yaml, .yml, .json)")
    for name in files:
        try:
            if name == "-":
                text, source = (stdin or sys.stdin).read(), "<stdin>"
            else:
                text, source = Path(name).read_text(), name
        except OSError as exc:
            lines.append(f"{name}: cannot read: {exc.strerror}")
            problems.append(DefinitionProblem(f"cannot read: {exc.strerror}", source=name))
            continue
        try:
            loaded = _documents(text, source, source.endswith(".json"))
            documents += [_Sourced(source, doc) for doc in loaded if doc is not None]
        except DefinitionError as exc:
            lines.append(str(exc))
            problems += exc.problems
    if lines:
        raise DefinitionError("\n".join(lines), problems)
    return _parse_sourced(documents, files)


class _Sourced:
    __slots__ = ("doc", "source")

    def __init__(self, source: str, doc: Any) -> None:
        self.source, self.doc = source, doc


def _parse_sourced(documents: list[_Sourced], files: list[str]) -> list[JobDefinition]:
    by_source: dict[str, list[Any]] = {}
    for item in documents:
        by_source.setdefault(item.source, []).append(item.doc)
    lines: list[str] = []
    problems: list[DefinitionProblem] = []
    definitions: list[JobDefinition] = []
    where: dict[str, str] = {}
    for source, docs in by_source.items():
        try:
            parsed = parse_definitions(docs, source)
        except DefinitionError as exc:
            lines.append(str(exc))
            problems += exc.problems
            continue
        for definition in parsed:
            if definition.job_id in where:
                lines.append(f"{source}: job_id {definition.job_id!r} is also defined in "
                             f"{where[definition.job_id]}")
                problems.append(DefinitionProblem(f"also defined in {where[definition.job_id]}",
                                                  definition.job_id, "job_id", source))
            where[definition.job_id] = source
            definitions.append(definition)
    if lines:
        raise DefinitionError("\n".join(lines), problems)
    if not definitions:
        raise DefinitionError(f"{', '.join(files)}: no definitions found")
    return definitions


def check_calendars(new: list[JobDefinition], calendars: Mapping[str, Calendar]) -> None:
    """Refuse a definition that names a calendar `calendars` (the live ones) does not hold,
    or moves fires by days (NEXT_DAY, PREVIOUS_DAY) in another timezone than its calendar's."""
    problems = []
    for d in new:
        if d.calendar is None:
            continue
        found = calendars.get(d.calendar)
        if found is None:
            problems.append(f"job_id {d.job_id!r}: calendar: no calendar {d.calendar!r} "
                            "(apply it first: cronstream calendar apply -f FILE)")
        elif d.on_excluded != "SKIP" and found.timezone != d.timezone:
            problems.append(f"job_id {d.job_id!r}: on_excluded: {d.on_excluded} moves a fire to "
                            f"another day at the same wall-clock time, so the job's timezone "
                            f"({d.timezone}) must be its calendar's ({found.timezone})")
    if problems:
        raise DefinitionError("\n".join(problems))


def pool_record(pool: str, slots: int, description: str | None, by: str) -> Pool:
    """A Pool to publish, stamped now by `by`; DefinitionError naming the field at fault."""
    try:
        return Pool.from_dict({"pool": pool, "slots": slots, "description": description,
                               "created_by": by, "created_at": datetime.now(UTC)})
    except ValidationError as exc:
        raise DefinitionError(f"pool {pool!r}: {describe(exc)}", [
            DefinitionProblem(error["msg"].removeprefix("Value error, "),
                              field=".".join(str(p) for p in error["loc"]) or None)
            for error in exc.errors(include_url=False)]) from None


def check_pools(new: list[JobDefinition], pools: Mapping[str, Pool]) -> None:
    """Refuse a definition that names a pool `pools` (the live ones) does not hold, or
    takes more slots of it than it has (its executions would wait for ever)."""
    problems = []
    for d in new:
        if d.pool is None:
            continue
        found = pools.get(d.pool)
        if found is None:
            problems.append(f"job_id {d.job_id!r}: pool: no pool {d.pool!r} "
                            f"(create it first: cronstream pool set {d.pool} --slots N)")
        elif d.pool_slots > found.slots > 0:
            problems.append(f"job_id {d.job_id!r}: pool_slots: {d.pool_slots} is more than pool "
                            f"{d.pool!r} has ({found.slots}): its executions would never start")
    if problems:
        raise DefinitionError("\n".join(problems))


def check_dags(new: list[JobDefinition], existing: Mapping[str, JobDefinition]) -> None:
    """Refuse cycles and DEPENDENT jobs with several scheduled roots (docs/reference/semantics.md#dags)."""
    merged = {**existing, **{d.job_id: d for d in new}}

    def lookup(job_id: str) -> tuple[str, list[str]] | None:
        found = merged.get(job_id)
        return None if found is None else (found.type, list(found.depends_on))

    def downstream(job_id: str) -> list[str]:
        return [d.job_id for d in merged.values() if job_id in d.depends_on]

    problems = [DefinitionProblem(problem, d.job_id, "depends_on") for d in new
                if (problem := dag_problem(d.job_id, lookup, downstream)) is not None]
    if problems:
        raise DefinitionError("\n".join(f"job_id {p.job_id!r}: {p.reason}" for p in problems),
                              problems)


def document(definition: JobDefinition, *, keep: Callable[[str, Any], bool] | None = None,
             ) -> dict[str, Any]:
    """The plain (JSON-compatible) form of a definition in field order, without unset
    optional fields; unknown fields of a newer version are kept. `apply` reads it back
    as the same definition."""
    data = definition.model_dump(mode="json", exclude_none=True)
    if keep is not None:
        data = {k: v for k, v in data.items() if keep(k, v)}
    return data


def without_stamps(data: dict[str, Any], unless_in: Mapping[str, Any] | None = None,
                   ) -> dict[str, Any]:
    """`data` without the fields `apply` stamps, unless `unless_in` sets them."""
    return {k: v for k, v in data.items()
            if k not in STAMPED or (unless_in is not None and unless_in.get(k) is not None)}
