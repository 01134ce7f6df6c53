"""The dashboard's pure parts: the Timeline agrees with the scheduler's clock, the DAG
layout, sessions and CSRF tokens, how values are shown, and the Schedulers page (read
from Kafka at most once a period, each shard's roles, escaped)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from starlette.requests import Request

from cronstream.errors import UnavailableError
from cronstream.services.scheduler.clock import Clock
from cronstream.shared.records import JobDefinition, Pool
from cronstream.shared.schedule import from_epoch_ms, to_epoch_ms
from cronstream.ui import graph, views
from cronstream.ui.app import template_env
from cronstream.ui.auth import CSRF_COOKIE, SESSION_COOKIE, Auth
from cronstream.ui.present import ago, clip, duration, local, spark, status_class, utc
from cronstream.ui.schedulers import (
    CACHE_SECONDS,
    Membership,
    SchedulerRoles,
    SchedulersUnavailable,
    shard_table,
)
from cronstream.ui.timeline import Window, load, missed_fires, project_row

T0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)


def definition(**fields: Any) -> JobDefinition:
    base = {"job_id": "j", "type": "INTERVAL", "interval_seconds": 10, "handler": "noop"}
    return JobDefinition(**{**base, **fields})


def clock_fires(d: JobDefinition, late_seconds: float) -> list[datetime]:
    clock = Clock()
    clock.apply_definition(d.job_id, d, d.to_json(), offset=0, observed_ms=to_epoch_ms(T0))
    plan = clock.plan(to_epoch_ms(T0 + timedelta(seconds=late_seconds)))
    return [from_epoch_ms(due.scheduled_ms) for due in plan.dues]


@pytest.mark.parametrize("policy", ["FIRE_ONCE", "FIRE_ALL", "SKIP"])
@pytest.mark.parametrize("late", [0, 3, 95, 1000])
def test_the_timeline_shows_missed_fires_as_the_scheduler_fires_them(policy: str, late: int) -> None:
    d = definition(misfire_policy=policy, misfire_grace_seconds=5)
    now = T0 + timedelta(seconds=late)
    shown = missed_fires(d, T0 - timedelta(seconds=10), now)  # the last fire was one step ago
    will_fire = [t for t, kind in shown if kind in ("due", "late")]
    assert will_fire == clock_fires(d, late)
    expected_missed = [T0 + timedelta(seconds=s) for s in range(0, late + 1, 10)]
    assert [t for t, _ in shown] == expected_missed, "every missed instant is shown"


def test_projection_follows_dst_from_the_firing_code() -> None:
    # 02:30 Europe/Berlin does not exist on 2026-03-29: it fires once, at 03:00 local (01:00Z).
    d = definition(type="CRON", interval_seconds=None, schedule="30 2 * * *", timezone="Europe/Berlin")
    start = datetime(2026, 3, 28, 0, 0, tzinfo=UTC)
    window = Window(start, start + timedelta(days=3), 72)
    row = project_row(d, enabled=True, last_fire=None, typical_seconds=None, now=start, window=window)
    assert [m.at for m in row.marks] == [datetime(2026, 3, 28, 1, 30, tzinfo=UTC),
                                         datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
                                         datetime(2026, 3, 30, 0, 30, tzinfo=UTC)]


def test_a_frequent_job_costs_one_mark_per_bucket_and_overlaps_are_flagged() -> None:
    d = definition(interval_seconds=1, concurrency_policy="FORBID")
    window = Window(T0, T0 + timedelta(hours=24), 240)
    row = project_row(d, enabled=True, last_fire=None, typical_seconds=5.0, now=T0, window=window)
    assert len(row.marks) == 240 and len({m.first for m in row.marks}) == 240
    assert row.overlaps and "FORBID will skip" in row.note
    assert load([row], 240) == [1] * 240
    paused = project_row(d, enabled=False, last_fire=None, typical_seconds=None, now=T0, window=window)
    assert paused.marks == [] and "paused" in paused.note
    limited = definition(interval_seconds=1, max_concurrent_runs=3)
    for typical, note in ((2.5, "runs overlap, at most 3 at once"),
                          (5.0, "runs outlast 3 intervals: max_concurrent_runs will skip fires")):
        row = project_row(limited, enabled=True, last_fire=None, typical_seconds=typical, now=T0,
                          window=window)
        assert row.overlaps and row.note == note


def test_dag_layout_columns_follow_the_longest_path() -> None:
    picture = graph.layout(["root", "a", "b", "join"],
                           [("root", "a"), ("root", "b"), ("a", "join"), ("b", "join"), ("root", "join")])
    columns = {name: node.column for name, node in picture.nodes.items()}
    assert columns == {"root": 0, "a": 1, "b": 1, "join": 2}
    assert len(picture.edges) == 5
    assert {(n.x, n.y) for n in picture.nodes.values()}.__len__() == 4, "no two nodes overlap"
    assert picture.width > 2 * graph.NODE_W and picture.height >= graph.NODE_H


def request(headers: dict[str, str] | None = None, cookies: dict[str, str] | None = None) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if cookies:
        raw.append((b"cookie", "; ".join(f"{k}={v}" for k, v in cookies.items()).encode()))
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw})


def test_sessions_and_csrf_tokens_cannot_be_forged() -> None:
    auth = Auth("t0ken", None, False, None)
    value = auth.session_value("alice")
    assert auth.identify(request(cookies={SESSION_COOKIE: value})).name == "alice"  # type: ignore[union-attr]
    forged = value.replace(value.split(".")[0], "Ym9i")  # "bob", same signature
    assert auth.identify(request(cookies={SESSION_COOKIE: forged})) is None
    expired = auth.session_value("alice", now=0)
    assert auth.identify(request(cookies={SESSION_COOKIE: expired})) is None
    assert Auth("other", None, False, None).identify(request(cookies={SESSION_COOKIE: value})) is None
    assert auth.identify(request({"Authorization": "Bearer t0ken"})).via == "bearer"  # type: ignore[union-attr]
    assert auth.identify(request({"Authorization": "Bearer nope"})) is None
    cookie = auth.new_csrf_cookie()
    browser = request(cookies={CSRF_COOKIE: cookie})
    anonymous = auth.csrf_token(browser)
    assert anonymous and auth.csrf_ok(browser, anonymous)
    assert not auth.csrf_ok(browser, auth.csrf_token(request(cookies={CSRF_COOKIE: auth.new_csrf_cookie()})))
    assert not auth.csrf_ok(browser, None) and not auth.csrf_ok(request(), anonymous)
    assert auth.csrf_token(request()) == "", "no cookie, nothing to bind a token to"
    assert not auth.csrf_ok(browser, "é" * 64), "a non-ASCII token is refused, not an error"
    assert not Auth(None, None, False, None).actions_enabled


def test_a_csrf_token_is_bound_to_the_session_or_pre_session_it_was_served_to() -> None:
    auth = Auth("t0ken-t0ken-t0ken", "X-Forwarded-User", False, None, token_login=True)
    cookie = auth.new_csrf_cookie()
    alice, alice_again, bob = (auth.session_value(n) for n in ("alice", "alice", "bob"))
    assert alice != alice_again, "each login is a session of its own"

    def served(session: str | None = None, user: str | None = None) -> Request:
        return request({"X-Forwarded-User": user} if user else {},
                       {CSRF_COOKIE: cookie, **({SESSION_COOKIE: session} if session else {})})

    tokens = {"anonymous": auth.csrf_token(served()), "alice": auth.csrf_token(served(alice)),
              "alice again": auth.csrf_token(served(alice_again)), "bob": auth.csrf_token(served(bob)),
              "dana": auth.csrf_token(served(user="dana")), "erin": auth.csrf_token(served(user="erin"))}
    assert len(set(tokens.values())) == len(tokens), "six subjects, six tokens"
    for who, token in tokens.items():
        assert auth.csrf_ok(served(alice), token) == (who == "alice"), who
        assert auth.csrf_ok(served(), token) == (who == "anonymous"), who
        assert auth.csrf_ok(served(user="dana"), token) == (who == "dana"), who
    # A session's token does not depend on the CSRF cookie beside it (a login replaces it).
    assert auth.csrf_ok(request(cookies={SESSION_COOKIE: alice}), tokens["alice"])
    # A proxy's user name may hold any separator: ("a|b", cookie) is not ("a", "b|" + cookie).
    split = request({"X-Forwarded-User": "a"}, {CSRF_COOKIE: "b|" + cookie})
    assert auth.csrf_token(split) != auth.csrf_token(request({"X-Forwarded-User": "a|b"}, {CSRF_COOKIE: cookie}))


@pytest.mark.parametrize(("headers", "ambient", "refused"), [
    ({"Origin": "http://ui:8180"}, True, False),
    ({"Origin": "http://UI:8180"}, True, False),
    ({"Origin": "http://evil.example"}, True, True),
    ({"Origin": "http://evil.example"}, False, True),
    ({"Origin": "null"}, True, True),
    ({"Origin": "http://ui:8180", "Referer": "http://evil.example/"}, True, False),
    ({"Referer": "http://ui:8180/jobs/x?y=1"}, True, False),
    ({"Referer": "http://evil.example/ui:8180"}, True, True),
    ({"Referer": "http://ui:8180@evil.example/"}, True, True),
    ({}, True, True),
    ({}, False, False),
])
def test_a_post_must_name_this_site_unless_a_bearer_token_carries_it(
    headers: dict[str, str], ambient: bool, refused: bool,
) -> None:
    given = request({**headers, "Host": "ui:8180"})
    assert (Auth.cross_site(given, ambient=ambient) is not None) == refused


def test_values_as_shown() -> None:
    t = datetime(2026, 1, 15, 8, 30, 0, 250_000, tzinfo=UTC)
    assert utc(t) == "2026-01-15 08:30:00.250Z"
    assert local(t, "Europe/Berlin") == "2026-01-15 09:30:00 CET (Europe/Berlin)"
    assert local(t, "UTC") == "" and local(t, "Not/AZone") == ""
    # PostgreSQL's -infinity and infinity as asyncpg returns them (naive, year 1 and 9999):
    # a next run being re-planned is not known yet, and the page must not fail on it.
    for endless in (datetime(1, 1, 1), datetime(9999, 12, 31, 23, 59, 59, 999_999)):
        assert (utc(endless), ago(endless, t), local(endless, "Europe/Berlin")) == ("-", "-", "")
    assert [duration(x) for x in (0.2, 12.34, 125, 7300, None)] == ["200 ms", "12.3 s", "2m 05s", "2h 01m", "-"]
    assert clip("x" * 10, 5) == "xxxx…"
    assert status_class("RUNNING") == "st-running" and status_class('"><script>') == "st-unknown"
    bars = spark(["COMPLETED", "FAILED"], [1.0, None])
    assert [b["h"] for b in bars] == [16.0, 8.0] and bars[1]["x"] == 5


# -- the Schedulers page -------------------------------------------------------------------


class Reads:
    """A stand-in for `scheduler_rows`: counts its calls, answers what it is told."""

    def __init__(self, *answers: tuple[list[dict[str, Any]], int] | Exception) -> None:
        self.answers = list(answers)
        self.calls = 0
        self.release = threading.Event()
        self.release.set()

    def __call__(self) -> tuple[list[dict[str, Any]], int]:
        self.calls += 1
        self.release.wait(30)
        answer = self.answers[min(self.calls, len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer


THREE = ([{"scheduler_id": "s1", "leads": [0, 3], "standby": [1, 2]},
          {"scheduler_id": "s2", "leads": [1, 4], "standby": [3, 5]},
          {"scheduler_id": "s3", "leads": [2, 5], "standby": [0, 4]}], 6)


def test_the_schedulers_are_read_once_per_period_however_many_pages_ask() -> None:
    now = [100.0]
    reads = Reads(THREE, UnavailableError("cannot reach Kafka at k:9092: timed out"), ([], 6))
    roles = SchedulerRoles(reads, clock=lambda: now[0])

    async def scenario() -> None:
        first = await asyncio.gather(*(roles.get() for _ in range(20)))
        assert reads.calls == 1 and all(m.schedulers == THREE[0] for m in first)
        now[0] += CACHE_SECONDS - 0.1
        await roles.get()
        assert reads.calls == 1, "still fresh"
        now[0] += 0.2
        for _ in range(3):  # an outage is asked about once a period too
            with pytest.raises(SchedulersUnavailable, match="cannot reach Kafka at k:9092"):
                await roles.get()
        assert reads.calls == 2
        now[0] += CACHE_SECONDS
        assert (await roles.get()).schedulers == []
        assert reads.calls == 3

    try:
        asyncio.run(scenario())
    finally:
        roles.close()


def test_a_read_kafka_does_not_answer_is_waited_for_not_started_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cronstream.ui.schedulers.READ_TIMEOUT_SECONDS", 0.2)
    now = [0.0]
    reads = Reads(THREE)
    reads.release.clear()
    roles = SchedulerRoles(reads, clock=lambda: now[0])

    async def scenario() -> None:
        with pytest.raises(SchedulersUnavailable, match=r"did not answer within 0\.2 s"):
            await roles.get()
        now[0] += CACHE_SECONDS
        with pytest.raises(SchedulersUnavailable):
            await roles.get()
        assert reads.calls == 1, "the read under way is the one waited for"
        reads.release.set()
        now[0] += CACHE_SECONDS
        assert (await roles.get()).shards == 6
        assert reads.calls == 1

    try:
        asyncio.run(scenario())
    finally:
        reads.release.set()
        roles.close()


def test_each_shard_shows_its_leader_and_standby_and_the_shards_nobody_leads() -> None:
    table = shard_table(Membership(*THREE, T0))
    assert [(s["shard"], s["leader"], s["standby"]) for s in table] == [
        (0, "s1", ["s3"]), (1, "s2", ["s1"]), (2, "s3", ["s1"]),
        (3, "s1", ["s2"]), (4, "s2", ["s3"]), (5, "s3", ["s2"])]
    nobody = shard_table(Membership([], 4, T0))
    assert all(s["leader"] is None and s["standby"] == [] for s in nobody) and len(nobody) == 4


def page(template: str, **context: Any) -> str:
    base = {"identity": None, "actions_enabled": False, "can_act": False, "csrf_field": "csrf",
            "csrf_token": "t", "login_possible": False, "notice": "", "path": "/schedulers",
            "here": "/schedulers"}
    return template_env().get_template(template).render(**base, **context)


def test_the_schedulers_page_names_every_role_and_escapes_what_kafka_clients_call_themselves() -> None:
    hostile = '<img src=x onerror="alert(1)">'
    roles = SchedulerRoles(lambda: ([{"scheduler_id": hostile, "leads": [0], "standby": []},
                                     {"scheduler_id": "s2", "leads": [], "standby": [0]}], 2))
    try:
        context = asyncio.run(views.schedulers(roles, standbys=1))
    finally:
        roles.close()
    assert (context["unled"], context["without_standby"]) == ([1], [])
    html = page("schedulers.html", **context)
    assert hostile not in html and "&lt;img src=x onerror=" in html
    assert 'data-unled="1"' in html and "1 shard(s) without a leader (1)" in html
    assert re.search(r'<tr data-shard="1" class="unled">', html)
    empty = SchedulerRoles(lambda: ([], 16))
    try:
        none = page("schedulers.html", **asyncio.run(views.schedulers(empty, standbys=1)))
    finally:
        empty.close()
    assert "No scheduler is running: none of the 16 shards fires." in none


def test_the_runs_page_shows_why_an_execution_waits_escaped() -> None:
    rows = template_env().get_template("_runs.html").module.rows  # type: ignore[attr-defined]
    waiting = {"execution_id": "e1", "job_id": "export", "status": "WAITING", "attempt_number": 1,
               "delivery": 1, "scheduled_at": T0, "waiting_reason": "pool <etl>: 2 of 2 slots in use"}
    html = str(rows([waiting], "waiting"))
    assert "pool &lt;etl&gt;: 2 of 2 slots in use" in html and "st-waiting" in html


def test_the_pools_page_shows_each_pools_holders_and_waiters() -> None:
    held = {"execution_id": "e1", "job_id": "load", "status": "RUNNING", "attempt_number": 1,
            "scheduled_at": T0, "queued_at": T0, "started_at": T0, "worker_id": "w1",
            "waiting_reason": None, "pool": "etl", "slots": 2}
    waiting = {**held, "execution_id": "e2", "status": "WAITING", "worker_id": None,
               "started_at": None, "waiting_reason": "pool etl: 2 of 2 slots in use", "slots": 1}

    class Store:
        async def fetch(self, name: str, *args: Any) -> list[dict[str, Any]]:
            assert name == "pool_executions"
            return [held, waiting]

    known = {"etl": Pool(pool="etl", slots=2, description="the <warehouse>"), "idle": Pool(pool="idle", slots=3)}
    context = asyncio.run(views.pools(Store(), known))  # type: ignore[arg-type]
    etl, idle = context["pools"]
    assert (etl["pool"], etl["slots"], etl["in_use"], len(etl["holders"]), len(etl["waiters"])) == \
        ("etl", 2, 2, 1, 1)
    assert (idle["pool"], idle["in_use"], idle["holders"]) == ("idle", 0, [])
    html = template_env().get_template("pools.html").render(
        **context, identity=None, actions_enabled=False, can_act=False, csrf_field="csrf",
        csrf_token="t", login_possible=False, notice="", path="/pools", here="/pools")
    assert "2 of 2 slots in use" in html and "pool etl: 2 of 2 slots in use" in html
    assert "the &lt;warehouse&gt;" in html  # the description, escaped
    unknown = asyncio.run(views.pools(Store(), None))  # type: ignore[arg-type]
    assert unknown["pools"][0]["slots"] is None and not unknown["sizes_known"]


def test_an_event_jobs_page_says_what_triggers_it_and_shows_its_trigger_behind_alert() -> None:
    definition = JobDefinition.model_validate({
        "job_id": "orders-in", "type": "EVENT", "handler": "noop",
        "event": {"topic": "shop.orders", "filter": 'value.kind == "<paid>"',
                  "batch": {"max_events": 100, "max_wait_seconds": 5}}})
    row = {**json.loads(definition.model_dump_json()), "definition": definition.model_dump_json(),
           "params": "{}", "deleted_at": None, "created_by": "ops", "updated_at": None, "version": 1,
           "next_execution_at": None, "enabled": True}
    alert = {"fired_at": T0, "kind": "TRIGGER_BEHIND", "state": "FIRING", "execution_id": None,
             "summary": "event trigger orders-in falls behind shop.orders: 4200 records in no run yet",
             "error_message": None}

    class Store:
        async def fetchrow(self, name: str, *args: Any) -> dict[str, Any] | None:
            return row if name == "job" else None

        async def fetch(self, name: str, *args: Any) -> list[dict[str, Any]]:
            return [alert] if name == "job_alerts" else []

    context = asyncio.run(views.job(Store(), "orders-in", {}))  # type: ignore[arg-type]
    assert context["fires"] == []
    html = page("job.html", **context)
    text = re.sub(r"<[^>]+>", "", html)
    assert "records of shop.orders where value.kind == &#34;&lt;paid&gt;&#34;: up to 100 per run, " \
           "waiting at most 5.0 s after the first; from the latest records" in text
    assert "Runs when matching records arrive on its topic" in text
    assert "TRIGGER_BEHIND" in text and "4200 records in no run yet" in text
    assert "<th>schedule</th>" not in html  # an EVENT job has none ("after" nothing, before)


def test_an_event_runs_page_lists_its_records_positions() -> None:
    execution = {"execution_id": "e1", "job_id": "orders-in", "run_id": "r1", "status": "COMPLETED",
                 "attempt_number": 1, "delivery": 1, "reason": "EVENT", "scheduled_at": T0,
                 "queued_at": T0, "started_at": T0, "completed_at": T0, "result_chars": 0}
    records = [{"topic": "shop.orders", "partition": 2, "offset": 41 + i,
                "written_at": T0, "key": None if i else "<k>"} for i in range(2)]

    class Store:
        async def fetchrow(self, name: str, *args: Any) -> dict[str, Any] | None:
            return execution if name == "execution" else None

        async def fetch(self, name: str, *args: Any) -> list[dict[str, Any]]:
            return records if name == "execution_trigger_records" else []

    context = asyncio.run(views.execution(Store(), uuid.uuid4()))  # type: ignore[arg-type]
    html = page("execution.html", **context)
    rows = re.findall(r"<tr><td>shop\.orders</td>.*?</tr>", html)
    assert len(rows) == 2 and ">41<" in rows[0] and ">42<" in rows[1]
    assert "&lt;k&gt;" in rows[0]  # a key is shown as text, escaped
    assert "<td>2026-06-01 12:00:00Z</td>" in rows[0]  # when it was written, as times are shown
