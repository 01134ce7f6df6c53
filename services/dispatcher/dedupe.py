"""The dispatcher's memory of what it queued: (execution_id, delivery), durable.

JobDue records can arrive twice on purpose: the monitor issues DAG steps, approvals and
requeues at least once (it re-issues them after a crash, with the same ids), and a
person may trigger twice. Queuing the second copy would run the execution twice at one
delivery. So the dispatcher remembers each (execution_id, delivery) it queued, and drops
a JobDue it has seen.

Durability: a memory lost on restart or rebalance would let the repeat through exactly
when repeats happen (after a crash). Entries of the at-least-once reasons are written to
the compacted `dispatcher-state` topic, in the partition of their job, in the same
transaction that queues them (key `due:<execution_id>`, value the delivery and when) and
loaded with the rest of that partition's state on assignment. First-attempt SCHEDULE
fires come exactly once from the scheduler's transactions and are not written (they are
most of the traffic); RETRY fires come once from the scheduler too, but their RetryRequest
may be written twice by a worker whose transaction outcome was unknown, so they are kept.

Bounded: at most `limit` entries in memory (oldest out first); entries older than
`max_age_ms` are dropped when loaded and tombstoned, so the topic does not grow for ever
(a repeat comes within minutes of the original, and `job-due` keeps 7 days).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from uuid import UUID

from cronstream.shared.fast_records import DueRecord

KEY_PREFIX = "due:"
DURABLE_REASONS = frozenset({"DEPENDENCY", "REQUEUE", "MANUAL", "BACKFILL", "RETRY"})
DEFAULT_LIMIT = 1_000_000
MAX_AGE_MS = 7 * 86_400_000


class SeenDues:
    def __init__(self, limit: int = DEFAULT_LIMIT, max_age_ms: int = MAX_AGE_MS) -> None:
        self.limit = limit
        self.max_age_ms = max_age_ms
        self._seen: OrderedDict[tuple[UUID, int], None] = OrderedDict()
        self.expired: list[tuple[str, int]] = []  # (key, partition) to tombstone

    def __len__(self) -> int:
        return len(self._seen)

    def seen(self, due: DueRecord) -> bool:
        return (due.execution_id, due.delivery) in self._seen

    def remember(self, due: DueRecord) -> None:
        self._add((due.execution_id, due.delivery))

    def forget(self, due: DueRecord) -> None:
        self._seen.pop((due.execution_id, due.delivery), None)

    def _add(self, key: tuple[UUID, int]) -> None:
        self._seen[key] = None
        if len(self._seen) > self.limit:
            self._seen.popitem(last=False)

    @staticmethod
    def durable(due: DueRecord) -> bool:
        return due.reason in DURABLE_REASONS

    @staticmethod
    def record(due: DueRecord, now_ms: int) -> tuple[bytes, bytes]:
        """(key, value) of the state record that makes `due` remembered across restarts."""
        key = f"{KEY_PREFIX}{due.execution_id}".encode()
        value = json.dumps({"delivery": due.delivery, "at_ms": now_ms}).encode()
        return key, value

    def load(self, key: str, value: bytes | None, partition: int, now_ms: int) -> None:
        """A `due:` record of dispatcher-state (tombstones and expired ones forgotten)."""
        if value is None:
            return
        try:
            execution = UUID(key[len(KEY_PREFIX):])
            data = json.loads(value)
            delivery, at_ms = int(data["delivery"]), int(data["at_ms"])
        except (ValueError, KeyError, TypeError, RecursionError):
            self.expired.append((key, partition))  # unreadable: drop it
            return
        if now_ms - at_ms > self.max_age_ms:
            self.expired.append((key, partition))
            return
        self._add((execution, delivery))
