"""The services, each in the foreground: `scheduler`, `dispatcher`, `worker`, `monitor`, `analytics`."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from cronstream.cli.common import CliState, pass_state
from cronstream.shared.lifecycle import run_service
from cronstream.shared.settings import SERVICE_PORTS


def http_options(service: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--http-port and --http-bind: where /metrics, /healthz and /readyz are served."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn = click.option("--http-bind",
                          help="Address for /metrics, /healthz, /readyz (default 0.0.0.0).")(fn)
        return click.option(
            "--http-port", type=click.IntRange(0, 65535),
            help=f"Port for /metrics, /healthz, /readyz (default {SERVICE_PORTS[service]}; "
                 "0: any free port).")(fn)

    return decorate


def instance_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--instance-id", help="Stable name of this instance (default hostname-pid); its Kafka transactional "
             "id derives from it, so a restart with the same name fences its predecessor.")(fn)


@click.command()
@instance_option
@http_options("scheduler")
@click.option("--session-timeout-ms", type=int,
              help="Failover bound: how long a process that stops heartbeating keeps its shards.")
@click.option("--standbys", type=click.IntRange(0, 8),
              help="Warm standbys of every shard on other scheduler processes (default 1).")
@click.option("--data-dir", type=click.Path(file_okay=False),
              help="Where this process keeps its shards' stores (a cache of Kafka).")
@pass_state
def scheduler(state: CliState, instance_id: str | None, http_port: int | None,
              http_bind: str | None, session_timeout_ms: int | None, standbys: int | None,
              data_dir: str | None) -> None:
    """Run a scheduler process: it leads some shards of the clock and keeps others warm."""
    from cronstream.services.scheduler.service import SchedulerService

    settings = state.settings(scheduler_session_timeout_ms=session_timeout_ms,
                              scheduler_standbys=standbys, scheduler_data_dir=data_dir,
                              instance_id=instance_id, http_port=http_port, http_bind=http_bind)
    sys.exit(run_service(SchedulerService(settings), settings))


@click.command()
@instance_option
@http_options("dispatcher")
@pass_state
def dispatcher(state: CliState, instance_id: str | None, http_port: int | None,
               http_bind: str | None) -> None:
    """Run a dispatcher instance."""
    from cronstream.services.dispatcher.service import DispatcherService

    settings = state.settings(instance_id=instance_id, http_port=http_port, http_bind=http_bind)
    sys.exit(run_service(DispatcherService(settings), settings))


@click.command()
@click.option("--worker-id", help="Default hostname-pid.")
@click.option("--concurrency", type=int, help="Executions run at once.")
@click.option("--queues", help="Comma-separated queues.")
@click.option("--import", "imports", multiple=True, metavar="MODULE",
              help="Module that registers handlers with @handler (repeatable).")
@click.option("--allow-shell", "allow_shell", multiple=True, is_flag=False, flag_value="",
              metavar="'NAME=ARGV' | EXECUTABLE[,...]",
              help="Enable the built-in `shell` handler for this command only: NAME=ARGV, the "
                   "argv with typed placeholders ({db:word}, {n:int}, {msg:text}, {fmt:csv|pdf}) "
                   "that a job's params.args fill; or executables run with no argument. "
                   "Repeatable [CRONSTREAM_WORKER_ALLOW_SHELL, one entry per line].")
@http_options("worker")
@pass_state
def worker(state: CliState, worker_id: str | None, concurrency: int | None, queues: str | None,
           imports: tuple[str, ...], allow_shell: tuple[str, ...], http_port: int | None,
           http_bind: str | None) -> None:
    """Run a worker for the given queues."""
    from cronstream.handlers import REGISTRY
    from cronstream.services.worker import builtins, shell
    from cronstream.services.worker.pool import PoolRunner
    from cronstream.services.worker.service import WorkerService

    for module in imports:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise click.BadParameter(f"cannot import {module!r}: {exc}",
                                     param_hint="--import") from None
    if "" in allow_shell:
        raise click.BadParameter(
            "name the commands the shell handler may run, e.g. --allow-shell "
            "'backup=/usr/local/bin/backup --db {db:word}' (any command at all is no longer "
            "an option)", param_hint="--allow-shell")
    settings = state.settings(
        worker_id=worker_id, worker_concurrency=concurrency,
        worker_queues=[q.strip() for q in queues.split(",") if q.strip()] if queues else None,
        worker_allow_shell=[e for e in allow_shell if e.strip()] or None, http_port=http_port,
        http_bind=http_bind,
    )
    del builtins  # imported for what it registers: noop, sleep, fail
    try:
        shell.enable(settings.worker_allow_shell)
    except shell.ShellConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--allow-shell") from None
    # The handler processes inherit this environment: the commands they run with.
    os.environ[shell.ALLOW_SHELL_ENV] = "\n".join(settings.worker_allow_shell)
    runner = PoolRunner(REGISTRY, settings.worker_concurrency, list(imports),
                        bool(settings.worker_allow_shell),
                        log_limit=settings.worker_log_limit_bytes)
    sys.exit(run_service(WorkerService(settings, runner), settings))


@click.command()
@instance_option
@http_options("monitor")
@pass_state
def monitor(state: CliState, instance_id: str | None, http_port: int | None,
            http_bind: str | None) -> None:
    """Run the monitor: the PostgreSQL projection."""
    from cronstream.services.monitor.service import MonitorService

    settings = state.settings(instance_id=instance_id, http_port=http_port, http_bind=http_bind)
    sys.exit(run_service(MonitorService(settings), settings))


@click.command()
@instance_option
@http_options("analytics")
@pass_state
def analytics(state: CliState, instance_id: str | None, http_port: int | None,
              http_bind: str | None) -> None:
    """Run the analytics service: windowed alerts (success rate, duration regression,
    queue growth, late fires) on the alerts topic. Run one instance."""
    from cronstream.services.analytics.service import AnalyticsService

    settings = state.settings(instance_id=instance_id, http_port=http_port, http_bind=http_bind)
    sys.exit(run_service(AnalyticsService(settings), settings))


COMMANDS = [scheduler, dispatcher, worker, monitor, analytics]
