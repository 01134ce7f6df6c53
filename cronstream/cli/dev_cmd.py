"""`cronstream dev`: the whole system in one command, with the examples and a live view."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import click
from rich.console import Group
from rich.live import Live
from rich.text import Text

from cronstream.cli.common import CliState, pass_state
from cronstream.cli.infra_cmds import initialise
from cronstream.cli.output import emit
from cronstream.cli.view_cmds import fetch, runs_table
from cronstream.client import Client
from cronstream.definitions import load_definitions
from cronstream.infra import Infra
from cronstream.shared.health import serving_port
from cronstream.shared.settings import SERVICE_PORTS

# How long `dev` waits for the services to say where they serve HTTP before it prints.
PORTS_WAIT_SECONDS = 15.0


def _examples_dir(given: str | None) -> Path:
    if given:
        return Path(given)
    for candidate in (Path.cwd() / "examples", Path(__file__).resolve().parents[2] / "examples"):
        if candidate.is_dir():
            return candidate
    raise click.ClickException("no examples/ directory found; pass --examples DIR")


def _spawn(args: list[str], env: dict[str, str], log_dir: Path, name: str) -> subprocess.Popen[bytes]:
    out = open(log_dir / f"{name}.log", "ab")  # noqa: SIM115  (owned by the child)
    # A session of its own: Ctrl-C reaches `dev` only, which then stops each service once.
    # CRONSTREAM_PARENT_PID makes the service stop by itself if `dev` dies (lifecycle.py).
    env = {**env, "CRONSTREAM_PARENT_PID": str(os.getpid())}
    return subprocess.Popen(
        [sys.executable, "-m", "cronstream", *args], env=env, stdout=out,
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )


def _stop_on_signals() -> threading.Event:
    """Ctrl-C and SIGTERM set the event the live view waits on. (As a KeyboardInterrupt,
    a Ctrl-C that came while the view read PostgreSQL inside asyncio.run cancelled that
    read, and the cancellation could be swallowed on its way out: `dev` ran on.)"""
    stopping = threading.Event()

    def stop(_signum: int, _frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    return stopping


def stop_all(procs: dict[str, subprocess.Popen[bytes]], timeout: float = 40.0) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.1, deadline - time.monotonic()))
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _start_services(procs: dict[str, subprocess.Popen[bytes]], folder: Path, env: dict[str, str],
                    log_dir: Path, n_workers: int) -> None:
    """Start every service into `procs`. Each serves HTTP on its default port, or on a free
    one when that is taken (the second worker, another `dev`): `_ports` reads which."""
    procs["monitor"] = _spawn(["monitor"], env, log_dir, "monitor")
    procs["scheduler"] = _spawn(["scheduler"], env, log_dir, "scheduler")
    procs["dispatcher"] = _spawn(["dispatcher"], env, log_dir, "dispatcher")
    procs["analytics"] = _spawn(["analytics"], env, log_dir, "analytics")
    imports = [p.stem for p in folder.glob("*.py")]
    for i in range(1, n_workers + 1):
        args = ["worker", "--worker-id", f"dev-worker-{i}"]
        for module in imports:
            args += ["--import", module]
        procs[f"worker-{i}"] = _spawn(args, env, log_dir, f"worker-{i}")
    procs["ui"] = _spawn(["ui"], env, log_dir, "ui")  # the web dashboard, on loopback


def _ports(procs: dict[str, subprocess.Popen[bytes]], log_dir: Path) -> dict[str, int | None]:
    """Where each service serves HTTP, as its log says (None: not said in time)."""
    ports: dict[str, int | None] = dict.fromkeys(procs)
    deadline = time.monotonic() + PORTS_WAIT_SECONDS
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            if ports[name] is None and proc.poll() is None:
                ports[name] = serving_port((log_dir / f"{name}.log").read_text(errors="replace"))
        if all(p is not None or procs[n].poll() is not None for n, p in ports.items()):
            break
        time.sleep(0.2)
    return ports


@click.command()
@click.option("--examples", "examples", help="Folder of example jobs (default ./examples).")
@click.option("--workers", "n_workers", default=2, show_default=True, type=click.IntRange(1, 16))
@click.option("--no-view", is_flag=True, help="No live view; just run until Ctrl-C.")
@pass_state
def dev(state: CliState, examples: str | None, n_workers: int, no_view: bool) -> None:
    """Infra, init, all services, the example jobs and a live view; Ctrl-C stops all."""
    settings = state.settings()
    folder = _examples_dir(examples)
    definitions = [d for f in sorted(folder.glob("*.yaml")) for d in load_definitions(f)]
    infra = Infra.from_settings(settings)
    started = infra.up(emit)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    log_dir = Path(os.environ.get("CRONSTREAM_DEV_LOGS", ".cronstream-dev"))
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        initialise(settings)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(folder), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["CRONSTREAM_KAFKA_BOOTSTRAP_SERVERS"] = settings.kafka_bootstrap_servers
        env["CRONSTREAM_DATABASE_URL"] = settings.database_url
        env["CRONSTREAM_TOPIC_PREFIX"] = settings.topic_prefix
        env.setdefault("CRONSTREAM_HEARTBEAT_INTERVAL_SECONDS", "5")
        # Each service on its default port, or a free one (the first worker takes 9183,
        # the second another): a port given for all of them could serve only one.
        env.pop("CRONSTREAM_HTTP_PORT", None)
        _start_services(procs, folder, env, log_dir, n_workers)
        with Client(settings) as client:
            client.apply(definitions)
        emit(f"applied {len(definitions)} example job(s) from {folder}; "
                   f"service logs in {log_dir}/; Ctrl-C stops everything")
        ports = _ports(procs, log_dir)
        emit(f"dashboard: http://127.0.0.1:{ports['ui'] or SERVICE_PORTS['ui']}/ (cronstream "
                   "ui; read-only unless CRONSTREAM_UI_TOKEN is set)")
        emit("metrics and probes: " + ", ".join(
            f"{name} http://127.0.0.1:{port}/metrics" for name, port in ports.items()
            if name != "ui" and port is not None))
        stopping = _stop_on_signals()
        if no_view:
            while all(p.poll() is None for p in procs.values()) and not stopping.wait(0.5):
                pass
        else:
            with Live(refresh_per_second=2, screen=False) as live:
                while not stopping.is_set():
                    dead = [n for n, p in procs.items() if p.poll() is not None]
                    header = Text(f"cronstream dev — {len(procs) - len(dead)}/{len(procs)} "
                                  f"services up" + (f"; exited: {', '.join(dead)}" if dead else ""))
                    try:
                        rows = fetch(settings, "recent_executions", None, 20)
                        live.update(Group(header, runs_table(rows)))
                    except Exception as exc:  # the projection may not exist for a moment
                        live.update(Group(header, Text(f"waiting for the monitor: {exc}")))
                    stopping.wait(1)
        emit("stopping ...")
    except KeyboardInterrupt:
        emit("stopping ...")
    finally:
        stop_all(procs)
        infra.down(emit, only=started)
        codes = {n: p.returncode for n, p in procs.items()}
        emit("stopped: " + ", ".join(f"{n}={c}" for n, c in codes.items()))


COMMANDS = [dev]
