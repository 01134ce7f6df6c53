"""A shard's clock on local disk: every job's definition and stored timing, the pending
retries, and how far the shard's three partitions have been read — rebuildable from
Kafka at any time, so a lost disk costs only the time to read the shard again.

Memory holds only what comes due soon (leader.py: the near window); this file holds the
rest, indexed by when it is due. One SQLite file per shard and process
(`<data dir>/<prefix>/<instance>/shard-<n>.sqlite`), written by one thread only (the
event loop's), with a bounded page cache: ten million jobs cost disk, not memory
(docs/decisions/0039-the-clock-in-shards.md).

Rows, by where they come from:
- `jobs.raw, def_offset, observed_ms, kind, depends_on, calendar`: the job's record on
  `job-definitions` (a tombstone deletes the definition part); `calendar` is the calendar
  it names, so that a change of a calendar finds its jobs (calendars.py);
- `jobs.st_offset, next_fire_ms, last_fire_ms, cal_offset, runs`: its record on
  `scheduler-state` (the definition offset and the calendar version the timing was
  computed from, the count of its fires);
- `retries`: the pending retry timers of `retries`;
- `positions`: the next offset to read of each of the shard's partitions.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
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
    last_fire_ms INTEGER,
    calendar TEXT,
    cal_offset INTEGER,
    runs INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS jobs_due ON jobs (next_fire_ms) WHERE next_fire_ms IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_dependent ON jobs (kind) WHERE kind = 'DEPENDENT';
CREATE INDEX IF NOT EXISTS jobs_calendar ON jobs (calendar) WHERE calendar IS NOT NULL;
-- What a takeover pages through (unreconciled, calendar_jobs): without these, each page
-- scans the table (~40 ms each at 320,000 jobs, on the event loop, for every shard taken).
CREATE INDEX IF NOT EXISTS jobs_unreconciled ON jobs (job_id)
    WHERE st_offset IS NULL OR def_offset IS NULL OR st_offset != def_offset;
CREATE INDEX IF NOT EXISTS jobs_calendar_named ON jobs (job_id) WHERE calendar IS NOT NULL;
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
# Pages of the cache (negative: KiB): what a shard may hold in memory at most. Every
# process holds a store per shard it leads or keeps warm (32 shards, one standby: 64 stores
# over the processes), and reads a store by its indexes, a window at a time: 2 MiB holds
# their inner pages and the near window (the rest comes from the system's file cache).
CACHE_KIB = 2 * 1024
_COLUMNS = ("job_id, def_offset, observed_ms, raw, st_offset, next_fire_ms, last_fire_ms, "
            "calendar, cal_offset, runs")


@dataclass(frozen=True, slots=True)
class StoredJob:
    job_id: str
    def_offset: int
    observed_ms: int
    raw: bytes
    st_offset: int | None
    next_fire_ms: int | None
    last_fire_ms: int | None
    calendar: str | None = None
    cal_offset: int | None = None
    runs: int | None = None


def kind_of(raw: bytes) -> tuple[str | None, str | None, str | None]:
    """(type, depends_on as JSON for a DEPENDENT job, the calendar it names) of a
    definition's bytes, without validating it: what the DAG checks and a calendar's change
    look up. Unreadable: (None, None, None)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # garbage, or JSON nested deeper than a parser goes
        return None, None, None
    if not isinstance(data, dict):
        return None, None, None
    kind = data.get("type") if isinstance(data.get("type"), str) else None
    calendar = data.get("calendar") if isinstance(data.get("calendar"), str) else None
    depends = data.get("depends_on")
    if kind == "DEPENDENT" and isinstance(depends, list):
        return kind, json.dumps([d for d in depends if isinstance(d, str)]), calendar
    return kind, None, calendar


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
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(jobs)")}
        if columns and "calendar" not in columns:
            # A store from before calendars: a cache of Kafka, read again from the start.
            self._db.executescript("DROP TABLE jobs; DROP TABLE IF EXISTS retries; "
                                   "DROP TABLE IF EXISTS positions;")
        self._db.executescript(SCHEMA)
        self._in_tx = False
        # (when, the count of jobs then): a count reads the whole table (33 ms at 320,000
        # jobs), too slow for a gauge every few seconds on the event loop.
        self.counted: tuple[float, int] | None = None

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
              states: Sequence[tuple[str, int | None, int | None, int | None, bool]
                               | tuple[str, int | None, int | None, int | None, bool, int | None,
                                       int | None]] = (),
              retries: Sequence[tuple[str, int | None, bytes | None, str | None]] = (),
              positions: Iterable[tuple[str, int]] = ()) -> None:
        """Apply records in one transaction.

        - definitions: (job_id, offset, observed_ms, raw or None for a tombstone);
        - states: (job_id, definition offset, next_fire_ms, last_fire_ms, deleted[,
          calendar offset, runs]);
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
                    "INSERT INTO jobs (job_id, def_offset, observed_ms, raw, kind, depends_on, calendar) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job_id) DO UPDATE SET "
                    "def_offset = excluded.def_offset, observed_ms = excluded.observed_ms, "
                    "raw = excluded.raw, kind = excluded.kind, depends_on = excluded.depends_on, "
                    "calendar = excluded.calendar", live)
            if gone:
                db.executemany("UPDATE jobs SET def_offset = NULL, observed_ms = NULL, raw = NULL, "
                               "kind = NULL, depends_on = NULL, calendar = NULL WHERE job_id = ?", gone)
            kept = [(s[0], s[1], s[2], s[3], *(s[5:7] if len(s) > 5 else (None, None)))
                    for s in states if not s[4]]
            dropped = [(s[0],) for s in states if s[4]]
            if kept:
                db.executemany(
                    "INSERT INTO jobs (job_id, st_offset, next_fire_ms, last_fire_ms, cal_offset, runs) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (job_id) DO UPDATE SET "
                    "st_offset = excluded.st_offset, next_fire_ms = excluded.next_fire_ms, "
                    "last_fire_ms = excluded.last_fire_ms, cal_offset = excluded.cal_offset, "
                    "runs = excluded.runs", kept)
            if dropped:
                db.executemany("UPDATE jobs SET st_offset = NULL, next_fire_ms = NULL, "
                               "last_fire_ms = NULL, cal_offset = NULL, runs = NULL "
                               "WHERE job_id = ?", dropped)
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
        """The jobs of the shard, counted now (a scan of the table)."""
        n = int(self._db.execute("SELECT count(*) FROM jobs WHERE raw IS NOT NULL").fetchone()[0])
        self.counted = (time.monotonic(), n)
        return n

    def last_count(self) -> int:
        """The jobs of the shard as last counted (counted now if never)."""
        return self.count() if self.counted is None else self.counted[1]

    def retry_count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM retries").fetchone()[0])

    def job(self, job_id: str) -> StoredJob | None:
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM jobs WHERE job_id = ? AND raw IS NOT NULL", (job_id,)).fetchone()
        return None if row is None else StoredJob(*row)

    def last_fire(self, job_id: str) -> int | None:
        row = self._db.execute("SELECT last_fire_ms FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return None if row is None else row[0]

    def fired(self, job_id: str) -> tuple[int | None, int]:
        """(last fire, count of fires) of a job (None, 0 when there is none)."""
        row = self._db.execute("SELECT last_fire_ms, runs FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return (None, 0) if row is None else (row[0], row[1] or 0)

    def naming(self, calendar_id: str) -> list[StoredJob]:
        """The jobs whose definition names `calendar_id`."""
        return [StoredJob(*row) for row in self._db.execute(
            f"SELECT {_COLUMNS} FROM jobs WHERE calendar = ? AND raw IS NOT NULL", (calendar_id,))]

    def calendar_jobs(self, after: str = "", limit: int = 10_000) -> list[StoredJob]:
        """The jobs that name a calendar, a page of `limit` in job_id order after `after`."""
        return [StoredJob(*row) for row in self._db.execute(
            f"SELECT {_COLUMNS} FROM jobs WHERE calendar IS NOT NULL AND raw IS NOT NULL "
            "AND job_id > ? ORDER BY job_id LIMIT ?", (after, limit))]

    def naming_counts(self) -> dict[str, int]:
        """How many jobs name each calendar."""
        return dict(self._db.execute("SELECT calendar, count(*) FROM jobs WHERE calendar IS NOT NULL "
                                     "AND raw IS NOT NULL GROUP BY calendar").fetchall())

    def due_between(self, start_ms: int | None, end_ms: int) -> Iterator[StoredJob]:
        """Jobs whose stored next fire is in [start_ms, end_ms) (from the beginning of
        time when start_ms is None), soonest first."""
        low = -(1 << 62) if start_ms is None else start_ms
        yield from (StoredJob(*row) for row in self._db.execute(
            f"SELECT {_COLUMNS} "
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
            f"SELECT {_COLUMNS} "
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
