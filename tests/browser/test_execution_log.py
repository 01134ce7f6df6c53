"""The execution page's log in a real browser: lines appear while the execution runs,
without a reload; when it fails, its traceback is shown folded open; and whatever the
handler wrote, markup included, is shown as text."""

from __future__ import annotations

from collections.abc import Callable

from playwright.sync_api import Page, expect

from cronstream.shared.settings import Settings
from tests.browser.conftest import Dashboard, db
from tests.conftest import Processes
from tests.support import eventually, run_now


def test_a_running_execution_logs_live_and_its_failure_shows_the_traceback(
    processes: Processes, topics: Settings, dashboard: Dashboard, page: Page,
    shoot: Callable[[Page, str], None],
) -> None:
    processes.system()
    run_now(topics, "exporter", "test.print-then-fail", params={"lines": 8, "every": 0.6,
                                                                "region": "eu"})
    running = eventually(lambda: (rows := db(topics.database_url, "SELECT execution_id, status FROM "
                                             "job_executions WHERE job_id = 'exporter'"))
                         and rows[0]["status"] == "RUNNING" and rows[0], 40, message="RUNNING")
    page.goto(dashboard.url(f"/executions/{running['execution_id']}"))
    page.evaluate("window.__sameDocument = true")
    log = page.locator("pre[data-log-lines]")
    # Lines arrive while it runs, in the same document.
    expect(log).to_contain_text("step 0", timeout=20_000)
    expect(page.locator("h1 .status")).to_have_text("RUNNING")
    expect(log).to_contain_text("step 4", timeout=20_000)
    shoot(page, "execution-log-live")
    # It fails: the traceback appears, open, the stream ends.
    traceback = page.locator("details[data-traceback]")
    expect(traceback).to_be_visible(timeout=30_000)
    expect(traceback).to_have_attribute("open", "")
    expect(traceback).to_contain_text("ValueError: region 'eu' is not served")
    expect(traceback).to_contain_text("handlers_for_tests.py")
    assert "child.py" not in traceback.inner_text(), "the worker's own frames are left out"
    # An attribute assertion, not wait_for_function: a string predicate is evaluated with
    # eval, which the dashboard's CSP (script-src 'self') refuses.
    expect(page.locator("body")).to_have_attribute("data-log-ended", "true", timeout=30_000)
    expect(page.locator("h1 .status")).to_have_text("PERMANENTLY_FAILED")  # the page follows
    assert page.evaluate("window.__sameDocument") is True, "no reload happened"
    assert int(page.get_attribute("body", "data-log-updates") or 0) >= 2
    expect(log).to_contain_text("tests.browser: about to fail")
    # Markup a handler printed is text, never a script or an element.
    expect(log).to_contain_text("<script>window.__injected = 1</script><b>bold?</b>")
    assert page.evaluate("typeof window.__injected") == "undefined"
    assert log.locator("b").count() == 0 and log.locator("script").count() == 0
    shoot(page, "execution-log-failed")

    # Read again from scratch (no live stream: the execution and its log have ended).
    page.reload()
    expect(page.locator("details[data-traceback]")).to_be_visible()
    assert page.locator("[data-log-live]").count() == 0
    expect(page.locator("pre[data-log-lines]")).to_contain_text("step 7")
