"""The `cronstream` command line (docs/reference/cli.md)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from cronstream.cli import (
    calendar_cmds,
    completion_cmd,
    dev_cmd,
    history_cmds,
    infra_cmds,
    inspect_cmds,
    job_cmds,
    kafka_acls_cmd,
    logs_cmd,
    pool_cmds,
    prune_cmd,
    schedulers_cmd,
    service_cmds,
    ui_cmd,
    view_cmds,
)
from cronstream.cli.common import (
    EXIT_OK,
    CliState,
    CronstreamGroup,
    setting_assignments,
    stdout_closed,
)
from cronstream.cli.output import emit

# Commands that act as a client (not services, not local infrastructure).
CLIENT_COMMANDS = frozenset({
    "alerts", "apply", "approve", "backfill", "calendar", "calendars", "cancel", "completion",
    "delete", "describe", "diff", "get", "history", "jobs", "kafka-acls", "logs", "pause", "pool", "pools",
    "preview", "reject", "resume", "runs", "schedulers", "tail", "trigger", "workers"})


@click.group(cls=CronstreamGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--bootstrap-servers", help="Kafka bootstrap servers [CRONSTREAM_KAFKA_BOOTSTRAP_SERVERS].")
@click.option("--database-url", help="PostgreSQL URL [CRONSTREAM_DATABASE_URL].")
@click.option("--topic-prefix", help="Prefix of every topic [CRONSTREAM_TOPIC_PREFIX].")
@click.option("--kafka-config", "kafka_config", multiple=True, metavar="KEY=VALUE",
              help="Any librdkafka property (repeatable) [CRONSTREAM_KAFKA_<PROPERTY>].")
@click.option("--log-level", help="DEBUG, INFO, WARNING, ERROR.")
@click.option("--heartbeat-interval-seconds", type=click.FloatRange(min=0, min_open=True),
              help="Seconds between a worker's heartbeats [CRONSTREAM_HEARTBEAT_INTERVAL_SECONDS].")
@click.option("--worker-dead-after-seconds", type=click.FloatRange(min=0, min_open=True),
              help="A worker silent this long is declared dead [CRONSTREAM_WORKER_DEAD_AFTER_SECONDS].")
@click.option("--set", "assignments", multiple=True, metavar="NAME=VALUE",
              help="Any setting, named as its variable with or without CRONSTREAM_ "
                   "(--set worker_dead_after_seconds=10); repeatable; its own flag wins.")
@click.option("--timeout", type=click.FloatRange(0.1, 600), default=10.0, show_default=True,
              help="Seconds to wait for Kafka or PostgreSQL before giving up (exit 3).")
@click.version_option(package_name="cronstream")
@click.pass_context
def cli(ctx: click.Context, bootstrap_servers: str | None, database_url: str | None,
        topic_prefix: str | None, kafka_config: tuple[str, ...], log_level: str | None,
        heartbeat_interval_seconds: float | None, worker_dead_after_seconds: float | None,
        assignments: tuple[str, ...], timeout: float) -> None:
    """cronstream: cron, interval and one-time jobs on Apache Kafka.

    Start with `cronstream dev` (everything, with examples and a live view).

    \b
    Exit codes: 0 ok, 1 failed, 2 usage, 3 cannot reach Kafka or PostgreSQL,
    4 not found.
    """
    extra: dict[str, str] = {}
    for item in kafka_config:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--kafka-config")
        extra[key.strip()] = value
    flags: dict[str, Any] = {
        "kafka_bootstrap_servers": bootstrap_servers,
        "database_url": database_url,
        "topic_prefix": topic_prefix,
        "log_level": log_level,
        "heartbeat_interval_seconds": heartbeat_interval_seconds,
        "worker_dead_after_seconds": worker_dead_after_seconds,
        "kafka_config": extra or None,
    }
    if ctx.invoked_subcommand in CLIENT_COMMANDS and (log_level or "").upper() != "DEBUG":
        # librdkafka logs every failed connection attempt; a client command reports the
        # outcome in one line instead (exit 3). Services keep their librdkafka logs.
        logging.getLogger("librdkafka").addHandler(logging.NullHandler())
        logging.getLogger("librdkafka").propagate = False
    # A setting's own flag wins over --set, and both over the environment.
    overrides = setting_assignments(assignments) | {k: v for k, v in flags.items() if v is not None}
    ctx.obj = CliState(overrides, timeout)


for module in (infra_cmds, service_cmds, job_cmds, view_cmds, inspect_cmds, history_cmds, logs_cmd,
               completion_cmd, dev_cmd, ui_cmd, prune_cmd, kafka_acls_cmd, schedulers_cmd,
               calendar_cmds, pool_cmds):
    for command in module.COMMANDS:
        cli.add_command(command)


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            result = cli.main(args=argv, prog_name="cronstream", standalone_mode=False)
        except click.exceptions.Abort:
            emit("aborted", err=True)
            return 130
        except click.ClickException as exc:
            exc.show()
            return exc.exit_code
        sys.stdout.flush()
    except BrokenPipeError:  # the final flush: the reader went away (`| head -1`)
        stdout_closed()
        return EXIT_OK
    return result if isinstance(result, int) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
