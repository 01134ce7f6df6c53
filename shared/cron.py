"""Cron expressions: parsing, validation and next-fire computation.

cronstream computes fire times itself rather than through croniter for two reasons:
the DST rule of the reference (a skipped wall-clock time fires once at the first instant after
the gap; a repeated one fires once) must hold exactly, and the scheduler's hot path
must not pay croniter's per-call parsing. An expression is compiled once into sorted
value tuples (`compiled`, cached: never on the hot path); `next_local` then jumps field by
field instead of scanning minutes.

Accepted syntax: 5 fields (minute hour day-of-month month day-of-week) or 6 with a
leading seconds field; `*`, `?` (day fields), lists `a,b`, ranges `a-b`, steps `*/n`,
`a-b/n`, `a/n`; month names JAN..DEC and day names SUN..SAT; day-of-week 7 = Sunday;
the macros @yearly @annually @monthly @weekly @daily @midnight @hourly. As in Vixie
cron, when both day fields are restricted a day matches if either matches.

And, as list elements (docs/decisions/0055):
- day of month: `L` (the last day), `L-n` (n days before it), `LW` (the last weekday),
  `nW` (the weekday nearest day n, never crossing the month: Quartz's rule; in a month
  shorter than n, nearest to its last day, as croniter);
- day of week: `nL` (the last weekday n of the month: `5L` the last Friday), `n#k` (the
  k-th weekday n: `1#2` the second Monday), names allowed (`FRI#3`, `FRIL`);
- every field: `H`, `H(a-b)`, `H/n`, `H(a-b)/n`: a value hashed from a seed (the job_id),
  Jenkins's forms and ranges (a bare `H` in the day of month draws from 1-28, in the
  day of week from 0-6), croniter's hash (CRC-32 of the seed, shifted by the field's
  index), so `croniter(expr, hash_id=job_id)` agrees wherever the ranges do.
"""

from __future__ import annotations

import calendar
import re
import zlib
from bisect import bisect_left
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

__all__ = ["CronError", "CronExpression", "compiled", "parse_cron", "uses_hash"]

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

SECOND, MINUTE, HOUR, DAY_OF_MONTH, MONTH, DAY_OF_WEEK = range(6)
# (name, low, high, names)
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("second", 0, 59, {}),
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
# croniter's index of each field in its hash (`(crc32 >> index) % range`): seconds last.
_HASH_INDEX = (5, 0, 1, 2, 3, 4)
# The range a bare `H` (or `H/n`) draws from: Jenkins keeps the day of month to 1-28 so
# that the job fires every month, and the day of week to 0-6 (7 is Sunday again).
_HASH_HIGH = {DAY_OF_MONTH: 28, DAY_OF_WEEK: 6}

_HASH = re.compile(r"^H(?:\((\d+)-(\d+)\))?(?:/(\d+))?$")
_HASH_TOKEN = re.compile(r"(?:^|[\s,])H(?=$|[\s,(/])")
_LAST_OFFSET = re.compile(r"^L(?:-(\d+))?$")
_NEAREST = re.compile(r"^(\d+)W$")
_NTH = re.compile(r"^(\w+?)#(\d+)$")
_LAST_WEEKDAY = re.compile(r"^(\w+?)L$")

# The longest a valid expression can go without firing is a Feb 29 that must also
# be a given weekday: 28 years. Searching further means the expression never fires.
_MAX_SEARCH_YEARS = 29
_ONE_SECOND = timedelta(seconds=1)
_ONE_DAY = timedelta(days=1)


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
    # The special day forms (empty for a plain expression, which keeps the fast path):
    last_offsets: frozenset[int] = frozenset()  # L (0), L-n (n)
    nearest: frozenset[int] = frozenset()       # nW
    last_weekday: bool = False                  # LW
    nth: frozenset[tuple[int, int]] = frozenset()  # (weekday, k) of weekday#k
    last_of: frozenset[int] = frozenset()       # weekdays of nL

    # -- matching -----------------------------------------------------------------

    def _day_matches(self, year: int, month: int, day: int) -> bool:
        weekday = (calendar.weekday(year, month, day) + 1) % 7
        dom_ok = day in self.days
        dow_ok = weekday in self.weekdays
        if not dom_ok and (self.last_offsets or self.nearest or self.last_weekday):
            dom_ok = self._special_dom(year, month, day)
        if not dow_ok and (self.nth or self.last_of):
            length = calendar.monthrange(year, month)[1]
            dow_ok = (weekday, (day - 1) // 7 + 1) in self.nth or (
                weekday in self.last_of and day + 7 > length)
        if self.dom_restricted and self.dow_restricted:
            return dom_ok or dow_ok
        if self.dom_restricted:
            return dom_ok
        if self.dow_restricted:
            return dow_ok
        return True

    def _special_dom(self, year: int, month: int, day: int) -> bool:
        length = calendar.monthrange(year, month)[1]
        if length - day in self.last_offsets:
            return True
        if self.last_weekday and day == _nearest_weekday(year, month, length, length):
            return True
        return any(day == _nearest_weekday(year, month, min(n, length), length)
                   for n in self.nearest)

    def matches_day(self, day: date) -> bool:
        """Whether the expression fires at some time of `day` (its day and month fields)."""
        return day.month in self.months and self._day_matches(day.year, day.month, day.day)

    def next_day(self, start: date) -> date | None:
        """The first day >= `start` on which the expression fires (None: never again)."""
        found = self.next_local(datetime.combine(start, time()))
        return None if found is None else found.date()

    def first_time_on(self, day: date, start: time) -> datetime | None:
        """The first naive wall-clock time of `day` at or after `start` allowed by the
        time fields (second, minute, hour), or None when none is left that day."""
        hour, minute, second = start.hour, start.minute, start.second
        while True:
            h = _ceil(self.hours, hour)
            if h is None:
                return None
            if h != hour:
                hour, minute, second = h, self.minutes[0], self.seconds[0]
                continue
            mi = _ceil(self.minutes, minute)
            if mi is None:
                hour, minute, second = hour + 1, self.minutes[0], self.seconds[0]
                continue
            if mi != minute:
                minute, second = mi, self.seconds[0]
                continue
            s = _ceil(self.seconds, second)
            if s is None:
                minute, second = minute + 1, self.seconds[0]
                continue
            return datetime.combine(day, time(hour, minute, s))

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


def _nearest_weekday(year: int, month: int, day: int, length: int) -> int:
    """The weekday (Mon-Fri) nearest `day` in its month, never crossing the month's
    bounds (Quartz: `1W` on a Saturday the 1st is Monday the 3rd; `31W` on a Sunday the
    31st is Friday the 29th)."""
    weekday = calendar.weekday(year, month, day)  # 0 = Monday
    if weekday == 5:  # Saturday: Friday, unless that is in the previous month
        return day - 1 if day > 1 else day + 2
    if weekday == 6:  # Sunday: Monday, unless that is in the next month
        return day + 1 if day < length else day - 2
    return day


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


# -- parsing ------------------------------------------------------------------------


@dataclass(slots=True)
class _Field:
    """One field as parsed: its plain values and the special forms found in it."""

    values: set[int]
    restricted: bool
    last_offsets: set[int]
    nearest: set[int]
    last_weekday: bool
    nth: set[tuple[int, int]]
    last_of: set[int]


def _parse_value(token: str, name: str, names: dict[str, int]) -> int:
    upper = token.upper()
    if upper in names:
        return names[upper]
    if not token.isdigit():
        raise CronError(f"{name} field: '{token}' is not a number" +
                        (" or a name" if names else ""))
    return int(token)


def _hashed(part: str, index: int, seed: str | None) -> range | None:
    """`H`, `H(a-b)`, `H/n`, `H(a-b)/n` as Jenkins reads them, or None for another part."""
    found = _HASH.match(part)
    if found is None:
        return None
    name, low, high, _ = _FIELDS[index]
    if seed is None:
        raise CronError(f"{name} field: 'H' is hashed from the job_id; none was given")
    a_text, b_text, step_text = found.groups()
    if a_text is not None:
        a, b = int(a_text), int(b_text)
        for v in (a, b):
            if not low <= v <= high:
                raise CronError(f"{name} field: {v} in '{part}' is outside {low}-{high}")
        if a > b:
            raise CronError(f"{name} field: range '{part}' runs backwards")
    else:
        a, b = low, _HASH_HIGH.get(index, high)
    crc = (zlib.crc32(seed.encode()) & 0xFFFFFFFF) >> _HASH_INDEX[index]
    if step_text is None:
        value = crc % (b - a + 1) + a
        return range(value, value + 1)
    step = int(step_text)
    if step == 0:
        raise CronError(f"{name} field: step '0' must be a positive integer")
    return range(crc % min(step, b - a + 1) + a, b + 1, step)


def _parse_part(part: str, index: int, seed: str | None) -> range:
    """One element of a field's list: `*`, `n`, `a-b`, each with an optional `/step`."""
    hashed = _hashed(part, index, seed)
    if hashed is not None:
        return hashed
    name, low, high, names = _FIELDS[index]
    range_part, _, step_text = part.partition("/")
    step = 1
    if step_text:
        if not step_text.isdigit() or int(step_text) == 0:
            raise CronError(f"{name} field: step '{step_text}' must be a positive integer")
        step = int(step_text)
    last = high if index != DAY_OF_WEEK else 6  # 7 is Sunday again: written, never implied
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


def _special_dom(part: str, field: _Field) -> bool:
    """`L`, `L-n`, `LW`, `nW` into `field`; False for any other part."""
    upper = part.upper()
    if upper == "LW":
        field.last_weekday = True
        return True
    found = _LAST_OFFSET.match(upper)
    if found is not None:
        offset = int(found.group(1) or 0)
        if offset > 30:
            raise CronError(f"day of month field: '{part}' reaches before the 1st (L-0 to L-30)")
        field.last_offsets.add(offset)
        return True
    found = _NEAREST.match(upper)
    if found is not None:
        day = int(found.group(1))
        if not 1 <= day <= 31:
            raise CronError(f"day of month field: {day} in '{part}' is outside 1-31")
        field.nearest.add(day)
        return True
    if "W" in upper or "L" in upper:
        raise CronError(f"day of month field: '{part}' is not L, L-n, LW or nW "
                        "(W takes one day, not a range or a step)")
    return False


def _weekday(token: str, part: str) -> int:
    value = _parse_value(token, "day of week", _DAYS)
    if not 0 <= value <= 7:
        raise CronError(f"day of week field: {value} in '{part}' is outside 0-7")
    return value % 7


def _special_dow(part: str, field: _Field) -> bool:
    """`n#k` and `nL` (names for n allowed) into `field`; False for any other part."""
    upper = part.upper()
    found = _NTH.match(upper)
    if found is not None:
        k = int(found.group(2))
        if not 1 <= k <= 5:
            raise CronError(f"day of week field: '{part}': the occurrence after '#' must be 1-5")
        field.nth.add((_weekday(found.group(1), part), k))
        return True
    if upper == "L":
        raise CronError("day of week field: 'L' alone is ambiguous; write nL for the last "
                        "weekday n of the month (5L: the last Friday) or 6 for Saturday")
    found = _LAST_WEEKDAY.match(upper)
    if found is not None:
        field.last_of.add(_weekday(found.group(1), part))
        return True
    if "#" in upper:
        raise CronError(f"day of week field: '{part}' is not n#k (1#2: the second Monday)")
    return False


def _parse_field(text: str, index: int, seed: str | None) -> _Field:
    name = _FIELDS[index][0]
    field = _Field(set(), True, set(), set(), False, set(), set())
    if text in ("*", "?"):
        if text == "?" and index not in (DAY_OF_MONTH, DAY_OF_WEEK):
            raise CronError(f"{name} field: '?' is only allowed in the day fields")
        field.restricted = False
    for part in text.split(","):
        if not part:
            raise CronError(f"{name} field: empty list element in '{text}'")
        if index == DAY_OF_MONTH and _special_dom(part, field):
            continue
        if index == DAY_OF_WEEK and _special_dow(part, field):
            continue
        field.values.update(_parse_part(part, index, seed))
    if index == DAY_OF_WEEK and 7 in field.values:
        field.values.discard(7)
        field.values.add(0)
    if not field.values and index not in (DAY_OF_MONTH, DAY_OF_WEEK):
        raise CronError(f"{name} field: '{text}' allows no value")
    return field


def uses_hash(expression: str) -> bool:
    """Whether `expression` has an `H` (its values then depend on the job_id)."""
    return _HASH_TOKEN.search(expression) is not None


@lru_cache(maxsize=65536)
def _compiled(expression: str, seed: str | None) -> CronExpression:
    return parse_cron(expression, seed)


def compiled(expression: str, seed: str | None = None) -> CronExpression:
    """`parse_cron`, cached: each expression is parsed once per process (and once per
    job_id only when it has an `H`), so that neither the validation of a definition nor
    a fire pays for parsing."""
    return _compiled(expression, seed if uses_hash(expression) else None)


def parse_cron(expression: str, seed: str | None = None) -> CronExpression:
    """Compile a cron expression, raising CronError that names the offending field.
    `seed` (the job_id) is what an `H` is hashed from."""
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
    seconds, minutes, hours, dom, months, dow = (_parse_field(p, i, seed) for i, p in enumerate(parts))
    expr = CronExpression(
        source=source,
        seconds=tuple(sorted(seconds.values)),
        minutes=tuple(sorted(minutes.values)),
        hours=tuple(sorted(hours.values)),
        days=tuple(sorted(dom.values)),
        months=tuple(sorted(months.values)),
        weekdays=frozenset(dow.values),
        dom_restricted=dom.restricted,
        dow_restricted=dow.restricted,
        last_offsets=frozenset(dom.last_offsets),
        nearest=frozenset(dom.nearest),
        last_weekday=dom.last_weekday,
        nth=frozenset(dow.nth),
        last_of=frozenset(dow.last_of),
    )
    _check_fires(expr)
    return expr


def _check_fires(expr: CronExpression) -> None:
    """Refuse an expression whose day fields never meet its months."""
    plain = not (expr.last_offsets or expr.nearest or expr.last_weekday or expr.nth or expr.last_of)
    if plain:
        if expr.dom_restricted and not expr.dow_restricted:
            longest = max(calendar.monthrange(2024, m)[1] for m in expr.months)  # 2024: leap year
            if min(expr.days) > longest:
                raise CronError(f"never fires: day of month {min(expr.days)} does not occur "
                                "in the chosen months")
        return
    # Special forms: whether a day of a 28-year cycle (every weekday on every date, leap
    # years included) matches, by looking.
    day = date(2001, 1, 1)
    while day.year < 2001 + 28:
        if expr.matches_day(day):
            return
        day += _ONE_DAY
    raise CronError("never fires: no day matches the day fields in the chosen months")
