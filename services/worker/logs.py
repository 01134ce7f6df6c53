"""A worker's execution logs on their way to `execution-logs` (docs/reference/operations.md#execution-logs).

Lines come from the capture (capture.py: a pool process sends them up its pipe, an inline
run adds them in place) and wait here per execution. Every SHIP_SECONDS the waiting lines
go out, one LogBatch per execution, through an idempotent producer of their own — outside
the turns' transactions, which stay as cheap as if no handler wrote anything (and a
worker whose handlers write nothing never makes the producer at all). The last batch of
an execution, `final`, with its traceback when it raised, is part of the transaction that
reports its end: a traceback is never lost, and a reader that sees `final` knows the log
of that delivery is whole. A worker killed mid-run keeps the lines it had shipped.

Lines are numbered per delivery of an execution (`seq`), so a batch sent twice — an
idempotent producer's retry, or the final batch of a turn reported again after an
unknown outcome — adds nothing where they are stored.

One chatty handler cannot flood the broker or crowd out the others: each attempt keeps
at most its limit (capture.py), and the worker as a whole ships at most `rate` bytes a
second (a token bucket with a second of burst); lines over the bound are dropped, and the
final batch of each execution that lost some says how many.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException

from cronstream.services.worker.capture import SHIP_SECONDS, Line
from cronstream.shared.lifecycle import wait_or_stop
from cronstream.shared.logs import log
from cronstream.shared.producers import IdempotentProducer, OutRecord
from cronstream.shared.records import LOG_BATCH_TEXT_BYTES, render_log_batch
from cronstream.shared.topics import Topics

if TYPE_CHECKING:
    from cronstream.services.worker.executions import Running

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ExecutionLog:
    """The log of one delivery of one running execution, on the worker's side."""

    seq: int = 0  # the number of the next line
    pending: list[Line] = field(default_factory=list)
    dropped_lines: int = 0  # over the worker's rate bound
    dropped_bytes: int = 0

    @property
    def written(self) -> bool:
        return self.seq > 0 or bool(self.pending) or self.dropped_lines > 0


class LogShipper:
    def __init__(self, topics: Topics, worker_id: str, rate: int,
                 make_producer: Callable[[], IdempotentProducer],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.topics = topics
        self.worker_id = worker_id
        self.rate = rate
        self._clock = clock
        self._make_producer = make_producer
        self._producer: IdempotentProducer | None = None
        self._waiting: dict[object, Running] = {}
        self._tokens = float(rate)
        self._refilled = clock()

    def add(self, run: Running, lines: list[Line]) -> None:
        """Lines of a running execution, to ship with the next batch (as far as the rate
        bound lets them)."""
        log_ = run.log = run.log or ExecutionLog()
        now = self._clock()
        self._tokens = min(float(self.rate), self._tokens + (now - self._refilled) * self.rate)
        self._refilled = now
        for line in lines:
            size = len(line[3]) + 64
            if size > self._tokens:
                log_.dropped_lines += 1
                log_.dropped_bytes += size - 64
                continue
            self._tokens -= size
            log_.pending.append(line)
        if log_.pending:
            self._waiting[run.due.execution_id] = run

    def final(self, run: Running, note: str | None = None, traceback: str | None = None
              ) -> list[OutRecord]:
        """The last batch of an execution's log (for the transaction that reports its end):
        what still waits, what the rate bound dropped, `note` (the worker's word on how it
        ended: killed, timed out) and the traceback. None when it wrote nothing at all."""
        self._waiting.pop(run.due.execution_id, None)
        log_ = run.log
        if log_ is None:
            if traceback is None:
                return []  # the common case: nothing written, nothing to say
            log_ = run.log = ExecutionLog()
        at = time.time()
        if log_.dropped_lines:
            log_.pending.append((at, "cronstream", "WARNING",
                                 f"[log cut] {log_.dropped_lines} lines ({log_.dropped_bytes} bytes) "
                                 f"dropped: this worker ships at most {self.rate} bytes of logs a second"))
        if note is not None and log_.written:
            log_.pending.append((at, "cronstream", "WARNING", note))
        if traceback is not None:
            log_.pending.append((at, "traceback", "ERROR", traceback))
        if not log_.written:
            return []
        return self._batches(run, log_, final=True)

    def _batches(self, run: Running, log_: ExecutionLog, final: bool) -> list[OutRecord]:
        """The waiting lines of one execution as records, each under LOG_BATCH_TEXT_BYTES of
        text (a record must fit the topic), the last one `final` when asked."""
        records: list[OutRecord] = []
        lines, log_.pending = log_.pending, []
        start = 0
        while start < len(lines) or (final and not records):
            end, size = start, 0
            while end < len(lines) and (end == start or size + len(lines[end][3]) <= LOG_BATCH_TEXT_BYTES):
                size += len(lines[end][3])
                end += 1
            chunk = lines[start:end]
            last = end >= len(lines)
            due = run.due
            records.append(OutRecord(self.topics.execution_logs, str(due.execution_id).encode(),
                                     render_log_batch(due, worker_id=self.worker_id,
                                                      trace_id=run.trace_id, first_seq=log_.seq,
                                                      lines=chunk, final=final and last),
                                     run.headers))
            log_.seq += len(chunk)
            start = end
        return records

    def ship(self) -> int:
        """Produce what waits (without waiting for the broker); the number of records."""
        waiting, self._waiting = self._waiting, {}
        produced = 0
        for run in waiting.values():
            if run.log is None:
                continue
            for record in self._batches(run, run.log, final=False):
                if self._producer is None:
                    self._producer = self._make_producer()
                try:
                    self._producer.produce(record)
                    produced += 1
                except (BufferError, KafkaException) as exc:
                    # The producer's queue is full (a broker away for long): these lines
                    # are lost, said once per batch; the final batch still goes out.
                    log(logger, "log_lines_dropped", logging.WARNING,
                        execution_id=str(run.due.execution_id), error=str(exc))
        return produced

    async def loop(self, stopping: asyncio.Event) -> None:
        while not await wait_or_stop(stopping, SHIP_SECONDS):
            self.ship()

    async def close(self) -> None:
        self.ship()
        if self._producer is not None:
            try:
                await self._producer.flush_async(5.0)
            except (KafkaException, RuntimeError) as exc:
                log(logger, "log_lines_not_delivered", logging.WARNING, error=str(exc))
