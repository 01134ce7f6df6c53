"""The four services, each in the foreground: `scheduler`, `dispatcher`, `worker`, `monitor`."""

from __future__ import annotations

import importlib
import sys

import click

from cronstream.cli.common import CliState, pass_state
from cronstream.shared.lifecycle import run_service


@click.command()
@click.option("--instance-id", help="Name of this instance in logs (default hostname-pid).")
@click.option("--session-timeout-ms", type=int, envvar="CRONSTREAM_SCHEDULER_SESSION_TIMEOUT_MS",
              help="Failover bound: the election group's session timeout.")
@pass_state
def scheduler(state: CliState, instance_id: str | None, session_timeout_ms: int | None) -> None:
    """Run a scheduler instance (leader or standby)."""
    from cronstream.services.scheduler.service import SchedulerService

    settings = state.settings(scheduler_session_timeout_ms=session_timeout_ms)
    sys.exit(run_service(SchedulerService(settings, instance_id), settings))


@click.command()
@click.option("--instance-id", help="Name of this instance (default hostname-pid).")
@pass_state
def dispatcher(state: CliState, instance_id: str | None) -> None:
    """Run a dispatcher instance."""
    from cronstream.services.dispatcher.service import DispatcherService

    settings = state.settings()
    sys.exit(run_service(DispatcherService(settings, instance_id), settings))


@click.command()
@click.option("--worker-id", envvar="CRONSTREAM_WORKER_ID", help="Default hostname-pid.")
@click.option("--concurrency", type=int, envvar="CRONSTREAM_WORKER_CONCURRENCY",
              help="Executions run at once.")
@click.option("--queues", envvar="CRONSTREAM_WORKER_QUEUES", help="Comma-separated queues.")
@click.option("--import", "imports", multiple=True, metavar="MODULE",
              help="Module that registers handlers with @handler (repeatable).")
@click.option("--allow-shell", is_flag=True, help="Enable the built-in `shell` handler.")
@pass_state
def worker(state: CliState, worker_id: str | None, concurrency: int | None, queues: str | None,
           imports: tuple[str, ...], allow_shell: bool) -> None:
    """Run a worker for the given queues."""
    from cronstream.handlers import REGISTRY
    from cronstream.services.worker import builtins
    from cronstream.services.worker.pool import PoolRunner
    from cronstream.services.worker.service import WorkerService

    for module in imports:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise click.BadParameter(f"cannot import {module!r}: {exc}",
                                     param_hint="--import") from None
    if allow_shell:
        builtins.enable_shell()
    settings = state.settings(
        worker_id=worker_id, worker_concurrency=concurrency,
        worker_queues=[q.strip() for q in queues.split(",") if q.strip()] if queues else None,
    )
    runner = PoolRunner(REGISTRY, settings.worker_concurrency, list(imports), allow_shell)
    sys.exit(run_service(WorkerService(settings, runner), settings))


@click.command()
@click.option("--instance-id", help="Name of this instance (default hostname-pid).")
@pass_state
def monitor(state: CliState, instance_id: str | None) -> None:
    """Run the monitor: the PostgreSQL projection."""
    from cronstream.services.monitor.service import MonitorService

    settings = state.settings()
    sys.exit(run_service(MonitorService(settings, instance_id), settings))


COMMANDS = [scheduler, dispatcher, worker, monitor]
