"""Publishing and controlling jobs from Python (mypy --strict clean: `make lint`).

    python examples/sdk_client.py          # against CRONSTREAM_* (default localhost)

A client is configured by the environment (`Client()`) or in code:
`Client(bootstrap_servers="kafka-1:9092", database_url="postgresql://...", topic_prefix="prod.")`.
"""

from __future__ import annotations

import asyncio

import yaml

from cronstream import AsyncClient, Client, DefinitionError, JobDefinition, NotFoundError

NIGHTLY = """
job_id: example.nightly-report
type: CRON
schedule: "30 2 * * *"
timezone: Europe/Berlin
handler: reports.daily
params: {format: pdf}
max_retries: 2
"""


def with_the_sync_client() -> None:
    # Plain mappings (from YAML, JSON or code) are validated like the wire: ISO 8601
    # strings for times, and an unknown field is an error that names it.
    definition = JobDefinition.from_dict(yaml.safe_load(NIGHTLY))
    with Client() as client:
        client.apply([definition, {"job_id": "example.every-minute", "type": "INTERVAL",
                                   "interval_seconds": 60, "handler": "noop"}])
        try:
            client.apply([{"job_id": "example.typo", "type": "INTERVAL",
                           "interval_seconds": 60, "handler": "noop", "max_retry": 3}])
        except DefinitionError as exc:
            for problem in exc.problems:  # here: job example.typo, field max_retry
                print(f"refused, nothing sent: {problem.job_id}: {problem.field}: {problem.reason}")
        client.pause(definition.job_id)
        client.resume(definition.job_id)
        for run in client.runs(definition.job_id, limit=5):
            print(run.execution_id, run.status, run.duration_seconds)


async def with_the_async_client() -> None:
    async with AsyncClient() as client:
        try:
            execution = await client.trigger("example.every-minute")
            print(f"triggered: {execution}")
        except NotFoundError as exc:
            print(f"no job {exc.job_id}")


if __name__ == "__main__":
    with_the_sync_client()
    asyncio.run(with_the_async_client())
