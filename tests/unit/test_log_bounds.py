"""The monitor's bounds on a delivery's log, without PostgreSQL (services/monitor/log_bounds.py):
kept up to the limit and cut there, nothing after its end, repeats left out, and an
honest worker's log — the worker's own capture, cut at the same limit — kept whole."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from cronstream.services.monitor import log_bounds
from cronstream.services.monitor.log_bounds import (
    ENDED,
    LIMIT,
    NOTE_BYTES,
    DeliveryLog,
    ExecutionState,
    Key,
    admit,
)
from cronstream.services.worker import capture
from cronstream.services.worker.capture import InvocationLog, LineSplitter, format_traceback
from cronstream.shared.records import JobDefinition, JobDue, LogBatch, render_log_batch

T0 = datetime(2026, 12, 4, 12, tzinfo=UTC)
Line = tuple[float, str, str | None, str]


def due(delivery: int = 1) -> JobDue:
    first = JobDue.first(JobDefinition(job_id="j", type="INTERVAL", interval_seconds=60, handler="h"),
                         T0, "MANUAL")
    return first if delivery == 1 else first.model_copy(update={"delivery": delivery})


def batch(of: JobDue, first_seq: int, lines: list[Line], final: bool = False) -> LogBatch:
    return LogBatch.model_validate_json(render_log_batch(
        of, worker_id="w1", trace_id=None, first_seq=first_seq, lines=lines, final=final))


def out(text: str, stream: str = "stdout") -> Line:
    return (T0.timestamp(), stream, None, text)


class Projection:
    """What PostgreSQL holds between transactions: each delivery's row, each execution."""

    def __init__(self) -> None:
        self.deliveries: dict[Key, DeliveryLog] = {}
        self.executions: dict[uuid.UUID, ExecutionState] = {}
        self.kept: set[tuple[uuid.UUID, int, int]] = set()

    def transaction(self, batches: list[LogBatch], limit: int) -> list[log_bounds.Admitted]:
        # As store.py reads them: the stored fields only, nothing of the last transaction.
        deliveries = {k: DeliveryLog(d.handler_bytes, d.note_bytes, d.next_seq, d.cut, d.end)
                      for k, d in self.deliveries.items()}
        outcomes = admit(batches, deliveries, self.executions, set(self.kept), limit)
        self.deliveries = deliveries
        for outcome in outcomes:
            b = outcome.batch
            self.kept |= {(b.execution_id, b.delivery, line.seq) for line in outcome.lines}
        return outcomes


def test_the_worked_example_of_the_module() -> None:
    """log_bounds' docstring: limit 100 bytes, lines of 60."""
    d, projection, limit = due(), Projection(), 100
    line = "x" * 60
    assert log_bounds.handler_budget(limit) == 164
    a = projection.transaction([batch(d, 0, [out(line), out(line)])], limit)
    b = projection.transaction([batch(d, 1, [out(line), out(line), out(line)])], limit)
    c = projection.transaction([batch(d, 4, [out("Traceback ...", "traceback")], final=True)], limit)
    late = projection.transaction([batch(d, 5, [out(line)])], limit)

    assert [x.seq for x in a[0].lines] == [0, 1] and not a[0].refused
    [cut] = b[0].lines
    assert (cut.seq, cut.stream, cut.level) == (2, "cronstream", "WARNING")
    assert cut.text.startswith("[log cut]") and "kept up to 100 bytes, cut after 120" in cut.text
    assert b[0].refused == {LIMIT: 2}
    assert [x.stream for x in c[0].lines] == ["traceback"] and c[0].end == 5
    assert late[0].lines == [] and late[0].refused == {ENDED: 1}
    assert "1 lines after the log of execution" in late[0].reason(limit)


def test_a_flood_is_kept_up_to_the_limit_and_cut_once() -> None:
    d, projection, limit = due(), Projection(), 64 * 1024
    line = "z" * 999
    outcomes = projection.transaction(
        [batch(d, i * 100, [out(line)] * 100) for i in range(13)], limit)
    kept = [line for o in outcomes for line in o.lines]
    output = sum(len(x.text.encode()) for x in kept if x.stream == "stdout")
    assert limit - len(line) < output <= log_bounds.handler_budget(limit)
    assert [x.text[:9] for x in kept if x.stream == "cronstream"] == ["[log cut]"]
    assert sum(o.refused[LIMIT] for o in outcomes) == 1300 - len(kept) + 1
    assert all(o.refused for o in outcomes[1:])
    # What the next transaction reads: cut, and nothing more of the handler's is kept.
    [after] = projection.transaction([batch(d, 1300, [out("small")])], limit)
    assert after.lines == [] and after.refused == {LIMIT: 1}
    assert projection.deliveries[d.execution_id, 1].cut


def test_an_honest_workers_log_cut_at_its_limit_is_kept_whole_with_its_notes() -> None:
    """The worker's own capture at the same limit — long lines cut at 16 KiB, the rest
    dropped, its summary and a long traceback — crosses the monitor's bounds untouched."""
    limit = 64 * 1024
    log = InvocationLog(limit)
    splitter = LineSplitter("stdout")
    for i in range(3):
        splitter.feed(b"a" * (capture.LINE_BYTES + 12_345_678 + i) + b"\n", log)
    for i in range(2000):
        splitter.feed(f"line {i} ".encode() + b"b" * 40 + b"\n", log)
    splitter.end(log)
    summary = log.summary()
    assert summary is not None
    try:
        raise RuntimeError("c" * 300_000)
    except RuntimeError as exc:
        traceback = format_traceback(exc)
    lines = [*log.take(), summary, (T0.timestamp(), "cronstream", "WARNING", "[TIMED_OUT] killed"),
             (T0.timestamp(), "traceback", "ERROR", traceback)]
    assert sum(len(text.encode()) for _, _, _, text in lines) > limit + 64 * 1024
    d, projection = due(), Projection()
    chunks = [lines[i:i + 300] for i in range(0, len(lines), 300)]
    outcomes = projection.transaction(
        [batch(d, i * 300, chunk, final=i == len(chunks) - 1) for i, chunk in enumerate(chunks)], limit)
    assert [o.refused for o in outcomes] == [{}] * len(chunks)
    assert [x.text for o in outcomes for x in o.lines] == [text for _, _, _, text in lines]


def test_a_final_batch_sent_again_is_a_repeat_and_lines_after_the_end_are_refused() -> None:
    d, projection, limit = due(), Projection(), 1 << 20
    end = batch(d, 2, [out("two"), out("Traceback ...", "traceback")], final=True)
    projection.transaction([batch(d, 0, [out("zero"), out("one")])], limit)
    [first] = projection.transaction([end], limit)
    # A worker reports a turn again after an unknown outcome: same lines, nothing new;
    # in the same transaction as lines after the end, and in a later one.
    again, after = projection.transaction([end, batch(d, 4, [out("more")] * 3)], limit)
    [later] = projection.transaction([end], limit)
    assert first.end == 4 and len(first.lines) == 2
    assert again.lines == [] and not again.refused and again.end is None
    assert after.lines == [] and after.refused == {ENDED: 3}
    assert later.lines == [] and not later.refused


def test_a_late_line_below_the_end_is_kept_but_a_gap_past_it_is_not() -> None:
    """A batch shipped before the final one can reach the topic after it (two producers):
    its lines, numbered before the end, are kept; none past the end is."""
    d, projection, limit = due(), Projection(), 1 << 20
    projection.transaction([batch(d, 3, [out("three")], final=True)], limit)
    [late] = projection.transaction([batch(d, 0, [out("zero"), out("one"), out("two")])], limit)
    [past] = projection.transaction([batch(d, 3, [out("three again"), out("four")])], limit)
    assert [x.seq for x in late.lines] == [0, 1, 2] and not late.refused
    assert past.lines == [] and past.refused == {ENDED: 1}  # seq 3 is a repeat


def test_once_a_terminal_executions_log_ended_no_delivery_keeps_new_lines() -> None:
    d1, projection, limit = due(), Projection(), 1 << 20
    d2 = due(2)
    projection.executions[d1.execution_id] = ExecutionState(terminal=True, delivery=2, ended=False)
    before_end = projection.transaction([batch(d1, 0, [out("zombie")]), batch(d2, 0, [out("two")]),
                                         batch(d2, 1, [], final=True), batch(d1, 1, [out("zombie")])],
                                        limit)
    [beyond] = projection.transaction([batch(due(3), 0, [out("three")])], limit)
    assert [len(o.lines) for o in before_end] == [1, 1, 0, 0]
    assert before_end[2].end == 1  # an empty final batch ends the log after the lines kept
    assert before_end[3].refused == {ENDED: 1}  # delivery 2 ended its log: delivery 1's is closed
    assert beyond.refused == {ENDED: 1}  # no delivery after the one a terminal execution ended with


def test_the_workers_own_lines_have_an_allowance_of_their_own() -> None:
    d, projection, limit = due(), Projection(), 4096
    note = "n" * 1000
    outcomes = projection.transaction(
        [batch(d, 0, [out("x" * 5000)]), batch(d, 1, [out(note, "cronstream")] * 100)], limit)
    kept_notes = [x for x in outcomes[1].lines if x.text == note]
    assert outcomes[0].refused == {LIMIT: 1}  # the handler's line does not fit...
    assert len(kept_notes) == NOTE_BYTES // len(note)  # ...the worker's notes still do
    assert outcomes[1].refused == {LIMIT: 100 - len(kept_notes)}


def test_bytes_are_counted_as_utf8() -> None:
    d, projection, limit = due(), Projection(), 4096
    [o] = projection.transaction([batch(d, 0, [out("é" * 1000)] * 3)], limit)
    assert sum(1 for x in o.lines if x.stream == "stdout") == 2  # 2,000 bytes each, not 1,000


def test_the_monitor_cuts_lines_where_the_worker_does() -> None:
    assert (log_bounds.LINE_BYTES, log_bounds.TRACEBACK_BYTES) == \
        (capture.LINE_BYTES, capture.TRACEBACK_BYTES)
    note = f" [line cut at {capture.LINE_BYTES} bytes: {2**63} more not kept]"
    assert len(note) <= log_bounds.LINE_NOTE_BYTES
