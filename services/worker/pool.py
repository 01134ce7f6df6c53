"""A pool of reusable handler processes, where any code can be stopped for real.

Each slot of the worker's concurrency is one long-lived child process (started from a
forkserver that has already imported the handler modules, so a start costs milliseconds,
not an interpreter boot). A child runs one execution at a time. The parent talks to it
over a pipe in JSON lines — never pickle:

    parent → child  {"op": "run", "due": <JobDue JSON>, "trace": [[header, value]...]}
                    {"op": "cancel"}
    child → parent  {"op": "progress", "percent": 40, "message": "..."}
                    {"op": "done", "status": "COMPLETED", "result": ..., "error": ...}

Timeouts and cancellations are enforced by the parent: at `timeout_seconds` the child is
killed (SIGKILL: CPU loops and blocking calls included) and the execution is TIMED_OUT; a
cancellation is passed to the handler's context first and the child killed if the handler
has not returned after `CANCEL_GRACE_SECONDS`. A killed child is replaced at once, so the
slot is healthy again. Handlers registered `inline=True` skip the pool and run on the
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import importlib
import json
import logging
import multiprocessing
import queue
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from cronstream.handlers import REGISTRY, HandlerRegistry, NonRetryableError
from cronstream.services.worker.runner import (
    CancelSignal,
    Outcome,
    ProgressFn,
    check_result,
    describe_error,
    encode_result,
    make_context,
)
from cronstream.shared import telemetry
from cronstream.shared.logs import log
from cronstream.shared.records import JobDue
from cronstream.shared.telemetry import Headers

logger = logging.getLogger(__name__)

CANCEL_GRACE_SECONDS = 5.0
BUILTINS = "cronstream.services.worker.builtins"
FORKSERVER_SIGNALS = "cronstream.services.worker.forkserver_signals"


# -- the child side ----------------------------------------------------------------------


def child_main(conn: Connection, imports: list[str], allow_shell: bool) -> None:
    """Entry point of a pool process: import the handler modules, then run executions.

    Each execution runs inside the run's trace context (sent by the parent), under a span
    of its own when tracing exports: spans the handler makes join the execution's trace."""
    telemetry.configure("worker")
    # Signals to the process group are the worker's to handle (forkserver_signals.py).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):  # die with the worker (Linux)
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    builtins = importlib.import_module(BUILTINS)
    for module in imports:
        importlib.import_module(module)
    if allow_shell:
        builtins.enable_shell()
    cancel = threading.Event()
    work: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def read() -> None:
        try:
            while True:
                message = json.loads(conn.recv_bytes())
                if message["op"] == "cancel":
                    cancel.set()
                else:
                    work.put(message)
        except (EOFError, OSError):
            work.put(None)  # the parent is gone

    threading.Thread(target=read, daemon=True, name="pool-reader").start()
    while (message := work.get()) is not None:
        cancel.clear()
        headers = [(str(k), str(v).encode()) for k, v in message.get("trace", [])]
        with telemetry.attached(headers):
            reply = _run_in_child(message["due"], conn, cancel)
        telemetry.flush()
        conn.send_bytes(json.dumps(reply).encode())


def _run_in_child(due_json: str, conn: Connection, cancel: threading.Event) -> dict[str, Any]:
    due = JobDue.model_validate_json(due_json)
    spec = REGISTRY.get(due.job.handler)
    if spec is None:
        return {"op": "done", "status": "PERMANENTLY_FAILED",
                "error": f"unknown handler {due.job.handler!r}"}

    def progress(percent: float, message: str | None) -> None:
        conn.send_bytes(json.dumps({"op": "progress", "percent": percent,
                                    "message": message}).encode())

    with telemetry.handler_span(due.job.handler, job_id=due.job_id,
                                execution_id=due.execution_id) as traceparent:
        ctx = make_context(due, progress, cancel, traceparent)
        try:
            result = asyncio.run(spec.func(ctx)) if spec.is_async else spec.func(ctx)
        except NonRetryableError as exc:
            return {"op": "done", "status": "PERMANENTLY_FAILED", "error": describe_error(exc)}
        except Exception as exc:
            return {"op": "done", "status": "FAILED", "error": describe_error(exc)}
    encoded, problem = encode_result(result)
    if problem is not None:
        return {"op": "done", "status": "FAILED", "error": problem}
    status = "CANCELLED" if cancel.is_set() else "COMPLETED"
    return {"op": "done", "status": status, "result_json": encoded}


# -- the parent side ---------------------------------------------------------------------


class Child:
    """One pool process and the parent's end of its pipe."""

    def __init__(self, ctx: Any, imports: list[str], allow_shell: bool) -> None:
        parent_end, child_end = ctx.Pipe(duplex=True)
        self.conn: Connection = parent_end
        self.process = ctx.Process(target=child_main, args=(child_end, imports, allow_shell),
                                   daemon=True, name="cronstream-handler")
        self.process.start()
        child_end.close()
        self.executions = 0

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, AttributeError):
            self.process.kill()
        self.process.join(5)
        self.conn.close()

    async def run(self, due: JobDue, progress: ProgressFn, cancel: CancelSignal,
                  trace: Headers | None = None) -> Outcome:
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        fd = self.conn.fileno()

        def readable() -> None:
            try:
                while self.conn.poll():
                    inbox.put_nowait(json.loads(self.conn.recv_bytes()))
            except (EOFError, OSError):
                loop.remove_reader(fd)
                inbox.put_nowait(None)

        loop.add_reader(fd, readable)
        self.executions += 1
        started = time.monotonic()
        deadline = started + due.job.timeout_seconds
        cancelled_at: float | None = None
        cancelled = asyncio.ensure_future(cancel.wait())
        try:
            self.conn.send_bytes(json.dumps({
                "op": "run", "due": due.to_json().decode(),
                "trace": [[k, v.decode("ascii", "replace")] for k, v in trace or []]}).encode())
            while True:
                limit = deadline if cancelled_at is None else min(
                    deadline, cancelled_at + CANCEL_GRACE_SECONDS)
                get = asyncio.ensure_future(inbox.get())
                waiting = {get} if cancelled_at is not None else {get, cancelled}
                done, _ = await asyncio.wait(waiting, timeout=max(0.0, limit - time.monotonic()),
                                             return_when=asyncio.FIRST_COMPLETED)
                if cancelled in done and cancelled_at is None:
                    cancelled_at = time.monotonic()  # tell the handler; kill after the grace
                    with contextlib.suppress(OSError):
                        self.conn.send_bytes(b'{"op":"cancel"}')
                if get not in done:
                    get.cancel()
                    if time.monotonic() >= limit:
                        return self._stop(due, cancelled_at, started)
                    continue
                message = get.result()
                if message is None:
                    return Outcome("FAILED", error="the handler process died "
                                   f"(exit code {self.process.exitcode})")
                if message["op"] == "progress":
                    progress(float(message["percent"]), message.get("message"))
                    continue
                return _outcome(message, cancelled_at is not None)
        except asyncio.CancelledError:
            self.kill()  # the worker gave up on this execution (drain): stop it for real
            raise
        finally:
            cancelled.cancel()
            with contextlib.suppress(ValueError, OSError):
                loop.remove_reader(fd)

    def _stop(self, due: JobDue, cancelled_at: float | None, started: float) -> Outcome:
        """The handler overran its timeout or its cancellation grace: kill it."""
        self.kill()
        ran = time.monotonic() - started
        if cancelled_at is not None and ran < due.job.timeout_seconds:
            return Outcome("CANCELLED", error="cancelled; the handler did not stop within "
                                              f"{CANCEL_GRACE_SECONDS:g}s and was killed")
        return Outcome("TIMED_OUT", error=f"timed out after {due.job.timeout_seconds:g}s; "
                                          "the handler was killed")


def _outcome(message: dict[str, Any], cancelled: bool) -> Outcome:
    status = message["status"]
    if cancelled and status in ("COMPLETED", "FAILED"):
        status = "CANCELLED"
    result = json.loads(message["result_json"]) if message.get("result_json") else None
    return Outcome(status, result=result, error=message.get("error") or
                   ("cancelled" if status == "CANCELLED" else None))


class PoolRunner:
    """`size` reusable handler processes plus inline execution for `inline` handlers."""

    def __init__(self, registry: HandlerRegistry, size: int, imports: list[str],
                 allow_shell: bool = False) -> None:
        self.registry = registry
        self.size = size
        self.imports = list(imports)
        self.allow_shell = allow_shell
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload([FORKSERVER_SIGNALS, BUILTINS, *self.imports])
        self._idle: asyncio.Queue[Child] = asyncio.Queue()
        self._children: list[Child] = []
        self._closing = False
        self.replaced = 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        children = await asyncio.gather(*(loop.run_in_executor(None, self._spawn)
                                          for _ in range(self.size)))
        for child in children:
            self._children.append(child)
            self._idle.put_nowait(child)
        log(logger, "handler_pool_started", processes=self.size)

    def _spawn(self) -> Child:
        return Child(self._ctx, self.imports, self.allow_shell)

    async def close(self) -> None:
        self._closing = True
        for child in self._children:
            child.kill()
        self._children.clear()

    async def run(self, due: JobDue, progress: ProgressFn, cancel: CancelSignal,
                  trace: Headers | None = None) -> Outcome:
        spec = self.registry.get(due.job.handler)
        if spec is None:
            return Outcome("PERMANENTLY_FAILED", error=f"unknown handler {due.job.handler!r}")
        if spec.inline:
            with telemetry.attached(trace or []):
                return await _run_inline(spec.func, spec.is_async, due, progress, cancel)
        child = await self._idle.get()
        try:
            return await child.run(due, progress, cancel, trace)
        finally:
            if child.alive:
                self._idle.put_nowait(child)
            elif not self._closing:
                await self._replace(child)

    async def _replace(self, dead: Child) -> None:
        with contextlib.suppress(ValueError):
            self._children.remove(dead)
        dead.kill()
        fresh = await asyncio.get_running_loop().run_in_executor(None, self._spawn)
        self._children.append(fresh)
        self._idle.put_nowait(fresh)
        self.replaced += 1
        log(logger, "handler_process_replaced", pid=fresh.process.pid, replaced=self.replaced)


async def _run_inline(func: Any, is_async: bool, due: JobDue, progress: ProgressFn,
                      cancel: CancelSignal) -> Outcome:
    try:
        with telemetry.handler_span(due.job.handler, job_id=due.job_id,
                                    execution_id=due.execution_id) as traceparent:
            ctx = make_context(due, progress, cancel.flag, traceparent)
            if is_async:
                result = await asyncio.wait_for(func(ctx), due.job.timeout_seconds)
            else:
                result = func(ctx)
    except TimeoutError:
        cancel.set("timeout")
        return Outcome("TIMED_OUT", error=f"timed out after {due.job.timeout_seconds:g}s")
    except NonRetryableError as exc:
        return Outcome("PERMANENTLY_FAILED", error=describe_error(exc))
    except Exception as exc:
        return Outcome("FAILED", error=describe_error(exc))
    if cancel.is_set():
        return Outcome("CANCELLED", result=result, error="cancelled")
    return check_result(result)


__all__ = ["CANCEL_GRACE_SECONDS", "Child", "PoolRunner", "child_main"]
