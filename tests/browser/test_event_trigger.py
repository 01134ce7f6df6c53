"""An event-triggered job in a real browser (issue 56, decision 0057): its page says what
triggers it, and its run's page lists the records the run was given — from the real
system: the scheduler's trigger reads the topic, the monitor projects the run."""

from __future__ import annotations

from collections.abc import Callable

from playwright.sync_api import Page, expect

from cronstream.shared.settings import Settings
from tests.browser.conftest import Dashboard, db, login
from tests.browser.test_dashboard import define, projected
from tests.conftest import Processes
from tests.e2e.test_event_triggers import source_topic, trigger_started, write
from tests.support import eventually


def test_an_event_jobs_page_and_its_runs_records(
    processes: Processes, topics: Settings, dashboard: Dashboard, page: Page,
    shoot: Callable[[Page, str], None],
) -> None:
    services = processes.system()
    topic = source_topic(topics, partitions=1)
    define(topics, "orders-in", name="Each batch of new orders", type="EVENT", handler="noop",
           event={"topic": topic, "filter": "value.keep == true",
                  "batch": {"max_events": 3, "max_wait_seconds": 30}})
    projected(topics, "orders-in")
    trigger_started([services["scheduler"]], "orders-in")
    write(topics, topic, 0, 6)  # three of them keep: one run of three

    def completed() -> str | None:
        rows = db(topics.database_url, "SELECT execution_id FROM job_executions "
                  "WHERE job_id = 'orders-in' AND status = 'COMPLETED'")
        return str(rows[0]["execution_id"]) if rows else None

    execution_id = eventually(completed, 60, message="the event run completed")
    login(page, dashboard, "alice")

    page.goto(dashboard.url("/jobs/orders-in"))
    trigger = page.locator("table.kv tr", has_text="event trigger")
    expect(trigger).to_contain_text(f"records of {topic} where value.keep == true: up to 3 per run, "
                                    "waiting at most 30.0 s after the first; from the latest records")
    expect(page.locator("table.kv th", has_text="schedule")).to_have_count(0)
    expect(page.locator("section", has_text="Next fires")).to_contain_text(
        "Runs when matching records arrive on its topic")
    shoot(page, "event-job")

    page.goto(dashboard.url(f"/executions/{execution_id}"))
    records = page.locator("table.records tbody tr")
    expect(records).to_have_count(3)
    assert [records.nth(i).locator("td").nth(2).inner_text() for i in range(3)] == ["0", "2", "4"]
    expect(records.first.locator("td").first).to_have_text(topic)
    expect(records.first.locator("td").nth(4)).to_have_text("k0")
    shoot(page, "event-run")
