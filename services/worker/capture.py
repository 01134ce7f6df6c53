"""What a handler writes while it runs — stdout, stderr, `logging` records — as its
attempt's log lines (docs/reference/operations.md#execution-logs), and the traceback of one that raised.

In a pool process (child.py) the capture is complete: file descriptors 1 and 2 are pipes
read by a thread of the process, so C extensions and the child processes a handler
spawns are captured too; `logging` records reach a handler on the root logger. Each line
goes to the invocation in progress, the one that began before it was read, under a lock
that the end of an invocation also takes: the end reads what is left in the pipes, so
whatever a handler wrote before it returned is its own, never the next invocation's.

Inline handlers (inline.py) run on the worker's event loop, in the worker's own process:
there the capture is as good as Python allows — `sys.stdout`, `sys.stderr` and `logging`,
through a context variable set for the duration of the invocation (a task each, so two
never mix); what C code writes to the descriptors goes to the worker's own output.

Bounds, whatever is written (binary garbage, invalid UTF-8, 20 MB in a second, a line of
10 MB): a line is cut at LINE_BYTES, an attempt keeps at most its limit
(`CRONSTREAM_WORKER_LOG_LIMIT_BYTES`, 1 MiB), and what was cut is counted and said in
the log's last line. Bytes that are not UTF-8 are kept as `\\xNN` escapes, NUL included
(PostgreSQL text holds no NUL). A handler that writes nothing costs a lock and two reads
that find nothing, per invocation.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import logging
import os
import select
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol, TextIO

LINE_BYTES = 16 * 1024
TRACEBACK_BYTES = 64 * 1024
# Lines read are handed on at least this often while a handler runs: the log is live.
SHIP_SECONDS = 0.2

# (time in epoch seconds, stream, level or None, text): one line of an attempt's log.
Line = tuple[float, str, str | None, str]
Sink = Callable[[list[Line]], None]


def text_of(data: bytes) -> str:
    """Bytes as text: UTF-8, anything else escaped (\\xNN), NUL too."""
    return data.decode("utf-8", "backslashreplace").replace("\x00", "\\x00")


def clip(text: str, most: int) -> str:
    """`text` cut to at most `most` bytes of UTF-8 (on a character boundary)."""
    if len(text) * 4 <= most:  # a character is at most four bytes
        return text
    data = text.encode()
    return text if len(data) <= most else data[:most].decode("utf-8", "ignore")


_WORKER = os.path.dirname(os.path.abspath(__file__))


def format_traceback(exc: BaseException) -> str:
    """The traceback of `exc` with its chained causes, as Python prints it, from the
    handler's frame on (the worker's own frames that called it are left out); a very long
    one keeps its start and its end (where the error was raised)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and \
            os.path.dirname(os.path.abspath(tb.tb_frame.f_code.co_filename)) == _WORKER:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    data = text.encode()
    if len(data) <= TRACEBACK_BYTES:
        return text
    half = TRACEBACK_BYTES // 2
    head, tail = data[:half].decode("utf-8", "ignore"), data[-half:].decode("utf-8", "ignore")
    return f"{head}\n... [{len(data) - 2 * half} bytes of the traceback cut] ...\n{tail}"


class InvocationLog:
    """One invocation's log (its attempt's, on this delivery) as it is written: the lines
    kept (up to `limit` bytes, each cut at LINE_BYTES) until taken, and what was cut."""

    __slots__ = ("_pending", "cut_bytes", "cut_lines", "kept", "limit", "shortened")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = 0  # bytes kept so far
        self.cut_bytes = 0  # bytes not kept: past the limit, or the end of a long line
        self.cut_lines = 0  # whole lines not kept (past the limit)
        self.shortened = 0  # lines cut at LINE_BYTES
        self._pending: list[Line] = []

    def add(self, stream: str, level: str | None, text: str, at: float | None = None,
            cut: int = 0) -> None:
        """A line (`cut`: bytes of it already dropped before it got here)."""
        size = len(text.encode()) if len(text) * 4 > LINE_BYTES or self.kept * 2 > self.limit \
            else len(text)  # an upper bound is enough while far from both limits
        if size > LINE_BYTES:
            clipped = clip(text, LINE_BYTES)
            cut += size - len(clipped.encode())
            text, size = clipped, LINE_BYTES
        if cut:
            self.shortened += 1
            self.cut_bytes += cut
            text = f"{text} [line cut at {LINE_BYTES} bytes: {cut} more not kept]"
        if self.kept + size > self.limit:
            self.cut_bytes += size
            self.cut_lines += 1
            return
        self.kept += size
        self._pending.append((time.time() if at is None else at, stream, level, text))

    def take(self) -> list[Line]:
        lines, self._pending = self._pending, []
        return lines

    def pending(self) -> bool:
        return bool(self._pending)

    def summary(self) -> Line | None:
        """The line that says what was cut, if anything was."""
        if not self.cut_lines and not self.shortened:
            return None
        parts = []
        if self.cut_lines:
            parts.append(f"{self.cut_lines} lines ({self.cut_bytes} bytes in all) not kept: "
                         f"the log of an attempt is kept up to {self.limit} bytes, cut after "
                         f"{self.kept}")
        if self.shortened:
            parts.append(f"{self.shortened} lines cut at {LINE_BYTES} bytes")
        return time.time(), "cronstream", "WARNING", "[log cut] " + "; ".join(parts)


class LineSplitter:
    """Bytes of one stream as lines: a line longer than LINE_BYTES is kept cut, the rest
    of it counted until its end arrives."""

    __slots__ = ("_overflow", "_partial", "stream")

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self._partial = b""
        self._overflow = 0

    def feed(self, data: bytes, log: InvocationLog | None) -> None:
        *complete, rest = (self._partial + data).split(b"\n")
        for raw in complete:
            if log is not None:
                log.add(self.stream, None, text_of(raw.rstrip(b"\r")), cut=self._overflow)
            self._overflow = 0
        if len(rest) > LINE_BYTES:
            self._overflow += len(rest) - LINE_BYTES
            rest = rest[:LINE_BYTES]
        self._partial = rest

    def end(self, log: InvocationLog | None) -> None:
        """The invocation ends: what is left of a line without its newline is a line too."""
        if (self._partial or self._overflow) and log is not None:
            log.add(self.stream, None, text_of(self._partial), cut=self._overflow)
        self._partial, self._overflow = b"", 0


class LineHandler(logging.Handler):
    """`logging` records as log lines of the invocation in progress (`current` tells which),
    added under `guard` when given (a pool process's capture lock)."""

    def __init__(self, current: Callable[[], InvocationLog | None],
                 guard: threading.Lock | None = None) -> None:
        super().__init__(logging.NOTSET)
        self.current = current
        self.guard = guard or contextlib.nullcontext()
        self.setFormatter(logging.Formatter("%(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if self.current() is None:
            return
        try:
            text = self.format(record)
        except Exception:
            text = f"{record.name}: (unformattable log record: {record.msg!r})"
        with self.guard:
            log = self.current()
            if log is not None:
                log.add("log", record.levelname, text, record.created)


class Capture(Protocol):
    """Where what a handler writes is taken from, for one invocation: into `log` from `begin`
    to `end` (given what `begin` returned), at least what was written before `end` returned."""

    def begin(self, log: InvocationLog) -> Any: ...

    def end(self, begun: Any) -> None: ...


# -- in a pool process -------------------------------------------------------------------


class ProcessCapture:
    """A pool process's stdout and stderr (its descriptors) and its `logging`: every line
    goes to the invocation in progress (`begin` ... `end`), and is handed to `ship` at least
    every SHIP_SECONDS while it runs."""

    def __init__(self, ship: Sink) -> None:
        self.ship = ship
        self.lock = threading.Lock()
        self.log: InvocationLog | None = None
        self._readers: dict[int, LineSplitter] = {}
        # Where what is written between two invocations goes: the process's own stdout and stderr
        # (the worker's), as before the capture.
        self._outside: dict[int, int] = {}
        self._shipped = time.monotonic()
        for fd, name, stream in ((1, "stdout", sys.stdout), (2, "stderr", sys.stderr)):
            read_end, write_end = os.pipe()
            with contextlib.suppress(AttributeError, ValueError, OSError):
                stream.flush()
            self._outside[read_end] = os.dup(fd)
            os.dup2(write_end, fd)
            os.close(write_end)
            os.set_blocking(read_end, False)
            self._readers[read_end] = LineSplitter(name)
        # Line-buffered: a print is in the pipe when it returns (live, and never lost to a
        # buffer when the invocation ends or the process is killed).
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):
                stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        root = logging.getLogger()
        root.addHandler(LineHandler(lambda: self.log, self.lock))
        if root.level > logging.INFO or root.level == logging.NOTSET:
            root.setLevel(logging.INFO)  # a handler's logger.info is part of its log
        threading.Thread(target=self._read_forever, daemon=True, name="log-capture").start()

    def begin(self, log: InvocationLog) -> None:
        with self.lock:
            self.log = log
            self._shipped = time.monotonic()

    def end(self, begun: object = None) -> None:
        """The handler returned: the rest of what it wrote, read now into its log (its last
        lines)."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, ValueError, OSError):
                stream.flush()
        with self.lock:
            log, self.log = self.log, None
            for fd, splitter in self._readers.items():
                self._read(fd, splitter, log)
                splitter.end(log)

    def _read(self, fd: int, splitter: LineSplitter, log: InvocationLog | None) -> None:
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                return
            if not data:
                return
            if log is None:
                with contextlib.suppress(OSError):
                    os.write(self._outside[fd], data)
            else:
                splitter.feed(data, log)

    def _read_forever(self) -> None:
        fds = list(self._readers)
        while True:
            readable, _, _ = select.select(fds, [], [], SHIP_SECONDS)
            with self.lock:
                for fd in readable:
                    self._read(fd, self._readers[fd], self.log)
                log = self.log
                if log is None or not log.pending():
                    continue
                if time.monotonic() - self._shipped < SHIP_SECONDS:
                    continue
                self._shipped = time.monotonic()
                lines = log.take()
            self.ship(lines)


# -- inline, in the worker's process ---------------------------------------------------------

_CURRENT: contextvars.ContextVar[InvocationLog | None] = contextvars.ContextVar(
    "cronstream_invocation_log", default=None)


class _Stream(io.TextIOBase):
    """sys.stdout or sys.stderr of the worker: the invocation's log inside an inline
    invocation, the real stream everywhere else."""

    def __init__(self, name: str, real: TextIO) -> None:
        self.name_ = name
        self.real = real
        self._partial: dict[int, str] = {}

    def write(self, text: str) -> int:
        log = _CURRENT.get()
        if log is None:
            return self.real.write(text)
        key = id(log)
        *complete, rest = (self._partial.pop(key, "") + text).split("\n")
        for line in complete:
            log.add(self.name_, None, line)
        if rest:
            self._partial[key] = rest
        return len(text)

    def flush(self) -> None:
        log = _CURRENT.get()
        if log is None:
            self.real.flush()
            return
        rest = self._partial.pop(id(log), "")
        if rest:
            log.add(self.name_, None, rest)

    def unfinished(self) -> bool:
        return bool(self._partial)

    def fileno(self) -> int:
        return self.real.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.real.encoding

    def isatty(self) -> bool:
        return self.real.isatty()


def install_inline_capture() -> None:
    """Route sys.stdout, sys.stderr and `logging` to the inline invocation in progress (where
    they are not routed already)."""
    if not isinstance(sys.stdout, _Stream):
        sys.stdout = _Stream("stdout", sys.stdout)
    if not isinstance(sys.stderr, _Stream):
        sys.stderr = _Stream("stderr", sys.stderr)
    root = logging.getLogger()
    if not any(isinstance(h, LineHandler) and h.current == _CURRENT.get for h in root.handlers):
        root.addHandler(LineHandler(_CURRENT.get))


class InlineCapture:
    """Inline invocations' capture: from `begin` to `end`, what the current context (the
    invocation's task, or the loop's own turn for a synchronous one) writes is `log`'s."""

    def begin(self, log: InvocationLog) -> contextvars.Token[InvocationLog | None]:
        return _CURRENT.set(log)

    def end(self, begun: contextvars.Token[InvocationLog | None]) -> None:
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, _Stream) and stream.unfinished():
                stream.flush()  # a last line without its newline is a line too
        _CURRENT.reset(begun)


INLINE = InlineCapture()
