"""One lifecycle for every service.

A service is an object with a `name`, a `health` and `async run(stopping)`. `run_service`
configures logging, serves `/metrics`, `/healthz` and `/readyz` (health.py), installs
SIGTERM/SIGINT handlers that set `stopping` (a second Ctrl-C exits at once; a repeated
SIGTERM changes nothing), runs the service to completion and returns its exit code.
Services finish their in-flight work and close their Kafka clients when `stopping` is
set; the whole shutdown stays well inside Kubernetes' default 30 s grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import faulthandler
import gc
import logging
import math
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol, TextIO

import uvloop

from cronstream.shared import logs, metrics, telemetry
from cronstream.shared.health import Health, HealthServer, open_http
from cronstream.shared.lanes import abandoned_lanes
from cronstream.shared.logs import log
from cronstream.shared.settings import Settings

logger = logging.getLogger(__name__)


# A clean stop finishes well inside Kubernetes' default 30 s grace; past this, exit anyway.
DEFAULT_SHUTDOWN_SECONDS = 25.0


class Service(Protocol):
    name: str
    health: Health

    async def run(self, stopping: asyncio.Event) -> None: ...


def die_with_parent() -> None:
    """With CRONSTREAM_PARENT_PID set (by `cronstream dev`), get SIGTERM when that parent
    dies, even by SIGKILL, so no service outlives the command that started it (Linux)."""
    parent = os.environ.get("CRONSTREAM_PARENT_PID")
    if not parent:
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != int(parent):  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


# The collector's default (a young-generation pass every 700 net container allocations)
# suits programs that keep what they allocate. A service decodes batches of thousands of
# records that live for one batch: at 700, every batch in flight was scanned several
# times, promoted, and then forced full collections of the whole heap — ~30 % of the
# monitor's core at 3,000 executions/s (docs/decisions/0013-garbage-collection.md).
GC_THRESHOLDS = (50_000, 20, 10)


def tune_gc() -> None:
    """Collect less often, and never scan again what the imports built."""
    gc.collect()
    gc.freeze()  # modules, classes, pydantic's validators: alive as long as the process
    gc.set_threshold(*GC_THRESHOLDS)


def run_service(service: Service, settings: Settings) -> int:
    tune_gc()
    # A crash in native code (librdkafka's asserts abort, a segfault) prints every
    # thread's Python stack to stderr before the process dies: the log says where.
    faulthandler.enable(all_threads=True)
    logs.configure(service.name, settings.log_level, settings.log_format)
    log(logger, "service_starting", service=service.name, settings=settings.redacted())
    metrics.announce(service.name)
    telemetry.configure(service.name)
    try:
        server = open_http(lambda port: HealthServer(service.health, settings.http_bind, port),
                           service.name, settings.http_port, settings.port_for(service.name))
    except OSError as exc:
        log(logger, "service_failed", logging.ERROR, service=service.name,
            error=f"cannot serve HTTP on {settings.http_bind}:{settings.port_for(service.name)}: {exc}")
        return 1
    server.start()
    code = 0
    try:
        # uvloop: the event loop in C (libuv). Every service is a loop handing batches
        # between Kafka's threads, PostgreSQL's socket and its own tasks; asyncio's own
        # loop in Python cost 4-6 % of the machine's CPU per execution at 3,000/s
        # (bench.e2e_throughput, interleaved runs; docs/decisions/0026).
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_main(service))
        live, why = service.health.live()
        if not live:
            log(logger, "service_failed", logging.ERROR, service=service.name, error=why)
            code = 1
    except Exception:
        logger.exception("service failed", extra={"action": "service_failed"})
        code = 1
    finally:
        server.stop()
        telemetry.shutdown()
    if code == 0:
        log(logger, "service_stopped", service=service.name)
    return _exit(code)


def _exit(code: int) -> int:
    """Return the exit code; or, when a thread is stuck in a client call that may never
    return (lanes.py), exit the process now rather than wait for it at interpreter exit."""
    if abandoned_lanes():
        log(logger, "service_exiting_with_stuck_calls", logging.WARNING, stuck=abandoned_lanes())
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


_watchdog: dict[str, threading.Timer] = {}
# How long after its watchdog the kernel ends a process whose watchdog could not run.
ALARM_AFTER_WATCHDOG_SECONDS = 5
_loops: set[asyncio.AbstractEventLoop] = set()  # the services' event loops (dump_stacks)


def arm_shutdown_watchdog(seconds: float, reason: str) -> None:
    """Whatever stops the service (SIGTERM, a fatal error such as a fenced producer), the
    process exits: if the stop takes longer than `seconds` (a stuck call without a
    deadline, a handler that ignores its cancellation, a thread asyncio.run waits for at
    exit), log where every thread is and exit with code 3. Armed once: the first reason
    sets the deadline."""
    if "timer" in _watchdog:
        return

    def expire() -> None:
        log(logger, "shutdown_overdue", logging.ERROR, seconds=seconds, reason=reason,
            hint="the stacks of every thread and task follow on stderr")
        dump_stacks(sys.stderr)
        logging.shutdown()
        os._exit(3)

    timer = _watchdog["timer"] = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    # The timer is Python: a C call that hangs holding the GIL (a fenced producer's
    # destruction in librdkafka) stops it too (a fenced worker once outlived its 30 s
    # watchdog by minutes). The kernel's alarm needs no GIL: SIGALRM, left at its default
    # action, ends the process a few seconds after the timer should have.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(math.ceil(seconds) + ALARM_AFTER_WATCHDOG_SECONDS)


def dump_stacks(out: TextIO) -> None:
    """Every thread's stack, then every asyncio task's (read from another thread: a
    best-effort picture of a process about to be ended)."""
    with contextlib.suppress(Exception):
        out.flush()
        faulthandler.dump_traceback(file=out, all_threads=True)
    for loop in list(_loops):
        with contextlib.suppress(Exception):
            for task in list(asyncio.all_tasks(loop)):
                out.write(f"\nasyncio task {task.get_name()}: {task.get_coro()!r}\n")
                task.print_stack(limit=20, file=out)
    with contextlib.suppress(Exception):
        out.flush()


async def _tick(health: Health) -> None:
    """Prove the loop turns: liveness fails when this stops stamping (health.py)."""
    while True:
        health.tick()
        await asyncio.sleep(1.0)


async def _main(service: Service) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    _loops.add(loop)

    def on_signal(signum: int) -> None:
        if stopping.is_set():
            # SIGTERM is idempotent (orchestrators and parent-death signals may repeat it);
            # a second Ctrl-C is a person insisting: exit now.
            if signum == signal.SIGINT:
                log(logger, "service_killed", logging.WARNING, signal="SIGINT")
                os._exit(130)
            return
        log(logger, "service_stopping", signal=signal.Signals(signum).name)
        stopping.set()
        arm_shutdown_watchdog(getattr(service, "shutdown_seconds", DEFAULT_SHUTDOWN_SECONDS),
                              signal.Signals(signum).name)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    die_with_parent()
    ticker = asyncio.create_task(_tick(service.health))
    try:
        await service.run(stopping)
    except BaseException as exc:
        # What asyncio.run still does (cancel the tasks left, join the executor's threads)
        # has no deadline of its own.
        arm_shutdown_watchdog(getattr(service, "shutdown_seconds", DEFAULT_SHUTDOWN_SECONDS),
                              type(exc).__name__)
        raise
    finally:
        ticker.cancel()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)
            # The service has stopped; a late signal must not cut the last cleanup short.
            signal.signal(signum, signal.SIG_IGN)


class TaskGaveUp(RuntimeError):
    """A supervised background task failed too often: the service stops and fails."""


async def supervise(name: str, task: Callable[[], Awaitable[None]], health: Health,
                    stopping: asyncio.Event, *, max_failures: int = 5, window: float = 120.0) -> None:
    """Run a background task until it returns or the service stops. When it raises, log
    the error and start it again with backoff; after `max_failures` failures within
    `window` seconds give up: liveness fails, the service stops and exits non-zero, and its
    supervisor (Kubernetes, systemd, `cronstream dev`) restarts it. No background task dies
    silently."""
    failures: deque[float] = deque()
    backoff = 0.5
    while not stopping.is_set():
        try:
            await task()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            now = time.monotonic()
            failures.append(now)
            while failures and now - failures[0] > window:
                failures.popleft()
            metrics.TASK_RESTARTS.labels(service=health.service, task=name).inc()
            log(logger, "background_task_failed", logging.ERROR, task=name,
                error=f"{type(exc).__name__}: {exc}", failures=len(failures),
                retry_in_seconds=backoff)
            if len(failures) >= max_failures:
                health.fail(f"{name} failed {len(failures)} times in {window:g}s; last: {exc}")
                stopping.set()
                raise TaskGaveUp(f"{name} gave up: {exc}") from exc
            await wait_or_stop(stopping, backoff)
            backoff = min(backoff * 2, 30.0)


async def wait_or_stop(stopping: asyncio.Event, timeout: float) -> bool:
    """Sleep up to `timeout` unless stopping; return whether stopping was set."""
    if timeout > 0 and not stopping.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), timeout)
    return stopping.is_set()
