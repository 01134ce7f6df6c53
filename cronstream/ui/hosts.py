"""The Host header allow-list: a web page cannot reach the dashboard by DNS rebinding.

A page on `http://rebind.example:8180/` whose name the attacker later points at
127.0.0.1 runs in the victim's browser as same-origin with the dashboard: it can read
every page, and act with whatever the browser carries (an identity header added by a
local proxy). What it cannot change is the Host header the browser sends: the
attacker's name. So the dashboard answers only Hosts it knows (docs/reference/operations.md#the-dashboard):

- loopback names (`localhost`, `127.0.0.1`, `[::1]`): a page can only send those when it
  is served from them;
- its bind address, and the IP address the connection was accepted on when the Host is
  that address written out (the kubelet's probes and Prometheus reach a pod by IP: no
  DNS name is involved, so nothing can be rebound);
- the names in `CRONSTREAM_UI_ALLOWED_HOSTS` (the Ingress host), or any with `*`.

Every other Host gets 400 before routing, with the setting to change in the answer.
"""

from __future__ import annotations

import ipaddress
import logging

from starlette.types import ASGIApp, Receive, Scope, Send

from cronstream.shared.logs import log

logger = logging.getLogger(__name__)

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def host_name(header: str) -> str | None:
    """The name of a Host header without its port (an IPv6 address without brackets),
    lowercased; None when it is not a plausible host."""
    value = header.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return name if _ip(name) is not None else None
    name, _colon, port = value.partition(":")
    if port and not port.isdigit():
        return None
    name = name.rstrip(".")
    if not name or any(c in name for c in "/@\\ ?#%"):
        return None
    return name


class AllowedHosts:
    def __init__(self, configured: list[str], bind: str) -> None:
        self.names = set(LOOPBACK_NAMES) | {h.lower() for h in configured}
        if bind not in _WILDCARD_BINDS:
            self.names.add(bind.lower())
        self.any = "*" in self.names

    def allows(self, header: str | None, server: str | None) -> bool:
        """Whether a request with this Host header, accepted on the local address
        `server`, may be answered."""
        name = host_name(header) if header else None
        if name is None:
            return False
        if self.any or name in self.names:
            return True
        asked, local = _ip(name), _ip(server) if server else None
        return asked is not None and asked == local


class HostGuard:
    """ASGI middleware: 400 for a Host that `AllowedHosts` refuses (module docstring)."""

    def __init__(self, app: ASGIApp, allowed: AllowedHosts) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
        server = scope.get("server")
        if self.allowed.allows(header, server[0] if server else None):
            await self.app(scope, receive, send)
            return
        shown = (header or "")[:100]
        log(logger, "ui_host_refused", host=shown, path=scope.get("path", "")[:200])
        body = (f"Host {shown!r} is not served here: add its name to "
                "CRONSTREAM_UI_ALLOWED_HOSTS.\n").encode()
        await send({"type": "http.response.start", "status": 400, "headers": [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store")]})
        await send({"type": "http.response.body", "body": body})
