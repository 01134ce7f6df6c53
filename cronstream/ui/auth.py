"""Who is acting, and whether a state-changing request may act (docs/reference/operations.md#the-dashboard).

Actions are off unless an identity can be established, in one of three ways:

- `Authorization: Bearer <CRONSTREAM_UI_TOKEN>` (scripts; recorded as `api-token`);
- a session cookie, obtained on /login with the token and a name (recorded as that
  name; the token is shared, so the name is the user's word: for real identities put
  the UI behind a proxy and use the header);
- the identity header of a trusted proxy (oauth2-proxy's `X-Forwarded-User`, ...),
  opt-in with CRONSTREAM_UI_IDENTITY_HEADER. Only safe when nothing but that proxy can
  reach the UI (it must strip the header from what clients send). In this mode the
  header is the identity: the token (login and bearer) is off unless
  CRONSTREAM_UI_TOKEN_LOGIN=true, since whoever knew it could log in under any name,
  and a header, when present, wins over a token's session.

Tokens are at least 16 characters (settings), wrong ones are throttled per client
address (`throttle.py`), and a session names the token it was opened with: changing the
token ends every session, even under a session key that stays the same.

Every state-changing request carried by ambient credentials (a cookie, a proxy's
header) must also carry a CSRF token, a hidden form field bound to whom the form was
served (`csrf_token`):

- a login session: an HMAC of the session cookie's value, which is new at each login
  (it carries a nonce), so the token works with that session and no other;
- a proxy's identity: an HMAC of that name and a random per-browser cookie
  (`cronstream_csrf`, SameSite=Strict);
- nobody yet (the login form, the pre-session): an HMAC of that cookie alone; a login
  gives the browser a new one.

A cross-site page can make the browser send the cookies but can neither read them nor
compute the HMAC; a pair (cookie, token) it obtained for itself, even planted in the
victim's browser, does not fit the victim's session. Such a request must also name this
site in `Origin` (or, without it, `Referer`), and one naming neither is refused. Bearer
requests carry no ambient credential (a page cannot make a browser attach the token):
they need no CSRF token and may name no origin (scripts), but a foreign one is refused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from starlette.requests import Request

from cronstream.shared import metrics
from cronstream.ui.throttle import Throttle

SESSION_COOKIE = "cronstream_session"
CSRF_COOKIE = "cronstream_csrf"
CSRF_FIELD = "csrf_token"
SESSION_SECONDS = 12 * 3600
API_IDENTITY = "api-token"
_NAME = re.compile(r"^[\w .@+-]{1,64}$")


@dataclass(frozen=True)
class Identity:
    name: str
    via: Literal["bearer", "session", "header"]


class Auth:
    def __init__(self, token: str | None, identity_header: str | None, protect_reads: bool,
                 secret: str | None, *, token_login: bool | None = None,
                 metrics_token: str | None = None, throttle: Throttle | None = None) -> None:
        self.identity_header = identity_header or None
        self.token_login = token_login if token_login is not None else self.identity_header is None
        self.token = (token or None) if self.token_login else None
        self.token_ignored = bool(token) and not self.token_login  # logged at start
        self.metrics_token = metrics_token or None
        self.protect_reads = protect_reads
        self.throttle = throttle or Throttle()
        if secret:
            key = secret.encode()
        elif self.token:
            # Replicas that share the token share sessions; changing it logs everyone out.
            key = hashlib.sha256(b"cronstream-ui|" + self.token.encode()).digest()
        else:
            key = secrets.token_bytes(32)
        self._key = key
        self._token_tag = hashlib.sha256(b"cronstream-ui-token|" + self.token.encode()).hexdigest()[:32] \
            if self.token else ""

    @property
    def actions_enabled(self) -> bool:
        return self.token is not None or self.identity_header is not None

    def _sign(self, *parts: str) -> str:
        # A JSON list, not a joined string: a proxy's user name may hold any separator,
        # and ("a|b", "c") must not sign as ("a", "b|c").
        return hmac.new(self._key, json.dumps(parts).encode(), hashlib.sha256).hexdigest()

    # -- identity -------------------------------------------------------------------

    @staticmethod
    def client(request: Request) -> str:
        """The client's address (the real one behind a trusted proxy: app.py)."""
        return request.client.host if request.client else "unknown"

    def throttled(self, request: Request) -> float:
        """Seconds this request's client must wait before a token is compared again."""
        return self.throttle.retry_after(self.client(request))

    def check_token(self, given: str, request: Request, expected: str | None = None) -> bool:
        """Whether `given` is the token (or `expected`); a throttled client's is not even
        compared, and a wrong one counts against its address."""
        wanted = self.token if expected is None else expected
        client = self.client(request)
        if wanted is not None and self.throttle.retry_after(client) <= 0:
            if hmac.compare_digest(given.encode(), wanted.encode()):
                self.throttle.succeeded(client)
                return True
            self.throttle.failed(client)
        metrics.UI_TOKEN_FAILURES.inc()
        return False

    @staticmethod
    def valid_name(name: str) -> bool:
        return bool(_NAME.match(name))

    def session_value(self, name: str, now: float | None = None) -> str:
        expires = str(int((time.time() if now is None else now) + SESSION_SECONDS))
        encoded = base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")
        # Two logins are two sessions, even under one name in one second: a CSRF token
        # is bound to the session's value (csrf_token) and must not fit the other.
        nonce = secrets.token_urlsafe(12)
        signature = self._sign("session", encoded, expires, nonce, self._token_tag)
        return f"{encoded}.{expires}.{nonce}.{signature}"

    def _session_name(self, value: str, now: float | None = None) -> str | None:
        try:
            encoded, expires, nonce, signature = value.split(".")
            if not self._token_tag or not hmac.compare_digest(
                    signature, self._sign("session", encoded, expires, nonce, self._token_tag)):
                return None
            if int(expires) < (time.time() if now is None else now):
                return None
            name = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        except (ValueError, UnicodeDecodeError):
            return None
        return name if self.valid_name(name) else None

    def identify(self, request: Request) -> Identity | None:
        """Who sends `request` (once per request: a wrong bearer token counts once)."""
        if "cronstream.identity" not in request.scope:
            request.scope["cronstream.identity"] = self._identify(request)
        identity: Identity | None = request.scope["cronstream.identity"]
        return identity

    def _identify(self, request: Request) -> Identity | None:
        if self.identity_header is not None:
            value = request.headers.get(self.identity_header, "").strip()
            if value:
                return Identity(value[:256], "header")
        if self.token is None:
            return None
        authorization = request.headers.get("authorization", "")
        if authorization.lower().startswith("bearer "):
            given = authorization[7:].strip()
            return Identity(API_IDENTITY, "bearer") if self.check_token(given, request) else None
        cookie = request.cookies.get(SESSION_COOKIE)
        if cookie:
            name = self._session_name(cookie)
            if name is not None:
                return Identity(name, "session")
        return None

    def may_scrape(self, request: Request) -> bool:
        """/metrics: with a scrape token (CRONSTREAM_UI_METRICS_TOKEN), that token as a
        bearer and nothing else; without one, as any page (open unless reads are
        protected)."""
        if self.metrics_token is None:
            return not self.protect_reads or self.identify(request) is not None
        authorization = request.headers.get("authorization", "")
        return authorization.lower().startswith("bearer ") and self.check_token(
            authorization[7:].strip(), request, self.metrics_token)

    # -- CSRF -----------------------------------------------------------------------

    @staticmethod
    def new_csrf_cookie() -> str:
        return secrets.token_urlsafe(32)

    def csrf_token(self, request: Request, csrf_cookie: str | None = None) -> str:
        """The CSRF token of a form served to `request`, bound to whom it is served (the
        module's docstring); `csrf_cookie` is the one about to be set when the request
        came without. "" when there is nothing to bind it to (no cookie yet)."""
        identity = self.identify(request)
        if identity is not None and identity.via == "session":
            return self._sign("csrf-session", request.cookies[SESSION_COOKIE])
        cookie = csrf_cookie or request.cookies.get(CSRF_COOKIE)
        if not cookie:
            return ""
        if identity is not None and identity.via == "header":
            return self._sign("csrf-header", identity.name, cookie)
        return self._sign("csrf-anonymous", cookie)

    def csrf_ok(self, request: Request, submitted: str | None) -> bool:
        expected = self.csrf_token(request)
        if not expected or not submitted:
            return False
        # Bytes: compare_digest refuses a str with non-ASCII characters (a 500, not a 403).
        return hmac.compare_digest(submitted.encode(), expected.encode())

    @staticmethod
    def cross_site(request: Request, *, ambient: bool) -> str | None:
        """Why a state-changing request is refused as not coming from this site, or None.

        A browser names the page a POST comes from in `Origin` (every current one does,
        same-origin too) or, where it leaves that out, in `Referer` (this site's
        Referrer-Policy, same-origin, keeps it on its own requests): whichever is sent
        must be this Host. With neither, nothing shows the request came from a page of
        this site: refused when it is carried by `ambient` credentials (a cookie, a
        proxy's header), let through for a bearer token, which a page cannot make a
        browser attach (a script sends neither)."""
        host = request.headers.get("host", "").lower()
        origin = request.headers.get("origin")
        if origin is not None:
            return None if _netloc(origin) == host else "cross-origin request refused"
        referer = request.headers.get("referer")
        if referer is not None:
            return None if _netloc(referer) == host else "cross-site request refused (Referer)"
        if ambient:
            return ("request without Origin or Referer refused: post from the dashboard's page "
                    "(scripts: Authorization: Bearer <token>)")
        return None


def _netloc(url: str) -> str:
    """The host[:port] of `url`; "" for what names none ("null", an opaque origin)."""
    try:
        return urlsplit(url).netloc.lower()
    except ValueError:
        return ""
