"""Faults of the servers: the Kafka broker and PostgreSQL crash (SIGKILL) and come back."""

from __future__ import annotations

import pytest

from tests.chaos.conftest import RunFactory
from tests.chaos.harness import RESTART_TARGET_SECONDS, hold_for, hold_until, short_or_full
from tests.chaos.servers import ChaosKafka, ChaosPostgres


@pytest.mark.chaos_short
def test_broker_sigkill_and_restart(chaos_run: RunFactory, chaos_kafka: ChaosKafka) -> None:
    """Rolling restarts are routine: a broker that crashes and returns must not stop
    execution (issue 9: the services hung in send_offsets_to_transaction for good)."""
    run = chaos_run("broker_restart")
    run.start_system()
    outage = short_or_full(8, 15)
    run.start_load(short_or_full(40, 75))
    hold_until(run.at(short_or_full(10, 20)))
    chaos_kafka.kill()
    run.figures["outage_seconds"] = outage
    hold_for(outage)
    chaos_kafka.start()
    run.fault_ended("broker restart", RESTART_TARGET_SECONDS)
    run.settle()
    # Every service rides it out: a monitor that took the fleet's silence during the
    # outage for death would fence every worker (each then exits and restarts).
    run.verdict(crash_restarts_allowed=False)


@pytest.mark.chaos_short
def test_postgres_sigkill_and_restart(chaos_run: RunFactory, chaos_postgres: ChaosPostgres) -> None:
    """A database outage is waited out (the monitor stays up, not ready), and the
    projection resumes exactly once when it returns (issue 9: the monitor crash-looped)."""
    run = chaos_run("postgres_restart")
    run.start_system()
    outage = short_or_full(8, 15)
    run.start_load(short_or_full(40, 75))
    hold_until(run.at(short_or_full(10, 20)))
    chaos_postgres.kill()
    run.figures["outage_seconds"] = outage
    hold_for(outage)
    chaos_postgres.start()
    run.fault_ended("postgres restart", RESTART_TARGET_SECONDS)
    run.settle()
    run.verdict(crash_restarts_allowed=False)
