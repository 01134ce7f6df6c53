"""`/metrics`, `/healthz`, `/readyz` over HTTP on every service (docs/reference/operations.md#http-endpoints).

The server runs on a thread of its own, never on the event loop, so that it can tell a
wedged loop from a live one:

- `/healthz` (liveness) answers 200 while the loop ticks (a task on it stamps `tick()`
  every second) and no fatal condition was reported; 503 with the reason otherwise.
  A Kubernetes liveness probe on it restarts a process whose loop is stuck in a blocking
  call, or whose supervised background task gave up.
- `/readyz` (readiness) answers 200 when every component the service registered says it
  is ready (connected, assigned, caught up...), 503 with the components' states as JSON
  otherwise. A scheduler standby is ready; a consumer waiting for its assignment is not.
- `/metrics` is prometheus-client's exposition (OpenMetrics when the scraper asks for it,
  which carries the exemplars that link a histogram bucket to a trace).

Where: the port set explicitly (`--http-port`, `CRONSTREAM_HTTP_PORT`), or else the
service's default port; when that default is taken (a second worker on the same host), a
free port, logged (`open_http`). An explicit port that is taken fails the start: a
Kubernetes probe expects the service exactly there.
"""

from __future__ import annotations

import errno
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder

from cronstream.shared.logs import log

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Liveness fails when the loop has not ticked for this long. Generous: a loop that
# misses 15 one-second ticks is stuck, not busy.
LOOP_STALL_SECONDS = 15.0


class Health:
    """What a service says about itself; read by the HTTP thread, written by the loop."""

    def __init__(self, service: str, stall_seconds: float = LOOP_STALL_SECONDS) -> None:
        self.service = service
        self.stall_seconds = stall_seconds
        self._lock = threading.Lock()
        self._components: dict[str, str | None] = {}  # name -> None when ready, else why not
        self._fatal: str | None = None
        self._tick = time.monotonic()

    # -- written by the service ------------------------------------------------------

    def require(self, *components: str) -> None:
        """Declare components that must be ready; each starts not ready."""
        with self._lock:
            for name in components:
                self._components.setdefault(name, "starting")

    def set(self, component: str, ready: bool, reason: str = "not ready") -> None:
        with self._lock:
            self._components[component] = None if ready else reason

    def tick(self) -> None:
        self._tick = time.monotonic()

    def fail(self, reason: str) -> None:
        """A fatal condition: liveness fails from now on (the process should be restarted)."""
        with self._lock:
            if self._fatal is None:
                self._fatal = reason
        log(logger, "health_failed", logging.ERROR, service=self.service, reason=reason)

    # -- read by probes ---------------------------------------------------------------

    def live(self) -> tuple[bool, str]:
        if self._fatal is not None:
            return False, self._fatal
        stalled = time.monotonic() - self._tick
        if stalled > self.stall_seconds:
            return False, f"event loop stalled for {stalled:.0f}s"
        return True, "ok"

    def ready(self) -> tuple[bool, dict[str, str]]:
        with self._lock:
            states = {k: (v or "ready") for k, v in self._components.items()}
            ok = all(v is None for v in self._components.values())
        live, why = self.live()
        if not live:
            ok = False
            states["liveness"] = why
        return ok, states


class _Handler(BaseHTTPRequestHandler):
    server: HealthServer

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        health = self.server.health
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(200, encoder(REGISTRY), content_type)
        elif path == "/healthz":
            ok, why = health.live()
            self._send(200 if ok else 503, f"{why}\n".encode(), "text/plain; charset=utf-8")
        elif path == "/readyz":
            ok, states = health.ready()
            body = json.dumps({"ready": ok, "service": health.service, "components": states})
            self._send(200 if ok else 503, body.encode() + b"\n", "application/json")
        else:
            self._send(404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain")

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # probes every few seconds would drown the service's own log


class HealthServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, health: Health, bind: str, port: int) -> None:
        super().__init__((bind, port), _Handler)
        self.health = health
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, name="http", daemon=True)
        self._thread.start()
        log(logger, "http_serving", service=self.health.service, bind=self.server_address[0],
            port=self.port)

    def stop(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join(5)
        self.server_close()


# How a service says where it serves (`action=http_serving ... port=N`), for whoever started
# it: port 0 or a taken default gives a port only the service knows.
_SERVING = re.compile(r"action=http_serving .*?port=(\d+)")


def serving_port(log_text: str) -> int | None:
    """The port a service's log says it serves HTTP on (logfmt lines), or None yet."""
    match = _SERVING.search(log_text)
    return int(match[1]) if match else None


def open_http(listen: Callable[[int], T], service: str, explicit: int | None, default: int) -> T:
    """`listen(port)` on the explicit port, or on the default one; a taken default gives way
    to any free port (0), with a warning that names both. Several services of one kind run
    side by side on a host without flags, while a port someone asked for is that port or
    an error (OSError, raised)."""
    if explicit is not None:
        return listen(explicit)
    try:
        return listen(default)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        opened = listen(0)
        log(logger, "http_default_port_taken", logging.WARNING, service=service, default_port=default,
            hint="serving on a free port instead (see action=http_serving); --http-port pins one")
        return opened
