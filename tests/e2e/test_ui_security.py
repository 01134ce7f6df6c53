"""`cronstream ui` refuses every action it cannot attribute: no credentials, a wrong
token, a missing or foreign CSRF token, a cross-origin request — and then publishes
nothing. With credentials, the same requests publish what the CLI publishes, with the
acting identity recorded."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import httpx

from cronstream.shared.settings import Settings
from tests.conftest import Processes
from tests.support import csrf_of, eventually, produce_json, read_all, sql, start_ui, value

TOKEN = "s3cret-token-long-enough"
YEARLY = "0 0 1 1 *"


def published(settings: Settings) -> dict[str, int]:
    topics = settings.topics
    return {name: len(read_all(settings, topic)) for name, topic in (
        ("job-due", topics.job_due), ("commands", topics.commands),
        ("job-definitions", topics.job_definitions))}


def awaiting_execution(settings: Settings, job_id: str) -> uuid.UUID:
    """A step parked in AWAITING_APPROVAL, as the monitor would have projected it."""
    execution, now = uuid.uuid4(), datetime.now(UTC)
    sql(settings.database_url, "INSERT INTO job_executions (execution_id, job_id, run_id, status, "
        "scheduled_at, attempt_number, last_event, updated_at) VALUES ($1, $2, $3, "
        "'AWAITING_APPROVAL', $4, 1, 'AWAITING_APPROVAL', $4)", execution, job_id, uuid.uuid4(), now)
    return execution


def test_actions_without_credentials_or_csrf_are_refused_and_publish_nothing(
    processes: Processes, topics: Settings,
) -> None:
    processes.start("monitor").wait_for_log("action=partitions_assigned")
    produce_json(topics, topics.topics.job_definitions, "report", {
        "job_id": "report", "type": "CRON", "schedule": YEARLY, "handler": "noop"})
    eventually(lambda: sql(topics.database_url, "SELECT 1 FROM job_definitions WHERE job_id = 'report'"),
               30, message="projected")
    step = awaiting_execution(topics, "report")
    before = published(topics)
    actions = ["/jobs/report/trigger", "/jobs/report/pause", "/jobs/report/resume",
               f"/executions/{step}/cancel", f"/executions/{step}/approve", f"/executions/{step}/reject"]

    off = start_ui(processes, "ui-off")
    for path in actions:
        assert httpx.post(off + path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 403

    base = start_ui(processes, "ui", CRONSTREAM_UI_TOKEN=TOKEN)
    for path in actions:
        anonymous = httpx.post(base + path, data={"reason": "x"})
        assert anonymous.status_code == 401, (path, anonymous.status_code)
        assert anonymous.headers["www-authenticate"].startswith("Bearer")
        wrong = httpx.post(base + path, headers={"Authorization": "Bearer not-the-token"})
        assert wrong.status_code == 401, path
        spoofed = httpx.post(base + path, headers={"X-Forwarded-User": "mallory"})
        assert spoofed.status_code == 401, "the identity header is ignored unless configured"

    # A browser names the page a form is posted from (refused without: test_dashboard_forms).
    with httpx.Client(headers={"Origin": base}) as browser:
        token = csrf_of(browser, base)
        assert browser.post(base + "/login", data={"name": "carol", "token": "wrong",
                                                    "csrf_token": token}).status_code == 401
        login = browser.post(base + "/login", data={"name": "carol", "token": TOKEN, "csrf_token": token})
        assert login.status_code == 303 and "cronstream_session" in login.headers["set-cookie"]
        assert "Content-Security-Policy" in browser.get(base + "/jobs").headers
        assert browser.post(base + actions[0], data={"csrf_token": token}).status_code == 403, \
            "the login form's token does not fit the session it opened"
        token = csrf_of(browser, base)
        for path in actions:
            assert browser.post(base + path, data={"reason": "x"}).status_code == 403, path
            forged = browser.post(base + path, data={"reason": "x", "csrf_token": "0" * 64})
            assert forged.status_code == 403, path
            foreign = browser.post(base + path, data={"reason": "x", "csrf_token": token},
                                   headers={"Origin": "http://evil.example"})
            assert foreign.status_code == 403, path
        with httpx.Client() as other:  # someone else's CSRF token does not fit this browser
            theirs = csrf_of(other, base)
        assert browser.post(base + actions[0], data={"csrf_token": theirs}).status_code == 403

        assert published(topics) == before, "a refused action published something"

        # The same requests, properly made, do publish (the checks above can fail).
        paused = browser.post(base + "/jobs/report/pause", data={"csrf_token": token, "next": "/jobs/report"})
        assert paused.status_code == 303 and paused.headers["location"].startswith("/jobs/report?notice=")
    triggered = httpx.post(base + "/jobs/report/trigger", headers={"Authorization": f"Bearer {TOKEN}"})
    assert triggered.status_code == 200 and triggered.json()["by"] == "api-token"
    rejected = httpx.post(base + f"/executions/{step}/reject", data={"reason": "no"},
                          headers={"Authorization": f"Bearer {TOKEN}"})
    assert rejected.status_code == 200, rejected.text
    after = published(topics)
    assert after == {"job-due": before["job-due"] + 1, "commands": before["commands"] + 1,
                     "job-definitions": before["job-definitions"] + 1}
    definitions = [json.loads(value(m)) for m in read_all(topics, topics.topics.job_definitions)
                   if m.key() == b"report"]  # each job's records in order, on its own shard
    assert (definitions[-1]["enabled"], definitions[-1]["created_by"]) == (False, "carol")
    command = json.loads(value(read_all(topics, topics.topics.commands)[-1]))
    assert (command["command"], command["issued_by"], command["reason"]) == ("REJECT", "api-token", "no")


def test_a_trusted_proxy_header_names_who_acts_and_reads_can_be_protected(
    processes: Processes, topics: Settings,
) -> None:
    step = awaiting_execution(topics, "gate")
    base = start_ui(processes, "ui", CRONSTREAM_UI_IDENTITY_HEADER="X-Forwarded-User",
                    CRONSTREAM_UI_PROTECT_READS="true")
    assert httpx.get(base + "/jobs").status_code == 303, "reads need an identity"
    assert httpx.get(base + "/healthz").status_code == 200
    assert httpx.get(base + "/readyz").json()["ready"] is True
    with httpx.Client(headers={"X-Forwarded-User": "dana@example.com", "Origin": base}) as browser:
        page = browser.get(base + "/jobs")
        assert page.status_code == 200 and "dana@example.com" in page.text
        token = csrf_of(browser, base, f"/executions/{step}")
        assert browser.post(base + f"/executions/{step}/approve", data={}).status_code == 403
        assert read_all(topics, topics.topics.commands) == []
        approved = browser.post(base + f"/executions/{step}/approve",
                                data={"csrf_token": token, "next": f"/executions/{step}"})
        assert approved.status_code == 303
    command = json.loads(value(read_all(topics, topics.topics.commands)[-1]))
    assert (command["command"], command["issued_by"]) == ("APPROVE", "dana@example.com")
