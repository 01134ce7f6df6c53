"""Which scheduler shard a job belongs to: the partition of `job-definitions` its job_id
hashes to with the Java client's partitioner (murmur2), the partitioner every cronstream
producer uses (librdkafka's `murmur2_random`) and any Java producer uses by default. So a
job's shard never changes, whoever published it, and what the clock keeps per job —
its state, its pending retries — is written to the same partition number of
`scheduler-state` and `retries` (docs/decisions/0039-the-clock-in-shards.md).

And which scheduler process leads a shard, and which stand by for it: a pure function of
the live processes (`roles`), which every process computes alike from the scheduler group's
members, and `cronstream schedulers` too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2` (a signed 32-bit int, as Java returns it)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    for i in range(0, length - length % 4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def shard_of(job_id: str | bytes, shards: int) -> int:
    """The partition `job_id` lands on among `shards` (Java: toPositive(murmur2) % n)."""
    key = job_id.encode() if isinstance(job_id, str) else job_id
    return (murmur2(key) & 0x7FFFFFFF) % shards


# -- which process leads and stands by for which shard ---------------------------------


def _score(shard: int, member: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{shard}|{member}".encode(), digest_size=8).digest(), "big")


def leaders(members: Iterable[str], shards: int) -> dict[int, str]:
    """The process that leads each shard (rendezvous hashing, each process capped at one
    more than its even share): every process computes the same from the same members.
    Shards are placed in an order of their own, each on the highest-scoring process that
    is not full, so a departure moves almost only the departed process's shards."""
    live = sorted(set(members))
    if not live:
        return {}
    cap = -(-shards // len(live)) + 1
    load = dict.fromkeys(live, 0)
    placed: dict[int, str] = {}
    for shard in sorted(range(shards), key=lambda s: _score(s, "")):
        for member in sorted(live, key=lambda m: (_score(shard, m), m), reverse=True):
            if load[member] < cap:
                placed[shard] = member
                load[member] += 1
                break
    return placed


@dataclass(frozen=True, slots=True)
class Roles:
    leads: tuple[int, ...]
    standby: tuple[int, ...]


def roles(members: Iterable[str], shards: int, standbys: int) -> dict[str, Roles]:
    """What each of `members` leads and stands by for. A shard's standbys are the processes
    that would lead it should its leader go (then the next one too, for a second standby):
    so a takeover lands, by construction, where the shard is kept warm."""
    live = sorted(set(members))
    leads: dict[str, list[int]] = {m: [] for m in live}
    standby: dict[str, list[int]] = {m: [] for m in live}
    placed = leaders(live, shards)
    without: dict[frozenset[str], dict[int, str]] = {}
    for shard, leader in sorted(placed.items()):
        leads[leader].append(shard)
        gone = {leader}
        for _ in range(min(standbys, len(live) - 1)):
            key = frozenset(gone)
            if key not in without:
                without[key] = leaders([m for m in live if m not in gone], shards)
            successor = without[key][shard]
            standby[successor].append(shard)
            gone.add(successor)
    return {m: Roles(tuple(leads[m]), tuple(sorted(standby[m]))) for m in live}
