"""Cron expressions: parsing, validation and next-fire computation.

cronstream computes fire times itself rather than through croniter for two reasons:
the DST rule of the reference (a skipped wall-clock time fires once at the first instant after
the gap; a repeated one fires once) must hold exactly, and the scheduler's hot path
must not pay croniter's per-call parsing. An expression is compiled once into sorted
value tuples; `next_local` then jumps field by field instead of scanning minutes.

Accepted syntax: 5 fields (minute hour day-of-month month day-of-week) or 6 with a
leading seconds field; `*`, `?` (day fields), lists `a,b`, ranges `a-b`, steps `*/n`,
`a-b/n`, `a/n`; month names JAN..DEC and day names SUN..SAT; day-of-week 7 = Sunday;
the macros @yearly @annually @monthly @weekly @daily @midnight @hourly. As in Vixie
cron, when both day fields are restricted a day matches if either matches.
"""

from __future__ import annotations

import calendar
from bisect import bisect_left
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

__all__ = ["CronError", "CronExpression", "parse_cron"]

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_MONTHS = {m.upper(): i for i, m in enumerate(calendar.month_abbr) if m}
_DAYS = {"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6}

# (name, low, high, names)
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("second", 0, 59, {}),
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 7, _DAYS),
)

# The longest a valid expression can go without firing is a Feb 29 that must also
# be a given weekday: 28 years. Searching further means the expression never fires.
_MAX_SEARCH_YEARS = 29
_ONE_SECOND = timedelta(seconds=1)


class CronError(ValueError):
    """The cron expression is invalid; the message says which field and why."""


@dataclass(frozen=True, slots=True)
class CronExpression:
    source: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: frozenset[int]  # 0 = Sunday
    dom_restricted: bool
    dow_restricted: bool

    # -- matching -----------------------------------------------------------------

    def _day_matches(self, year: int, month: int, day: int) -> bool:
        dom_ok = day in self.days
        dow_ok = (calendar.weekday(year, month, day) + 1) % 7 in self.weekdays
        if self.dom_restricted and self.dow_restricted:
            return dom_ok or dow_ok
        if self.dom_restricted:
            return dom_ok
        if self.dow_restricted:
            return dow_ok
        return True

    def next_local(self, start: datetime) -> datetime | None:
        """First naive wall-clock time >= `start` (whole seconds) matching the expression.

        Each field that does not match jumps to its next allowed value, resetting the
        smaller fields; overflow (minute 60, hour 24, day 32, month 13) carries into the
        next larger field on the following pass. Returns None when nothing matches
        within the search horizon, which for a validated expression never happens.
        """
        if start.microsecond:
            start = start.replace(microsecond=0) + _ONE_SECOND
        year, month, day = start.year, start.month, start.day
        hour, minute, second = start.hour, start.minute, start.second
        first_h, first_m, first_s = self.hours[0], self.minutes[0], self.seconds[0]
        limit = year + _MAX_SEARCH_YEARS
        while year <= limit:
            m = _ceil(self.months, month)
            if m != month:
                year, month = (year, m) if m is not None else (year + 1, self.months[0])
                day, hour, minute, second = 1, first_h, first_m, first_s
                continue
            if day > calendar.monthrange(year, month)[1]:
                month, day, hour, minute, second = month + 1, 1, first_h, first_m, first_s
                continue
            if not self._day_matches(year, month, day):
                day, hour, minute, second = day + 1, first_h, first_m, first_s
                continue
            h = _ceil(self.hours, hour)
            if h != hour:
                if h is None:
                    day, hour = day + 1, first_h
                else:
                    hour = h
                minute, second = first_m, first_s
                continue
            mi = _ceil(self.minutes, minute)
            if mi != minute:
                hour, minute = (hour, mi) if mi is not None else (hour + 1, first_m)
                second = first_s
                continue
            s = _ceil(self.seconds, second)
            if s != second:
                minute, second = (minute, s) if s is not None else (minute + 1, first_s)
                continue
            return datetime(year, month, day, hour, minute, second)
        return None

    def next_after(self, after: datetime, tz: ZoneInfo) -> datetime | None:
        """First fire instant strictly after `after` (aware), as an aware UTC datetime.

        DST, by the rule of docs/reference/semantics.md#dst:
        - a wall-clock time skipped by a spring-forward gap fires once, at the first
          instant after the gap (several skipped times collapse into that one fire);
        - a wall-clock time repeated by a fall-back fires once, at its first occurrence.
        Worked example, America/New_York, `*/15 * * * *`, 2026-03-08: 01:45 EST fires,
        then 02:00, 02:15, 02:30, 02:45 do not exist and all resolve to 03:00 EDT
        (07:00Z), which is also the 03:00 fire: one fire at 07:00Z, then 03:15 EDT.
        """
        after_utc = after.astimezone(UTC)
        if tz.key == "UTC":
            start = after_utc.replace(tzinfo=None)
            if not start.microsecond:
                start += _ONE_SECOND  # strictly after; next_local rounds fractions up
            naive = self.next_local(start)
            return None if naive is None else naive.replace(tzinfo=UTC)
        candidate = after_utc.astimezone(tz).replace(tzinfo=None, fold=0)
        while True:
            naive = self.next_local(candidate)
            if naive is None:
                return None
            instant = resolve_local(naive, tz)
            if instant > after_utc:
                return instant
            candidate = naive + _ONE_SECOND


def _ceil(values: tuple[int, ...], value: int) -> int | None:
    """The smallest allowed value >= `value`, or None when it lies past the last one."""
    i = bisect_left(values, value)
    return values[i] if i < len(values) else None


def resolve_local(naive: datetime, tz: ZoneInfo) -> datetime:
    """The UTC instant a naive wall-clock time fires at in `tz` (see `next_after`)."""
    first = naive.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) == naive:
        return first  # exists; fold=0 is the first occurrence of a repeated time
    # In a gap: fold=0 applies the offset before the transition, fold=1 the one after,
    # so the transition instant lies between the two readings. Find it to the second.
    lo = naive.replace(tzinfo=tz, fold=1).astimezone(UTC)
    hi = first
    if lo > hi:
        lo, hi = hi, lo
    after_offset = hi.astimezone(tz).utcoffset()
    while hi - lo > _ONE_SECOND:
        mid = lo + (hi - lo) / 2
        mid = mid.replace(microsecond=0)
        if mid.astimezone(tz).utcoffset() == after_offset:
            hi = mid
        else:
            lo = mid
    return hi


def _parse_value(token: str, name: str, names: dict[str, int]) -> int:
    upper = token.upper()
    if upper in names:
        return names[upper]
    if not token.isdigit():
        raise CronError(f"{name} field: '{token}' is not a number" +
                        (" or a name" if names else ""))
    return int(token)


def _parse_part(part: str, index: int) -> range:
    """One element of a field's list: `*`, `n`, `a-b`, each with an optional `/step`."""
    name, low, high, names = _FIELDS[index]
    range_part, _, step_text = part.partition("/")
    step = 1
    if step_text:
        if not step_text.isdigit() or int(step_text) == 0:
            raise CronError(f"{name} field: step '{step_text}' must be a positive integer")
        step = int(step_text)
    last = high if name != "day-of-week" else 6  # 7 is Sunday again: written, never implied
    if range_part in ("*", "?"):
        start, end = low, last
    elif "-" in range_part:
        a, _, b = range_part.partition("-")
        start, end = _parse_value(a, name, names), _parse_value(b, name, names)
        if start > end:
            raise CronError(f"{name} field: range '{range_part}' runs backwards")
    else:
        start = _parse_value(range_part, name, names)
        end = last if step_text else start
    for v in (start, end):
        if not low <= v <= high:
            raise CronError(f"{name} field: {v} is outside {low}-{high}")
    return range(start, end + 1, step)


def _parse_field(text: str, index: int) -> tuple[tuple[int, ...], bool]:
    name = _FIELDS[index][0]
    values: set[int] = set()
    restricted = True
    if text in ("*", "?"):
        if text == "?" and name not in ("day-of-month", "day-of-week"):
            raise CronError(f"{name} field: '?' is only allowed in the day fields")
        restricted = False
    for part in text.split(","):
        if not part:
            raise CronError(f"{name} field: empty list element in '{text}'")
        values.update(_parse_part(part, index))
    if name == "day-of-week" and 7 in values:
        values.discard(7)
        values.add(0)
    return tuple(sorted(values)), restricted


def parse_cron(expression: str) -> CronExpression:
    """Compile a cron expression, raising CronError that names the offending field."""
    if not isinstance(expression, str) or not expression.strip():
        raise CronError("empty cron expression")
    source = expression.strip()
    text = MACROS.get(source.lower(), source)
    if text.startswith("@"):
        raise CronError(f"unknown macro '{source}'; known: {', '.join(sorted(MACROS))}")
    parts = text.split()
    if len(parts) == 5:
        parts = ["0", *parts]
    elif len(parts) != 6:
        raise CronError(
            f"expected 5 fields (minute hour day-of-month month day-of-week) or 6 with a "
            f"leading seconds field, got {len(parts)}"
        )
    fields = [_parse_field(p, i) for i, p in enumerate(parts)]
    (seconds, _), (minutes, _), (hours, _), (days, dom_r), (months, _), (dows, dow_r) = fields
    expr = CronExpression(
        source=source,
        seconds=seconds,
        minutes=minutes,
        hours=hours,
        days=days,
        months=months,
        weekdays=frozenset(dows),
        dom_restricted=dom_r,
        dow_restricted=dow_r,
    )
    if dom_r and not dow_r:
        longest = max(calendar.monthrange(2024, m)[1] for m in months)  # 2024: leap year
        if min(days) > longest:
            raise CronError(
                f"never fires: day-of-month {min(days)} does not occur in the chosen months"
            )
    return expr
