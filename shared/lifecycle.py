"""One lifecycle for every service.

A service is an object with a `name` and `async run(stopping)`. `run_service` configures
logging, installs SIGTERM/SIGINT handlers that set `stopping` (a second signal exits at
once), runs the service to completion and returns its exit code. Services finish their
in-flight work and close their Kafka clients when `stopping` is set; the whole shutdown
stays well inside Kubernetes' default 30 s grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import Protocol

from cronstream.shared import logs
from cronstream.shared.logs import log
from cronstream.shared.settings import Settings

logger = logging.getLogger(__name__)


class Service(Protocol):
    name: str

    async def run(self, stopping: asyncio.Event) -> None: ...


def run_service(service: Service, settings: Settings) -> int:
    logs.configure(service.name, settings.log_level)
    log(logger, "service_starting", service=service.name, settings=settings.redacted())
    try:
        asyncio.run(_main(service))
    except Exception:
        logger.exception("service failed", extra={"action": "service_failed"})
        return 1
    log(logger, "service_stopped", service=service.name)
    return 0


async def _main(service: Service) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stopping.is_set():
            log(logger, "service_killed", logging.WARNING, signal=signal.Signals(signum).name)
            os._exit(130)
        log(logger, "service_stopping", signal=signal.Signals(signum).name)
        stopping.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await service.run(stopping)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)


async def wait_or_stop(stopping: asyncio.Event, timeout: float) -> bool:
    """Sleep up to `timeout` unless stopping; return whether stopping was set."""
    if timeout > 0 and not stopping.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), timeout)
    return stopping.is_set()
