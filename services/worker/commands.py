"""Cancellations from the `commands` topic, as one worker sees them.

Every worker reads the whole (single-partition) `commands` topic: it remembers recent
CANCELs, so that an execution cancelled before it started is skipped when its work
record is reached — the worker that consumes the work record is the only one that decides
whether it starts or ends CANCELLED, which makes cancelling a queued execution race-free —
and it stops a running one at once. Bad commands are the monitor's to dead-letter.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from uuid import UUID

from confluent_kafka import Message

from cronstream.shared.logs import log
from cronstream.shared.records import Command

logger = logging.getLogger(__name__)

CANCELLED_MEMORY = 100_000  # cancelled execution ids remembered


class Cancellations:
    def __init__(self, on_cancel: Callable[[UUID, str, str | None], bool]) -> None:
        # execution_id -> (reason, issued_by)
        self._cancelled: OrderedDict[UUID, tuple[str, str | None]] = OrderedDict()
        self._on_cancel = on_cancel

    def get(self, execution_id: UUID) -> tuple[str, str | None] | None:
        return self._cancelled.get(execution_id)

    def feed(self, messages: list[Message]) -> None:
        for msg in messages:
            if msg.error() is not None:
                continue
            try:
                command = Command.model_validate_json(msg.value() or b"")
            except Exception:
                continue
            if command.command != "CANCEL":
                continue
            reason = command.reason or "cancelled"
            self._cancelled[command.execution_id] = (reason, command.issued_by)
            if len(self._cancelled) > CANCELLED_MEMORY:
                self._cancelled.popitem(last=False)
            if self._on_cancel(command.execution_id, reason, command.issued_by):
                log(logger, "execution_cancel_requested", execution_id=str(command.execution_id),
                    reason=reason, issued_by=command.issued_by)
