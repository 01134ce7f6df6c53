"""Flow control in the dispatcher: where each admission is decided, and what is
forwarded there (docs/decisions/0056). The decisions themselves are admission.py's.

1. A JobDue of a job with `concurrency`, `pool` or `rate_limit` becomes an Ask. Its
   *admission partition* is its pool's (`murmur2(pool) % P`), or, without a pool, the
   partition it arrived on (its job's).
2. Asked on its own partition, it is decided at once by that partition's Admission: it
   starts (QUEUED and the work record) or waits (WAITING, with the reason).
   Otherwise the job's partition keeps a route (`flow:route:<execution_id>`: the pool)
   to settle the execution's end there later, and the ask is decided at once too when
   this dispatcher owns the admission partition (one transaction holds both partitions'
   changes), else forwarded as an `ask` request on `admissions` to its owner.
3. A terminal event of a followed job, read on its job's partition, ends what the
   execution holds or waits for: at once when its admission partition is this
   dispatcher's, else by an `end` request on `admissions` (and the route is tombstoned).
4. After each batch, and when a rate limit or a pool's new size lets one start, each
   owned partition's Admission admits what may start now.

An `ask` request is the JobDue itself, byte for byte (key: the job_id): re-encoding the
due inside another record cost more than the admission's decision (issue 57). An `end`
request is `{"execution_id": ...}`, marked by the `cronstream-admission: end` header.

`admissions` has as many partitions as `job-due` and is consumed by the dispatcher group,
so the owner of partition i of `job-due` owns partition i of `admissions` and of
`dispatcher-state` too: every decision and its state commit in one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from cronstream.services.dispatcher.admission import PREFIX, Admission, Ask, key_of
from cronstream.shared.fast_records import DueRecord
from cronstream.shared.shards import shard_of

ROUTE = f"{PREFIX}route:"


def limited(job: Any) -> bool:
    """Whether a job's executions pass through admission."""
    return job.concurrency is not None or job.pool is not None or job.rate_limit is not None


def ask_of(due: DueRecord, raw: bytes) -> Ask:
    job = due.job
    return Ask(execution_id=due.execution_id, job_id=due.job_id,
               key=key_of(job.concurrency, job.params),
               max_running=None if job.concurrency is None else job.concurrency.max_running,
               rate_limit=job.rate_limit, pool=job.pool, slots=job.pool_slots,
               due=raw.decode())


# `admissions` records (internal, key: the job_id). An execution that asks to start is
# its JobDue, byte for byte (as the work record is): the admission partition decodes it
# once and asks with what it says. One that asked and ended is a small JSON object, marked
# by this header.
END_HEADER = "cronstream-admission"
END_MARK = b"end"


def end_request(execution_id: UUID, job_id: str) -> tuple[bytes, bytes]:
    """The key and value of an `end` request."""
    return job_id.encode(), json.dumps({"execution_id": str(execution_id)}).encode()


def is_end(headers: Any) -> bool:
    """Whether a record's headers (confluent-kafka's list of pairs, or None) mark an end."""
    return isinstance(headers, list) and any(
        k == END_HEADER and v == END_MARK for k, v in headers)


def ended(value: bytes | None) -> UUID:
    """The execution an `end` request names (ValueError when it names none)."""
    try:
        return UUID(json.loads(value or b"")["execution_id"])
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not an end request: {exc}") from exc


@dataclass
class Flow:
    partitions: int
    pools: dict[str, int] = field(default_factory=dict)
    cores: dict[int, Admission] = field(default_factory=dict)
    # Per job partition: executions whose admission is elsewhere → their pool.
    routes: dict[int, dict[UUID, str]] = field(default_factory=dict)
    followed: set[str] = field(default_factory=set)  # job_ids whose events matter here
    route_dirty: dict[int, dict[str, bytes | None]] = field(default_factory=dict)

    def core(self, partition: int) -> Admission:
        core = self.cores.get(partition)
        if core is None:
            core = self.cores[partition] = Admission(pools=self.pools)
        return core

    def home_of(self, due: DueRecord, arrived_on: int) -> int:
        pool = due.job.pool
        return arrived_on if pool is None else self.home_of_pool(pool)

    def home_of_pool(self, pool: str) -> int:
        """The partition that admits `pool`'s executions (the Java client's partitioner)."""
        return shard_of(pool, self.partitions)

    def route(self, partition: int, execution_id: UUID, job_id: str, pool: str) -> None:
        self.routes.setdefault(partition, {})[execution_id] = pool
        self.followed.add(job_id)
        self.route_dirty.setdefault(partition, {})[f"{ROUTE}{execution_id}"] = json.dumps(
            {"pool": pool, "job_id": job_id}).encode()

    def unroute(self, partition: int, execution_id: UUID) -> str | None:
        pool = self.routes.get(partition, {}).pop(execution_id, None)
        if pool is not None:
            self.route_dirty.setdefault(partition, {})[f"{ROUTE}{execution_id}"] = None
        return pool

    def drain_dirty(self) -> list[tuple[str, int, bytes | None]]:
        """(key, partition, value or None) of every changed flow record."""
        out = [(key, p, value) for p, core in sorted(self.cores.items())
               for key, value in core.drain_dirty()]
        out += [(key, p, value) for p, changes in self.route_dirty.items()
                for key, value in changes.items()]
        self.route_dirty.clear()
        return out

    def load(self, partition: int, records: Iterable[tuple[str, bytes | None]]) -> None:
        """A partition's flow records from `dispatcher-state` (latest per key)."""
        latest = dict(records)
        core = self.core(partition)
        core.load((k, v) for k, v in latest.items() if not k.startswith(ROUTE))
        self.followed.update(h.job_id for h in core.holds.values())
        self.followed.update(a.job_id for queue in core.waiting.values() for a in queue)
        for key, value in latest.items():
            if key.startswith(ROUTE) and value is not None:
                route = json.loads(value)
                self.routes.setdefault(partition, {})[UUID(key[len(ROUTE):])] = route["pool"]
                self.followed.add(route["job_id"])

    def next_wakeup(self) -> float | None:
        times = [t for core in self.cores.values() if (t := core.next_wakeup()) is not None]
        return min(times) if times else None

    def pooled_waiting(self) -> bool:
        return any(a.pool is not None for core in self.cores.values()
                   for queue in core.waiting.values() for a in queue)

    def waiting_by_kind(self, now: float) -> dict[str, int]:
        kinds: dict[str, int] = dict.fromkeys(("pool", "key", "rate_limit", "missing_pool"), 0)
        for core in self.cores.values():
            for kind, n in core.waiting_by_kind(now).items():
                kinds[kind] = kinds.get(kind, 0) + n
        return kinds

    def in_use(self) -> dict[str, int]:
        """Slots in use per pool, over the partitions this dispatcher owns."""
        used: dict[str, int] = {}
        for core in self.cores.values():
            for pool, n in core.in_use.items():
                used[pool] = used.get(pool, 0) + n
        return used
