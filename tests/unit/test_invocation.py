"""One body for every invocation of a handler (services/worker/runner.invoke), inline and in
a pool process alike: the handler is looked up once, its Context is built from one
Invocation, what it returns or raises ends the same way on both paths, and every message
on the pool's pipe is a named type that crosses it intact."""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

import tests.e2e.handlers_for_tests  # noqa: F401  (registers the handlers in this process too)
from cronstream.handlers import REGISTRY, Context, HandlerRegistry, HandlerSpec, NonRetryableError
from cronstream.services.worker import inline
from cronstream.services.worker.capture import InvocationLog, Line
from cronstream.services.worker.child import (
    Done,
    LogLines,
    Progress,
    answer,
    answer_invocation,
    done_line,
    invocation_line,
    log_line,
    progress_line,
)
from cronstream.services.worker.pool import PoolRunner, _outcome
from cronstream.services.worker.runner import CancelSignal, Invocation, Outcome, returned
from cronstream.shared.fast_records import FastUpstream, upstream_of
from cronstream.shared.records import JobDue, JobSnapshot
from cronstream.shared.records import Upstream as UpstreamRecord

HANDLERS = "tests.e2e.handlers_for_tests"
TRACE = [("traceparent", b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01")]


class CountingRegistry(HandlerRegistry):
    """REGISTRY's handlers and this module's own, with every lookup counted."""

    def __init__(self) -> None:
        super().__init__()
        self.looked_up: list[str] = []

    def get(self, name: str) -> HandlerSpec | None:
        self.looked_up.append(name)
        return super().get(name) or REGISTRY.get(name)


def _returns(ctx: Context) -> dict[str, Any]:
    return {"attempt": ctx.attempt_number, "params": ctx.params}


async def _async_returns(ctx: Context) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"attempt": ctx.attempt_number, "params": ctx.params}


def _raises(ctx: Context) -> None:
    try:
        ctx.params["region"]
    except KeyError as exc:
        raise RuntimeError("lookup failed") from exc


async def _async_raises(ctx: Context) -> None:
    await asyncio.sleep(0)
    raise NonRetryableError("the input can never work")


def _refuses(ctx: Context) -> None:
    raise NonRetryableError("the input can never work")


def _not_json(ctx: Context) -> object:
    return {"when": datetime(2026, 12, 1, tzinfo=UTC)}


def _too_large(ctx: Context) -> str:
    return "x" * 70_000


def _registry() -> CountingRegistry:
    registry = CountingRegistry()
    for name, func in (("t.returns", _returns), ("t.async-returns", _async_returns),
                       ("t.raises", _raises), ("t.async-raises", _async_raises),
                       ("t.refuses", _refuses), ("t.not-json", _not_json),
                       ("t.too-large", _too_large)):
        registry.register(name, func)
    registry.register("t.inline-returns", _returns, inline=True)
    registry.register("t.inline-async-returns", _async_returns, inline=True)
    return registry


def _due(handler: str, **params: Any) -> JobDue:
    return JobDue(execution_id=uuid.uuid4(), job_id="job-7", run_id=uuid.uuid4(),
                  scheduled_at=datetime(2026, 12, 1, 2, 3, 4, 567891, tzinfo=UTC), reason="RETRY",
                  attempt_number=3, idempotency_key="key-3",
                  job=JobSnapshot(handler=handler, params=params, timeout_seconds=60))


class _Quiet:
    """A capture that takes nothing (the real ones own the process's streams)."""

    def begin(self, log: InvocationLog) -> None:
        return None

    def end(self, begun: object) -> None:
        return None


def _ignore(percent: float, message: str | None) -> None:
    pass


def _in_the_child(registry: HandlerRegistry, invocation: Invocation, cancel: threading.Event,
                  progress: list[tuple[float, str | None]]) -> Outcome:
    """What the parent settles for `invocation` invoked by a pool process's body, its
    `done` across the pipe included (without the process)."""
    def report(percent: float, message: str | None) -> None:
        progress.append((percent, message))

    lines: list[Line] = []
    outcome = answer_invocation(registry, invocation, cancel, progress=report, lines=lines.extend,
                                capture=_Quiet(), log_limit=1 << 20)
    done = answer(done_line(outcome).removesuffix(b"\n"))
    assert isinstance(done, Done)
    return _outcome(done, False)


def _inline(registry: HandlerRegistry, invocation: Invocation, cancel: CancelSignal,
            progress: list[tuple[float, str | None]]) -> Outcome:
    def report(percent: float, message: str | None) -> None:
        progress.append((percent, message))

    spec = registry.get(invocation.handler)
    assert spec is not None
    if not spec.is_async and not cancel.is_set():
        return inline.invoke_now(spec, invocation, report)
    return asyncio.run(inline.invoke_awaited(spec, invocation, 60, report, cancel))


@pytest.mark.parametrize(("handler", "params", "cancelled", "status"), [
    ("t.returns", {"n": 2, "text": "two\nlines ü"}, False, "COMPLETED"),
    ("t.async-returns", {"n": 2}, False, "COMPLETED"),
    ("test.context", {"message": "halfway"}, False, "COMPLETED"),
    ("t.raises", {}, False, "FAILED"),
    ("t.async-raises", {}, False, "PERMANENTLY_FAILED"),
    ("t.refuses", {}, False, "PERMANENTLY_FAILED"),
    ("t.not-json", {}, False, "FAILED"),
    ("t.too-large", {}, False, "FAILED"),
    ("test.wait-for-cancel", {"seconds": 30}, True, "CANCELLED"),
])
def test_a_handler_ends_the_same_way_inline_and_in_a_pool_process(
        handler: str, params: dict[str, Any], cancelled: bool, status: str) -> None:
    """Same Context, same mapping of what it returned or raised (its traceback included),
    same progress reports: the two paths run one body."""
    registry = _registry()
    invocation = Invocation.of(_due(handler, **params), TRACE)
    signal = CancelSignal()
    if cancelled:
        signal.set("cancelled by a person")
    flag = threading.Event()
    if cancelled:
        flag.set()
    inline_progress: list[tuple[float, str | None]] = []
    child_progress: list[tuple[float, str | None]] = []
    there = _inline(registry, invocation, signal, inline_progress)
    here = _in_the_child(registry, invocation, flag, child_progress)
    assert there.status == status, there
    assert (here.status, here.result, here.error) == (there.status, there.result, there.error)
    if "async" in handler and there.traceback is not None:  # inline: asyncio's wait_for frames too
        assert here.traceback is not None
        assert here.traceback.splitlines()[-3:] == there.traceback.splitlines()[-3:]
    else:
        assert here.traceback == there.traceback
    assert here.retryable == there.retryable
    assert child_progress == inline_progress
    if status == "FAILED" and handler == "t.raises":
        assert here.error == "RuntimeError: lookup failed"
        assert here.traceback is not None and "KeyError: 'region'" in here.traceback
        assert "runner.py" not in here.traceback, "the worker's own frames are left out"


def test_a_handler_is_looked_up_once_per_execution_inline_and_in_the_pool() -> None:
    """The worker asks its runner `run_now` and then, when that cannot settle it, `run`:
    one lookup in all. A pool process looks the name up once in its own registry."""
    registry = _registry()

    async def scenario() -> dict[str, Outcome | None]:
        runner = PoolRunner(registry, 1, [HANDLERS])
        await runner.start()
        outcomes: dict[str, Outcome | None] = {}
        try:
            for handler in ("test.context", "t.inline-returns", "t.inline-async-returns", "t.nope"):
                registry.looked_up.clear()
                due = _due(handler, message="m")
                outcome = runner.run_now(due, _ignore, TRACE)
                if outcome is None:
                    outcome = await asyncio.wait_for(runner.run(due, _ignore, CancelSignal(), TRACE), 30)
                assert registry.looked_up == [handler], (handler, registry.looked_up)
                outcomes[handler] = outcome
            registry.looked_up.clear()  # `run` alone (a bench, a test) looks it up itself
            outcome = await asyncio.wait_for(runner.run(_due("test.context"), _ignore, CancelSignal()), 30)
            assert registry.looked_up == ["test.context"] and outcome.status == "COMPLETED"
            assert not runner._found, "every handler found by run_now was taken by run"
        finally:
            await runner.close()
        return outcomes

    outcomes = asyncio.run(scenario())
    assert {h: o.status if o else None for h, o in outcomes.items()} == {
        "test.context": "COMPLETED", "t.inline-returns": "COMPLETED",
        "t.inline-async-returns": "COMPLETED", "t.nope": "PERMANENTLY_FAILED"}
    for handler in ("test.context", "test.async-double"):
        registry.looked_up.clear()
        outcome = _in_the_child(registry, Invocation.of(_due(handler, n=2, message="m")),
                                threading.Event(), [])
        assert outcome.status == "COMPLETED", outcome
        assert registry.looked_up == [handler]


def test_every_pipe_message_round_trips_through_its_named_type() -> None:
    """Each message is one line of JSON: an Invocation down (untagged, one kind), and the
    tagged answers up — Progress, LogLines, Done — decoded straight into their types."""
    view = UpstreamRecord.of({"region": "eu"}, [("extract", uuid.uuid4(), "COMPLETED", {"rows": 3})])
    due = _due("test.upstream", message="two\nlines \u2028 ü", nested={"x": [1, 2.5, None]})
    due = due.model_copy(update={"upstream": view})
    invocation = Invocation.of(due, [*TRACE, ("x-empty", None)])  # type: ignore[list-item]
    line = invocation_line(invocation)
    assert line.count(b"\n") == 1 and line.endswith(b"\n")
    back = msgspec.json.Decoder(Invocation).decode(line)
    assert back == invocation
    assert isinstance(back.upstream, FastUpstream) and back.upstream == upstream_of(due)
    assert back.scheduled_at == due.scheduled_at and back.scheduled_at.tzinfo is not None

    captured: list[Line] = [(1733011200.25, "stdout", None, "a line\nwith a break"),
                            (1733011200.5, "log", "WARNING", "tests: careful \\xff")]
    result = {"rows": 3, "text": "two\nlines"}
    sent: list[tuple[bytes, Any]] = [
        (progress_line(40.0, "message"), Progress(40.0, "message")),
        (progress_line(100.0, None), Progress(100.0, None)),
        (log_line(captured), LogLines(captured)),
        (done_line(returned(result, cancelled=False)), Done("COMPLETED", result, None, None)),
        (done_line(Outcome("FAILED", error="RuntimeError: x", traceback="Traceback ...")),
         Done("FAILED", None, "RuntimeError: x", "Traceback ...")),
    ]
    for line, expected in sent:
        assert line.count(b"\n") == 1 and line.endswith(b"\n"), line
        assert line.startswith(b'["' + type(expected).__struct_config__.tag.encode() + b'"'), line
        assert answer(line.removesuffix(b"\n")) == expected
    # Python's json writes NaN, which msgspec refuses: such a result is read through json.
    nan = answer(done_line(returned({"x": float("nan")}, cancelled=False)).removesuffix(b"\n"))
    assert isinstance(nan, Done) and nan.status == "COMPLETED" and nan.result["x"] != nan.result["x"]
