"""The `cronstream` command line (SPEC §7)."""

from __future__ import annotations

import sys
from typing import Any

import click

from cronstream.cli import (
    alerts_cmd,
    dev_cmd,
    infra_cmds,
    job_cmds,
    prune_cmd,
    service_cmds,
    view_cmds,
)
from cronstream.cli.common import CliState, CronstreamGroup


@click.group(cls=CronstreamGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--bootstrap-servers", envvar="CRONSTREAM_KAFKA_BOOTSTRAP_SERVERS",
              help="Kafka bootstrap servers [CRONSTREAM_KAFKA_BOOTSTRAP_SERVERS].")
@click.option("--database-url", envvar="CRONSTREAM_DATABASE_URL",
              help="PostgreSQL URL [CRONSTREAM_DATABASE_URL].")
@click.option("--topic-prefix", envvar="CRONSTREAM_TOPIC_PREFIX",
              help="Prefix of every topic [CRONSTREAM_TOPIC_PREFIX].")
@click.option("--kafka-config", "kafka_config", multiple=True, metavar="KEY=VALUE",
              help="Any librdkafka property (repeatable) [CRONSTREAM_KAFKA_<PROPERTY>].")
@click.option("--log-level", envvar="CRONSTREAM_LOG_LEVEL", help="DEBUG, INFO, WARNING, ERROR.")
@click.version_option(package_name="cronstream")
@click.pass_context
def cli(ctx: click.Context, bootstrap_servers: str | None, database_url: str | None,
        topic_prefix: str | None, kafka_config: tuple[str, ...], log_level: str | None) -> None:
    """cronstream: cron, interval and one-time jobs on Apache Kafka.

    Start with `cronstream dev` (everything, with examples and a live view).
    """
    extra: dict[str, str] = {}
    for item in kafka_config:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--kafka-config")
        extra[key.strip()] = value
    overrides: dict[str, Any] = {
        "kafka_bootstrap_servers": bootstrap_servers,
        "database_url": database_url,
        "topic_prefix": topic_prefix,
        "log_level": log_level,
        "kafka_config": extra or None,
    }
    ctx.obj = CliState({k: v for k, v in overrides.items() if v is not None})


for module in (infra_cmds, service_cmds, job_cmds, view_cmds, dev_cmd, prune_cmd, alerts_cmd):
    for command in module.COMMANDS:
        cli.add_command(command)


def main(argv: list[str] | None = None) -> int:
    try:
        result = cli.main(args=argv, prog_name="cronstream", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
