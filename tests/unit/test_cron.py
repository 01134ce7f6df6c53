"""The cron engine: syntax, errors that name the field, croniter as an oracle, DST."""

from __future__ import annotations

import random
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
