"""A dashboard form is good for one session, from this site, and only so large.

Each test runs `cronstream ui` as a process and talks to it over HTTP, as
`test_dashboard.py` does: a CSRF token fits only the session (or, before login, the
pre-session cookie) it was served to; a POST carried by a browser's credentials names
this site in `Origin` or `Referer`; a form is cut off at its limit however its body is
framed (`Content-Length` or chunked), with 413.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from cronstream.shared.settings import Settings
from cronstream.ui.app import MAX_FORM_BYTES, PARAMS_FORM_BYTES
from cronstream.ui.auth import CSRF_COOKIE, SESSION_COOKIE
from tests.conftest import Processes
from tests.security.test_dashboard import TOKEN, log_in, login_form, seed_job
from tests.support import produce_json, start_ui

FORM = "application/x-www-form-urlencoded"


def cookie(response: httpx.Response, name: str) -> str:
    """The `name=value` pair of the cookie `response` sets, as a browser sends it back."""
    for line in response.headers.get_list("set-cookie"):
        pair = line.split(";", 1)[0]
        if pair.split("=", 1)[0] == name:
            return pair
    raise AssertionError(f"no {name} cookie in {response.headers.get_list('set-cookie')}")


def token_on(base: str, cookies: str, path: str = "/login", **headers: str) -> str:
    """The CSRF token of the form a browser sending `cookies` is served on `path`."""
    page = httpx.get(base + path, headers={"Cookie": cookies, **headers})
    assert page.status_code == 200, page.status_code
    match = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page.text)
    assert match, "every form carries a CSRF token"
    return match[1]


def chunks(total: int, field: str = "name") -> Iterator[bytes]:
    """A form of one field, `total` bytes long, sent 4 KiB at a time (chunked: no
    Content-Length says in advance how large it is)."""
    head = f"{field}=".encode()
    yield head
    left = total - len(head)
    while left > 0:
        yield b"a" * min(4096, left)
        left -= 4096


def test_an_anonymous_csrf_token_is_refused_beside_another_users_session(
    processes: Processes, topics: Settings,
) -> None:
    execution = seed_job(topics, "payroll")
    base = start_ui(processes, "ui", CRONSTREAM_UI_TOKEN=TOKEN)
    cancel = f"{base}/executions/{execution}/cancel"
    # The attacker's own pair, from the login form anyone may load ...
    attacker_page, attacker_token = login_form(base, {})
    attacker_csrf = cookie(attacker_page, CSRF_COOKIE)
    # ... planted beside the victim's session (a sibling domain can set the CSRF cookie).
    victim = cookie(log_in(base, TOKEN, "victim"), SESSION_COOKIE)
    planted = f"{attacker_csrf}; {victim}"
    forged = httpx.post(cancel, data={"csrf_token": attacker_token},
                        headers={"Origin": base, "Cookie": planted})
    assert forged.status_code == 403 and "CSRF" in forged.text, forged.status_code

    # The victim's own form, served with the same cookies, still acts: the refusal above
    # is the token's binding, not a broken form.
    own = token_on(base, planted)
    assert own != attacker_token
    acted = httpx.post(cancel, data={"csrf_token": own}, headers={"Origin": base, "Cookie": planted})
    assert acted.status_code == 303, acted.text


def test_a_csrf_token_fits_only_the_session_it_was_served_to_and_login_rotates_it(
    processes: Processes, topics: Settings,
) -> None:
    execution = seed_job(topics, "reports")
    base = start_ui(processes, "ui", CRONSTREAM_UI_TOKEN=TOKEN)
    page, before_login = login_form(base, {})
    browser_csrf = cookie(page, CSRF_COOKIE)
    login = httpx.post(base + "/login", data={"name": "carol", "token": TOKEN, "csrf_token": before_login},
                       headers={"Origin": base, "Cookie": browser_csrf})
    assert login.status_code == 303, login.text
    carol = cookie(login, SESSION_COOKIE)
    carol_again = cookie(log_in(base, TOKEN, "carol"), SESSION_COOKIE)
    dave = cookie(log_in(base, TOKEN, "dave"), SESSION_COOKIE)
    carols_token = token_on(base, f"{browser_csrf}; {carol}")

    def cancel_with(session: str, token: str) -> int:
        return httpx.post(f"{base}/executions/{execution}/cancel", data={"csrf_token": token},
                          headers={"Origin": base, "Cookie": f"{browser_csrf}; {session}"}).status_code

    assert cancel_with(dave, carols_token) == 403, "another user's session"
    assert carol != carol_again, "each login is a session of its own, even under one name"
    assert cancel_with(carol_again, carols_token) == 403, "another session of the same name"
    assert cancel_with(carol, before_login) == 403, "the token from before the login"
    assert cancel_with(carol, carols_token) == 303, "its own session"
    assert cookie(login, CSRF_COOKIE) != browser_csrf, "a login gives the browser a new CSRF cookie"


def test_a_browsers_post_without_origin_or_referer_is_refused_and_a_bearer_token_needs_neither(
    processes: Processes, topics: Settings,
) -> None:
    execution = seed_job(topics, "cleanup")
    cancel = f"/executions/{execution}/cancel"
    base = start_ui(processes, "ui", CRONSTREAM_UI_TOKEN=TOKEN)
    page, anonymous = login_form(base, {})
    csrf = cookie(page, CSRF_COOKIE)
    bare_login = httpx.post(base + "/login", data={"name": "carol", "token": TOKEN, "csrf_token": anonymous},
                            headers={"Cookie": csrf})
    assert bare_login.status_code == 403 and "Origin" in bare_login.text, bare_login.status_code

    cookies = f"{csrf}; {cookie(log_in(base, TOKEN), SESSION_COOKIE)}"
    token = token_on(base, cookies)

    def post(path: str, **headers: str) -> httpx.Response:
        return httpx.post(base + path, data={"csrf_token": token}, headers={"Cookie": cookies, **headers})

    bare = post(cancel)
    assert bare.status_code == 403 and "Origin" in bare.text, bare.status_code
    assert post("/logout").status_code == 403
    assert post(cancel, Referer="http://evil.example/page").status_code == 403
    assert post(cancel, Origin="null").status_code == 403, "an opaque origin is no origin of ours"
    assert post(cancel, Referer=f"{base}/executions/{execution}").status_code == 303, \
        "a Referer of this site stands in for a missing Origin"
    scripted = httpx.post(base + cancel, headers={"Authorization": f"Bearer {TOKEN}"})
    assert scripted.status_code == 200, "a bearer token is no ambient credential: a script sends neither"
    assert post("/logout", Origin=base).status_code == 303

    # A trusted proxy's header is as ambient as a cookie: the browser adds neither itself.
    proxied = start_ui(processes, "ui-proxied", CRONSTREAM_UI_IDENTITY_HEADER="X-Forwarded-User")
    dana = {"X-Forwarded-User": "dana@example.com"}
    page = httpx.get(proxied + "/login", headers=dana)
    dana_csrf = cookie(page, CSRF_COOKIE)
    dana_token = token_on(proxied, dana_csrf, f"/executions/{execution}", **dana)
    headers = {**dana, "Cookie": dana_csrf}
    unnamed = httpx.post(proxied + cancel, data={"csrf_token": dana_token}, headers=headers)
    assert unnamed.status_code == 403, unnamed.status_code
    named = httpx.post(proxied + cancel, data={"csrf_token": dana_token}, headers={**headers, "Origin": proxied})
    assert named.status_code == 303, named.text


def test_a_chunked_form_is_refused_at_its_limit_without_waiting_for_its_end(
    processes: Processes, topics: Settings,
) -> None:
    base = start_ui(processes, "ui", CRONSTREAM_UI_TOKEN=TOKEN)
    address = urlsplit(base)
    assert address.hostname is not None and address.port is not None
    # A body that would be 200 KiB, of which only a little more than the limit is sent:
    # the answer must come before the rest (a server parsing the whole form would wait).
    with socket.create_connection((address.hostname, address.port), timeout=20) as sock:
        sock.sendall(f"POST /login HTTP/1.1\r\nHost: {address.netloc}\r\nOrigin: {base}\r\n"
                     f"Content-Type: {FORM}\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        sent = 0
        for chunk in chunks(200 * 1024):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
            if sent > MAX_FORM_BYTES + 4096:
                break
        answer = b""
        try:
            while b"\r\n" not in answer:
                received = sock.recv(4096)
                assert received, "the server closed the connection without an answer"
                answer += received
        except TimeoutError:
            pytest.fail(f"no answer after {sent} bytes of a form limited to {MAX_FORM_BYTES}")
    assert answer.split(b"\r\n", 1)[0] == b"HTTP/1.1 413 Request Entity Too Large", answer[:200]

    # Sent whole, 200 KiB chunked is refused too, on an action as on the login form.
    execution = seed_job(topics, "big-forms")
    # A trigger reads the job's definition from its topic (the SDK's client), not the projection.
    produce_json(topics, topics.topics.job_definitions, "big-forms", {
        "job_id": "big-forms", "type": "CRON", "schedule": "0 0 1 1 *", "handler": "noop"})
    login = log_in(base, TOKEN)
    cookies = f"{cookie(login, CSRF_COOKIE)}; {cookie(login, SESSION_COOKIE)}"
    token = token_on(base, cookies)
    browser = {"Cookie": cookies, "Origin": base, "Content-Type": FORM}
    whole = httpx.post(f"{base}/executions/{execution}/cancel", content=chunks(200 * 1024, "reason"),
                       headers=browser)
    assert whole.status_code == 413 and "too large" in whole.text, whole.status_code

    # The trigger form keeps its larger limit (a run's params), chunked or not.
    def trigger(size: int) -> int:
        body = b"".join(chunks(size, "padding")) + f"&csrf_token={token}".encode()
        return httpx.post(f"{base}/jobs/big-forms/trigger", content=iter([body[:size // 2], body[size // 2:]]),
                          headers=browser).status_code

    assert trigger(100 * 1024) == 303, "100 KiB is within the trigger's limit"
    assert trigger(PARAMS_FORM_BYTES + 1) == 413


def test_an_oversized_login_answers_413_with_or_without_content_length(
    processes: Processes, topics: Settings,
) -> None:
    base = start_ui(processes, "ui", CRONSTREAM_UI_TOKEN=TOKEN)
    page, token = login_form(base, {})
    headers = {"Origin": base, "Cookie": cookie(page, CSRF_COOKIE), "Content-Type": FORM}
    body = f"csrf_token={token}&name=".encode() + b"a" * (1024 * 1024)
    announced = httpx.post(base + "/login", content=body, headers=headers)
    assert announced.status_code == 413, announced.status_code
    chunked = httpx.post(base + "/login", content=iter([body[:4096], body[4096:]]), headers=headers)
    assert chunked.status_code == 413, chunked.status_code
    # A form within the limit still logs in: the limit refuses size, not forms.
    fits = httpx.post(base + "/login", data={"csrf_token": token, "name": "carol", "token": TOKEN},
                      headers={"Origin": base, "Cookie": headers["Cookie"]})
    assert fits.status_code == 303, fits.text
