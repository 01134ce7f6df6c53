"""The SDK's public face, pinned: what `cronstream` exports, the verbs of the clients (each
with a docstring), a client configured by plain arguments, and errors that carry their
data. The public API changes only on purpose: a change here is a change of the API."""

from __future__ import annotations

import asyncio
import inspect
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import cronstream
from cronstream import (
    AsyncClient,
    Client,
    ConfigurationError,
    CronstreamError,
    DefinitionError,
    DefinitionProblem,
    JobDefinition,
    NotFoundError,
    ParamsError,
    ResultOmittedError,
    UnavailableError,
)
from cronstream._plumbing import Plumbing
from cronstream.definitions import check_dags, load_sources, parse_definitions
from cronstream.handlers import UpstreamResult

EXPORTS = [
    "AsyncClient", "Calendar", "Client", "Command", "ConfigurationError", "Context", "CronstreamError",
    "DefinitionError", "DefinitionProblem", "DefinitionVersion", "EventBatch", "EventTrigger",
    "Execution", "ExecutionEvent", "JobDefinition", "LogEntry", "NonRetryableError", "NotFoundError",
    "ParamsError", "ResultOmittedError", "TriggerEvent", "UnavailableError", "events", "handler",
]
# The verbs a user scripts against; the CLI's and the dashboard's plumbing (a query's raw
# rows, a run at a given time, a command of any kind...) is `_plumbing.Plumbing`.
VERBS = [
    "apply", "apply_calendar", "apply_calendars", "approve", "calendar", "calendar_history",
    "calendars", "cancel", "close", "definitions", "delete", "delete_calendar", "delete_pool",
    "execution", "follow_logs", "get", "history", "list", "logs", "pause", "pools", "reject",
    "resume", "runs", "set_pool", "trigger", "version",
]
ERRORS = ["ConfigurationError", "CronstreamError", "DefinitionError", "NotFoundError",
          "ParamsError", "ResultOmittedError", "UnavailableError"]


def public_methods(cls: type) -> list[str]:
    return sorted(name for name, member in vars(cls).items()
                  if not name.startswith("_") and inspect.isfunction(member))


def test_public_api_is_pinned() -> None:
    assert sorted(cronstream.__all__) == EXPORTS
    assert all(hasattr(cronstream, name) for name in cronstream.__all__)
    assert cronstream.events.__all__ == ["ExecutionEvent", "Subscription", "subscribe"]
    assert cronstream.client.__all__ == ["AsyncClient", "Client"]


def test_the_clients_keep_the_verbs_and_only_them() -> None:
    assert public_methods(Client) == VERBS
    assert public_methods(AsyncClient) == VERBS
    for plumbing in ("fetch", "submit", "command", "get_with_offset", "set_enabled",
                     "cancel_retry", "cancel_pending_retry"):
        assert not hasattr(Client, plumbing) and not hasattr(AsyncClient, plumbing), plumbing
    assert not hasattr(AsyncClient(), "settings"), "no internal settings on show"


@pytest.mark.parametrize("cls", [Client, AsyncClient, Plumbing])
def test_every_public_method_has_a_docstring(cls: type) -> None:
    assert inspect.getdoc(cls)
    missing = [name for name in public_methods(cls) if not inspect.getdoc(getattr(cls, name))]
    assert missing == []


def test_the_two_clients_take_the_same_arguments() -> None:
    for name in [*VERBS, "__init__"]:
        sync = inspect.signature(getattr(Client, name)).parameters
        coroutine = inspect.signature(getattr(AsyncClient, name)).parameters
        # follow_logs's poll interval is the coroutine's alone.
        assert list(sync) == [p for p in coroutine if p != "poll_seconds"], name


def test_every_error_is_exported_and_is_a_cronstream_error() -> None:
    exported = [n for n in cronstream.__all__
                if isinstance(getattr(cronstream, n), type) and issubclass(getattr(cronstream, n), Exception)
                and n != "NonRetryableError"]  # raised by handlers, not by the SDK
    assert sorted(exported) == ERRORS
    assert all(issubclass(getattr(cronstream, n), CronstreamError) for n in exported)
    assert set(cronstream.errors.__all__) <= set(cronstream.__all__)


# -- configuration --------------------------------------------------------------------


def settings_of(client: Client | AsyncClient) -> Any:
    return (client._async if isinstance(client, Client) else client)._plumbing.settings


@pytest.fixture(autouse=True)
def no_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the environment configures, the tests set themselves."""
    for name in list(os.environ):
        if name.startswith("CRONSTREAM_"):
            monkeypatch.delenv(name)


def test_a_client_is_configured_by_plain_arguments_over_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRONSTREAM_TOPIC_PREFIX", "env.")
    monkeypatch.setenv("CRONSTREAM_DATABASE_URL", "postgresql://env@db/env")
    monkeypatch.setenv("CRONSTREAM_KAFKA_SECURITY_PROTOCOL", "SSL")
    with Client(bootstrap_servers="k1:9092,k2:9092", topic_prefix="prod.",
                kafka_config={"client.rack": "eu-1"}, timeout=3) as client:
        settings = settings_of(client)
        assert (settings.kafka_bootstrap_servers, settings.topic_prefix, settings.database_url) \
            == ("k1:9092,k2:9092", "prod.", "postgresql://env@db/env"), "what is not given: the environment"
        assert settings.kafka_config == {"security.protocol": "SSL", "client.rack": "eu-1"}
        assert client._async._plumbing.timeout == 3
    with Client() as client:
        assert settings_of(client).topic_prefix == "env."
    given = settings_of(AsyncClient(database_url="postgresql://a@b/c"))
    with Client(given, topic_prefix="other.") as client:  # the services' settings, overridden
        assert (settings_of(client).topic_prefix, settings_of(client).database_url) == \
            ("other.", "postgresql://a@b/c")
    with Client(given) as client:
        assert settings_of(client) is given


def test_a_bad_configuration_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="topic_prefix: String should match") as caught:
        AsyncClient(topic_prefix="bad prefix!")
    assert caught.value.settings == ("topic_prefix",) and isinstance(caught.value, ValueError)
    monkeypatch.setenv("CRONSTREAM_TOPIC_PREFIX", "also bad!")
    with pytest.raises(ConfigurationError, match="CRONSTREAM_TOPIC_PREFIX") as caught:
        Client()
    assert caught.value.settings == ("topic_prefix",)
    with Client(topic_prefix="fine.") as client:  # an argument replaces the variable
        assert settings_of(client).topic_prefix == "fine."


# -- errors carry their data ----------------------------------------------------------


def test_a_definition_error_lists_each_problem_with_its_job_and_field() -> None:
    with pytest.raises(DefinitionError) as caught:
        parse_definitions([
            {"job_id": "fine", "type": "INTERVAL", "interval_seconds": 60, "handler": "noop"},
            {"job_id": "bad", "type": "INTERVAL", "interval_seconds": 60, "handler": "noop",
             "timout_seconds": 5, "max_retries": -1},
            {"type": "INTERVAL", "interval_seconds": 60, "handler": "noop"},
            JobDefinition.model_validate({"job_id": "typo", "type": "INTERVAL", "interval_seconds": 60,
                                          "handler": "noop", "prioriti": 3}),
        ], "apply")
    error = caught.value
    assert "apply: definition #2 (job_id 'bad'): " in str(error), "the message is unchanged"
    assert {(p.job_id, p.field, p.index) for p in error.problems} == {
        ("bad", "timout_seconds", 2), ("bad", "max_retries", 2), (None, "job_id", 3),
        ("typo", "prioriti", 4)}
    assert all(p.source == "apply" and p.reason for p in error.problems)
    assert error.job_ids == ["bad", "typo"]
    (typo,) = [p for p in error.problems if p.job_id == "typo"]
    assert str(typo) == "apply: job_id 'typo': prioriti: unknown field of JobDefinition"


def test_a_dag_and_a_file_problem_say_where() -> None:
    step = JobDefinition.from_dict({"job_id": "a", "type": "DEPENDENT", "depends_on": ["a2"],
                                    "handler": "noop"})
    loop = JobDefinition.from_dict({"job_id": "a2", "type": "DEPENDENT", "depends_on": ["a"],
                                    "handler": "noop"})
    with pytest.raises(DefinitionError) as caught:
        check_dags([step, loop], {})
    assert {(p.job_id, p.field) for p in caught.value.problems} == {("a", "depends_on"),
                                                                   ("a2", "depends_on")}
    with pytest.raises(DefinitionError) as caught:
        load_sources(["/nonexistent/jobs.yaml"])
    (problem,) = caught.value.problems
    assert (problem.source, problem.job_id, problem.field) == ("/nonexistent/jobs.yaml", None, None)
    assert DefinitionError("no place").problems == (DefinitionProblem("no place"),)


def test_params_errors_name_the_job_and_the_key_and_send_nothing() -> None:
    definition = JobDefinition.from_dict({"job_id": "nightly", "type": "INTERVAL",
                                          "interval_seconds": 60, "handler": "noop"})
    # Nothing can be sent: no server answers at this address, and none is asked.
    plumbing = AsyncClient(bootstrap_servers="127.0.0.1:1", timeout=1)._plumbing

    def submit(params: Any) -> ParamsError:
        with pytest.raises(ParamsError) as caught:
            asyncio.run(plumbing.submit(definition, datetime.now(UTC), "MANUAL", params=params))
        return caught.value

    bad = submit({"region": "eu", "when": object()})
    assert (bad.job_id, bad.key) == ("nightly", "when")
    assert str(bad).startswith("job 'nightly': params: not JSON data")
    assert submit(["not", "a", "mapping"]).key is None
    assert submit({"blob": "x" * 100_000}).key is None, "too large: the params as a whole"


def test_not_found_unavailable_and_omitted_results_carry_what_they_are_about() -> None:
    execution = uuid.uuid4()
    missing = NotFoundError("no execution", execution_id=execution, attempt=2)
    assert (missing.execution_id, missing.attempt, missing.job_id, missing.version) == \
        (execution, 2, None, None)
    down = UnavailableError("cannot reach Kafka at k:9092: timed out", service="kafka", server="k:9092")
    assert isinstance(down, ConnectionError) and (down.service, down.server) == ("kafka", "k:9092")
    omitted = UpstreamResult(execution, "COMPLETED", result_omitted=True)
    with pytest.raises(ResultOmittedError) as caught:
        _ = omitted.result
    assert caught.value.execution_id == execution and isinstance(caught.value, LookupError)


def test_the_reference_names_each_errors_attributes() -> None:
    """docs/reference/python.md#errors is written by hand: each error has its row, and the
    row names every attribute the error carries."""
    root = Path(__file__).resolve().parents[2]
    section = (root / "docs/reference/python.md").read_text().split("## Errors", 1)[1]
    rows = {line.split("`")[1]: line for line in section.splitlines() if line.startswith("| `")}
    for name in ERRORS:
        if name == "CronstreamError":
            continue
        carried = [a for a in vars(getattr(cronstream, name)("message")) if not a.startswith("_")]
        assert carried and name in rows, name
        assert [a for a in carried if f"`{a}`" not in rows[name]] == [], name


def test_the_docs_no_longer_build_settings_for_a_client() -> None:
    root = Path(__file__).resolve().parents[2]
    for page in ("README.md", "docs/reference/python.md", "examples/sdk_client.py"):
        text = (root / page).read_text()
        assert "Client(Settings" not in text and "from cronstream.shared" not in text, page
