"""The dashboard cannot be turned against its users (issue 49, item 4).

Each test runs `cronstream ui` as a process and talks to it over HTTP (a real Chromium
for DNS rebinding): the Host allow-list, cookies and HSTS behind a TLS-terminating proxy,
throttled tokens and their minimum length, sessions that end with the token, token
logins off beside an SSO proxy's header, the Referer fallback of the post-action
redirect, and a protected `/metrics`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from datetime import UTC, datetime

import httpx
import pytest

from cronstream.shared.settings import Settings
from cronstream.ui.hosts import AllowedHosts, host_name
from cronstream.ui.throttle import LIMIT
from tests.browser.conftest import chromium
from tests.conftest import Processes
from tests.support import csrf_of, env_for, sql, start_ui

TOKEN = "dashboard-token-0123456789"
OTHER_TOKEN = "rotated-token-9876543210"
SESSION_KEY = "shared-session-key-of-the-replicas"


def seed_job(settings: Settings, job_id: str) -> uuid.UUID:
    """A projected job with a RUNNING execution (what the monitor would have written)."""
    definition = json.dumps({"job_id": job_id, "type": "CRON", "schedule": "0 0 1 1 *", "handler": "noop"})
    sql(settings.database_url,
        "INSERT INTO job_definitions (job_id, name, type, schedule, timezone, trigger_rule, handler, "
        "max_retries, retry_delay_seconds, max_retry_delay_seconds, timeout_seconds, priority, queue, "
        "concurrency_policy, misfire_policy, misfire_grace_seconds, enabled, updated_at, definition) "
        "VALUES ($1, $1, 'CRON', '0 0 1 1 *', 'UTC', 'ALL_SUCCESS', 'noop', 0, 10, 3600, 3600, "
        "'normal', 'default', 'ALLOW', 'FIRE_ONCE', 60, true, now(), $2::jsonb)", job_id, definition)
    execution, now = uuid.uuid4(), datetime.now(UTC)
    sql(settings.database_url,
        "INSERT INTO job_executions (execution_id, job_id, run_id, status, scheduled_at, "
        "attempt_number, last_event, updated_at) VALUES ($1, $2, $3, 'RUNNING', $4, 1, 'RUNNING', $4)",
        execution, job_id, uuid.uuid4(), now)
    return execution


def cookies_of(response: httpx.Response) -> dict[str, str]:
    """name -> the whole Set-Cookie line, for the flags."""
    return {line.split("=", 1)[0]: line for line in response.headers.get_list("set-cookie")}


def cookie_header(*responses: httpx.Response) -> str:
    """What a browser would send back (httpx keeps Secure cookies off plain http)."""
    pairs = [line.split(";", 1)[0] for r in responses for line in r.headers.get_list("set-cookie")]
    return "; ".join(pairs)


def login_form(base: str, headers: dict[str, str], path: str = "/login") -> tuple[httpx.Response, str]:
    """A page with a form, and its CSRF token."""
    page = httpx.get(base + path, headers=headers)
    assert page.status_code == 200, page.status_code
    match = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page.text)
    assert match
    return page, match[1]


def log_in(base: str, token: str, name: str = "carol", headers: dict[str, str] | None = None,
           form_on: str = "/login") -> httpx.Response:
    headers = headers or {}
    page, csrf = login_form(base, headers, form_on)
    # A browser names the page a form was posted from (the dashboard refuses a login without).
    return httpx.post(base + "/login", data={"name": name, "token": token, "csrf_token": csrf},
                      headers={"Origin": base, **headers, "Cookie": cookie_header(page)})


def test_hosts_are_judged_by_name_or_by_the_address_the_connection_came_to() -> None:
    allowed = AllowedHosts(["dash.example.com"], "0.0.0.0")
    assert allowed.allows("localhost:8180", "127.0.0.1") and allowed.allows("[::1]:8180", "::1")
    assert allowed.allows("DASH.example.com.", "10.0.0.5")
    assert allowed.allows("10.0.0.5:8180", "10.0.0.5"), "a probe to the pod's own address"
    assert allowed.allows("10.0.0.5", "::ffff:10.0.0.5")
    assert not allowed.allows("10.0.0.6:8180", "10.0.0.5"), "another address"
    assert not allowed.allows("rebind.example:8180", "127.0.0.1")
    assert not allowed.allows(None, "127.0.0.1") and not allowed.allows("", "127.0.0.1")
    assert not allowed.allows("evil@localhost", "127.0.0.1")
    assert AllowedHosts([], "192.168.1.9").allows("192.168.1.9:8180", None), "the bind address"
    assert AllowedHosts(["*"], "127.0.0.1").allows("anything.example", None)
    assert host_name("[2001:db8::1]:80") == "2001:db8::1" and host_name("[nope]") is None


def test_a_rebound_dns_name_cannot_read_a_local_dashboard(processes: Processes, topics: Settings) -> None:
    seed_job(topics, "payroll-export")
    base = start_ui(processes, "ui")
    port = base.rsplit(":", 1)[1]
    allowed = start_ui(processes, "ui-allowed", CRONSTREAM_UI_ALLOWED_HOSTS="dash.test")
    allowed_port = allowed.rsplit(":", 1)[1]
    # The attacker's name resolves to this machine, as after a DNS rebinding.
    rules = "--host-resolver-rules=MAP rebind.test 127.0.0.1, MAP dash.test 127.0.0.1"
    with chromium(rules) as browser:
        page = browser.new_page()
        rebound = page.goto(f"http://rebind.test:{port}/jobs")
        assert rebound is not None and rebound.status == 400
        assert "payroll-export" not in page.content()
        assert "CRONSTREAM_UI_ALLOWED_HOSTS" in page.content()
        direct = page.goto(f"http://127.0.0.1:{port}/jobs")
        assert direct is not None and direct.status == 200 and "payroll-export" in page.content()
        named = page.goto(f"http://dash.test:{allowed_port}/jobs")
        assert named is not None and named.status == 200 and "payroll-export" in page.content()
    assert httpx.get(base + "/healthz", headers={"Host": "rebind.test"}).status_code == 400


def test_behind_a_trusted_tls_proxy_cookies_are_secure_and_hsts_is_sent(
    processes: Processes, topics: Settings,
) -> None:
    trusting = start_ui(processes, "ui-trusting", CRONSTREAM_UI_TOKEN=TOKEN,
                        CRONSTREAM_UI_TRUSTED_PROXIES="127.0.0.1")
    tls = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"}
    page, _ = login_form(trusting, tls)
    assert "secure" in cookies_of(page)["cronstream_csrf"].lower()
    assert page.headers["strict-transport-security"].startswith("max-age=")
    login = log_in(trusting, TOKEN, headers=tls)
    assert login.status_code == 303, login.text
    session = cookies_of(login)["cronstream_session"].lower()
    assert "secure" in session and "httponly" in session and "samesite=strict" in session
    assert "strict-transport-security" in login.headers

    plain, _ = login_form(trusting, {})
    assert "secure" not in cookies_of(plain)["cronstream_csrf"].lower()
    assert "strict-transport-security" not in plain.headers

    # A proxy that is not trusted cannot claim TLS for its clients.
    wary = start_ui(processes, "ui-wary", CRONSTREAM_UI_TOKEN=TOKEN,
                    CRONSTREAM_UI_TRUSTED_PROXIES="10.9.9.9")
    spoofed, _ = login_form(wary, tls)
    assert "secure" not in cookies_of(spoofed)["cronstream_csrf"].lower()
    assert "strict-transport-security" not in spoofed.headers


def test_wrong_tokens_are_throttled_per_client_and_short_tokens_are_refused(
    processes: Processes, topics: Settings,
) -> None:
    execution = seed_job(topics, "nightly")
    base = start_ui(processes, "ui", CRONSTREAM_UI_TOKEN=TOKEN, CRONSTREAM_UI_TRUSTED_PROXIES="127.0.0.1")
    guesser = {"X-Forwarded-For": "198.51.100.1"}
    for _ in range(LIMIT):
        assert log_in(base, "wrong-token-guess-0000", headers=guesser).status_code == 401
    locked = log_in(base, TOKEN, headers=guesser)
    assert locked.status_code == 429, "the right token after ten wrong ones waits its turn"
    assert int(locked.headers["retry-after"]) > 0
    assert log_in(base, TOKEN, headers={"X-Forwarded-For": "198.51.100.2"}).status_code == 303, \
        "another client is not locked out"

    script = {"X-Forwarded-For": "198.51.100.3"}
    cancel = f"{base}/executions/{execution}/cancel"
    for _ in range(LIMIT):
        wrong = httpx.post(cancel, headers={**script, "Authorization": "Bearer wrong-token-guess-0"})
        assert wrong.status_code == 401
    assert httpx.post(cancel, headers={**script, "Authorization": f"Bearer {TOKEN}"}).status_code == 429
    assert httpx.post(cancel, headers=script).status_code == 401, "no token tried: not throttled"
    metrics = httpx.get(base + "/metrics").text
    assert re.search(r"^cronstream_ui_token_failures_total (\d+)", metrics, re.M)

    env = {**env_for(topics), "CRONSTREAM_UI_TOKEN": "hunter2"}
    try:
        short = subprocess.run([sys.executable, "-m", "cronstream", "ui"], env=env, capture_output=True,
                               text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the dashboard started with a 7-character token")
    assert short.returncode == 2 and "CRONSTREAM_UI_TOKEN" in short.stderr and "16" in short.stderr
    assert "hunter2" not in short.stderr


def test_a_changed_token_ends_every_session_even_under_the_same_session_key(
    processes: Processes, topics: Settings,
) -> None:
    before = start_ui(processes, "ui-before", CRONSTREAM_UI_TOKEN=TOKEN,
                      CRONSTREAM_UI_SESSION_KEY=SESSION_KEY, CRONSTREAM_UI_PROTECT_READS="true")
    login = log_in(before, TOKEN)
    assert login.status_code == 303
    session = {"Cookie": cookie_header(login)}
    assert httpx.get(before + "/jobs", headers=session).status_code == 200
    # A replica with the same session key that still has the old token keeps it valid ...
    same = start_ui(processes, "ui-same", CRONSTREAM_UI_TOKEN=TOKEN,
                    CRONSTREAM_UI_SESSION_KEY=SESSION_KEY, CRONSTREAM_UI_PROTECT_READS="true")
    assert httpx.get(same + "/jobs", headers=session).status_code == 200
    # ... a rotated token ends it.
    after = start_ui(processes, "ui-after", CRONSTREAM_UI_TOKEN=OTHER_TOKEN,
                     CRONSTREAM_UI_SESSION_KEY=SESSION_KEY, CRONSTREAM_UI_PROTECT_READS="true")
    refused = httpx.get(after + "/jobs", headers=session)
    assert refused.status_code == 303 and refused.headers["location"].startswith("/login")
    assert log_in(after, OTHER_TOKEN).status_code == 303


def test_beside_an_sso_header_the_token_logs_in_nobody_unless_enabled(
    processes: Processes, topics: Settings,
) -> None:
    execution = seed_job(topics, "gated")
    sso = start_ui(processes, "ui-sso", CRONSTREAM_UI_IDENTITY_HEADER="X-Forwarded-Email",
                   CRONSTREAM_UI_TOKEN=TOKEN)
    # An SSO user who knows the token cannot log in under another name with it.
    mallory = {"X-Forwarded-Email": "mallory@example.com"}
    assert log_in(sso, TOKEN, "ceo", mallory, form_on=f"/executions/{execution}").status_code == 403
    bearer = httpx.post(f"{sso}/executions/{execution}/cancel", headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.status_code == 401
    assert "alice@example.com" in httpx.get(sso + "/jobs", headers={"X-Forwarded-Email": "alice@example.com"}).text

    both = start_ui(processes, "ui-both", CRONSTREAM_UI_IDENTITY_HEADER="X-Forwarded-Email",
                    CRONSTREAM_UI_TOKEN=TOKEN, CRONSTREAM_UI_TOKEN_LOGIN="true")
    login = log_in(both, TOKEN, "ceo")
    assert login.status_code == 303, "enabled on purpose"
    page = httpx.get(both + "/jobs", headers={"Cookie": cookie_header(login),
                                               "X-Forwarded-Email": "alice@example.com"})
    who = re.search(r'class="identity"[^>]*>([^<]+)<', page.text)
    assert who and who[1] == "alice@example.com", "the proxy's word wins over a token's session"


def test_the_referer_fallback_never_redirects_off_the_site(processes: Processes, topics: Settings) -> None:
    execution = seed_job(topics, "cleanup")
    base = start_ui(processes, "ui", CRONSTREAM_UI_TOKEN=TOKEN)
    with httpx.Client() as browser:
        token = csrf_of(browser, base)
        assert browser.post(base + "/login", data={"name": "carol", "token": TOKEN, "csrf_token": token},
                            headers={"Origin": base}).status_code == 303
        token = csrf_of(browser, base)  # the session's own (it names no Origin: its Referer stands in)
        cancelled = browser.post(f"{base}/executions/{execution}/cancel", data={"csrf_token": token},
                                 headers={"Referer": f"{base}//evil.example/phish"})
    assert cancelled.status_code == 303, cancelled.text
    location = cancelled.headers["location"]
    assert location.startswith("/") and not location.startswith("//"), location


def test_metrics_are_protected_with_the_reads_or_by_their_own_scrape_token(
    processes: Processes, topics: Settings,
) -> None:
    protected = start_ui(processes, "ui-protected", CRONSTREAM_UI_TOKEN=TOKEN,
                         CRONSTREAM_UI_PROTECT_READS="true")
    assert httpx.get(protected + "/metrics").status_code == 401
    scraped = httpx.get(protected + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert scraped.status_code == 200 and "cronstream_build_info" in scraped.text
    assert httpx.get(protected + "/healthz").status_code == 200, "probes stay open"

    scrape = "scrape-token-0123456789abcdef"
    separate = start_ui(processes, "ui-scrape", CRONSTREAM_UI_TOKEN=TOKEN,
                        CRONSTREAM_UI_METRICS_TOKEN=scrape)
    assert httpx.get(separate + "/metrics").status_code == 401
    assert httpx.get(separate + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 401
    assert httpx.get(separate + "/metrics", headers={"Authorization": f"Bearer {scrape}"}).status_code == 200
    assert httpx.get(separate + "/jobs").status_code == 200, "reads stay as configured"
