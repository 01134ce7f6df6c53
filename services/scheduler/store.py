"""A shard's clock on local disk: every job's definition and stored timing, the pending
retries, and how far the shard's three partitions have been read — rebuildable from
Kafka at any time, so a lost disk costs only the time to read the shard again.

Memory holds only what comes due soon (leader.py: the near window); this file holds the
rest, indexed by when it is due. One SQLite file per shard and process
(`<data dir>/<prefix>/<instance>/shard-<n>.sqlite`), written by one thread only (the
event loop's), with a bounded page cache: ten million jobs cost disk, not memory
(docs/decisions/0039-the-clock-in-shards.md).

Rows, by where they come from:
- `jobs.raw, def_offset, observed_ms, kind, depends_on`: the job's record on
  `job-definitions` (a tombstone deletes the definition part);
- `jobs.st_offset, next_fire_ms, last_fire_ms`: its record on `scheduler-state` (the
  definition offset the timing was computed from);
- `retries`: the pending retry timers of `retries`;
- `positions`: the next offset to read of each of the shard's partitions.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    def_offset INTEGER,
    observed_ms INTEGER,
    raw BLOB,
    kind TEXT,
    depends_on TEXT,
    st_offset INTEGER,
    next_fire_ms INTEGER,
    last_fire_ms INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS jobs_due ON jobs (next_fire_ms) WHERE next_fire_ms IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_dependent ON jobs (kind) WHERE kind = 'DEPENDENT';
CREATE TABLE IF NOT EXISTS retries (
    execution_id TEXT PRIMARY KEY,
    due_ms INTEGER NOT NULL,
    value BLOB NOT NULL,
    headers TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS retries_due ON retries (due_ms);
CREATE TABLE IF NOT EXISTS positions (
    topic TEXT PRIMARY KEY,
    next_offset INTEGER NOT NULL
) WITHOUT ROWID;
"""
# Pages of the cache (negative: KiB): what a shard may hold in memory at most.
CACHE_KIB = 8 * 1024


@dataclass(frozen=True, slots=True)
class StoredJob:
    job_id: str
    def_offset: int
    observed_ms: int
    raw: bytes
    st_offset: int | None
    next_fire_ms: int | None
    last_fire_ms: int | None


def kind_of(raw: bytes) -> tuple[str | None, str | None]:
    """(type, depends_on as JSON for a DEPENDENT job) of a definition's bytes, without
    validating it: what the DAG checks look up. Unreadable: (None, None)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # garbage, or JSON nested deeper than a parser goes
        return None, None
    if not isinstance(data, dict):
        return None, None
    kind = data.get("type") if isinstance(data.get("type"), str) else None
    depends = data.get("depends_on")
    if kind == "DEPENDENT" and isinstance(depends, list):
        return kind, json.dumps([d for d in depends if isinstance(d, str)])
    return kind, None


class ShardStore:
    """One shard's rows (see the module's docstring). Not thread-safe: one owner."""

    def __init__(self, path: Path, shard: int) -> None:
        self.path = path
        self.shard = shard
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # The store is a cache of Kafka: a crash may lose the last writes (they are read
        # again from the positions, which commit with them), never corrupt the file.
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        self._db.execute("PRAGMA temp_store=MEMORY")
        self._db.executescript(SCHEMA)
        self._in_tx = False

    def close(self) -> None:
        self._db.close()

    def destroy(self) -> None:
        """Close and delete the file (a shard this process no longer keeps)."""
        self.close()
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                os.unlink(f"{self.path}{suffix}")

    # -- writing: each call is one transaction ----------------------------------------

    def write(self, *, definitions: Sequence[tuple[str, int, int, bytes | None]] = (),
              states: Sequence[tuple[str, int | None, int | None, int | None, bool]] = (),
              retries: Sequence[tuple[str, int | None, bytes | None, str | None]] = (),
              positions: Iterable[tuple[str, int]] = ()) -> None:
        """Apply records in one transaction.

        - definitions: (job_id, offset, observed_ms, raw or None for a tombstone);
        - states: (job_id, definition offset, next_fire_ms, last_fire_ms, deleted);
        - retries: (execution_id, due_ms, value, headers JSON), value None deletes;
        - positions: (topic, next offset to read).
        """
        db = self._db
        db.execute("BEGIN")
        try:
            live = [(j, o, t, r, *kind_of(r)) for j, o, t, r in definitions if r is not None]
            gone = [(j,) for j, _o, _t, r in definitions if r is None]
            if live:
                db.executemany(
                    "INSERT INTO jobs (job_id, def_offset, observed_ms, raw, kind, depends_on) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (job_id) DO UPDATE SET "
                    "def_offset = excluded.def_offset, observed_ms = excluded.observed_ms, "
                    "raw = excluded.raw, kind = excluded.kind, depends_on = excluded.depends_on",
                    live)
            if gone:
                db.executemany("UPDATE jobs SET def_offset = NULL, observed_ms = NULL, raw = NULL, "
                               "kind = NULL, depends_on = NULL WHERE job_id = ?", gone)
            kept = [(j, o, n, last) for j, o, n, last, deleted in states if not deleted]
            dropped = [(j,) for j, _o, _n, _l, deleted in states if deleted]
            if kept:
                db.executemany(
                    "INSERT INTO jobs (job_id, st_offset, next_fire_ms, last_fire_ms) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (job_id) DO UPDATE SET "
                    "st_offset = excluded.st_offset, next_fire_ms = excluded.next_fire_ms, "
                    "last_fire_ms = excluded.last_fire_ms", kept)
            if dropped:
                db.executemany("UPDATE jobs SET st_offset = NULL, next_fire_ms = NULL, "
                               "last_fire_ms = NULL WHERE job_id = ?", dropped)
            if gone or dropped:
                db.executemany("DELETE FROM jobs WHERE job_id = ? AND raw IS NULL "
                               "AND st_offset IS NULL", gone + dropped)
            pending = [(e, d, v, h) for e, d, v, h in retries if v is not None]
            fired = [(e,) for e, _d, v, _h in retries if v is None]
            if pending:
                db.executemany("INSERT OR REPLACE INTO retries VALUES (?, ?, ?, ?)", pending)
            if fired:
                db.executemany("DELETE FROM retries WHERE execution_id = ?", fired)
            db.executemany("INSERT OR REPLACE INTO positions VALUES (?, ?)", list(positions))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def set_timing(self, timings: Sequence[tuple[str, int, int | None, int | None]]) -> None:
        """(job_id, definition offset, next_fire_ms, last_fire_ms) the leader committed."""
        self.write(states=[(j, o, n, last, False) for j, o, n, last in timings])

    def reset(self) -> None:
        """Forget everything (the shard is read again from the start)."""
        self._db.executescript("DELETE FROM jobs; DELETE FROM retries; DELETE FROM positions;")

    # -- reading ------------------------------------------------------------------------

    def positions(self) -> dict[str, int]:
        return dict(self._db.execute("SELECT topic, next_offset FROM positions").fetchall())

    def count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM jobs WHERE raw IS NOT NULL").fetchone()[0])

    def retry_count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM retries").fetchone()[0])

    def job(self, job_id: str) -> StoredJob | None:
        row = self._db.execute(
            "SELECT job_id, def_offset, observed_ms, raw, st_offset, next_fire_ms, last_fire_ms "
            "FROM jobs WHERE job_id = ? AND raw IS NOT NULL", (job_id,)).fetchone()
        return None if row is None else StoredJob(*row)

    def last_fire(self, job_id: str) -> int | None:
        row = self._db.execute("SELECT last_fire_ms FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return None if row is None else row[0]

    def due_between(self, start_ms: int | None, end_ms: int) -> Iterator[StoredJob]:
        """Jobs whose stored next fire is in [start_ms, end_ms) (from the beginning of
        time when start_ms is None), soonest first."""
        low = -(1 << 62) if start_ms is None else start_ms
        yield from (StoredJob(*row) for row in self._db.execute(
            "SELECT job_id, def_offset, observed_ms, raw, st_offset, next_fire_ms, last_fire_ms "
            "FROM jobs WHERE next_fire_ms >= ? AND next_fire_ms < ? AND raw IS NOT NULL "
            "ORDER BY next_fire_ms", (low, end_ms)))

    def retries_between(self, start_ms: int | None, end_ms: int) -> list[tuple[str, int, bytes, str | None]]:
        low = -(1 << 62) if start_ms is None else start_ms
        return self._db.execute(
            "SELECT execution_id, due_ms, value, headers FROM retries WHERE due_ms >= ? AND due_ms < ? "
            "ORDER BY due_ms", (low, end_ms)).fetchall()

    def unreconciled(self, after: str = "", limit: int = 10_000) -> list[StoredJob]:
        """Jobs whose stored timing was not computed from their definition (or that have
        none), and timings of deleted jobs (raw None): what a new leader computes again.
        A page of `limit`, in job_id order after `after`."""
        return [StoredJob(*row) for row in self._db.execute(
            "SELECT job_id, def_offset, observed_ms, raw, st_offset, next_fire_ms, last_fire_ms "
            "FROM jobs WHERE job_id > ? AND (st_offset IS NULL OR def_offset IS NULL "
            "OR st_offset != def_offset) ORDER BY job_id LIMIT ?", (after, limit)).fetchall()]

    def dependents(self) -> Iterator[tuple[str, list[str]]]:
        """Every DEPENDENT job of the shard with its upstreams."""
        for job_id, depends in self._db.execute(
                "SELECT job_id, depends_on FROM jobs WHERE kind = 'DEPENDENT' AND raw IS NOT NULL"):
            yield job_id, json.loads(depends or "[]")

    def shape(self, job_id: str) -> tuple[str, list[str]] | None:
        """(type, depends_on) of a job of this shard, or None."""
        row = self._db.execute("SELECT kind, depends_on FROM jobs WHERE job_id = ? AND raw IS NOT NULL",
                               (job_id,)).fetchone()
        if row is None or row[0] is None:
            return None
        return row[0], json.loads(row[1] or "[]")
