"""What a handler writes, as its attempt's log lines: in a pool process (every stream,
down to file descriptors and child processes) and inline (as far as Python allows), each
run's lines its own, and every flood bounded."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

import tests.e2e.handlers_for_tests  # noqa: F401  (registers the handlers in this process too)
from cronstream.handlers import REGISTRY
from cronstream.services.worker import builtins  # noqa: F401  (registers sleep)
from cronstream.services.worker.capture import LINE_BYTES, InvocationLog, Line, LineSplitter
from cronstream.services.worker.pool import PoolRunner
from cronstream.services.worker.runner import CancelSignal, Outcome
from cronstream.shared.records import JobDue, JobSnapshot

HANDLERS = "tests.e2e.handlers_for_tests"


def _due(handler: str, **params: Any) -> JobDue:
    return JobDue(execution_id=uuid.uuid4(), job_id="job", run_id=uuid.uuid4(),
                  scheduled_at=datetime(2026, 12, 1, tzinfo=UTC), reason="SCHEDULE",
                  idempotency_key="k", job=JobSnapshot(handler=handler, params=params,
                                                       timeout_seconds=60))


def _run(*dues: JobDue, log_limit: int = 1 << 20) -> list[tuple[Outcome, list[Line]]]:
    """Each due run in turn by a pool of one process, with the lines it wrote."""
    async def scenario() -> list[tuple[Outcome, list[Line]]]:
        runner = PoolRunner(REGISTRY, 1, [HANDLERS], log_limit=log_limit)
        await runner.start()
        try:
            results = []
            for due in dues:
                lines: list[Line] = []
                outcome = await asyncio.wait_for(runner.run(
                    due, lambda percent, text: None, CancelSignal(), None, lines.extend), 60)
                results.append((outcome, lines))
            return results
        finally:
            await runner.close()

    return asyncio.run(scenario())


def test_a_failing_pool_handler_keeps_every_stream_and_its_whole_traceback() -> None:
    (outcome, lines), (after, after_lines) = _run(_due("test.chatty-fail", region="eu"),
                                                  _due("sleep", seconds=0))
    assert outcome.status == "FAILED"
    assert outcome.error == "RuntimeError: lookup failed"
    texts = [(stream, level, text) for _, stream, level, text in lines]
    assert ("stdout", None, "processing eu") in texts
    assert ("stderr", None, "progress: half") in texts
    assert ("stdout", None, "raw bytes \\xff\\xfe on fd 1") in texts
    assert ("stdout", None, "from a child process") in texts
    assert ("log", "WARNING", "tests.chatty: retrying the lookup") in texts
    # The traceback, chained cause included, names the handler's file.
    assert outcome.traceback is not None
    assert "handlers_for_tests.py" in outcome.traceback
    assert "KeyError: 'region'" in outcome.traceback
    assert "The above exception was the direct cause" in outcome.traceback
    assert outcome.traceback.rstrip().endswith("RuntimeError: lookup failed")
    # The next run of the same process starts with a clean log.
    assert after.status == "COMPLETED"
    assert after_lines == []


def test_a_flood_is_cut_at_the_attempts_limit_and_says_so() -> None:
    limit = 64 * 1024
    [(outcome, lines)] = _run(_due("test.flood", megabytes=20, long_line=10_000_000),
                              log_limit=limit)
    assert outcome.status == "COMPLETED"
    kept = sum(len(text.encode()) for _, stream, _, text in lines if stream == "stdout")
    assert limit - 1024 <= kept <= limit
    summary = lines[-1]
    assert summary[1] == "cronstream"
    assert "not kept" in summary[3] and f"kept up to {limit} bytes" in summary[3]


def test_lines_are_cut_at_16_kib_and_garbage_kept_readable() -> None:
    log = InvocationLog(1 << 20)
    splitter = LineSplitter("stdout")
    splitter.feed(b"a" * (LINE_BYTES + 5000), log)  # a long line arrives in pieces
    splitter.feed(b"b" * 10_000 + b"\nnul\x00 and \xc3\x28 invalid\n", log)
    splitter.feed(b"no newline at the end", log)
    splitter.end(log)
    texts = [text for _, _, _, text in log.take()]
    assert texts[0].startswith("a" * LINE_BYTES)
    assert texts[0].endswith(f"[line cut at {LINE_BYTES} bytes: {5000 + 10_000} more not kept]")
    assert texts[1:] == ["nul\\x00 and \\xc3( invalid", "no newline at the end"]
    summary = log.summary()
    assert summary is not None and "1 lines cut at 16384 bytes" in summary[3]


def test_inline_handlers_are_captured_each_run_its_own_lines() -> None:
    dues = [_due("test.inline-print") for _ in range(3)]
    captured: list[list[Line]] = [[] for _ in dues]

    async def scenario() -> list[Outcome | None]:
        runner = PoolRunner(REGISTRY, 1, [HANDLERS])
        await runner.start()
        try:
            return [runner.run_now(due, lambda p, m: None, None, lines.extend)
                    for due, lines in zip(dues, captured, strict=True)]
        finally:
            await runner.close()

    outcomes = asyncio.run(scenario())
    for outcome, lines, due in zip(outcomes, captured, dues, strict=True):
        assert outcome is not None and outcome.status == "COMPLETED"
        assert [(s, lvl, t) for _, s, lvl, t in lines] == [
            ("stdout", None, f"inline {due.execution_id}"),
            ("log", "WARNING", f"tests.inline: inline warning {due.execution_id}")]
