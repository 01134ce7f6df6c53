"""A supervisor for the four services, as Kubernetes would run them.

Each service is a `python -m cronstream ...` process in a session of its own (its pid is
its process group, so a fault can signal the whole group as systemd or an init would).
The supervisor's thread:
- restarts a process that exits, after a short backoff (1 s, doubling while it keeps
  failing early, at most 8 s: CrashLoopBackOff, compressed);
- probes `/healthz` every second (the port comes from the process's
  `action=http_serving port=N` line) and SIGKILLs the group of a process whose probe has
  failed for `liveness_seconds` (a liveness probe with failureThreshold × period = 10 s),
  or that never served HTTP within `startup_seconds`; it is then restarted like any exit;
- records every exit: when, the exit code, whether a test caused it (`induced`), and the
  log of that incarnation (`<name>.<n>.log`), so that a test can tell a crash from a fault
  it injected and read what the process said before it went.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from cronstream.shared.health import serving_port

# A clear error line: an ERROR logged through shared/logs.py with a stable action key.
_ERROR_LINE = re.compile(r"^ts=\S+ level=error service=\S+ action=\S+", re.MULTILINE)


@dataclass
class Exit:
    service: str
    incarnation: int
    pid: int
    code: int | None
    at: float  # time.time()
    ran_seconds: float
    induced: str | None  # what the test did to it (e.g. "SIGKILL"), None for a crash
    reason: str  # "exited", or "liveness: <why>" when the supervisor killed it
    log_path: Path

    def error_lines(self) -> list[str]:
        """The clear error lines of this incarnation, each cut to its head and its end (a
        traceback's last line names the exception)."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return [line if len(line) < 400 else f"{line[:150]} … {line[-250:]}"
                for line in text.splitlines() if _ERROR_LINE.match(line)]

    def describe(self) -> str:
        how = f"induced {self.induced}" if self.induced else self.reason
        return (f"{self.service}#{self.incarnation} exit {self.code} after {self.ran_seconds:.1f}s "
                f"({how})")


@dataclass
class _Service:
    name: str
    args: list[str]
    env: dict[str, str]
    log_dir: Path
    incarnation: int = 0
    proc: subprocess.Popen[bytes] | None = None
    out: object = None
    started: float = 0.0
    port: int | None = None
    failing_since: float | None = None
    last_failure: str = ""
    induced: str | None = None
    killed_for: str | None = None
    restart_at: float | None = None
    backoff: float = 1.0
    exits: list[Exit] = field(default_factory=list)

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.{self.incarnation}.log"


class Supervisor:
    def __init__(self, log_dir: Path, liveness_seconds: float = 10.0,
                 startup_seconds: float = 60.0, max_backoff: float = 8.0) -> None:
        self.log_dir = log_dir
        self.liveness_seconds = liveness_seconds
        self.startup_seconds = startup_seconds
        self.max_backoff = max_backoff
        self._services: dict[str, _Service] = {}
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)
        self._thread.start()

    # -- what a test calls ------------------------------------------------------------

    def add(self, name: str, args: list[str], env: dict[str, str]) -> None:
        with self._lock:
            service = _Service(name, args, env, self.log_dir)
            self._services[name] = service
            self._spawn(service)

    @property
    def names(self) -> list[str]:
        return list(self._services)

    def pid(self, name: str) -> int | None:
        with self._lock:
            proc = self._services[name].proc
            return proc.pid if proc is not None and proc.poll() is None else None

    def incarnation(self, name: str) -> int:
        return self._services[name].incarnation

    def signal(self, name: str, sig: int, group: bool = False) -> int:
        """Send `sig` to the service's process (or its whole process group); the exit it
        causes, if any, is recorded as induced. Returns the pid signalled."""
        with self._lock:
            service = self._services[name]
            proc = service.proc
            assert proc is not None and proc.poll() is None, f"{name} is not running"
            service.induced = signal.Signals(sig).name + (" to the group" if group else "")
            if group:
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)
            return proc.pid

    def exits(self, name: str | None = None) -> list[Exit]:
        with self._lock:
            return [e for s in self._services.values() if name in (None, s.name) for e in s.exits]

    def log(self, name: str) -> str:
        """The log of the current incarnation."""
        path = self._services[name].log_path
        return path.read_text(errors="replace") if path.exists() else ""

    def all_logs(self, name: str) -> list[Path]:
        return sorted(self.log_dir.glob(f"{name}.*.log"),
                      key=lambda p: int(p.name.rsplit(".", 2)[1]))

    def get(self, name: str, path: str, timeout: float = 2.0) -> tuple[int, str]:
        """GET a probe of the current incarnation: (status, body); (0, why) if no answer."""
        port = self._services[name].port
        if port is None:
            return 0, "not serving HTTP yet"
        return _http_get(port, path, timeout)

    def ready(self, name: str) -> bool:
        return self.get(name, "/readyz")[0] == 200

    def wait_ready(self, names: list[str] | None = None, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        pending = list(names or self.names)
        while pending and time.monotonic() < deadline:
            pending = [n for n in pending if not self.ready(n)]
            if pending:
                time.sleep(0.5)
        if pending:
            states = {n: self.get(n, "/readyz") for n in pending}
            raise AssertionError(f"not ready after {timeout:.0f}s: {states}")

    def wait_restarted(self, name: str, after_incarnation: int, timeout: float = 60.0) -> None:
        """Wait until a later incarnation than `after_incarnation` runs and is ready."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._services[name].incarnation > after_incarnation and self.ready(name):
                return
            time.sleep(0.2)
        raise AssertionError(f"{name} not restarted and ready within {timeout:.0f}s "
                             f"(exits: {[e.describe() for e in self.exits(name)]})")

    def stop(self, timeout: float = 40.0) -> None:
        """Stop supervising; SIGTERM every process, SIGKILL the groups still alive after
        `timeout`. Records those exits too."""
        self._stopping.set()
        self._thread.join(10)
        with self._lock:
            live = [s for s in self._services.values() if s.proc is not None and s.proc.poll() is None]
            for service in live:
                service.induced = "SIGTERM (end of test)"
                with contextlib.suppress(ProcessLookupError):
                    os.kill(service.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
                    os.kill(service.proc.pid, signal.SIGTERM)  # type: ignore[union-attr]
            deadline = time.monotonic() + timeout
            for service in live:
                assert service.proc is not None
                try:
                    service.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    service.killed_for = "did not stop within the grace period after SIGTERM"
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(service.proc.pid, signal.SIGKILL)
                    service.proc.wait(10)
                self._record_exit(service)
            for service in self._services.values():
                # Pool processes and forkservers of a worker share its group.
                if service.proc is not None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(service.proc.pid, signal.SIGKILL)
                self._close_out(service)

    # -- the supervising thread -------------------------------------------------------

    def _spawn(self, service: _Service) -> None:
        self._close_out(service)
        service.incarnation += 1
        out = open(service.log_path, "ab")  # noqa: SIM115 - closed on exit
        service.out = out
        service.proc = subprocess.Popen(
            [sys.executable, "-m", "cronstream", *service.args], env=service.env, stdout=out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        service.started = time.monotonic()
        service.port = None
        service.failing_since = None
        service.induced = None
        service.killed_for = None
        service.restart_at = None

    @staticmethod
    def _close_out(service: _Service) -> None:
        out = service.out
        if out is not None:
            with contextlib.suppress(OSError):
                out.close()  # type: ignore[attr-defined]
            service.out = None

    def _record_exit(self, service: _Service) -> None:
        proc = service.proc
        assert proc is not None
        ran = time.monotonic() - service.started
        service.exits.append(Exit(
            service.name, service.incarnation, proc.pid, proc.returncode, time.time(), ran,
            service.induced, f"liveness: {service.killed_for}" if service.killed_for else "exited",
            service.log_path))
        # CrashLoopBackOff, compressed: an early failure doubles the wait, a long run resets it.
        service.backoff = 1.0 if ran > 30 or service.induced else min(self.max_backoff,
                                                                       service.backoff * 2)

    def _run(self) -> None:
        next_probe = 0.0
        while not self._stopping.wait(0.2):
            now = time.monotonic()
            probe = now >= next_probe
            if probe:
                next_probe = now + 1.0
            for service in list(self._services.values()):
                with self._lock:
                    if self._stopping.is_set():
                        return
                    self._supervise(service, now, probe)

    def _supervise(self, service: _Service, now: float, probe: bool) -> None:
        proc = service.proc
        if proc is None:
            return
        if service.restart_at is not None:
            if now >= service.restart_at:
                self._spawn(service)
            return
        if proc.poll() is not None:
            # Whatever is left of the group (a worker's pool) goes with it, as in a pod.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            self._record_exit(service)
            service.restart_at = now + service.backoff
            return
        if not probe:
            return
        if service.port is None:
            service.port = self._port(service)
        if service.port is None:
            ok, why = now - service.started < self.startup_seconds, "never served HTTP"
        else:
            status, body = _http_get(service.port, "/healthz", 2.0)
            ok, why = status == 200, f"/healthz {status or 'no answer'}: {body.strip()[:200]}"
        if ok:
            service.failing_since = None
            return
        if service.failing_since is None:
            service.failing_since = now
        service.last_failure = why
        if service.port is None or now - service.failing_since >= self.liveness_seconds:
            service.killed_for = why
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    @staticmethod
    def _port(service: _Service) -> int | None:
        try:
            with open(service.log_path, "rb") as log:
                return serving_port(log.read(200_000).decode(errors="replace"))
        except OSError:
            return None


def _http_get(port: int, path: str, timeout: float) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (OSError, ValueError) as exc:
        return 0, str(exc)
