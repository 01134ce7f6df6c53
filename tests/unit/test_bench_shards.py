"""The shard benchmark's missed fires, by phase, without servers: each gap between two
fires of a probe is counted in the phase its first missed instant falls in."""

from __future__ import annotations

from bench.shards import missed_by_phase


def test_gaps_are_counted_in_the_phase_of_their_first_missed_instant() -> None:
    phases = [("publish", 0), ("cold_start", 10_000), ("sigkill", 100_000)]
    by_probe = {
        "probe-000": [11_000, 12_000, 13_000, 90_000, 91_000],  # 76 missed, cold start
        "probe-001": [101_000, 102_000, 105_000],  # 2 missed in the SIGKILL phase
        "probe-002": [5_000, 6_000, 7_000, 7_000],  # none (a double is not a gap)
    }
    found = missed_by_phase(by_probe, phases, shards=4)
    assert set(found) == {"cold_start", "sigkill"}
    assert found["cold_start"]["missed"] == 76 and found["cold_start"]["gaps"] == 1
    assert found["cold_start"]["longest_gap_ms"] == 77_000
    assert found["cold_start"]["largest"][0]["starts_s_into_phase"] == 4.0
    assert found["cold_start"]["gaps_not_policy"] == 0  # 77 s: later than the grace of 60
    assert found["sigkill"] == {"missed": 2, "gaps": 1, "gaps_not_policy": 1, "probes": 1,
                                "shards": found["sigkill"]["shards"], "longest_gap_ms": 3_000,
                                "largest": found["sigkill"]["largest"]}
    assert found["sigkill"]["largest"][0]["probe"] == "probe-001"
