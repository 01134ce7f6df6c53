"""The process pool without Kafka: a cancellation reaches the handler that runs (which
returns, and its process lives on), one that arrives after its execution ended never
touches the next invocation in that process, and what a handler is given and returns
crosses the pipe intact."""

from __future__ import annotations

import asyncio
import multiprocessing
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import tests.e2e.handlers_for_tests  # noqa: F401  (registers the handlers in this process too)
from cronstream.handlers import REGISTRY
from cronstream.services.worker.pool import FORKSERVER_SIGNALS, WARM_PROCESSES, Child, PoolRunner
from cronstream.services.worker.runner import CancelSignal, Invocation, Outcome
from cronstream.shared.records import JobDue, JobSnapshot

HANDLERS = "tests.e2e.handlers_for_tests"


def _due(handler: str, timeout_seconds: float = 60, **params: Any) -> JobDue:
    return JobDue(execution_id=uuid.uuid4(), job_id="job", run_id=uuid.uuid4(),
                  scheduled_at=datetime(2026, 12, 1, tzinfo=UTC), reason="SCHEDULE",
                  idempotency_key="k", job=JobSnapshot(handler=handler, params=params,
                                                       timeout_seconds=timeout_seconds))


def _child() -> Child:
    """One pool process on its own, outside a PoolRunner."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([FORKSERVER_SIGNALS, HANDLERS])
    return Child(context, [HANDLERS], False)


def _ignore(percent: float, message: str | None) -> None:
    pass


async def _invoke(child: Child, due: JobDue) -> Outcome:
    return await child.invoke(Invocation.of(due), due.job.timeout_seconds, _ignore, CancelSignal())


def test_a_cancelled_handler_stops_and_its_process_runs_the_next(tmp_path: Path) -> None:
    path = tmp_path / "ran.txt"

    async def scenario() -> None:
        runner = PoolRunner(REGISTRY, 1, [HANDLERS])
        await runner.start()
        try:
            # Cancelled while it waits (its progress report says it does) ...
            signal = CancelSignal()
            outcome = await asyncio.wait_for(runner.run(
                _due("test.wait-for-cancel", seconds=60),
                lambda percent, message: signal.set("cancelled by a person"), signal), 10)
            assert (outcome.status, outcome.result) == ("CANCELLED", {"cancelled": True})
            after = await runner.run(_due("test.write", path=str(path)), _ignore, CancelSignal())
            assert (after.status, after.result) == ("COMPLETED", {"written": True})
            assert runner.replaced == 0, "the handlers returned: their process was not killed"
        finally:
            await runner.close()

    asyncio.run(scenario())
    assert len(path.read_text().splitlines()) == 1


def test_a_cancellation_read_before_its_invocation_reaches_the_handler() -> None:
    """Two pipes, two readers: the child may read a cancellation before the invocation it
    names."""
    async def scenario() -> None:
        child = _child()
        try:
            due = _due("test.wait-for-cancel", seconds=60)
            child.cancels.send_bytes(str(due.execution_id).encode())
            outcome = await asyncio.wait_for(_invoke(child, due), 10)
            assert outcome.result == {"cancelled": True}, outcome
        finally:
            child.kill()

    asyncio.run(scenario())


def test_a_cancellation_that_arrives_after_its_invocation_leaves_the_next_one_alone(tmp_path: Path) -> None:
    async def scenario() -> None:
        child = _child()
        try:
            first = _due("test.write", path=str(tmp_path / "first.txt"))
            assert (await _invoke(child, first)).status == "COMPLETED"
            child.cancels.send_bytes(str(first.execution_id).encode())  # too late for it
            second = _due("test.wait-for-cancel", seconds=1)
            outcome = await asyncio.wait_for(_invoke(child, second), 10)
            assert (outcome.status, outcome.result) == ("COMPLETED", {"cancelled": False})
        finally:
            child.kill()

    asyncio.run(scenario())


def test_an_invocation_reaches_its_handler_and_comes_back_exactly() -> None:
    """The Context a pool handler gets is the execution's (ids, attempt, key, an aware
    scheduled_at, params with line breaks and nesting, the trace it runs under); its
    progress and its result come back as it sent them."""
    params = {"message": "two\nlines \u2028 ü \"quoted\"", "nested": {"x": [1, 2.5, None, True]}}
    traceparent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    due = JobDue(execution_id=uuid.uuid4(), job_id="job-7", run_id=uuid.uuid4(),
                 scheduled_at=datetime(2026, 12, 1, 2, 3, 4, 567891, tzinfo=UTC), reason="RETRY",
                 attempt_number=3, idempotency_key="key-3",
                 job=JobSnapshot(handler="test.context", params=params, timeout_seconds=60))
    reports: list[tuple[float, str | None]] = []

    async def scenario() -> Any:
        runner = PoolRunner(REGISTRY, 1, [HANDLERS])
        await runner.start()
        try:
            trace = [("traceparent", traceparent.encode()), ("x-empty", None)]
            # A Kafka header's value may be None, which Headers does not admit: on purpose.
            return await asyncio.wait_for(runner.run(
                due, lambda percent, text: reports.append((percent, text)), CancelSignal(),
                trace), 30)  # type: ignore[arg-type]
        finally:
            await runner.close()

    outcome = asyncio.run(scenario())
    assert outcome.status == "COMPLETED", outcome
    assert outcome.result == {
        "execution_id": str(due.execution_id), "job_id": "job-7", "run_id": str(due.run_id),
        "attempt_number": 3, "idempotency_key": "key-3",
        "scheduled_at": "2026-12-01T02:03:04.567891+00:00", "params": params,
        "traceparent": traceparent}
    assert reports == [(50.0, params["message"])]


def test_the_pool_starts_few_processes_and_grows_with_the_invocations_that_wait(tmp_path: Path) -> None:
    """Executions one after another never need a second process; a burst of handlers that
    hold their process gets one each, up to the pool's size, and no more."""
    size, burst = 6, 9

    async def scenario() -> None:
        runner = PoolRunner(REGISTRY, size, [HANDLERS])
        await runner.start()
        try:
            assert runner.processes == WARM_PROCESSES
            for _ in range(20):
                outcome = await runner.run(_due("test.write", path=str(tmp_path / "one.txt")),
                                           _ignore, CancelSignal())
                assert outcome.status == "COMPLETED", outcome
            assert runner.processes == WARM_PROCESSES, "sequential runs always find a free process"
            # Each waits (up to 60 s) until it is cancelled: every one holds its process.
            signals = [CancelSignal() for _ in range(burst)]
            runs = [asyncio.ensure_future(runner.run(_due("test.wait-for-cancel", seconds=60),
                                                     _ignore, signal)) for signal in signals]

            async def grown() -> None:
                while len(runner._children) < size or runner._spawning:
                    await asyncio.sleep(0.05)  # polling a condition, under the deadline below

            await asyncio.wait_for(grown(), 60)
            assert runner.processes == size, "never more processes than slots"
            for signal in signals:
                signal.set("test over")
            outcomes = await asyncio.wait_for(asyncio.gather(*runs), 60)
            assert [o.status for o in outcomes] == ["CANCELLED"] * burst
            assert runner.replaced == 0
        finally:
            await runner.close()

    asyncio.run(scenario())
    assert len((tmp_path / "one.txt").read_text().splitlines()) == 20


def test_handlers_that_compute_get_no_more_processes_than_cpus() -> None:
    """A burst of handlers that compute (never sleep) on a pool given one CPU: the two
    warm processes compute already, so the runs wait for them instead of each starting a
    process that would only share the CPU; they all complete."""
    size, burst = 6, 8

    async def scenario() -> None:
        runner = PoolRunner(REGISTRY, size, [HANDLERS], cpus=1)
        await runner.start()
        try:
            most = 0

            async def watch() -> None:
                nonlocal most
                while True:
                    most = max(most, runner.processes)
                    await asyncio.sleep(0.01)  # sampling the pool's size while it works

            watcher = asyncio.ensure_future(watch())
            runs = [runner.run(_due("test.spin", seconds=0.25), _ignore, CancelSignal())
                    for _ in range(burst)]
            outcomes = await asyncio.wait_for(asyncio.gather(*runs), 60)
            watcher.cancel()
            assert [o.status for o in outcomes] == ["COMPLETED"] * burst, outcomes
            assert most == WARM_PROCESSES, f"the pool grew to {most} processes for computing handlers"
        finally:
            await runner.close()

    asyncio.run(scenario())


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_process_that_dies_or_is_killed_takes_only_its_own_invocation_with_it(tmp_path: Path) -> None:
    """Invocations waiting for the process of one that dies under it, or is killed at its
    timeout, are invoked in its replacement, once each."""
    async def scenario() -> None:
        runner = PoolRunner(REGISTRY, 1, [HANDLERS])
        await runner.start()
        try:
            # The dying run's timeout is far off: its end must come from the exit itself
            # (a fresh clone's first spawn, compiling the handlers, can take over 0.5 s).
            for ender, expected, timeout in (("test.exit", "FAILED", 30.0),
                                             ("test.block", "TIMED_OUT", 0.5)):
                ended = asyncio.ensure_future(runner.run(_due(ender, timeout_seconds=timeout),
                                                         _ignore, CancelSignal()))
                behind = [asyncio.ensure_future(runner.run(
                    _due("test.write", path=str(tmp_path / f"{ender}-{i}")), _ignore, CancelSignal()))
                    for i in range(3)]
                outcomes = await asyncio.wait_for(asyncio.gather(ended, *behind), 60)
                assert [o.status for o in outcomes] == [expected, *["COMPLETED"] * 3], outcomes
            assert runner.replaced == 2
        finally:
            await runner.close()

    asyncio.run(scenario())
    for ender in ("test.exit", "test.block"):
        for i in range(3):
            assert len(_lines(tmp_path / f"{ender}-{i}")) == 1


def test_an_invocation_cancelled_while_it_waits_for_a_process_never_begins(tmp_path: Path) -> None:
    async def scenario() -> None:
        runner = PoolRunner(REGISTRY, 1, [HANDLERS])
        await runner.start()
        try:
            long_signal, waiting_signal = CancelSignal(), CancelSignal()
            long = asyncio.ensure_future(runner.run(_due("test.wait-for-cancel", seconds=60),
                                                    _ignore, long_signal))
            waiting = asyncio.ensure_future(runner.run(_due("test.write", path=str(tmp_path / "never")),
                                                       _ignore, waiting_signal))
            waiting_signal.set("cancelled by a person")
            long_signal.set("test over")
            assert (await asyncio.wait_for(long, 10)).status == "CANCELLED"
            outcome = await asyncio.wait_for(waiting, 10)
            assert (outcome.status, outcome.error) == ("CANCELLED", "cancelled before it started")
            after = await asyncio.wait_for(runner.run(
                _due("test.write", path=str(tmp_path / "after")), _ignore, CancelSignal()), 10)
            assert after.status == "COMPLETED"
        finally:
            await runner.close()

    asyncio.run(scenario())
    assert not (tmp_path / "never").exists()
    assert len(_lines(tmp_path / "after")) == 1
