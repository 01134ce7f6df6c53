"""Each delivery's log, bounded where it is kept (no I/O; store.py reads and writes).

A worker cuts an attempt's log at CRONSTREAM_WORKER_LOG_LIMIT_BYTES before it ships it
(services/worker/capture.py), but whoever may write to `execution-logs` — a worker's
credential is enough — can send more: thirteen hand-published batches of 8,000 lines for
a COMPLETED execution were all kept (104,000 lines; the monitor grew from 68 to 186 MB,
and `cronstream logs` needed 112 MB to print them). So the monitor keeps each delivery's
log to the same bound, batch by batch, in the order the batches were consumed:

1. A line the log holds already (same delivery, same `seq`: a batch sent twice) is a
   repeat: left out, neither counted nor refused.
2. A delivery whose log has ended keeps nothing new: no line at or past the end its final
   batch recorded, and no line of another delivery once the execution is terminal and the
   log of its last delivery has ended (or of a delivery after its last: terminal rows are
   final).
3. The handler's lines (stdout, stderr, logging) are kept up to the limit, counted in
   UTF-8 bytes as PostgreSQL stores them (plus what the worker appends to a line it cut at
   LINE_BYTES). The first line that does not fit cuts the log: a "[log cut]" line takes
   its place (its `seq`), and nothing more of the handler's is kept.
4. The worker's own lines (`cronstream` notes, the `traceback`) have an allowance of their
   own, NOTE_BYTES: a log cut here still ends with why its handler failed.

What is refused is counted per batch by reason ("limit", "ended"), so the batch can be
dead-lettered with the reason and the lines counted once its transaction commits.

Worked example, limit 100 bytes (164 with room for the notes the worker appends to lines
it cut), one delivery, each line 60 bytes:
    batch A: seq 0, 1        -> both kept (120 bytes)
    batch B: seq 1, 2, 3     -> seq 1 is a repeat; seq 2 does not fit: "[log cut]" at seq 2,
                                seq 2 and 3 refused ("limit", 2 lines)
    batch C: seq 4 traceback -> kept (its own allowance); final: the log ends at 5
    batch D: seq 5           -> refused ("ended")
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from uuid import UUID

from cronstream.shared.records import LogBatch, LogLine
from cronstream.shared.settings import Settings

# As the worker cuts them (services/worker/capture.py; tests/unit/test_log_bounds.py holds
# them equal): a line at LINE_BYTES, with a note of at most LINE_NOTE_BYTES appended; a
# traceback at TRACEBACK_BYTES, with a note in its middle.
LINE_BYTES = 16 * 1024
LINE_NOTE_BYTES = 64
TRACEBACK_BYTES = 64 * 1024
# The worker's own lines of one delivery: its traceback and a few notes of a few hundred
# bytes each (what was cut, dropped by the rate bound, how a killed handler ended).
NOTE_BYTES = TRACEBACK_BYTES + 16 * 1024
HANDLER_STREAMS = frozenset({"stdout", "stderr", "log"})
DEFAULT_LIMIT: int = Settings.model_fields["worker_log_limit_bytes"].default

LIMIT = "limit"
ENDED = "ended"

Key = tuple[UUID, int]  # (execution_id, delivery)


def handler_budget(limit: int) -> int:
    """The bytes of handler lines a delivery keeps: the limit as the worker counts it, and
    the notes it appends to lines cut at LINE_BYTES (those are not counted there)."""
    return limit + (limit // LINE_BYTES + 1) * LINE_NOTE_BYTES


@dataclass(slots=True)
class DeliveryLog:
    """What one delivery's log holds where it is kept: a row of `execution_log_sizes`,
    and the number of lines its end recorded (None: not ended)."""

    handler_bytes: int = 0
    note_bytes: int = 0
    next_seq: int = 0  # one past the highest seq kept: a line below it may be a repeat
    cut: bool = False
    end: int | None = None
    changed: bool = False  # to be written back
    kept_now: set[int] = field(default_factory=set)  # seqs kept by this transaction

    def fits(self, line: LogLine, budget: int) -> bool:
        """Whether `line` fits in what is left (counted if so): the handler's lines in
        `budget`, until the log is cut; the worker's own in NOTE_BYTES."""
        text = line.text
        size = len(text) if text.isascii() else len(text.encode())
        if line.stream in HANDLER_STREAMS:
            if self.cut or self.handler_bytes + size > budget:
                return False
            self.handler_bytes += size
            return True
        if self.note_bytes + size > NOTE_BYTES:
            return False
        self.note_bytes += size
        return True


@dataclass(slots=True)
class ExecutionState:
    """The execution a delivery belongs to, as projected (None fields: not projected yet)."""

    terminal: bool = False
    delivery: int | None = None  # its last delivery
    ended: bool = False  # the log of its last delivery has ended


@dataclass(slots=True)
class Admitted:
    """One batch's outcome: the lines to store (its own, and the "[log cut]" line where it
    cut the log), the lines refused by reason, and the end to record if it ended its
    delivery's log."""

    batch: LogBatch
    lines: list[LogLine]
    refused: Counter[str] = field(default_factory=Counter)
    end: int | None = None

    def reason(self, limit: int) -> str:
        """Why lines were refused, for the dead letter."""
        b = self.batch
        whose = f"the log of execution {b.execution_id} delivery {b.delivery}"
        parts = []
        if self.refused[ENDED]:
            parts.append(f"{self.refused[ENDED]} lines after {whose} ended")
        if self.refused[LIMIT]:
            parts.append(f"{self.refused[LIMIT]} lines past {whose}'s limit ({limit} bytes of "
                         f"output, CRONSTREAM_WORKER_LOG_LIMIT_BYTES, and {NOTE_BYTES} of the "
                         "worker's notes)")
        return f"log lines not kept, of {len(b.lines)}: " + "; ".join(parts)


def admit(batches: list[LogBatch], deliveries: dict[Key, DeliveryLog],
          executions: dict[UUID, ExecutionState], repeats: set[tuple[UUID, int, int]],
          limit: int) -> list[Admitted]:
    """Decide each batch's lines, in order (`deliveries` and `executions` are updated as
    the batches go: a later batch sees what an earlier one kept or ended). `repeats`: the
    (execution_id, delivery, seq) below a delivery's next_seq that the log holds."""
    budget = handler_budget(limit)
    outcomes = []
    for b in batches:
        key = (b.execution_id, b.delivery)
        log = deliveries.setdefault(key, DeliveryLog())
        execution = executions.setdefault(b.execution_id, ExecutionState())
        closed = execution.terminal and execution.delivery is not None and (
            b.delivery > execution.delivery or (execution.ended and b.delivery != execution.delivery))
        outcome = Admitted(b, [])
        for line in b.lines:
            seq = line.seq
            if seq < log.next_seq and (seq in log.kept_now or (*key, seq) in repeats):
                continue
            if closed or (log.end is not None and seq >= log.end):
                outcome.refused[ENDED] += 1
                continue
            kept = line
            if not log.fits(line, budget):
                outcome.refused[LIMIT] += 1
                if log.cut:
                    continue
                log.cut = True
                kept = cut_line(line, limit, log.handler_bytes)
            outcome.lines.append(kept)
            log.kept_now.add(seq)
            log.next_seq = max(log.next_seq, seq + 1)
            log.changed = True
        if b.final and not closed and log.end is None:
            # The end of the log is after every line kept (a final batch without lines,
            # whose handler's lines all went before it, ends after them).
            log.end = outcome.end = max(b.lines[-1].seq + 1 if b.lines else 0, log.next_seq)
            if b.delivery == execution.delivery:
                execution.ended = True
        outcomes.append(outcome)
    return outcomes


def cut_line(refused: LogLine, limit: int, kept: int) -> LogLine:
    """The line that says the log was cut, in the place of the first line refused."""
    return LogLine(seq=refused.seq, at=refused.at, stream="cronstream", level="WARNING",
                   text=f"[log cut] lines from here on not kept: where it is stored, the log of "
                        f"an attempt is kept up to {limit} bytes, cut after {kept}")
