"""Every service stops cleanly on SIGTERM and on Ctrl-C (SIGINT), exit code 0; several of
a kind share a host without flags."""

from __future__ import annotations

import contextlib
import signal
import socket
import time
from collections.abc import Iterator

import pytest

from cronstream.shared.settings import SERVICE_PORTS, Settings
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


@contextlib.contextmanager
def taken(port: int) -> Iterator[None]:
    """`port` held by someone else on the loopback address for the block (already held,
    by another program on this host: just as good)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(OSError):
            sock.bind(("127.0.0.1", port))
            sock.listen(1)
        yield
    finally:
        sock.close()


def test_a_second_worker_on_a_host_takes_a_free_port_unless_one_was_asked_for(
    processes: Processes, topics: Settings,
) -> None:
    default = SERVICE_PORTS["worker"]
    with taken(default):
        # Not set: the default port is taken, so any free one (a second worker on a VM).
        worker = processes.worker("w1", extra_env={"CRONSTREAM_HTTP_PORT": ""})
        assert "action=http_default_port_taken" in worker.log()
        assert worker.http_port() != default
        assert worker.get("/healthz")[0] == 200
        # Set explicitly (a Kubernetes probe expects it there): the clear error, at once.
        pinned = processes.start("worker", "--worker-id", "w2", "--http-port", str(default),
                                 name="worker-pinned", extra_env={"CRONSTREAM_HTTP_PORT": ""})
        assert pinned.proc.wait(30) == 1
        assert f"cannot serve HTTP on 127.0.0.1:{default}" in pinned.log()
