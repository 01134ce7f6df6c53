"""The clock's shards moving under load (issue 55): three scheduler processes share the
shards; one is SIGKILLed and one SIGTERMed while every job fires each second, and each is
restarted by the supervisor (a process joining again). The ledger then holds every fire of
the window exactly once, QUEUED and terminal, and the projection equals the log."""

from __future__ import annotations

import signal

import pytest

from tests.chaos.conftest import RunFactory
from tests.chaos.harness import RESTART_TARGET_SECONDS, hold_until, short_or_full


@pytest.mark.chaos_short
def test_shards_move_under_load_and_every_fire_happens_once(chaos_run: RunFactory) -> None:
    run = chaos_run("shard_moves")
    run.start_system(schedulers=3)
    run.start_load(short_or_full(30, 60))
    hold_until(run.at(short_or_full(8, 15)))
    killed = run.supervisor.incarnation("scheduler-2")
    run.supervisor.signal("scheduler-2", signal.SIGKILL)
    run.supervisor.wait_restarted("scheduler-2", killed, timeout=90)
    run.fault_ended("a scheduler SIGKILLed (its shards taken over, then it rejoined)",
                    RESTART_TARGET_SECONDS)
    hold_until(run.at(short_or_full(18, 35)))
    stopped = run.supervisor.incarnation("scheduler-3")
    run.supervisor.signal("scheduler-3", signal.SIGTERM)
    run.supervisor.wait_restarted("scheduler-3", stopped, timeout=90)
    run.fault_ended("a scheduler SIGTERMed (its shards handed over, then it rejoined)",
                    RESTART_TARGET_SECONDS)
    run.settle()
    run.verdict()
