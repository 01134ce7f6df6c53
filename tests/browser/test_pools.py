"""The Pools page in a real browser (issue 57, decision 0056): a pool's slots in use and
who holds them, what waits and why — the reason a person can act on — and the slots back
to none once the holders end. The real system runs the jobs: the dispatcher admits, the
monitor projects, the page reads the projection and the pools topic."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from playwright.sync_api import Page, expect

from cronstream.client import Client
from cronstream.shared.settings import Settings
from tests.browser.conftest import Dashboard, db, login
from tests.browser.test_dashboard import YEARLY, define, projected
from tests.conftest import Processes
from tests.support import cli, eventually


def statuses(settings: Settings, job_id: str) -> dict[UUID, Any]:
    return {r["execution_id"]: r for r in db(
        settings.database_url, "SELECT execution_id, status, waiting_reason, completed_at "
        "FROM job_executions WHERE job_id = $1", job_id)}


def test_the_pools_page_shows_holders_and_what_waits_and_why(
    processes: Processes, topics: Settings, dashboard: Dashboard, page: Page,
    shoot: Callable[[Page, str], None],
) -> None:
    processes.system(worker_args=("--concurrency", "4"))
    for name, slots, description in (("warehouse", 2, "the reporting warehouse"),
                                     ("partner-api", 3, "100 calls a minute")):
        done = cli(topics, "pool", "set", name, "--slots", str(slots), "--description", description)
        assert done.returncode == 0, done.stderr
    define(topics, "export", type="CRON", schedule=YEARLY, handler="sleep", params={"seconds": 60},
           pool="warehouse")
    projected(topics, "export")
    with Client(topics) as client:
        now = datetime.now(UTC)
        fired = [client.trigger("export", now + timedelta(milliseconds=i)) for i in range(3)]
    holders, waiting = fired[:2], fired[2]

    def settled() -> bool:
        runs = statuses(topics, "export")
        return (len(runs) == 3 and [runs[e]["status"] for e in holders] == ["RUNNING", "RUNNING"]
                and runs[waiting]["status"] == "WAITING")

    eventually(settled, 60, message="two runs hold the warehouse's slots and the third waits")
    login(page, dashboard, "alice")

    page.goto(dashboard.url("/pools"))
    warehouse = page.locator('section.pool[data-pool="warehouse"]')
    expect(warehouse.locator("h2 .in-use")).to_have_text("2 of 2 slots in use")
    expect(warehouse.locator("h2 .waiting")).to_have_text("1 waiting")
    expect(warehouse.locator("p.description")).to_have_text("the reporting warehouse")
    held = warehouse.locator('tbody[data-section="holders"] tr')
    expect(held).to_have_count(2)
    assert sorted(held.nth(i).get_attribute("data-execution-id") or "" for i in range(2)) == \
        sorted(map(str, holders))
    for i in range(2):
        expect(held.nth(i).locator(".status")).to_have_text("RUNNING")
    waiter = warehouse.locator(f'tbody[data-section="waiters"] tr[data-execution-id="{waiting}"]')
    expect(waiter.locator(".status")).to_have_text("WAITING")
    expect(waiter.locator("td.detail")).to_contain_text("pool warehouse: 2 of 2 slots in use")
    # A pool nothing uses is listed with its size; the page names how to make one.
    idle = page.locator('section.pool[data-pool="partner-api"]')
    expect(idle.locator("h2 .in-use")).to_have_text("0 of 3 slots in use")
    expect(idle.locator('tbody[data-section="holders"] tr.empty')).to_have_text("no slot held")
    shoot(page, "pools")

    # From the waiting run to its page: the same reason, where a person looks first.
    waiter.locator("a", has_text="details").click()
    page.wait_for_url(f"**/executions/{waiting}")
    expect(page.locator("main")).to_contain_text("WAITING")
    expect(page.locator("main")).to_contain_text("pool warehouse: 2 of 2 slots in use")

    # The holders end (cancelled): the waiting run takes a slot, and once it ends too the
    # warehouse holds none.
    with Client(topics) as client:
        for execution in holders:
            client.cancel(execution, "done looking")
    eventually(lambda: statuses(topics, "export")[waiting]["status"] == "RUNNING", 60,
               message="the waiting run is admitted once a slot is free")
    page.goto(dashboard.url("/pools"))
    expect(warehouse.locator("h2 .in-use")).to_have_text("1 of 2 slots in use")
    expect(warehouse.locator('tbody[data-section="waiters"]')).to_have_count(0)
    with Client(topics) as client:
        client.cancel(waiting, "done looking")
    eventually(lambda: all(r["completed_at"] for r in statuses(topics, "export").values()), 60,
               message="every run ends")
    page.goto(dashboard.url("/pools"))
    expect(warehouse.locator("h2 .in-use")).to_have_text("0 of 2 slots in use")
    expect(warehouse.locator('tbody[data-section="holders"] tr.empty')).to_have_text("no slot held")
