"""A calendar's days: which it excludes, and why (docs/decisions/0055).

Pure, no I/O. `resolve(calendar)` builds the evaluation of one calendar version once
(cached by its content): its listed dates as sets, and the public holidays of the years
asked for, computed by the `holidays` package the first time a day of that year is asked
about and kept. `excluded(day)` then answers with the reason, or None:

1. a date in `include_dates` is never excluded (it overrides everything below);
2. a public holiday of `holidays` (observed days included): "holiday: Christmas Day (US)";
3. a date in `exclude_dates`: "excluded date";
4. a day of `exclude_weekdays`: "weekend: SAT" (Saturday, Sunday), "excluded weekday: MON".

Holiday names are in English where the package has them, else in the country's language.
Every scheduler must run the same `holidays` release to agree on a holiday (pin it).
"""

from __future__ import annotations

import threading
from datetime import date
from functools import lru_cache
from zoneinfo import ZoneInfo

from cronstream.shared.records import WEEKDAYS, Calendar, zone_named

__all__ = ["CalendarMissingError", "ResolvedCalendar", "resolve"]

# How far a search for an included day goes before it gives up (a calendar that excludes
# every day for that long: the job then has no fire).
MAX_EXCLUDED_DAYS = 3660


class CalendarMissingError(LookupError):
    """A definition names a calendar that was not given (not applied yet, or deleted):
    its fires cannot be computed. The scheduler holds such a job waiting (no fire, not
    suspended) until the calendar is applied (services/scheduler/calendars.py)."""


class ResolvedCalendar:
    """One calendar version, ready to answer `excluded(day)` (thread-safe)."""

    __slots__ = ("_exclude", "_holidays", "_include", "_lock", "_weekdays", "calendar",
                 "calendar_id", "zone")

    def __init__(self, calendar: Calendar) -> None:
        self.calendar = calendar
        self.calendar_id = calendar.calendar_id
        self.zone: ZoneInfo = zone_named(calendar.timezone)
        self._include = frozenset(calendar.include_dates)
        self._exclude = frozenset(calendar.exclude_dates)
        self._weekdays = frozenset(WEEKDAYS.index(w) for w in calendar.exclude_weekdays)
        self._holidays: dict[int, dict[date, str]] = {}
        self._lock = threading.Lock()

    def excluded(self, day: date) -> str | None:
        """Why the calendar excludes `day`, or None when it is included."""
        if day in self._include:
            return None
        if self.calendar.holidays is not None:
            name = self._holidays_of(day.year).get(day)
            if name is not None:
                return f"holiday: {name} ({self._region()})"
        if day in self._exclude:
            return "excluded date"
        weekday = day.weekday()
        if weekday in self._weekdays:
            return f"{'weekend' if weekday >= 5 else 'excluded weekday'}: {WEEKDAYS[weekday]}"
        return None

    def included(self, day: date) -> bool:
        return self.excluded(day) is None

    def _region(self) -> str:
        source = self.calendar.holidays
        assert source is not None
        return source.country + (f"-{source.subdivision}" if source.subdivision else "")

    def _holidays_of(self, year: int) -> dict[date, str]:
        found = self._holidays.get(year)
        if found is None:
            with self._lock:
                found = self._holidays.get(year)
                if found is None:
                    found = self._holidays[year] = _holidays(self.calendar, year)
        return found


def _holidays(calendar: Calendar, year: int) -> dict[date, str]:
    import holidays  # loaded once a calendar with holidays is evaluated

    source = calendar.holidays
    assert source is not None
    language = None
    if "en_US" in holidays.country_holidays(source.country).supported_languages:
        language = "en_US"
    found = holidays.country_holidays(source.country, subdiv=source.subdivision, years=year,
                                      observed=True, language=language)
    return {day: str(name) for day, name in found.items() if day.year == year}


@lru_cache(maxsize=256)
def _resolved(document: str) -> ResolvedCalendar:
    return ResolvedCalendar(Calendar.model_validate_json(document))


def resolve(calendar: Calendar) -> ResolvedCalendar:
    """The evaluation of `calendar`, built once per version (by content) and kept."""
    return _resolved(calendar.model_dump_json())
