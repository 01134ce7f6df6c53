"""A pool of reusable handler processes, where any code can be stopped for real.

Each slot of the worker's concurrency can hold one long-lived child process (started from
a forkserver that has already imported the handler modules, so a start costs
milliseconds, not an interpreter boot); the code that runs in it, and the protocol of its
pipes, are in child.py. A child holds one invocation of a handler at a time.

Timeouts and cancellations are enforced here, by the parent: at `timeout_seconds` the
child is killed (SIGKILL: CPU loops and blocking calls included) and the execution is
TIMED_OUT; a cancellation is passed to the handler's context first and the child killed
if the handler has not returned after `CANCEL_GRACE_SECONDS`. A killed child is replaced
at once, so the slot is healthy again. Handlers registered `inline=True` skip the pool
and are invoked on the event loop (inline.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import multiprocessing
import os
from collections import deque
from multiprocessing.connection import Connection
from typing import Any
from uuid import UUID

from cronstream.handlers import HandlerRegistry, HandlerSpec
from cronstream.services.worker import inline
from cronstream.services.worker.capture import install_inline_capture
from cronstream.services.worker.child import (
    BUILTINS,
    READ_SIZE,
    Done,
    Progress,
    answer,
    child_main,
    invocation_line,
    send,
)
from cronstream.services.worker.runner import (
    CancelSignal,
    Invocation,
    LinesFn,
    Outcome,
    ProgressFn,
    unknown_handler,
)
from cronstream.shared import metrics
from cronstream.shared.fast_records import DueRecord
from cronstream.shared.logs import log
from cronstream.shared.statuses import Status
from cronstream.shared.telemetry import Headers

logger = logging.getLogger(__name__)

CANCEL_GRACE_SECONDS = 5.0
FORKSERVER_SIGNALS = "cronstream.services.worker.forkserver_signals"


class _Interrupt(enum.Enum):
    """What settles an invocation before its child answers `done` (never sent)."""

    TIMEOUT = "timeout"  # its timer: it has run for its timeout or its cancellation grace
    CANCEL = "cancel"  # its cancel signal


Reply = Done | _Interrupt | None  # None: the child's pipe closed (its process is gone)


class Child:
    """One pool process and the parent's end of its pipe.

    The pipe is watched by the event loop for the child's whole life (one reader, not one
    per execution); what it reads settles the current invocation's future, which its timer
    and its cancel signal may settle first."""

    def __init__(self, ctx: Any, imports: list[str], allow_shell: bool, log_limit: int = 1 << 20
                 ) -> None:
        parent_end, child_end = ctx.Pipe(duplex=True)
        cancels_in, cancels_out = ctx.Pipe(duplex=False)
        self.conn: Connection = parent_end
        self.cancels: Connection = cancels_out
        self._fd = parent_end.fileno()
        self._partial = b""  # the start of a line still being read
        self.process = ctx.Process(target=child_main,
                                   args=(child_end, cancels_in, imports, allow_shell, log_limit),
                                   daemon=True, name="cronstream-handler")
        self.process.start()
        child_end.close()
        cancels_in.close()
        self.executions = 0
        self.dead = False  # killed, or its pipe closed: replaced, never run again
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reply: asyncio.Future[Reply] | None = None
        self._progress: ProgressFn | None = None
        self._lines: LinesFn | None = None
        self.invoked_at = 0.0
        self._naps = 0  # looks of the pool in a row that found this process asleep

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is None:
            self._loop = loop
            loop.add_reader(self._fd, self._readable)

    def _unwatch(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self._fd)
            self._loop = None

    def _readable(self) -> None:
        """The lines the child has written (one read: the loop calls again while more is
        readable)."""
        try:
            data = os.read(self._fd, READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # its end closed: the process is gone
            self.dead = True
            self._unwatch()
            self._settle(None)
            return
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            message = answer(line)
            if isinstance(message, Done):
                self._settle(message)
            elif isinstance(message, Progress):
                if self._progress is not None:
                    self._progress(message.percent, message.message)
            elif self._lines is not None:  # LogLines
                self._lines(message.lines)

    def _settle(self, message: Reply) -> None:
        reply = self._reply
        if reply is not None and not reply.done():
            reply.set_result(message)

    @property
    def pid(self) -> int:
        return self.process.pid or 0

    def asleep(self, now: float) -> bool:
        """Asleep in its handler: at this look and the one before, every thread of the
        process slept, and its invocation has lasted ASLEEP_AFTER_SECONDS (one caught
        between two steps, or a process still settling in, is not)."""
        self._naps = 0 if computing(self.pid) else self._naps + 1
        return self._naps >= 2 and now - self.invoked_at >= ASLEEP_AFTER_SECONDS

    def answered(self) -> bool:
        """The child is done with its invocation, or about to be: its `done` is read (the
        invocation has yet to hand the process back) or waiting to be read."""
        reply = self._reply
        if reply is None or reply.done():
            return True
        try:
            return self.conn.poll(0)
        except (OSError, EOFError):
            return True

    def kill(self) -> None:
        self.dead = True
        self._unwatch()
        with contextlib.suppress(ProcessLookupError, AttributeError):
            self.process.kill()
        self.process.join(5)
        self.conn.close()
        self.cancels.close()

    async def invoke(self, invocation: Invocation, timeout: float, progress: ProgressFn,
                     cancel: CancelSignal, lines: LinesFn | None = None) -> Outcome:
        """Have the child invoke the handler, and settle how it ended: as the child answers,
        or killed at `timeout` (seconds) or CANCEL_GRACE_SECONDS after its cancellation."""
        loop = asyncio.get_running_loop()
        self._watch(loop)
        reply = self._reply = loop.create_future()
        self._progress = progress
        self._lines = lines
        self.executions += 1
        started = self.invoked_at = loop.time()
        self._naps = 0
        deadline = started + timeout
        timer = loop.call_at(deadline, self._settle, _Interrupt.TIMEOUT)

        def cancelled() -> None:
            if not reply.done():
                reply.set_result(_Interrupt.CANCEL)

        cancel.on_set(loop, cancelled)
        cancelled_at: float | None = None
        try:
            send(self._fd, invocation_line(invocation))
            while True:
                message = await reply
                if message is _Interrupt.CANCEL:
                    # Tell the handler; kill it if it has not returned after the grace.
                    cancelled_at = loop.time()
                    with contextlib.suppress(OSError):
                        self.cancels.send_bytes(str(invocation.execution_id).encode())
                    timer.cancel()
                    reply = self._reply = loop.create_future()
                    timer = loop.call_at(min(deadline, cancelled_at + CANCEL_GRACE_SECONDS),
                                         self._settle, _Interrupt.TIMEOUT)
                    continue
                if message is _Interrupt.TIMEOUT:
                    return self._stop(timeout, cancelled_at, started, loop.time())
                if message is None:
                    return Outcome("FAILED", error="the handler process died "
                                   f"(exit code {self.process.exitcode})")
                return _outcome(message, cancelled_at is not None)
        except asyncio.CancelledError:
            self.kill()  # the worker gave up on this execution (drain): stop it for real
            raise
        finally:
            timer.cancel()
            self._reply = None
            self._progress = None
            self._lines = None

    def _stop(self, timeout: float, cancelled_at: float | None, started: float,
              now: float) -> Outcome:
        """The handler overran its timeout or its cancellation grace: kill it."""
        self.kill()
        ran = now - started
        if cancelled_at is not None and ran < timeout:
            return Outcome("CANCELLED", error="cancelled; the handler did not stop within "
                                              f"{CANCEL_GRACE_SECONDS:g}s and was killed")
        return Outcome("TIMED_OUT", error=f"timed out after {timeout:g}s; "
                                          "the handler was killed")


def _outcome(done: Done, cancelled: bool) -> Outcome:
    """How an invocation the child answered ended: CANCELLED, whatever the handler did,
    when it was cancelled meanwhile."""
    status = done.status
    if cancelled and status in (Status.COMPLETED, Status.FAILED):
        status = "CANCELLED"
    return Outcome(status, result=done.result,
                   error=done.error or ("cancelled" if status == "CANCELLED" else None),
                   traceback=done.traceback)


# Processes a pool starts with; it starts more as invocations need them, up to its size.
WARM_PROCESSES = 2
# An invocation that finds every process busy waits this long for one to come free
# before the pool starts another. Short handlers keep reusing the few processes whose
# memory is in the caches (each process woken in turn was a cache refill and a context
# switch per execution: with one process per slot, 64 short invocations woke 64
# processes); a burst of long ones gets a process each, this much later.
GROW_AFTER_SECONDS = 0.005
# A busy process counts as asleep in its handler once its invocation has lasted this long
# and two looks in a row found none of its threads on (or waiting for) a CPU.
ASLEEP_AFTER_SECONDS = 0.02


def cpu_budget() -> int:
    """The CPUs this process may use: its affinity, bounded by a cgroup v2 CPU quota (a
    Kubernetes CPU limit), at least one."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as limits:
            quota, period = limits.read().split()
        if quota != "max":
            cpus = min(cpus, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def computing(pid: int) -> bool:
    """Whether a thread of the process runs or waits for a CPU (state R): a handler's
    main thread waiting for the GIL that another of its threads holds computes too. Not
    computing: every thread sleeps in a call. Where /proc cannot tell, it is taken as
    sleeping (the pool grows, as it may)."""
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/stat", "rb") as stat:
                if stat.read().rpartition(b")")[2][1:2] == b"R":
                    return True
    except OSError:
        pass
    return False


class PoolRunner:
    """Up to `size` reusable handler processes plus inline invocation for `inline` handlers.

    The pool grows with what its invocations need: it starts WARM_PROCESSES and adds one
    for each that has waited GROW_AFTER_SECONDS for a free process, up to `size` (the worker's
    concurrency: every slot can still hold a blocking handler) — up to one process per
    CPU (`cpu_budget`), and beyond that one for each busy process asleep in its handler.
    Handlers that sleep in a call (network, disk, `time.sleep`) get a process each;
    handlers that compute get no more processes than CPUs, since another would only
    share the same CPUs and make each invocation slower: under a load of short handlers on two
    cores, 64 processes per worker completed 12 % fewer executions than 4, at a quarter
    more CPU each (issue 16). A process whose answer waits to be read is about to be free
    and counts for neither. A worker whose handlers are all inline starts no more than the
    warm ones. Processes stay once started (a killed one is replaced), idle ones are
    reused last in, first out."""

    def __init__(self, registry: HandlerRegistry, size: int, imports: list[str],
                 allow_shell: bool = False, *, cpus: int | None = None,
                 log_limit: int = 1 << 20) -> None:
        self.registry = registry
        self.size = size
        self.imports = list(imports)
        self.allow_shell = allow_shell
        self.log_limit = log_limit  # bytes of an attempt's log (capture.py)
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload([FORKSERVER_SIGNALS, BUILTINS, *self.imports])
        # Last in, first out: the child that just answered runs the next execution, while
        # its memory is still in the caches; under less than full load the others sleep.
        self._idle: list[Child] = []
        self._waiting: deque[asyncio.Future[Child]] = deque()
        self._children: list[Child] = []
        self._spawning = 0
        self._spawns: set[asyncio.Future[None]] = set()
        self._grow_timer: asyncio.TimerHandle | None = None
        self._spawn_error: BaseException | None = None
        self._closing = False
        self._cpus = cpus or cpu_budget()
        self.replaced = 0
        # The handlers `run_now` found for the executions it left to `run` (taken there).
        self._found: dict[UUID, HandlerSpec] = {}

    @property
    def processes(self) -> int:
        """Handler processes alive or starting."""
        return len(self._children) + self._spawning

    async def start(self) -> None:
        """Start the warm processes, without waiting for them: each joins the idle ones
        when it is up, and an invocation waits for the first free one. What inline handlers write
        is captured from here on (capture.py)."""
        install_inline_capture()
        for _ in range(min(self.size, WARM_PROCESSES)):
            self._spawn_one()

    def _spawn_one(self) -> None:
        loop = asyncio.get_running_loop()
        self._spawning += 1
        spawned = loop.run_in_executor(None, self._spawn)
        task = asyncio.ensure_future(self._enlist(spawned))
        self._spawns.add(task)
        task.add_done_callback(self._spawns.discard)

    async def _enlist(self, spawned: asyncio.Future[Child]) -> None:
        try:
            child = await spawned
        except Exception as exc:
            self._spawning -= 1
            logger.exception("a handler process did not start",
                             extra={"action": "handler_pool_failed"})
            self._spawn_error = exc
            if not self._children and not self._spawning:
                # Nothing can invoke them: fail the waiting invocations instead of holding them.
                while self._waiting:
                    waiter = self._waiting.popleft()
                    if not waiter.done():
                        waiter.set_exception(RuntimeError(f"the handler pool did not start: {exc}"))
            return
        self._spawning -= 1
        if self._closing:
            child.kill()
            return
        self._spawn_error = None
        self._children.append(child)
        metrics.WORKER_HANDLER_PROCESSES.set(len(self._children))
        self._release(child)

    def _spawn(self) -> Child:
        return Child(self._ctx, self.imports, self.allow_shell, self.log_limit)

    def _release(self, child: Child) -> None:
        """A free process: to the invocation that has waited longest, else to the idle ones."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(child)
                return
        self._idle.append(child)

    async def _acquire(self) -> Child:
        if self._idle:
            return self._idle.pop()
        if not self._children and not self._spawning:
            if self._spawn_error is not None:
                raise RuntimeError(f"the handler pool did not start: {self._spawn_error}")
            self._spawn_one()  # a pool of size 0 never gets here: size >= 1 (settings)
        waiter: asyncio.Future[Child] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        if self._grow_timer is None:
            self._grow_timer = asyncio.get_running_loop().call_later(GROW_AFTER_SECONDS, self._grow)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._release(waiter.result())  # handed over just as this one was cancelled
            raise

    def _grow(self) -> None:
        """New processes for the invocations still waiting, as far as the size, the CPUs and
        the processes asleep in their handlers allow (then look again a little later, while
        some still wait: a handler that computes now may sleep next)."""
        self._grow_timer = None
        if self._closing:
            return
        waiting = sum(1 for waiter in self._waiting if not waiter.done())
        wanted = min(waiting - self._spawning, self.size - self.processes)
        if wanted <= 0:
            return
        idle = set(map(id, self._idle))
        busy = [c for c in self._children if id(c) not in idle and not c.dead]
        running = [c for c in busy if not c.answered()]
        answered = len(busy) - len(running)
        now = asyncio.get_running_loop().time()
        asleep = sum(1 for c in running if c.asleep(now))
        # Up to one process per CPU; beyond that, one per process asleep in its handler
        # (invocations like its own wait: a burst of sleepers doubles the pool at each look).
        # Never for CPUs merely unused by the pool: on a busy machine they are not free.
        spawn = min(wanted - answered, max(self._cpus - self.processes, asleep))
        for _ in range(spawn):
            self._spawn_one()
        if spawn < wanted:
            self._grow_timer = asyncio.get_running_loop().call_later(
                GROW_AFTER_SECONDS * 4, self._grow)

    async def close(self) -> None:
        self._closing = True
        if self._grow_timer is not None:
            self._grow_timer.cancel()
        if self._spawns:
            # The processes still starting are killed as they come.
            await asyncio.gather(*self._spawns, return_exceptions=True)
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_exception(RuntimeError("the handler pool is closing"))
        for child in self._children:
            child.kill()
        self._children.clear()
        self._idle.clear()
        self._found.clear()

    def run_now(self, due: DueRecord, progress: ProgressFn, trace: Headers | None = None,
                lines: LinesFn | None = None) -> Outcome | None:
        """The outcome of an execution that needs no waiting, on the spot: an unknown
        handler, or an inline synchronous one (invoked here, on the event loop it must not
        block, inside the context of the trace headers `trace`, when given: its log lines
        carry the trace id). None for the others, without a look at their headers: `run`
        them, with the handler found here (an execution's handler is looked up once). No
        task, no second context per execution: a no-op's whole invocation is a function
        call."""
        spec = self.registry.get(due.job.handler)
        if spec is None:
            return unknown_handler(due.job.handler)
        if not spec.inline or spec.is_async:
            self._found[due.execution_id] = spec
            return None
        return inline.invoke_now(spec, Invocation.of(due, trace), progress, lines=lines,
                                 log_limit=self.log_limit)

    async def run(self, due: DueRecord, progress: ProgressFn, cancel: CancelSignal,
                  trace: Headers | None = None, lines: LinesFn | None = None) -> Outcome:
        """Run `due` to its outcome: its handler invoked inline inside the context of the
        trace headers `trace` (its span and log lines join the trace), or in a process
        that attaches them itself (the parent does not). Its handler is the one `run_now`
        found for it, if it was asked first; else it is looked up here."""
        spec = self._found.pop(due.execution_id, None) or self.registry.get(due.job.handler)
        if spec is None:
            return unknown_handler(due.job.handler)
        if spec.inline:
            return await inline.invoke_awaited(spec, Invocation.of(due, trace),
                                               due.job.timeout_seconds, progress, cancel,
                                               lines=lines, log_limit=self.log_limit)
        child = await self._acquire()
        while child.dead and not self._closing:  # its process died while idle
            await self._replace(child)
            child = await self._acquire()
        if cancel.is_set():  # cancelled while it waited for a process: it never begins
            self._release(child)
            return Outcome("CANCELLED", error="cancelled before it started")
        try:
            return await child.invoke(Invocation.of(due, trace), due.job.timeout_seconds,
                                      progress, cancel, lines)
        finally:
            # A child that answered is alive (no waitpid per execution); one that did not
            # was killed or lost its pipe.
            if not child.dead:
                self._release(child)
            elif not self._closing:
                await self._replace(child)

    async def _replace(self, dead: Child) -> None:
        with contextlib.suppress(ValueError):
            self._children.remove(dead)
        dead.kill()
        fresh = await asyncio.get_running_loop().run_in_executor(None, self._spawn)
        if self._closing:
            fresh.kill()
            return
        self._children.append(fresh)
        metrics.WORKER_HANDLER_PROCESSES.set(len(self._children))
        self._release(fresh)
        self.replaced += 1
        log(logger, "handler_process_replaced", pid=fresh.process.pid, replaced=self.replaced)


__all__ = ["ASLEEP_AFTER_SECONDS", "CANCEL_GRACE_SECONDS", "GROW_AFTER_SECONDS", "WARM_PROCESSES",
           "Child", "PoolRunner", "computing", "cpu_budget"]
