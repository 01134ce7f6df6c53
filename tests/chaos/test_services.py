"""Faults of the stateless services: the dispatcher or the monitor SIGKILLed under load,
restarted by the supervisor (same instance name, as a StatefulSet would)."""

from __future__ import annotations

import signal

import pytest

from tests.chaos.conftest import RunFactory
from tests.chaos.harness import RESTART_TARGET_SECONDS, hold_until, short_or_full


@pytest.mark.parametrize("service", ["dispatcher", "monitor"])
def test_service_sigkill_and_restart(chaos_run: RunFactory, service: str) -> None:
    """The restarted instance fences its predecessor's open transaction and carries on
    from the committed position: nothing lost, nothing doubled, the projection exact."""
    run = chaos_run(f"{service}_kill")
    run.start_system()
    run.start_load(short_or_full(30, 50))
    hold_until(run.at(short_or_full(10, 15)))
    incarnation = run.supervisor.incarnation(service)
    run.supervisor.signal(service, signal.SIGKILL, group=True)
    run.supervisor.wait_restarted(service, incarnation, timeout=60)
    run.fault_ended(f"{service} SIGKILL and restart", RESTART_TARGET_SECONDS)
    run.settle()
    run.verdict()
