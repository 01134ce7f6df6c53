"""An execution's cancel signal: set once from the event loop, seen by a handler thread
blocked in `Context.wait_cancelled`, by `Context.cancelled`, and by the loop's awaiters —
whichever comes first, the set or the wait."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import UTC, datetime

from cronstream.services.worker.runner import CancelSignal, Invocation
from cronstream.shared.records import JobDue, JobSnapshot

DUE = JobDue(execution_id=uuid.uuid4(), job_id="job", run_id=uuid.uuid4(),
             scheduled_at=datetime(2026, 11, 30, tzinfo=UTC), reason="SCHEDULE",
             idempotency_key="k", job=JobSnapshot(handler="noop"))


def test_a_handler_thread_waiting_for_cancellation_wakes_when_it_is_set() -> None:
    signal = CancelSignal()
    ctx = Invocation.of(DUE).context(lambda p, m: None, signal.flag, None)
    woke: list[tuple[bool, float]] = []
    waiting = threading.Event()

    def handler() -> None:
        waiting.set()
        started = time.monotonic()
        woke.append((ctx.wait_cancelled(30), time.monotonic() - started))

    thread = threading.Thread(target=handler)
    thread.start()
    assert waiting.wait(5)
    assert not ctx.cancelled
    signal.set("cancelled by a person", "alice")
    thread.join(10)
    assert not thread.is_alive()
    assert woke and woke[0][0] is True and woke[0][1] < 10, woke
    assert ctx.cancelled and signal.is_set()
    assert (signal.reason, signal.by) == ("cancelled by a person", "alice")


def test_a_signal_set_before_the_wait_returns_at_once_and_keeps_its_first_reason() -> None:
    signal = CancelSignal()
    signal.set("timeout")
    signal.set("worker drained")  # set once: the first reason stays
    assert signal.reason == "timeout"
    assert signal.flag.wait(30) is True  # no blocking: already set
    assert Invocation.of(DUE).context(lambda p, m: None, signal.flag, None).cancelled


def test_an_unset_signal_times_out_and_the_loop_can_await_it() -> None:
    signal = CancelSignal()
    assert signal.flag.wait(0.01) is False

    async def scenario() -> None:
        waiter = asyncio.create_task(signal.wait())
        await asyncio.sleep(0)
        assert not waiter.done()
        signal.set("replaced")
        await asyncio.wait_for(waiter, 5)

    asyncio.run(scenario())
