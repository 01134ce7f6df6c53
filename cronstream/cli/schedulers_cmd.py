"""`cronstream schedulers [-o table|wide|json|yaml]`: the scheduler processes and their shards.

Read from Kafka, not PostgreSQL: the members of the scheduler group (who is alive, as the
group's coordinator says), and the roles every process computes from them alike
(shared/shards.py) — the shards each leads and stands by for. JSON: a list of objects with
`scheduler_id`, `leads` and `standby` (lists of shard numbers).
"""

from __future__ import annotations

from typing import Any

import click
from confluent_kafka import KafkaException

from cronstream.cli.common import CliState, pass_state
from cronstream.cli.output import Column, emit, output_option, show
from cronstream.errors import UnavailableError
from cronstream.shared.kafka.admin import group_members, partition_counts
from cronstream.shared.settings import Settings
from cronstream.shared.shards import roles

MEMBER_PREFIX = "scheduler-"


def scheduler_rows(settings: Settings) -> tuple[list[dict[str, Any]], int]:
    """One row per live scheduler process, and the number of shards."""
    topics = settings.topics
    try:
        shards = partition_counts(settings, [topics.job_definitions]).get(topics.job_definitions)
        members = group_members(settings, f"{topics.prefix}scheduler")
    except KafkaException as exc:
        raise UnavailableError(f"cannot reach Kafka at {settings.kafka_bootstrap_servers}: {exc}",
                               service="kafka", server=settings.kafka_bootstrap_servers) from None
    if shards is None:
        raise click.ClickException(f"topic {topics.job_definitions} does not exist: run `cronstream init`")
    assigned = roles(members, shards, settings.scheduler_standbys)
    return [{"scheduler_id": m.removeprefix(MEMBER_PREFIX), "leads": list(r.leads),
             "standby": list(r.standby)} for m, r in assigned.items()], shards


def _shards(numbers: list[int]) -> str:
    return ",".join(str(n) for n in numbers) or "-"


COLUMNS = [
    Column("scheduler", lambda r: r["scheduler_id"]),
    Column("leads", lambda r: _shards(r["leads"])),
    Column("standby for", lambda r: _shards(r["standby"])),
    Column("led", lambda r: len(r["leads"]), wide_only=True),
    Column("standby", lambda r: len(r["standby"]), wide_only=True),
]


@click.command()
@output_option()
@pass_state
def schedulers(state: CliState, fmt: str) -> None:
    """Scheduler processes, the shards each leads and the ones it keeps warm."""
    settings = state.settings()
    rows, shards = scheduler_rows(settings)
    show(rows, COLUMNS, fmt, f"schedulers ({shards} shards)")
    if fmt in ("table", "wide"):
        unled = shards if not rows else 0
        if unled:
            emit(f"no scheduler runs: none of the {shards} shards fires", err=True)


COMMANDS = [schedulers]
