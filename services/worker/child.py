"""A handler process of the worker's pool: the code that runs in the child.

The parent (pool.py) talks to each child over two pipes, in JSON — never pickle. On the
first, one JSON array per line:

    parent → child  [handler, execution_id, job_id, run_id, attempt_number,
                     idempotency_key, scheduled_at, params, [[header, base64 value]...],
                     upstream (a DAG step's view of its run, else null)]
    child → parent  ["progress", 40, "message"]
                    ["log", [[epoch seconds, stream, level, text]...]]
                    ["done", "COMPLETED", result, error, traceback]
    parent → child  <execution id>        (the second pipe: cancel that execution)

A run is one write and, in the child, one read: msgspec decodes it straight into the
Context's types (UUIDs, an aware datetime, the trace headers' bytes), and each side reads
whatever lines have arrived with one system call (docs/decisions/0024). The child's main
thread reads its runs itself: an execution costs one wake-up of the child, not a reader
thread's and then the main thread's. Cancellations, rare, come on their own pipe, read by
a thread that sleeps until one does; it names its execution, so one that arrives late
never touches the next run. What the handler writes is captured (capture.py) and goes up
the first pipe as `log` lines while it runs, and the rest before its `done`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import importlib
import os
import signal
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime
from multiprocessing.connection import Connection
from typing import Any
from uuid import UUID

import msgspec

from cronstream.handlers import REGISTRY, Context
from cronstream.services.worker.capture import Line, ProcessCapture, RunLog
from cronstream.services.worker.runner import failed, returned, upstream_view
from cronstream.shared import telemetry
from cronstream.shared.fast_records import DueRecord, FastUpstream, upstream_of
from cronstream.shared.telemetry import Headers

BUILTINS = "cronstream.services.worker.builtins"
READ_SIZE = 1 << 16


class RunMessage(msgspec.Struct, array_like=True, frozen=True):
    """What the parent sends a child to run: the parts of the execution its handler's
    Context needs, from the JobDue the worker validated (the child does not decode it
    again), and the trace headers it runs under."""

    handler: str
    execution_id: UUID
    job_id: str
    run_id: UUID
    attempt_number: int
    idempotency_key: str
    scheduled_at: datetime
    params: dict[str, Any]
    trace: Sequence[tuple[str, bytes | None]]
    upstream: FastUpstream | None = None


_encode = msgspec.json.Encoder().encode


def run_message(due: DueRecord, trace: Headers | None) -> bytes:
    """The line that sends a child `due` to run (RunMessage)."""
    return _encode(RunMessage(
        due.job.handler, due.execution_id, due.job_id, due.run_id, due.attempt_number,
        due.idempotency_key, due.scheduled_at, due.job.params, trace or [],
        upstream_of(due))) + b"\n"


def lines(fd: int) -> Iterator[bytes]:
    """The lines read from `fd`, as many as one read brings at a time, until its end."""
    partial = b""
    while True:
        try:
            data = os.read(fd, READ_SIZE)
        except OSError:
            return
        if not data:
            return
        *complete, partial = (partial + data).split(b"\n")
        yield from complete


def send(fd: int, data: bytes) -> None:
    """All of `data` (a line is one write unless the pipe is full)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class _Up:
    """The child's end of the first pipe, written by its main thread (progress, done) and
    its capture thread (log lines): one line at a time."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()

    def send(self, data: bytes) -> None:
        with self._lock:
            send(self.fd, data)

    def lines(self, lines: list[Line]) -> None:
        self.send(_encode(("log", lines)) + b"\n")


def child_main(conn: Connection, cancels: Connection, imports: list[str], allow_shell: bool,
               log_limit: int = 1 << 20) -> None:
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
    with contextlib.suppress(OSError, AttributeError):
        # A woken batch task does not preempt the running one: the worker's write of a run
        # returns at once instead of handing its CPU to the child in the middle of its turn
        # (each child waking in the worker's place stalled its event loop for a time slice).
        # Fair share is unchanged.
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    importlib.import_module(BUILTINS)
    for module in imports:
        importlib.import_module(module)
    if allow_shell:
        from cronstream.services.worker import shell

        shell.enable()  # the worker's commands, from the environment it exported
    watch = _Cancels(cancels)
    threading.Thread(target=watch.read, daemon=True, name="pool-cancels").start()
    fd = conn.fileno()
    up = _Up(fd)
    capture = ProcessCapture(up.lines)
    decode = msgspec.json.Decoder(RunMessage).decode
    for line in lines(fd):  # until the parent is gone
        run = decode(line)
        cancel = watch.running(run.execution_id)
        log = RunLog(log_limit)
        capture.begin(log)
        with telemetry.attached(run.trace):
            reply = _run(run, up, cancel)
        rest = capture.end()
        summary = log.summary()
        if summary is not None:
            rest.append(summary)
        if rest:
            up.lines(rest)
        watch.finished()
        telemetry.flush()
        up.send(reply)


class _Cancels:
    """The child's cancellations: the execution ids its parent sent, and the flag of the
    one running. A cancellation may be read before its run (two pipes, two readers) or
    after it ended: each side checks the other's latest, so neither order loses it and a
    late one never reaches the next run (the reader takes the flag before it compares
    the running id, which the run sets after its flag and clears when it ends)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.current: UUID | None = None
        self.flag = threading.Event()
        self.last_cancelled: UUID | None = None

    def running(self, execution_id: UUID) -> threading.Event:
        flag = self.flag = threading.Event()  # a fresh flag: a late set of the last one is harmless
        self.current = execution_id
        if execution_id == self.last_cancelled:
            flag.set()
        return flag

    def finished(self) -> None:
        self.current = None

    def read(self) -> None:
        with contextlib.suppress(EOFError, OSError, ValueError):
            while True:
                execution_id = UUID(self.conn.recv_bytes().decode())
                self.last_cancelled = execution_id
                flag = self.flag
                if execution_id == self.current:
                    flag.set()


def _run(run: RunMessage, up: _Up, cancel: threading.Event) -> bytes:
    """The `done` line of one run (the result's JSON is spliced in, not encoded twice)."""
    spec = REGISTRY.get(run.handler)
    if spec is None:
        return _done("PERMANENTLY_FAILED", error=f"unknown handler {run.handler!r}")

    def progress(percent: float, text: str | None) -> None:
        up.send(_encode(("progress", percent, text)) + b"\n")

    with telemetry.handler_span(run.handler, telemetry.lone_traceparent(run.trace),
                                job_id=run.job_id, execution_id=run.execution_id) as traceparent:
        ctx = Context(
            execution_id=run.execution_id, job_id=run.job_id, run_id=run.run_id,
            attempt_number=run.attempt_number, idempotency_key=run.idempotency_key,
            scheduled_at=run.scheduled_at, params=run.params, traceparent=traceparent,
            _progress=progress, _cancel=cancel, _upstream=upstream_view(run.upstream))
        try:
            result = asyncio.run(spec.func(ctx)) if spec.is_async else spec.func(ctx)
        except Exception as exc:
            outcome = failed(exc)
            return _done(outcome.status, outcome.error, outcome.traceback)
    outcome, encoded = returned(result, cancel.is_set())
    if encoded is None:
        return _done(outcome.status, outcome.error)
    return b'["done","%s",%s,null,null]\n' % (outcome.status.encode(), encoded.encode())


def _done(status: str, error: str | None, traceback: str | None = None) -> bytes:
    return _encode(("done", status, None, error, traceback)) + b"\n"


__all__ = ["BUILTINS", "READ_SIZE", "RunMessage", "child_main", "lines", "run_message", "send"]
