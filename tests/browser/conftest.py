"""Browser tests: Debian's Chromium driven by Playwright, against the real services.

Playwright's own browser download does not work here, so the tests launch the system's
`/usr/bin/chromium` (`make test` installs it). Missing Chromium fails the run in CI and
skips these tests elsewhere. Screenshots go to the test's temporary folder, or to
`docs/ui/` with CRONSTREAM_UI_SCREENSHOTS=1 (`make ui-screenshots`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Dialog, Error, Page, sync_playwright

from tests.conftest import CI, Processes
from tests.support import ServiceProcess, sql

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage"]
TOKEN = "browser-test-token"
DOCS_UI = Path(__file__).resolve().parents[2] / "docs" / "ui"


def db(url: str, statement: str, *args: Any) -> list[Any]:
    """tests.support.sql on a thread of its own: Playwright's sync API keeps an event
    loop running on the test's thread, where asyncio.run() is not allowed."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(sql, url, statement, *args).result(timeout=30)


@contextmanager
def chromium(*args: str) -> Iterator[Browser]:
    """The system's Chromium under Playwright, with `args` besides ours (a missing one
    fails in CI and skips elsewhere)."""
    if not os.path.exists(CHROMIUM):
        message = f"{CHROMIUM} is missing (apt-get install chromium; `make test` does it)"
        if CI:
            pytest.fail(message)
        pytest.skip(message)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, *args])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def browser() -> Iterator[Browser]:
    """Per test, and requested after the database fixtures: Playwright's loop must not
    be running while they call asyncio.run()."""
    with chromium() as launched:
        yield launched


@dataclass
class Dashboard:
    proc: ServiceProcess
    base: str

    def url(self, path: str) -> str:
        return self.base + path


@pytest.fixture
def dashboard(processes: Processes) -> Dashboard:
    proc = processes.start("ui", extra_env={"CRONSTREAM_UI_TOKEN": TOKEN})
    proc.wait_for_log("action=live_listening")
    return Dashboard(proc, f"http://127.0.0.1:{proc.http_port()}")


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    opened = context.new_page()
    errors: list[str] = []

    def page_error(exc: Error) -> None:
        errors.append(str(exc))

    def dialog(shown: Dialog) -> None:
        errors.append(f"dialog: {shown.message}")
        shown.dismiss()

    opened.on("pageerror", page_error)
    opened.on("dialog", dialog)
    yield opened
    context.close()
    assert not errors, f"script errors or dialogs in the page: {errors}"


@pytest.fixture
def shoot(tmp_path: Path) -> Callable[[Page, str], None]:
    """Screenshot of the current page as <name>.png (docs/ui/ when asked)."""
    folder = DOCS_UI if os.environ.get("CRONSTREAM_UI_SCREENSHOTS") else tmp_path
    folder.mkdir(parents=True, exist_ok=True)

    def take(page: Page, name: str) -> None:
        assert re.fullmatch(r"[a-z0-9-]+", name)
        page.screenshot(path=str(folder / f"{name}.png"), full_page=False)

    return take


def login(page: Page, dashboard: Dashboard, name: str) -> None:
    page.goto(dashboard.url("/login?next=/jobs"))
    page.fill("input[name=name]", name)
    page.fill("input[name=token]", TOKEN)
    page.click("form.login button[type=submit]")
    page.wait_for_url(re.compile(r".*/jobs$"))
    assert page.inner_text("header .identity") == name
