"""Every service stops cleanly on SIGTERM and on Ctrl-C (SIGINT), exit code 0."""

from __future__ import annotations

import signal
import time

import pytest

from cronstream.shared.settings import Settings
from tests.conftest import Processes


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_services_stop_cleanly(processes: Processes, topics: Settings, sig: int) -> None:
    services = processes.system()
    started = time.monotonic()
    for proc in services.values():
        proc.signal(sig)
        if sig == signal.SIGTERM:
            proc.signal(sig)  # a repeated SIGTERM is harmless
    for name, proc in services.items():
        assert proc.proc.wait(40) == 0, f"{name} exit code {proc.proc.returncode}"
        assert "action=service_stopped" in proc.log(), name
    assert time.monotonic() - started < 30, "shutdown fits in Kubernetes' default grace period"
