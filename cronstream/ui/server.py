"""Running the dashboard: uvicorn on a socket we bind ourselves, clean stop on SIGTERM.

The socket is bound and listening before `action=http_serving port=N` is logged, so a
client that reads the port from the log never races the server (port 0 takes any free
port). SIGTERM / Ctrl-C end the live streams first (they would otherwise hold the
graceful shutdown open), then uvicorn drains the other requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Iterator
from types import FrameType

import uvicorn

from cronstream.shared import logs, metrics
from cronstream.shared.health import open_http
from cronstream.shared.lifecycle import die_with_parent
from cronstream.shared.logs import log
from cronstream.shared.settings import Settings
from cronstream.ui.app import UI, create_app

logger = logging.getLogger(__name__)

SERVICE = "ui"
GRACEFUL_SECONDS = 5


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, ui: UI) -> None:
        super().__init__(config)
        self.ui = ui

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            log(logger, "service_stopping", signal=signal.Signals(sig).name)
        self.ui.hub.close()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn's own version re-raises the signal after shutdown, which would end the
        # process "killed by SIGTERM" instead of exiting 0 after a clean stop.
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _listen(bind: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bind, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def serve(settings: Settings) -> int:
    logs.configure(SERVICE, settings.log_level)
    # uvicorn's start/stop chatter duplicates our action= lines; its errors still show.
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    log(logger, "service_starting", service=SERVICE, settings=settings.redacted())
    metrics.announce(SERVICE)
    port = settings.port_for(SERVICE)
    try:
        sock = open_http(lambda p: _listen(settings.ui_bind, p), SERVICE, settings.http_port, port)
    except OSError as exc:
        log(logger, "service_failed", logging.ERROR, service=SERVICE,
            error=f"cannot serve HTTP on {settings.ui_bind}:{port}: {exc}")
        return 1
    app = create_app(settings)
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on",
                            timeout_graceful_shutdown=GRACEFUL_SECONDS, server_header=False,
                            proxy_headers=False)
    server = _Server(config, app.state.ui)
    if app.state.ui.auth.token_ignored:
        log(logger, "ui_token_ignored", logging.WARNING,
            reason="CRONSTREAM_UI_IDENTITY_HEADER is set: the proxy names who acts; "
                   "set CRONSTREAM_UI_TOKEN_LOGIN=true to let the token log in too")
    bound = sock.getsockname()
    log(logger, "http_serving", service=SERVICE, bind=bound[0], port=bound[1],
        url=f"http://{settings.ui_bind}:{bound[1]}/",
        actions="on" if app.state.ui.auth.actions_enabled else "off")
    die_with_parent()
    try:
        asyncio.run(server.serve(sockets=[sock]))
    except Exception:
        logger.exception("ui failed", extra={"action": "service_failed"})
        return 1
    finally:
        sock.close()
    log(logger, "service_stopped", service=SERVICE)
    return 0
