"""Who is acting, and whether a state-changing request may act (SPEC §10).

Actions are off unless an identity can be established, in one of three ways:

- `Authorization: Bearer <CRONSTREAM_UI_TOKEN>` (scripts; recorded as `api-token`);
- a session cookie, obtained on /login with the token and a name (recorded as that
  name; the token is shared, so the name is the user's word: for real identities put
  the UI behind a proxy and use the header);
- the identity header of a trusted proxy (oauth2-proxy's `X-Forwarded-User`, ...),
  opt-in with CRONSTREAM_UI_IDENTITY_HEADER. Only safe when nothing but that proxy can
  reach the UI (it must strip the header from what clients send).

Every state-changing request carried by ambient credentials (a cookie, a proxy's
header) must also carry a CSRF token: the HMAC of a random per-browser cookie
(`cronstream_csrf`, SameSite=Strict), as a hidden form field. A cross-site page can
make the browser send the cookie but can neither read it nor compute the HMAC. A
cross-origin `Origin` header is refused as well. Bearer requests carry no ambient
credential and need no CSRF token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from starlette.requests import Request

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
                 secret: str | None) -> None:
        self.token = token or None
        self.identity_header = identity_header or None
        self.protect_reads = protect_reads
        if secret:
            key = secret.encode()
        elif self.token:
            # Replicas that share the token share sessions; changing it logs everyone out.
            key = hashlib.sha256(b"cronstream-ui|" + self.token.encode()).digest()
        else:
            key = secrets.token_bytes(32)
        self._key = key

    @property
    def actions_enabled(self) -> bool:
        return self.token is not None or self.identity_header is not None

    def _sign(self, *parts: str) -> str:
        return hmac.new(self._key, "|".join(parts).encode(), hashlib.sha256).hexdigest()

    # -- identity -------------------------------------------------------------------

    def valid_token(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    @staticmethod
    def valid_name(name: str) -> bool:
        return bool(_NAME.match(name))

    def session_value(self, name: str, now: float | None = None) -> str:
        expires = str(int((time.time() if now is None else now) + SESSION_SECONDS))
        encoded = base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")
        return f"{encoded}.{expires}.{self._sign('session', encoded, expires)}"

    def _session_name(self, value: str, now: float | None = None) -> str | None:
        try:
            encoded, expires, signature = value.split(".")
            if not hmac.compare_digest(signature, self._sign("session", encoded, expires)):
                return None
            if int(expires) < (time.time() if now is None else now):
                return None
            name = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        except (ValueError, UnicodeDecodeError):
            return None
        return name if self.valid_name(name) else None

    def identify(self, request: Request) -> Identity | None:
        authorization = request.headers.get("authorization", "")
        if authorization.lower().startswith("bearer ") and self.token is not None:
            return Identity(API_IDENTITY, "bearer") if self.valid_token(authorization[7:].strip()) else None
        if self.token is not None:
            cookie = request.cookies.get(SESSION_COOKIE)
            if cookie:
                name = self._session_name(cookie)
                if name is not None:
                    return Identity(name, "session")
        if self.identity_header is not None:
            value = request.headers.get(self.identity_header, "").strip()
            if value:
                return Identity(value[:256], "header")
        return None

    # -- CSRF -----------------------------------------------------------------------

    @staticmethod
    def new_csrf_cookie() -> str:
        return secrets.token_urlsafe(32)

    def csrf_token(self, cookie: str) -> str:
        return self._sign("csrf", cookie)

    def csrf_ok(self, request: Request, submitted: str | None) -> bool:
        cookie = request.cookies.get(CSRF_COOKIE)
        if not cookie or not submitted:
            return False
        return hmac.compare_digest(submitted, self.csrf_token(cookie))

    @staticmethod
    def same_origin(request: Request) -> bool:
        """A browser names the page that sent a POST in `Origin`; it must be this site."""
        origin = request.headers.get("origin")
        if origin is None:  # not a browser, or a same-origin GET-like request
            return True
        host = request.headers.get("host", "")
        return urlsplit(origin).netloc == host
