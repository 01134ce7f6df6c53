"""A handler process of the worker's pool: the code that runs in the child, and the
protocol of its pipes.

The parent (pool.py) talks to each child over two pipes, in JSON — never pickle. On the
first, one JSON array per line, each a named message type (msgspec structs, decoded
straight into them):

    parent → child  Invocation  [handler, execution_id, job_id, run_id, attempt_number,
                                 idempotency_key, scheduled_at, params,
                                 [[header, base64 value]...],
                                 upstream (a DAG step's view of its run, else null),
                                 events (an event trigger's records, else null)]
    child → parent  Progress    ["progress", 40.0, "message"]
                    LogLines    ["log", [[epoch seconds, stream, level, text]...]]
                    Done        ["done", "COMPLETED", result, error, traceback]
    parent → child  <execution id>        (the second pipe: cancel that execution)

The answers are tagged: their first element names their type (`Answer`). An invocation is
one write and, in the child, one read: msgspec decodes it straight into the Context's
types (UUIDs, an aware datetime, the trace headers' bytes), and each side reads whatever
lines have arrived with one system call (docs/decisions/0024). The child's main thread
reads its invocations itself: one costs one wake-up of the child, not a reader thread's
and then the main thread's. It invokes each through the one body every handler runs
through (runner.invoke), as an inline handler is. Cancellations, rare, come on their own
pipe, read by a thread that sleeps until one does; it names its execution, so one that
arrives late never touches the next invocation. What the handler writes is captured
(capture.py) and goes up the first pipe as `log` lines while it runs, and the rest before
its `done`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import importlib
import json
import os
import signal
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any
from uuid import UUID

import msgspec

from cronstream.handlers import REGISTRY, HandlerRegistry
from cronstream.services.worker.capture import Capture, Line, ProcessCapture
from cronstream.services.worker.runner import (
    Invocation,
    LinesFn,
    Outcome,
    OutcomeStatus,
    ProgressFn,
    at_once,
    invoke,
    unknown_handler,
)
from cronstream.shared import telemetry

BUILTINS = "cronstream.services.worker.builtins"
READ_SIZE = 1 << 16


class Progress(msgspec.Struct, array_like=True, frozen=True, gc=False, tag="progress"):
    """The handler reported how far along it is (Context.report_progress)."""

    percent: float
    message: str | None


class LogLines(msgspec.Struct, array_like=True, frozen=True, gc=False, tag="log"):
    """Lines the handler wrote, as they are captured (capture.py)."""

    lines: list[Line]


class Done(msgspec.Struct, array_like=True, frozen=True, gc=False, tag="done"):
    """The handler returned or raised: how its invocation ended (runner.Outcome)."""

    status: OutcomeStatus
    # Sent as the result's JSON as the handler's process encoded it (msgspec.Raw, spliced
    # in as it is: never encoded twice), read back as the value.
    result: Any
    error: str | None
    traceback: str | None


Answer = Progress | LogLines | Done  # what a child sends its parent

_encode = msgspec.json.Encoder().encode
_answer = msgspec.json.Decoder(Answer).decode


def invocation_line(invocation: Invocation) -> bytes:
    """The line that sends a child an invocation."""
    return _encode(invocation) + b"\n"


def progress_line(percent: float, message: str | None) -> bytes:
    return _encode(Progress(percent, message)) + b"\n"


def log_line(lines: list[Line]) -> bytes:
    return _encode(LogLines(lines)) + b"\n"


def done_line(outcome: Outcome) -> bytes:
    result = None if outcome.result_json is None else msgspec.Raw(outcome.result_json)
    return _encode(Done(outcome.status, result, outcome.error, outcome.traceback)) + b"\n"


def answer(line: bytes) -> Answer:
    """A child's line, decoded (a result with NaN or Infinity, which Python's json writes
    and msgspec refuses, through json)."""
    try:
        return _answer(line)
    except msgspec.DecodeError:
        return msgspec.convert(json.loads(line), Answer)  # type: ignore[arg-type]


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

    def progress(self, percent: float, message: str | None) -> None:
        self.send(progress_line(percent, message))

    def lines(self, lines: list[Line]) -> None:
        self.send(log_line(lines))


def child_main(conn: Connection, cancels: Connection, imports: list[str], allow_shell: bool,
               log_limit: int = 1 << 20) -> None:
    """Entry point of a pool process: import the handler modules, then answer invocations.

    Each invocation runs inside the trace context the parent sent with it, under a span of
    its own when tracing exports: spans the handler makes join the execution's trace."""
    telemetry.configure("worker")
    # Signals to the process group are the worker's to handle (forkserver_signals.py).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):  # die with the worker (Linux)
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    with contextlib.suppress(OSError, AttributeError):
        # A woken batch task does not preempt the running one: the worker's write of an
        # invocation returns at once instead of handing its CPU to the child in the middle of its turn
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
    decode = msgspec.json.Decoder(Invocation).decode
    for line in lines(fd):  # until the parent is gone
        invocation = decode(line)
        cancel = watch.running(invocation.execution_id)
        outcome = answer_invocation(REGISTRY, invocation, cancel, progress=up.progress,
                                    lines=up.lines, capture=capture, log_limit=log_limit)
        watch.finished()
        telemetry.flush()
        up.send(done_line(outcome))


class _Cancels:
    """The child's cancellations: the execution ids its parent sent, and the flag of the
    one running. A cancellation may be read before its invocation (two pipes, two readers)
    or after it ended: each side checks the other's latest, so neither order loses it and a
    late one never reaches the next invocation (the reader takes the flag before it
    compares the running id, which an invocation sets after its flag and clears when it
    ends)."""

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


def answer_invocation(registry: HandlerRegistry, invocation: Invocation, cancel: threading.Event,
                      *, progress: ProgressFn, lines: LinesFn, capture: Capture,
                      log_limit: int) -> Outcome:
    """Invoke the handler `invocation` names, found in this process's registry (once), as
    an inline handler is invoked (runner.invoke): a synchronous one in this thread, an
    async one in an event loop of its own."""
    spec = registry.get(invocation.handler)
    if spec is None:
        return unknown_handler(invocation.handler)
    invoking = invoke(spec, invocation, progress, cancel, capture=capture, lines=lines,
                      log_limit=log_limit)
    return asyncio.run(invoking) if spec.is_async else at_once(invoking)


__all__ = ["BUILTINS", "READ_SIZE", "Answer", "Done", "LogLines", "Progress", "answer",
           "answer_invocation", "child_main", "done_line", "invocation_line", "lines",
           "log_line", "progress_line", "send"]
