"""The SDK against the real broker and database: AsyncClient inside asyncio.run, the sync
Client from threads and from async code, mappings in apply, errors with meaning."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from cronstream import (
    AsyncClient,
    Client,
    CronstreamError,
    DefinitionError,
    JobDefinition,
    NotFoundError,
    ParamsError,
    UnavailableError,
)
from cronstream.shared.settings import Settings
from tests.support import read_all, sql, value

JOB = {"job_id": "nightly", "type": "ONE_TIME", "run_at": "2030-12-01T00:00:00Z", "handler": "noop",
       "params": {"format": "pdf"}}


def on_topic(settings: Settings, topic: str) -> list[tuple[str, dict[str, object] | None]]:
    return [((m.key() or b"").decode(), json.loads(value(m)) if m.value() else None)
            for m in read_all(settings, topic)]


def test_async_client_inside_asyncio_run(topics: Settings) -> None:
    async def main() -> None:
        async with AsyncClient(topics) as client:
            assert await client.apply([JOB, JobDefinition.from_dict({**JOB, "job_id": "other"})]) \
                == ["nightly", "other"]
            found = await client.get("nightly")
            assert found is not None and found.params == {"format": "pdf"}
            assert found.run_at == datetime(2030, 12, 1, tzinfo=UTC) and found.created_by
            assert [d.job_id for d in await client.list()] == ["nightly", "other"]
            assert (await client.pause("nightly")).enabled is False
            assert (await client.resume("nightly")).enabled is True
            execution = await client.trigger("nightly")
            command = await client.cancel(execution, "not needed")
            assert command.execution_id == execution
            await client.approve(uuid.uuid4())
            with pytest.raises(NotFoundError, match="no job 'missing'") as missing:
                await client.pause("missing")
            assert (missing.value.job_id, missing.value.execution_id) == ("missing", None)
            assert await client.runs() == [] and await client.execution(execution) is None
            await client.delete("other")
            assert await client.get("other") is None

    asyncio.run(main())
    records = on_topic(topics, topics.topics.job_definitions)
    # Each job's records in their order (jobs of different shards are on different partitions).
    assert [v["enabled"] if v else None for k, v in records if k == "nightly"] == [True, False, True]
    assert [v["enabled"] if v else None for k, v in records if k == "other"] == [True, None]
    assert [json.loads(value(m))["command"] for m in read_all(topics, topics.topics.commands)] == \
        ["CANCEL", "APPROVE"]
    assert [m.key() for m in read_all(topics, topics.topics.job_due)] == [b"nightly"]


def test_client_apply_takes_mappings_and_names_the_bad_field(topics: Settings) -> None:
    with Client(topics) as client:
        assert client.apply([JOB]) == ["nightly"]
        with pytest.raises(DefinitionError) as caught:
            client.apply([{**JOB, "job_id": "fine"}, {**JOB, "job_id": "bad", "timout_seconds": 5},
                          {**JOB, "job_id": "worse", "run_at": "tomorrow"}])
        message = str(caught.value)
        assert "definition #2 (job_id 'bad'): timout_seconds: Extra inputs are not permitted" in message
        assert "definition #3 (job_id 'worse'): run_at: Input should be a valid datetime" in message
        # A typo in a model built in code is refused the same way.
        typo = JobDefinition.model_validate({**JOB, "job_id": "typo", "prioriti": "high",
                                             "run_at": datetime(2030, 1, 1, tzinfo=UTC)})
        with pytest.raises(DefinitionError, match="prioriti: unknown field"):
            client.apply([typo])
    assert [k for k, _ in on_topic(topics, topics.topics.job_definitions)] == ["nightly"]


def test_client_is_safe_from_threads_and_from_async_code(topics: Settings) -> None:
    with Client(topics) as client:
        errors: list[BaseException] = []

        def publish(n: int) -> None:
            try:
                client.apply([{**JOB, "job_id": f"t{n}-{i}"} for i in range(5)])
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=publish, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []

        async def from_a_coroutine() -> int:
            # Under a running loop: the sync client never calls asyncio.run().
            return len(client.definitions())

        assert asyncio.run(from_a_coroutine()) == 20
    with pytest.raises(CronstreamError, match="closed"):
        client.get("t0-0")


def test_runs_reads_the_projection(topics: Settings) -> None:
    execution, run = uuid.uuid4(), uuid.uuid4()
    sql(topics.database_url,
        "INSERT INTO job_executions (execution_id, job_id, run_id, status, scheduled_at, "
        "attempt_number, result, last_event, updated_at) "
        "VALUES ($1, 'nightly', $2, 'COMPLETED', now(), 1, '{\"rows\": 3}', 'COMPLETED', now())",
        execution, run)
    with Client(topics) as client:
        (found,) = client.runs("nightly")
        assert (found.execution_id, found.status, found.result, found.terminal) == \
            (execution, "COMPLETED", {"rows": 3}, True)
        assert client.runs(status="FAILED") == []
        assert client.execution(execution) == found


def test_unreachable_servers_raise_unavailable(topics: Settings) -> None:
    closed_db = topics.model_copy(update={"database_url": "postgresql://postgres:pw@127.0.0.1:1/x"})
    with Client(closed_db, timeout=2) as client, \
            pytest.raises(UnavailableError, match=r"cannot reach PostgreSQL at postgresql://postgres:\*\*\*@127\.0\.0\.1:1/x") as db:
        client.runs()
    assert (db.value.service, db.value.server) == ("postgresql", "postgresql://postgres:***@127.0.0.1:1/x")
    closed_kafka = topics.model_copy(update={"kafka_bootstrap_servers": "127.0.0.1:1"})
    with Client(closed_kafka, timeout=1) as client, \
            pytest.raises(UnavailableError, match=r"cannot reach Kafka at 127\.0\.0\.1:1") as kafka:
        client.apply([JOB])
    assert (kafka.value.service, kafka.value.server) == ("kafka", "127.0.0.1:1")
    missing = topics.model_copy(update={"topic_prefix": f"missing{uuid.uuid4().hex[:6]}."})
    with Client(missing) as client, pytest.raises(CronstreamError, match="run `cronstream init`"):
        client.delete("x")


def test_a_client_configured_by_plain_arguments_reaches_the_deployment_they_name(
        topics: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """No settings object: the servers and the topic prefix as arguments, over whatever
    the environment says."""
    monkeypatch.setenv("CRONSTREAM_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.setenv("CRONSTREAM_TOPIC_PREFIX", "elsewhere.")
    with Client(bootstrap_servers=topics.kafka_bootstrap_servers, database_url=topics.database_url,
                topic_prefix=topics.topic_prefix, kafka_config={"client.rack": "r1"},
                timeout=5) as client:
        assert client.apply([JOB]) == ["nightly"]
        assert client.runs("nightly") == []
        execution = client.trigger("nightly", params={"region": "eu"})
        with pytest.raises(ParamsError) as bad:
            client.trigger("nightly", params={"when": object()})
        assert (bad.value.job_id, bad.value.key) == ("nightly", "when")
        with pytest.raises(NotFoundError) as unknown:
            client.version("nightly", 99)
        assert (unknown.value.job_id, unknown.value.version) == ("nightly", 99)
        with pytest.raises(NotFoundError) as no_log:
            list(client.logs(execution, attempt=3))
        assert (no_log.value.execution_id, no_log.value.attempt) == (execution, 3)
    assert [k for k, _ in on_topic(topics, topics.topics.job_definitions)] == ["nightly"]
    assert [m.key() for m in read_all(topics, topics.topics.job_due)] == [b"nightly"]


def test_client_logs_reads_a_page_only_once_the_one_before_is_consumed(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long log streams: the first line costs one page, not the whole log (a log of
    104,000 lines once needed 112 MB in `cronstream logs`)."""
    from cronstream.client import LOG_PAGE

    execution, total = uuid.uuid4(), 2 * LOG_PAGE + 10
    sql(settings.database_url,
        "INSERT INTO job_executions (execution_id, job_id, run_id, status, scheduled_at, "
        "attempt_number, last_event, updated_at) "
        "VALUES ($1, 'chatty', gen_random_uuid(), 'COMPLETED', now(), 1, 'COMPLETED', now())",
        execution)
    sql(settings.database_url,
        "INSERT INTO execution_logs (execution_id, delivery, seq, job_id, attempt_number, at, "
        "stream, line) SELECT $1, 1, i, 'chatty', 1, now(), 'stdout', 'line ' || i "
        "FROM generate_series(0, $2::int - 1) AS i", execution, total)
    pages: list[int] = []

    def counting(fetch: Any) -> Any:
        async def counted(name: str, *args: Any) -> Any:
            if name == "log_lines":
                pages.append(len(pages) + 1)
            return await fetch(name, *args)
        return counted

    with Client(settings) as client:
        monkeypatch.setattr(client._async._plumbing, "fetch", counting(client._async._plumbing.fetch))
        lines = iter(client.logs(execution))
        assert pages == [], "nothing is read before the first line is asked for"
        assert next(lines).text == "line 0"
        assert pages == [1]
        rest = [next(lines) for _ in range(LOG_PAGE - 1)]
        assert pages == [1] and rest[-1].seq == LOG_PAGE - 1
        assert [line.seq for line in lines] == list(range(LOG_PAGE, total))
        assert pages == [1, 2, 3]

    async def first_line() -> str:
        async with AsyncClient(settings) as client:
            monkeypatch.setattr(client._plumbing, "fetch", counting(client._plumbing.fetch))
            async with contextlib.aclosing(client.logs(execution)) as lines:
                return (await anext(lines)).text

    pages.clear()
    assert asyncio.run(first_line()) == "line 0" and pages == [1]
