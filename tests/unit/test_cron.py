"""The cron engine: syntax, errors that name the field, croniter as an oracle, DST."""

from __future__ import annotations

import itertools
import random
import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from cronstream.shared.cron import CronError, parse_cron

UTCZ = ZoneInfo("UTC")
NEW_YORK = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")

ORACLE_EXPRESSIONS = [
    "* * * * *", "*/5 * * * *", "0 * * * *", "30 2 * * *", "0 0 1 * *", "15 10 * * 1-5",
    "0 0 * * 0", "0 0 29 2 *", "5,10,55 */3 * * *", "0 9-17/2 * * mon-fri", "0 0 13 * 5",
    "0 0 1,15 * 3", "59 23 31 12 *", "0 12 * jan,jul *", "*/7 1-4 */2 * *"
]


def test_five_and_six_field_forms() -> None:
    every_10s = parse_cron("*/10 * * * * *")
    assert every_10s.seconds == (0, 10, 20, 30, 40, 50)
    five = parse_cron("*/10 * * * *")
    assert five.seconds == (0,) and five.minutes == (0, 10, 20, 30, 40, 50)


@pytest.mark.parametrize(("macro", "expanded"), [
    ("@yearly", "0 0 1 1 *"), ("@annually", "0 0 1 1 *"), ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"), ("@daily", "0 0 * * *"), ("@hourly", "0 * * * *"),
])
def test_macros(macro: str, expanded: str) -> None:
    a, b = parse_cron(macro), parse_cron(expanded)
    assert (a.seconds, a.minutes, a.hours, a.days, a.months, a.weekdays) == \
           (b.seconds, b.minutes, b.hours, b.days, b.months, b.weekdays)


def test_names_and_sunday_as_seven() -> None:
    expr = parse_cron("0 0 * JAN,Dec sun,7")
    assert expr.months == (1, 12)
    assert expr.weekdays == frozenset({0})


@pytest.mark.parametrize(("text", "needle"), [
    ("", "empty"),
    ("* * * *", "expected 5 fields"),
    ("61 * * * *", "minute field: 61 is outside 0-59"),
    ("* 24 * * *", "hour field: 24"),
    ("* * 0 * *", "day of month field: 0"),
    ("* * * 13 *", "month field: 13"),
    ("* * * * 8", "day of week field: 8"),
    ("*/0 * * * *", "step '0'"),
    ("5-1 * * * *", "runs backwards"),
    ("a * * * *", "minute field: 'a' is not a number"),
    ("* * * foo *", "month field: 'foo' is not a number or a name"),
    ("0 0 30 2 *", "never fires"),
    ("@fortnightly", "unknown macro"),
    ("? * * * *", "only allowed in the day fields"),
])
def test_errors_name_the_field(text: str, needle: str) -> None:
    with pytest.raises(CronError, match=needle.replace("*", r"\*").replace("?", r"\?")):
        parse_cron(text)


@pytest.mark.parametrize("expression", ORACLE_EXPRESSIONS)
def test_agrees_with_croniter_in_utc(expression: str) -> None:
    ours = parse_cron(expression)
    rng = random.Random(expression)
    for _ in range(40):
        start = datetime(2020, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randrange(10 * 365 * 86400))
        expected = croniter(expression, start).get_next(datetime)
        assert ours.next_after(start, UTCZ) == expected, (expression, start)


def test_six_fields_agree_with_croniter_seconds_first() -> None:
    for expression in ("*/10 * * * * *", "5 */2 * * * *", "0,30 0 12 * * mon"):
        ours = parse_cron(expression)
        t = datetime(2026, 5, 17, 11, 59, 58, tzinfo=UTC)
        oracle = croniter(expression, t, second_at_beginning=True)
        for _ in range(20):
            expected = oracle.get_next(datetime)
            found = ours.next_after(t, UTCZ)
            assert found == expected
            t = expected


def test_next_is_strictly_after() -> None:
    expr = parse_cron("0 * * * *")
    t = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    assert expr.next_after(t, UTCZ) == datetime(2026, 1, 1, 11, 0, tzinfo=UTC)
    assert expr.next_after(t - timedelta(microseconds=1), UTCZ) == t


def fires(expression: str, tz: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
    expr, t = parse_cron(expression), start
    out: list[datetime] = []
    while True:
        found = expr.next_after(t, tz)
        if found is None or found > end:
            return out
        out.append(found)
        t = found


def local(times: list[datetime], tz: ZoneInfo) -> list[str]:
    return [t.astimezone(tz).strftime("%m-%d %H:%M %Z") for t in times]


# America/New_York: spring forward 2026-03-08 02:00 EST -> 03:00 EDT (07:00Z);
# fall back 2026-11-01 02:00 EDT -> 01:00 EST (06:00Z).
SPRING_NY = (datetime(2026, 3, 7, 12, tzinfo=UTC), datetime(2026, 3, 9, 12, tzinfo=UTC))
FALL_NY = (datetime(2026, 10, 31, 12, tzinfo=UTC), datetime(2026, 11, 2, 12, tzinfo=UTC))
# Europe/Berlin: 2026-03-29 02:00 CET -> 03:00 CEST (01:00Z); 2026-10-25 03:00 CEST -> 02:00 CET.
SPRING_BERLIN = (datetime(2026, 3, 28, 12, tzinfo=UTC), datetime(2026, 3, 30, 12, tzinfo=UTC))
FALL_BERLIN = (datetime(2026, 10, 24, 12, tzinfo=UTC), datetime(2026, 10, 26, 12, tzinfo=UTC))


def test_new_york_spring_forward_skipped_time_fires_once_after_the_gap() -> None:
    assert local(fires("0 2 * * *", NEW_YORK, *SPRING_NY), NEW_YORK) == [
        "03-08 03:00 EDT", "03-09 02:00 EDT"]
    assert local(fires("30 1 * * *", NEW_YORK, *SPRING_NY), NEW_YORK) == [
        "03-08 01:30 EST", "03-09 01:30 EDT"]


def test_new_york_spring_forward_every_15_minutes_collapses_the_gap_into_one_fire() -> None:
    got = fires("*/15 * * * *", NEW_YORK, datetime(2026, 3, 8, 6, 30, tzinfo=UTC),
                datetime(2026, 3, 8, 7, 30, tzinfo=UTC))
    assert local(got, NEW_YORK) == ["03-08 01:45 EST", "03-08 03:00 EDT", "03-08 03:15 EDT",
                                    "03-08 03:30 EDT"]
    assert len(set(got)) == len(got)


def test_new_york_fall_back_repeated_time_fires_once() -> None:
    assert local(fires("30 1 * * *", NEW_YORK, *FALL_NY), NEW_YORK) == [
        "11-01 01:30 EDT", "11-02 01:30 EST"]
    assert local(fires("0 2 * * *", NEW_YORK, *FALL_NY), NEW_YORK) == [
        "11-01 02:00 EST", "11-02 02:00 EST"]
    quarter = fires("*/15 * * * *", NEW_YORK, datetime(2026, 11, 1, 4, 50, tzinfo=UTC),
                    datetime(2026, 11, 1, 7, 20, tzinfo=UTC))
    # 01:00-01:45 happen twice in real time but fire only at their first occurrence.
    assert local(quarter, NEW_YORK) == [
        "11-01 01:00 EDT", "11-01 01:15 EDT", "11-01 01:30 EDT", "11-01 01:45 EDT",
        "11-01 02:00 EST", "11-01 02:15 EST"]


def test_berlin_both_transitions() -> None:
    assert local(fires("30 2 * * *", BERLIN, *SPRING_BERLIN), BERLIN) == [
        "03-29 03:00 CEST", "03-30 02:30 CEST"]
    assert local(fires("30 2 * * *", BERLIN, *FALL_BERLIN), BERLIN) == [
        "10-25 02:30 CEST", "10-26 02:30 CET"]
    assert local(fires("0 2 * * *", BERLIN, *SPRING_BERLIN), BERLIN) == [
        "03-29 03:00 CEST", "03-30 02:00 CEST"]
    assert local(fires("30 1 * * *", BERLIN, *SPRING_BERLIN), BERLIN) == [
        "03-29 01:30 CET", "03-30 01:30 CEST"]
    quarter = fires("*/15 * * * *", BERLIN, datetime(2026, 3, 29, 0, 40, tzinfo=UTC),
                    datetime(2026, 3, 29, 1, 20, tzinfo=UTC))
    assert local(quarter, BERLIN) == ["03-29 01:45 CET", "03-29 03:00 CEST", "03-29 03:15 CEST"]


def test_every_second_is_dense_and_monotonic_across_a_transition() -> None:
    got = fires("* * * * * *", NEW_YORK, datetime(2026, 3, 8, 6, 59, 57, tzinfo=UTC),
                datetime(2026, 3, 8, 7, 0, 2, tzinfo=UTC))
    assert [t.second for t in got] == [58, 59, 0, 1, 2]


# -- L, W, #, H (docs/decisions/0055) ----------------------------------------------------


def days(expression: str, start: datetime, count: int, seed: str | None = None) -> list[str]:
    """The next `count` fire days in UTC, as YYYY-MM-DD Dow."""
    expr, t, out = parse_cron(expression, seed), start, []
    for _ in range(count):
        found = expr.next_after(t, UTCZ)
        assert found is not None
        out.append(found.strftime("%Y-%m-%d %a"))
        t = found
    return out


JAN_2026 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("expression", "start", "expected"), [
    # L: the last day, leap years included (2100 is not one).
    ("0 0 L * *", JAN_2026, ["2026-01-31 Sat", "2026-02-28 Sat", "2026-03-31 Tue", "2026-04-30 Thu"]),
    ("0 0 L 2 *", datetime(2023, 6, 1, tzinfo=UTC), ["2024-02-29 Thu", "2025-02-28 Fri",
                                                       "2026-02-28 Sat", "2027-02-28 Sun", "2028-02-29 Tue"]),
    ("0 0 L 2 *", datetime(2099, 6, 1, tzinfo=UTC), ["2100-02-28 Sun", "2101-02-28 Mon"]),
    # L-n: n days before the last.
    ("0 0 L-3 * *", datetime(2024, 1, 1, tzinfo=UTC), ["2024-01-28 Sun", "2024-02-26 Mon", "2024-03-28 Thu"]),
    ("0 0 L-30 * *", JAN_2026 - timedelta(seconds=1), ["2026-01-01 Thu", "2026-03-01 Sun", "2026-05-01 Fri"]),
    # nW, Quartz's rule: the nearest weekday, never crossing the month. 2026-08-01 is a
    # Saturday: 1W is Monday the 3rd, not Friday July 31st. 2026-08-15 is a Saturday:
    # Friday the 14th; 2026-11-15 a Sunday: Monday the 16th.
    ("0 0 1W 8 *", JAN_2026, ["2026-08-03 Mon", "2027-08-02 Mon", "2028-08-01 Tue"]),
    ("0 0 15W 8,11 *", JAN_2026, ["2026-08-14 Fri", "2026-11-16 Mon", "2027-08-16 Mon"]),
    # 31W: 2026-05-31 is a Sunday (Friday the 29th, not Monday June 1st); in a shorter month
    # the weekday nearest its last day (as croniter): 2026-02-28 is a Saturday.
    ("0 0 31W 2,5 *", JAN_2026, ["2026-02-27 Fri", "2026-05-29 Fri", "2027-02-26 Fri"]),
    # LW: the last weekday.
    ("0 0 LW * *", JAN_2026, ["2026-01-30 Fri", "2026-02-27 Fri", "2026-03-31 Tue", "2026-04-30 Thu",
                              "2026-05-29 Fri"]),
    ("0 0 LW 2 *", datetime(2024, 1, 1, tzinfo=UTC), ["2024-02-29 Thu", "2025-02-28 Fri", "2026-02-27 Fri"]),
    # nL: the last weekday n of the month (5L: the last Friday), names too.
    ("0 0 * * 5L", JAN_2026, ["2026-01-30 Fri", "2026-02-27 Fri", "2026-03-27 Fri"]),
    ("0 0 * * FRIL", JAN_2026, ["2026-01-30 Fri", "2026-02-27 Fri", "2026-03-27 Fri"]),
    ("0 0 * 2 7L", datetime(2024, 1, 1, tzinfo=UTC), ["2024-02-25 Sun", "2025-02-23 Sun"]),
    # n#k: the k-th weekday n.
    ("0 0 * * 1#2", JAN_2026, ["2026-01-12 Mon", "2026-02-09 Mon", "2026-03-09 Mon"]),
    ("0 0 * * MON#1,FRI#3", JAN_2026, ["2026-01-05 Mon", "2026-01-16 Fri", "2026-02-02 Mon",
                                        "2026-02-20 Fri"]),
    ("0 0 * * fri#5", JAN_2026, ["2026-01-30 Fri", "2026-05-29 Fri", "2026-07-31 Fri", "2026-10-30 Fri"]),
    # A fifth Tuesday in February: only in a leap year whose February starts on a Tuesday.
    ("0 0 * 2 2#5", JAN_2026, ["2028-02-29 Tue", "2056-02-29 Tue"]),
    # Both day fields restricted: either matches (Vixie cron), with the new forms too.
    ("0 0 L * 1#1", JAN_2026, ["2026-01-05 Mon", "2026-01-31 Sat", "2026-02-02 Mon", "2026-02-28 Sat"]),
])
def test_special_day_forms(expression: str, start: datetime, expected: list[str]) -> None:
    assert days(expression, start, len(expected)) == expected


@pytest.mark.parametrize(("ours", "theirs"), [
    ("0 0 L * *", None), ("0 12 15W * *", None), ("0 0 1W * *", None), ("0 0 31W * *", None),
    ("30 6 * * 1#2", None), ("0 0 * * fri#5", None), ("0 0 * * 5L", "0 0 * * L5"),
    ("0 0 * * 0L", "0 0 * * L0"), ("*/20 9-17 L * *", None),
])
def test_special_forms_agree_with_croniter_in_utc(ours: str, theirs: str | None) -> None:
    expr = parse_cron(ours)
    rng = random.Random(ours)
    for _ in range(40):
        start = datetime(2000, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randrange(40 * 365 * 86400))
        oracle = croniter(theirs or ours, start)
        t: datetime | None = start
        for _ in range(3):
            assert t is not None
            t = expr.next_after(t, UTCZ)
            assert t == oracle.get_next(datetime), (ours, start)


@pytest.mark.parametrize("expression", [
    "H H * * *", "H/15 * * * *", "H(0-29)/10 H(9-17) * * *", "0 0 * H *", "0 0 * * H",
    "H H(0-7) * * 1-5", "0 0 H(1-28) * *", "H * * * * *",
])
def test_hash_agrees_with_croniter_hash_id(expression: str) -> None:
    """H is croniter's hash (CRC-32 of the job_id, shifted by the field's index)."""
    rng = random.Random(expression)
    for n in range(30):
        job_id = f"job-{n}-{rng.randrange(10**6)}"
        expr = parse_cron(expression, job_id)
        start = datetime(2010, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randrange(20 * 365 * 86400))
        oracle = croniter(expression, start, hash_id=job_id,
                          second_at_beginning=len(expression.split()) == 6)
        t: datetime | None = start
        for _ in range(3):
            assert t is not None
            t = expr.next_after(t, UTCZ)
            assert t == oracle.get_next(datetime), (expression, job_id, start)


def test_hash_is_stable_spread_and_jenkins_ranged() -> None:
    minutes = {parse_cron("H * * * *", f"job-{n}").minutes for n in range(300)}
    assert len(minutes) > 40, "spread over the hour"
    assert parse_cron("H H * * *", "nightly") == parse_cron("H H * * *", "nightly")
    assert parse_cron("H H * * *", "nightly").minutes == (6,) and parse_cron("H H * * *", "nightly").hours == (21,)
    # A bare H in the day of month draws from 1-28 (Jenkins): every month has the day.
    assert {d for n in range(500) for d in parse_cron("0 0 H * *", f"job-{n}").days} <= set(range(1, 29))
    assert {d for n in range(500) for d in parse_cron("0 0 * * H", f"job-{n}").weekdays} <= set(range(7))
    # H/n starts at a hashed offset below n, then every n; H(a-b)/n within a-b.
    for n in range(100):
        quarter = parse_cron("H/15 * * * *", f"job-{n}").minutes
        assert len(quarter) == 4 and quarter[0] < 15 and all(b - a == 15 for a, b in itertools.pairwise(quarter))
        half = parse_cron("H(0-29)/10 * * * *", f"job-{n}").minutes
        assert len(half) == 3 and half[0] < 10 and half[-1] <= 29


@pytest.mark.parametrize(("text", "needle"), [
    ("0 0 L-31 * *", "day of month field: 'L-31' reaches before the 1st"),
    ("0 0 32W * *", "day of month field: 32 in '32W' is outside 1-31"),
    ("0 0 1-5W * *", "day of month field: '1-5W' is not L, L-n, LW or nW"),
    ("0 0 * * 1#6", "day of week field: '1#6': the occurrence after '#' must be 1-5"),
    ("0 0 * * 8#1", "day of week field: 8 in '8#1' is outside 0-7"),
    ("0 0 * * L", "day of week field: 'L' alone is ambiguous"),
    ("0 0 * * XYZL", "day of week field: 'XYZ' is not a number or a name"),
    ("H * * * *", "minute field: 'H' is hashed from the job_id; none was given"),
    ("H(0-99) * * * *", "minute field: 99 in 'H(0-99)' is outside 0-59"),
    ("0 H(20-10) * * *", "hour field: range 'H(20-10)' runs backwards"),
    ("0 0 L 2 1#5", None),  # fires (the last of February): no error
    ("0 0 * 2 1#5", None),  # a fifth Monday of February: 2016, 2044, ...
    ("0 0 30W 2 *", None),  # the weekday nearest February's end
])
def test_special_form_errors_name_the_field(text: str, needle: str | None) -> None:
    if needle is None:
        parse_cron(text, "j")
        return
    with pytest.raises(CronError, match=re.escape(needle)):
        parse_cron(text, None if text.startswith("H *") else "j")


def test_a_special_form_that_never_fires_is_refused() -> None:
    with pytest.raises(CronError, match="never fires"):
        parse_cron("0 0 L-29 2 *")  # February has no day 29 days before its last... in 28-day years
    # ...but a leap February does: L-28 of 2024-02 is the 1st; L-29 does not exist in any.
    parse_cron("0 0 L-28 2 *")


def test_dst_new_york_second_sunday_of_march_at_a_skipped_time_fires_once_after_the_gap() -> None:
    # The US springs forward on the second Sunday of March: 02:30 never exists that day,
    # and fires at 03:00 EDT, once a year (2026-03-08, 2027-03-14).
    got = fires("30 2 * 3 0#2", NEW_YORK, datetime(2026, 1, 1, tzinfo=UTC), datetime(2027, 4, 1, tzinfo=UTC))
    assert local(got, NEW_YORK) == ["03-08 03:00 EDT", "03-14 03:00 EDT"]
    assert got[0] == datetime(2026, 3, 8, 7, 0, tzinfo=UTC)


def test_dst_new_york_first_sunday_of_november_at_a_repeated_time_fires_once() -> None:
    got = fires("30 1 * 11 0#1", NEW_YORK, datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 12, 31, tzinfo=UTC))
    assert local(got, NEW_YORK) == ["11-01 01:30 EDT"]


def test_dst_berlin_last_sunday_of_march_and_october() -> None:
    # Berlin changes on the last Sunday of March and of October: 0L.
    spring = fires("30 2 * 3 0L", BERLIN, datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 12, 31, tzinfo=UTC))
    assert local(spring, BERLIN) == ["03-29 03:00 CEST"]
    autumn = fires("30 2 * 10 0L", BERLIN, datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 12, 31, tzinfo=UTC))
    assert local(autumn, BERLIN) == ["10-25 02:30 CEST"] and autumn[0] == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)


def test_dst_hashed_minute_in_the_skipped_hour_fires_after_the_gap() -> None:
    expr = parse_cron("H 2 * * *", "nightly")
    minute = expr.minutes[0]
    got = fires("H 2 * * *".replace("H", str(minute), 1), NEW_YORK, *SPRING_NY)
    assert local(got, NEW_YORK) == ["03-08 03:00 EDT", f"03-09 02:{minute:02d} EDT"]
    t: datetime | None = SPRING_NY[0]
    found = []
    for _ in range(2):
        assert t is not None
        t = expr.next_after(t, NEW_YORK)
        found.append(t)
    assert found == got


def test_dst_last_weekday_and_nearest_weekday_in_berlin() -> None:
    # LW and 15W at a time the autumn change repeats: the first occurrence, once.
    got = fires("30 2 LW 10 *", BERLIN, datetime(2026, 1, 1, tzinfo=UTC), datetime(2027, 12, 31, tzinfo=UTC))
    assert local(got, BERLIN) == ["10-30 02:30 CET", "10-29 02:30 CEST"]


def test_compiled_is_cached_per_expression_and_per_job_only_with_h() -> None:
    from cronstream.shared.cron import compiled
    assert compiled("0 9 * * *", "a") is compiled("0 9 * * *", "b")
    assert compiled("H 9 * * *", "a") is compiled("H 9 * * *", "a")
    assert compiled("H 9 * * *", "a") is not compiled("H 9 * * *", "b")
    # THU is a name, not an H.
    assert compiled("0 9 * * THU", "a") is compiled("0 9 * * THU", "b")
