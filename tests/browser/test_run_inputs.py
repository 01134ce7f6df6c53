"""Run inputs in the dashboard, in a real browser against the real services: a trigger
with params (invalid JSON refused in the page before anything is sent; the run gets the
job's params with the changes; who triggered it and its definition version shown), and a
job's versions with the diff between two."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from playwright.sync_api import Page, expect

from cronstream.shared.settings import Settings
from tests.browser.conftest import Dashboard, db, login
from tests.browser.test_dashboard import YEARLY, define
from tests.conftest import Processes
from tests.support import eventually


def test_trigger_with_params_and_the_diff_between_two_versions(
    processes: Processes, topics: Settings, dashboard: Dashboard, page: Page,
    shoot: Callable[[Page, str], None],
) -> None:
    processes.system()
    base = {"type": "CRON", "schedule": YEARLY, "handler": "noop", "name": "Nightly export"}
    define(topics, "export", **base, params={"region": "all", "limit": 10}, created_by="alice")
    define(topics, "export", **base, params={"region": "all", "limit": 20, "format": "csv"},
           created_by="bob")
    eventually(lambda: len(db(topics.database_url, "SELECT 1 FROM job_definition_versions "
                              "WHERE job_id = 'export'")) == 2, 30, message="two versions")
    login(page, dashboard, "carol")
    versions_and_their_diff(page, dashboard, shoot)
    execution_id = trigger_with_params(page, dashboard, topics, shoot)

    page.goto(dashboard.url(f"/executions/{execution_id}"))
    facts = page.locator("table.kv")
    expect(facts).to_contain_text("triggered by")
    expect(facts).to_contain_text("carol")
    expect(facts.locator("a", has_text="version 2")).to_have_attribute("href", "/jobs/export/versions/2")
    assert json.loads(page.locator("pre[data-params]").inner_text()) == {
        "region": "eu", "limit": 20, "format": "csv"}
    shoot(page, "execution-params")

    # The job's runs name the version each ran and who triggered it.
    page.goto(dashboard.url("/jobs/export"))
    run = page.locator(f'table.runs tr[data-execution-id="{execution_id}"]')
    expect(run).to_contain_text("by carol")
    expect(run.locator("a", has_text="v2")).to_have_attribute("href", "/jobs/export/versions/2")
    page.locator("table.versions").scroll_into_view_if_needed()
    shoot(page, "job-versions")


def versions_and_their_diff(page: Page, dashboard: Dashboard, shoot: Callable[[Page, str], None]) -> None:
    """The versions, newest first, and what version 2 changed."""
    page.goto(dashboard.url("/jobs/export"))
    versions = page.locator("table.versions tbody tr")
    expect(versions).to_have_count(2)
    expect(versions.nth(0)).to_contain_text("bob")
    expect(versions.nth(0)).to_contain_text("params")
    expect(versions.nth(1)).to_contain_text("created")
    versions.nth(0).locator("a", has_text="diff").click()
    page.wait_for_url(re.compile(r".*/jobs/export/versions/2$"))
    diff = page.locator("pre[data-diff]")
    expect(diff.locator(".diff-del")).to_contain_text(["limit: 10"])
    expect(diff.locator(".diff-add")).to_contain_text(["limit: 20", "format: csv"])
    expect(page.locator("[data-change]")).to_have_text("params")
    shoot(page, "job-version-diff")


def trigger_with_params(page: Page, dashboard: Dashboard, topics: Settings,
                        shoot: Callable[[Page, str], None]) -> str:
    """The page refuses params that are not a JSON object, sending nothing; the run of
    valid ones gets the job's params with the change. Returns its execution id."""
    page.goto(dashboard.url("/jobs/export"))
    form = page.locator("form.trigger")
    field = form.locator("textarea[name=params]")
    form.locator("summary").click()
    assert json.loads(field.input_value()) == {"region": "all", "limit": 20, "format": "csv"}, \
        "the job's params are the starting point"
    field.fill('{"region": "eu",}')
    form.locator("button").click()
    error = form.locator("[data-params-error]")
    expect(error).to_be_visible()
    expect(error).to_contain_text("params: not valid JSON")
    expect(field).to_have_attribute("aria-invalid", "true")
    expect(page.locator("p.notice")).to_have_count(0)
    shoot(page, "job-trigger-params-invalid")
    assert not db(topics.database_url, "SELECT 1 FROM job_executions"), "nothing was sent"

    field.fill('{"region": "eu", "limit": 20, "format": "csv"}')
    form.locator("button").click()
    notice = page.locator("p.notice")
    expect(notice).to_contain_text("triggered export: execution")
    expect(notice).to_contain_text("with region changed")
    execution_id = re.search(r"execution ([0-9a-f-]{36})", notice.inner_text())[1]  # type: ignore[index]
    row: Any = eventually(lambda: (r := db(topics.database_url, "SELECT * FROM job_executions WHERE "
                                      "status = 'COMPLETED'")) and r[0], 30, message="the run ends")
    assert str(row["execution_id"]) == execution_id
    assert json.loads(row["result"]) == {"region": "eu", "limit": 20, "format": "csv"}
    assert (row["triggered_by"], row["definition_version"]) == ("carol", 2)
    return execution_id
