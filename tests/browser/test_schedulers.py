"""The Schedulers page against real schedulers: three processes share six shards, the
page shows the roles every scheduler computes (each shard led once and kept warm by
another), each scheduler's own metrics agree with what the page says it leads, and when
one stops its shards move to the two left."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, expect

from cronstream.shared.kafka.admin import ensure_topics
from cronstream.shared.settings import Settings
from cronstream.shared.shards import roles
from tests.browser.conftest import TOKEN, Dashboard, login
from tests.conftest import Processes
from tests.support import ServiceProcess, eventually

SHARDS = 6


@pytest.fixture
def six_shards(settings: Settings, tmp_path: Path) -> Iterator[Processes]:
    """Processes on topics whose clock has six shards (the test settings have two)."""
    sharded = settings.model_copy(update={"scheduler_shards": SHARDS})
    ensure_topics(sharded, sharded.topics.specs())
    procs = Processes(sharded, tmp_path)
    yield procs
    procs.stop_all()
    for proc in procs.started:
        print(f"\n----- {proc.name} (exit {proc.proc.returncode}) -----\n"
              + "\n".join(proc.log().splitlines()[-30:]))


def shards_led(scheduler: ServiceProcess) -> int | None:
    status, body = scheduler.get("/metrics")
    found = re.search(r"^cronstream_scheduler_shards_led (\S+)$", body, re.MULTILINE)
    return int(float(found[1])) if status == 200 and found else None


def leading(scheduler: ServiceProcess, shards: int) -> bool:
    return shards_led(scheduler) == shards


def ready(scheduler: ServiceProcess) -> bool:
    return scheduler.get("/readyz")[0] == 200


def numbers(row: Locator, cell: str) -> list[int]:
    return [int(n) for n in row.locator(f"td.{cell} .shard").all_inner_texts()]


def shown(page: Page) -> dict[str, tuple[list[int], list[int]]]:
    """Scheduler -> (shards it leads, shards it keeps warm), as the page lists them."""
    return {row.get_attribute("data-scheduler-id") or "": (numbers(row, "leads"), numbers(row, "standby"))
            for row in page.locator("table.schedulers tr[data-scheduler-id]").all()}


def test_the_page_shows_which_scheduler_leads_and_keeps_warm_each_shard_and_follows_a_departure(
    six_shards: Processes, page: Page, shoot: Callable[[Page, str], None],
) -> None:
    ui = six_shards.start("ui", extra_env={"CRONSTREAM_UI_TOKEN": TOKEN})
    schedulers = {f"s{i}": six_shards.start("scheduler", "--instance-id", f"s{i}", name=f"scheduler-s{i}")
                  for i in (1, 2, 3)}
    ui.wait_for_log("action=live_listening")
    dashboard = Dashboard(ui, f"http://127.0.0.1:{ui.http_port()}")
    expected = roles([f"scheduler-{name}" for name in schedulers], SHARDS, 1)

    # Ready: a member, and every shard it leads taken over — what its metrics then count.
    for name, proc in schedulers.items():
        eventually(partial(ready, proc), 90, 0.5, message=f"{name} ready")
        eventually(partial(leading, proc, len(expected[f"scheduler-{name}"].leads)), 60, 0.5,
                   message=f"{name} leading its shards")

    login(page, dashboard, "bob")
    page.goto(dashboard.url("/schedulers"))
    expect(page.locator("table.schedulers tr[data-scheduler-id]")).to_have_count(3)
    assert shown(page) == {name.removeprefix("scheduler-"): (list(r.leads), list(r.standby))
                           for name, r in expected.items()}
    expect(page.locator("h1 .count")).to_have_text("3 running · 6 shards · 1 standby per shard")
    expect(page.locator("table.shard-roles tr[data-shard]")).to_have_count(SHARDS)
    expect(page.locator("table.shard-roles tr.unled")).to_have_count(0)
    expect(page.locator("p.warning")).to_have_count(0)
    for shard in range(SHARDS):
        row = page.locator(f'table.shard-roles tr[data-shard="{shard}"] td')
        leader = next(n for n, r in expected.items() if shard in r.leads).removeprefix("scheduler-")
        standby = next(n for n, r in expected.items() if shard in r.standby).removeprefix("scheduler-")
        expect(row.nth(1)).to_have_text(leader)
        expect(row.nth(2)).to_have_text(standby)
    expect(page.locator("header nav a.active")).to_have_text("Schedulers")
    shoot(page, "schedulers")

    # One stops (SIGTERM: it hands its shards over); the next read of the group (at most
    # 5 s later) shows its shards led by the two left.
    assert schedulers["s3"].stop() == 0
    after = roles(["scheduler-s1", "scheduler-s2"], SHARDS, 1)

    def moved() -> bool:
        page.goto(dashboard.url("/schedulers"))
        return set(shown(page)) == {"s1", "s2"}

    eventually(moved, 30, 1.0, message="the page without s3")
    assert shown(page) == {name.removeprefix("scheduler-"): (list(r.leads), list(r.standby))
                           for name, r in after.items()}
    expect(page.locator("table.shard-roles tr.unled")).to_have_count(0)
    for name in ("s1", "s2"):
        eventually(partial(leading, schedulers[name], len(after[f"scheduler-{name}"].leads)), 60, 0.5,
                   message=f"{name} took over its share of s3's shards")
