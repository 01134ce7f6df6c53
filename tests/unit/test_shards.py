"""Which shard a job belongs to, and which process leads and stands by for each shard
(shared/shards.py) — the pure logic every scheduler process and `cronstream schedulers`
compute alike; the shard store of one process (services/scheduler/store.py)."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import pytest

from cronstream.services.scheduler.follower import retry_due_ms
from cronstream.services.scheduler.store import ShardStore, kind_of
from cronstream.shared.shards import leaders, murmur2, roles, shard_of

# Kafka's own vectors (clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java).
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}
MEMBERS = [f"scheduler-s{i}" for i in range(5)]


@pytest.mark.parametrize("data, expected", KAFKA_VECTORS.items())
def test_murmur2_is_kafkas(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_a_jobs_shard_is_the_partition_the_java_client_gives_its_key() -> None:
    # Java: Utils.toPositive(Utils.murmur2(key)) % numPartitions.
    for key, hashed in KAFKA_VECTORS.items():
        assert shard_of(key, 16) == (hashed & 0x7FFFFFFF) % 16
    assert shard_of("nightly-export", 1) == 0
    assert {shard_of(f"job-{i}", 16) for i in range(1000)} == set(range(16)), "every shard used"


@pytest.mark.parametrize("count, shards", [(1, 1), (1, 16), (2, 2), (3, 16), (3, 32), (5, 32), (7, 8)])
def test_every_shard_has_one_leader_and_a_standby_elsewhere(count: int, shards: int) -> None:
    members = MEMBERS[:count] if count <= len(MEMBERS) else [f"m{i}" for i in range(count)]
    assigned = roles(members, shards, standbys=1)
    led = Counter(s for r in assigned.values() for s in r.leads)
    assert led == dict.fromkeys(range(shards), 1)
    stood = Counter(s for r in assigned.values() for s in r.standby)
    assert stood == (dict.fromkeys(range(shards), 1) if count > 1 else {})
    for r in assigned.values():
        assert not set(r.leads) & set(r.standby)
    loads = [len(r.leads) for r in assigned.values()]
    assert max(loads) <= -(-shards // count) + 1, "no process leads more than one over its share"


def test_every_process_computes_the_same_roles_whatever_order_it_lists_the_members_in() -> None:
    once = roles(MEMBERS, 32, 2)
    for order in itertools.islice(itertools.permutations(MEMBERS), 20):
        assert roles(list(order), 32, 2) == once


@pytest.mark.parametrize("shards", [8, 16, 32])
def test_when_a_leader_goes_its_shards_go_to_their_standby(shards: int) -> None:
    for count in (2, 3, 4, 5):
        members = MEMBERS[:count]
        before = roles(members, shards, standbys=1)
        for gone in members:
            after = leaders([m for m in members if m != gone], shards)
            for shard in before[gone].leads:
                assert shard in before[after[shard]].standby, \
                    f"shard {shard} of {gone} went to {after[shard]}, not its standby"


def test_a_second_standby_takes_over_when_the_first_goes_too() -> None:
    before = roles(MEMBERS[:4], 16, standbys=2)
    for shard in range(16):
        leader = next(m for m, r in before.items() if shard in r.leads)
        first = leaders([m for m in MEMBERS[:4] if m != leader], 16)[shard]
        second = leaders([m for m in MEMBERS[:4] if m not in (leader, first)], 16)[shard]
        assert {m for m, r in before.items() if shard in r.standby} == {first, second}


def test_a_process_joining_takes_few_shards_and_most_stay_where_they_are() -> None:
    before, after = leaders(MEMBERS[:3], 32), leaders(MEMBERS[:4], 32)
    moved = [s for s in range(32) if before[s] != after[s]]
    assert {after[s] for s in moved} >= {MEMBERS[3]}
    assert len(moved) <= 32 // 4 + 3


def test_no_member_no_role() -> None:
    assert roles([], 16, 1) == {}
    assert leaders([], 16) == {}


# -- the shard store ----------------------------------------------------------------------


def definition(job_id: str, kind: str = "INTERVAL", depends_on: list[str] | None = None) -> bytes:
    extra = f',"depends_on":{depends_on!r}'.replace("'", '"') if depends_on else ""
    return (f'{{"job_id":"{job_id}","type":"{kind}","interval_seconds":60,"handler":"noop"{extra}}}'
            ).encode()


def test_the_store_keeps_definitions_timings_retries_and_positions_across_a_reopen(tmp_path: Path) -> None:
    store = ShardStore(tmp_path / "shard-3.sqlite", 3)
    store.write(definitions=[("a", 0, 1000, definition("a")), ("b", 1, 1000, definition("b")),
                             ("c", 2, 1000, definition("c", "DEPENDENT", ["a"]))],
                states=[("a", 0, 5000, None, False), ("b", 0, 9000, 100, False)],
                retries=[("r1", 7000, b"{}", None), ("r2", 99000, b"{}", None)],
                positions=[("defs", 3), ("state", 2), ("retries", 2)])
    store.close()
    store = ShardStore(tmp_path / "shard-3.sqlite", 3)
    assert store.positions() == {"defs": 3, "state": 2, "retries": 2}
    assert store.count() == 3
    assert [j.job_id for j in store.due_between(None, 10_000)] == ["a", "b"]
    assert [j.job_id for j in store.due_between(6000, 10_000)] == ["b"]
    assert [r[0] for r in store.retries_between(None, 10_000)] == ["r1"]
    # b's timing was computed from another definition offset; c has none: both recomputed.
    assert sorted(j.job_id for j in store.unreconciled()) == ["b", "c"]
    assert list(store.dependents()) == [("c", ["a"])]
    assert store.shape("c") == ("DEPENDENT", ["a"]) and store.shape("zzz") is None
    assert store.last_fire("b") == 100


def test_a_deleted_job_leaves_the_store_once_its_state_is_gone_too(tmp_path: Path) -> None:
    store = ShardStore(tmp_path / "s.sqlite", 0)
    store.write(definitions=[("a", 0, 1000, definition("a"))], states=[("a", 0, 5000, None, False)])
    store.write(definitions=[("a", 1, 2000, None)])
    assert store.count() == 0
    assert [(j.job_id, j.raw is None) for j in store.unreconciled()] == [("a", True)], \
        "its state is dropped next"
    store.write(states=[("a", None, None, None, True)])
    assert list(store.unreconciled()) == []
    store.write(retries=[("r1", 7000, b"{}", None)])
    store.write(retries=[("r1", None, None, None)])
    assert store.retry_count() == 0


def test_the_stores_cheap_reads_survive_json_nested_deeper_than_a_parser_goes() -> None:
    # The chaos flood writes such records to every topic: a shard's leader stored one as a
    # definition (suspended) and failed on it, over and over (RecursionError, not ValueError).
    deep = b"[" * 100_000 + b"]" * 100_000
    assert kind_of(deep) == (None, None, None)
    assert retry_due_ms(deep) == 0


def test_a_handover_commits_ahead_no_further_than_the_workers_hold_a_record() -> None:
    """The fires a leaving leader commits ahead (SIGTERM) must be held by the workers until
    their time, with room for clock skew: a record due further ahead than the workers hold
    starts at once (decision 0027)."""
    from cronstream.services.scheduler.leader import HAND_OVER_AHEAD_MS
    from cronstream.services.worker.intake import HOLD_AT_MOST_SECONDS

    assert 1_000 <= HAND_OVER_AHEAD_MS <= HOLD_AT_MOST_SECONDS * 1000 - 500
