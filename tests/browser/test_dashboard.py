"""The dashboard in a real browser against the real services: live progress without a
reload, trigger and cancel, a DAG run's picture, approving and rejecting gated steps
with the identity recorded, and record payloads that must render as text."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from playwright.sync_api import Page, expect

from cronstream.shared.settings import Settings
from tests.browser.conftest import Dashboard, db, login
from tests.conftest import Processes
from tests.support import eventually, produce_json

YEARLY = "0 0 1 1 *"  # never fires during a test: runs only when triggered


def define(settings: Settings, job_id: str, **fields: Any) -> None:
    produce_json(settings, settings.topics.job_definitions, job_id, {"job_id": job_id, **fields})


def projected(settings: Settings, *job_ids: str) -> None:
    eventually(lambda: len(db(settings.database_url, "SELECT 1 FROM job_definitions WHERE "
                              "job_id = ANY($1::text[])", list(job_ids))) == len(job_ids),
               30, message=f"{job_ids} projected")


def latest(settings: Settings, job_id: str) -> Any:
    rows = db(settings.database_url, "SELECT * FROM job_executions WHERE job_id = $1 "
              "ORDER BY scheduled_at DESC LIMIT 1", job_id)
    return rows[0] if rows else None


def progress_of(page: Page, execution_id: str) -> float:
    value = page.get_attribute(f'tr[data-execution-id="{execution_id}"] progress', "value")
    return float(value or 0)


def test_live_progress_then_completed_and_trigger_and_cancel_from_the_ui(
    processes: Processes, topics: Settings, dashboard: Dashboard, page: Page,
    shoot: Callable[[Page, str], None],
) -> None:
    processes.system()
    define(topics, "nightly-export", name="Nightly export", type="CRON", schedule=YEARLY,
           timezone="Europe/Berlin", handler="sleep", params={"seconds": 6})
    define(topics, "stuck", type="CRON", schedule=YEARLY, handler="sleep", params={"seconds": 120})
    projected(topics, "nightly-export", "stuck")
    login(page, dashboard, "alice")

    page.goto(dashboard.url("/jobs/nightly-export"))
    expect(page.locator("h1")).to_contain_text("nightly-export")
    page.click("form.trigger button")
    notice = page.locator("p.notice")
    expect(notice).to_contain_text("triggered nightly-export: execution")
    execution_id = re.search(r"execution ([0-9a-f-]{36})", notice.inner_text())[1]  # type: ignore[index]
    shoot(page, "job")

    page.goto(dashboard.url("/runs"))
    page.evaluate("window.__sameDocument = true")
    running = page.locator(f'tbody[data-section="running"] tr[data-execution-id="{execution_id}"]')
    expect(running).to_be_visible(timeout=30_000)
    first = progress_of(page, execution_id)
    page.wait_for_function(
        "([id, first]) => { const p = document.querySelector(`tr[data-execution-id='${id}'] progress`);"
        " return p && Number(p.value) > first; }", arg=[execution_id, first], timeout=20_000)
    assert progress_of(page, execution_id) > first, "the bar moved forward"
    shoot(page, "runs")
    done = page.locator(f'tbody[data-section="recent"] tr[data-execution-id="{execution_id}"] .status')
    expect(done).to_have_text("COMPLETED", timeout=30_000)
    assert page.evaluate("window.__sameDocument") is True, "no reload happened"
    assert int(page.get_attribute("body", "data-live-updates") or 0) >= 2

    # Cancel a running execution from its page: recorded with who did it.
    page.goto(dashboard.url("/jobs/stuck"))
    page.click("form.trigger button")
    stuck = eventually(lambda: (r := latest(topics, "stuck")) and r["status"] == "RUNNING" and r, 30,
                       message="stuck runs")
    page.goto(dashboard.url(f"/executions/{stuck['execution_id']}"))
    page.fill("form.cancel input[name=reason]", "taking too long")
    page.click("form.cancel button")
    expect(page.locator("p.notice")).to_contain_text("cancel sent for stuck")
    ended = eventually(lambda: (r := latest(topics, "stuck")) and r["status"] == "CANCELLED" and r, 30,
                       message="stuck is cancelled")
    assert ended["cancelled_by"] == "alice"
    page.reload()
    expect(page.locator("table.kv")).to_contain_text("cancelled by")
    expect(page.locator("table.kv")).to_contain_text("alice")
    shoot(page, "execution")


EVIL_NAME = '<script>window.__xss = "name"</script>'
EVIL_PARAM = '<img src=x onerror="window.__xss = \'params\'">'
EVIL_ERROR = "<svg onload=\"window.__xss = 'error'\"></svg><b>bold?</b>"


def dependent(job_id: str, depends_on: list[str], **fields: Any) -> dict[str, Any]:
    return {"type": "DEPENDENT", "depends_on": depends_on, "handler": "noop",
            "params": {"step": job_id}, **fields}


def test_dag_run_picture_approve_and_reject_and_payloads_render_as_text(  # noqa: PLR0915
    processes: Processes, topics: Settings, dashboard: Dashboard, page: Page,
    shoot: Callable[[Page, str], None],
) -> None:
    processes.system()
    define(topics, "extract", type="CRON", schedule=YEARLY, handler="noop", params={"rows": 5})
    define(topics, "big-only", **dependent("big-only", ["extract"], condition="extract.result.rows > 10"))
    define(topics, "load", **dependent("load", ["extract"], requires_approval=True))
    define(topics, "publish", **dependent("publish", ["extract"], requires_approval=True))
    define(topics, "report", **dependent("report", ["load", "big-only"], trigger_rule="ALL_DONE"))
    define(topics, "evil", name=EVIL_NAME, type="CRON", schedule=YEARLY, handler="fail",
           params={"message": EVIL_ERROR, "html": EVIL_PARAM})
    # Scheduled jobs for the Timeline (noop, at most one fire during the test).
    define(topics, "hourly-sync", type="CRON", schedule="15 * * * *", timezone="Europe/Berlin",
           handler="noop")
    define(topics, "nightly-backup", type="CRON", schedule="0 2 * * *", handler="noop")
    define(topics, "poll-feeds", type="INTERVAL", interval_seconds=1200, handler="noop",
           concurrency_policy="FORBID")
    eventually(lambda: len(db(topics.database_url, "SELECT 1 FROM job_dependencies")) == 5, 30,
               message="the DAG is projected")
    projected(topics, "extract", "evil")
    login(page, dashboard, "bob")

    page.goto(dashboard.url("/jobs/extract"))
    page.click("form.trigger button")
    expect(page.locator("p.notice")).to_contain_text("triggered extract")
    eventually(lambda: all((r := latest(topics, j)) and r["status"] == "AWAITING_APPROVAL"
                           for j in ("load", "publish")), 40, message="both steps wait")
    run_id = latest(topics, "extract")["run_id"]

    page.goto(dashboard.url(f"/runs/{run_id}"))
    nodes = page.locator("svg.dag g.node")
    expect(nodes).to_have_count(5)
    statuses = {n.get_attribute("data-job-id"): n.get_attribute("data-status") for n in nodes.all()}
    assert statuses == {"extract": "COMPLETED", "big-only": "SKIPPED", "load": "AWAITING_APPROVAL",
                        "publish": "AWAITING_APPROVAL", "report": "PENDING"}
    assert page.locator("svg.dag path.edge").count() == 5
    skipped = page.locator('table.steps tr[data-job-id="big-only"]')
    expect(skipped).to_contain_text("condition is false: extract.result.rows > 10")
    expect(skipped.locator(".cond-false")).to_have_text("false")
    expect(skipped.locator("ul.operands")).to_contain_text("extract.result.rows = 5")

    page.locator('table.steps tr[data-job-id="load"] form.approve button').click()
    expect(page.locator("p.notice")).to_contain_text("approved load")
    page.locator('table.steps tr[data-job-id="publish"] form.reject input[name=reason]').fill("not today")
    page.locator('table.steps tr[data-job-id="publish"] form.reject button').click()
    expect(page.locator("p.notice")).to_contain_text("rejected publish")

    eventually(lambda: latest(topics, "report") and latest(topics, "report")["status"] == "COMPLETED"
               and latest(topics, "publish")["status"] == "SKIPPED", 40, message="the run finishes")
    approved, rejected = latest(topics, "load"), latest(topics, "publish")
    assert (approved["status"], approved["approved_by"]) == ("COMPLETED", "bob")
    assert rejected["rejected_by"] == "bob" and "not today" in rejected["error_message"]
    page.reload()
    statuses = {n.get_attribute("data-job-id"): n.get_attribute("data-status") for n in nodes.all()}
    assert statuses == {"extract": "COMPLETED", "big-only": "SKIPPED", "load": "COMPLETED",
                        "publish": "SKIPPED", "report": "COMPLETED"}
    expect(page.locator('table.steps tr[data-job-id="publish"]')).to_contain_text("rejected by bob")
    expect(page.locator('table.steps tr[data-job-id="publish"]')).to_contain_text("not today")
    shoot(page, "dag-run")

    # Names, params and error messages from records are text, never markup or script.
    page.goto(dashboard.url("/jobs/evil"))
    page.click("form.trigger button")
    failed = eventually(lambda: (r := latest(topics, "evil")) and r["status"] == "PERMANENTLY_FAILED" and r,
                        40, message="evil fails")
    for path in ("/jobs?q=evil", "/jobs/evil", f"/executions/{failed['execution_id']}", "/runs",
                 "/alerts", "/timeline?q=evil"):
        page.goto(dashboard.url(path))
        page.wait_for_load_state("load")
        assert page.evaluate("window.__xss") is None, f"a payload ran on {path}"
        assert page.locator("main img, main script, main b, svg.dag svg").count() == 0, path
    page.goto(dashboard.url("/jobs/evil"))
    expect(page.locator("p.lead")).to_have_text(EVIL_NAME)
    expect(page.locator("pre.json")).to_contain_text("onerror")
    page.goto(dashboard.url(f"/executions/{failed['execution_id']}"))
    expect(page.locator("pre.error")).to_contain_text(EVIL_ERROR)

    for name, path in (("jobs", "/jobs"), ("timeline", "/timeline"), ("workers", "/workers"),
                       ("alerts", "/alerts")):
        page.goto(dashboard.url(path))
        shoot(page, name)
