"""Calendars as people write them (`cronstream calendar apply -f`): YAML or JSON files.

A file holds one calendar, several YAML documents, a list, or `{calendars: [...]}`; each
is validated with `Calendar.from_dict` (dates as ISO strings or YAML dates, no other
coercion, an unknown field named as a typo) before anything is sent, every problem with
its place and field:

    calendars.yaml: calendar #1 (calendar_id 'us-business'): holidays: country: 'XX' is not ...
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cronstream.definitions import documents_of, files_in
from cronstream.errors import DefinitionError
from cronstream.shared.codec import describe
from cronstream.shared.records import Calendar

__all__ = ["CalendarLike", "load_calendar_sources", "parse_calendars"]

CalendarLike = Calendar | Mapping[str, Any]


def parse_calendars(documents: Iterable[Any], source: str = "input") -> list[Calendar]:
    """Validate raw calendars (mappings or Calendars); raise DefinitionError listing every
    problem with its place, or return them all."""
    items: list[Any] = []
    for doc in documents:
        if doc is None:
            continue
        inner = doc["calendars"] if isinstance(doc, Mapping) and set(doc) == {"calendars"} else doc
        items.extend(inner if isinstance(inner, list) else [inner])
    problems: list[str] = []
    calendars: list[Calendar] = []
    for index, item in enumerate(items, start=1):
        name = item.get("calendar_id") if isinstance(item, Mapping) else getattr(item, "calendar_id", None)
        where = f"{source}: calendar #{index}" + (f" (calendar_id {name!r})" if name else "")
        try:
            calendars.append(_one(item))
        except (TypeError, ValueError) as exc:
            problems.append(f"{where}: {exc}")
    seen: set[str] = set()
    for calendar in calendars:
        if calendar.calendar_id in seen:
            problems.append(f"{source}: calendar_id {calendar.calendar_id!r} is defined more than once")
        seen.add(calendar.calendar_id)
    if problems:
        raise DefinitionError("\n".join(problems))
    if not calendars:
        raise DefinitionError(f"{source}: no calendars found")
    return calendars


def _one(item: Any) -> Calendar:
    if isinstance(item, Calendar):
        if item.model_extra:
            raise ValueError(f"{', '.join(sorted(item.model_extra))}: unknown field(s) of Calendar")
        return item
    if not isinstance(item, Mapping):
        raise TypeError(f"expected a mapping of fields, got {type(item).__name__}")
    try:
        return Calendar.from_dict(item)
    except ValidationError as exc:
        raise ValueError(describe(exc)) from None


def load_calendar_sources(paths: Iterable[str]) -> list[Calendar]:
    """Calendars from files, directories and `-` (stdin), validated together: any problem
    anywhere refuses the whole set."""
    problems: list[str] = []
    calendars: list[Calendar] = []
    files = files_in(paths)
    if not files:
        raise DefinitionError("no calendar files found (.yaml, .yml, .json)")
    for name in files:
        try:
            source, docs = documents_of(name)
            calendars += parse_calendars(docs, source)
        except DefinitionError as exc:
            problems.append(str(exc))
    seen: dict[str, int] = {}
    for calendar in calendars:
        seen[calendar.calendar_id] = seen.get(calendar.calendar_id, 0) + 1
    problems += [f"calendar_id {c!r} is defined in more than one file" for c, n in seen.items() if n > 1]
    if problems:
        raise DefinitionError("\n".join(problems))
    return calendars


def read_calendar_file(path: str | Path) -> list[Calendar]:
    """The calendars of one file (`preview --calendar-file`)."""
    return load_calendar_sources([str(path)])
