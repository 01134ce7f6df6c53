"""Run inputs without Kafka: a run's params (the job's, overlaid; their limits; the CLI's
--param), a DAG step's view of its upstreams (its budget, what the handler sees, the pool
protocol carrying it) and the run limit of `max_concurrent_runs`."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import click
import pytest
from click.testing import CliRunner

import tests.e2e.handlers_for_tests  # noqa: F401  (registers test.upstream here too)
from cronstream.cli import cli
from cronstream.cli.run_params import given_params, parse_param, parse_value
from cronstream.handlers import REGISTRY, ResultOmittedError, Upstream
from cronstream.services.dispatcher.policy import PolicyState
from cronstream.services.scheduler.clock import Clock, JobClock
from cronstream.services.worker.pool import PoolRunner
from cronstream.services.worker.runner import CancelSignal, Invocation
from cronstream.shared.codec import MAX_RECORD_BYTES, decode
from cronstream.shared.fast_records import FastDue, decode_due
from cronstream.shared.ids import retry_execution_id
from cronstream.shared.records import (
    MAX_PARAMS_BYTES,
    MAX_UPSTREAM_RESULTS_BYTES,
    ExecutionEvent,
    JobDefinition,
    JobDue,
    JobSnapshot,
    RetryRequest,
    run_params,
)
from cronstream.shared.records import Upstream as UpstreamRecord
from cronstream.shared.retry import next_attempt

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HANDLERS = "tests.e2e.handlers_for_tests"


def job(**fields: Any) -> JobDefinition:
    return JobDefinition.from_dict({"job_id": "export", "type": "INTERVAL", "interval_seconds": 60,
                                    "handler": "noop", **fields})


def due(snapshot: JobSnapshot, *, upstream: UpstreamRecord | None = None, run: uuid.UUID | None = None,
        reason: str = "MANUAL", **fields: Any) -> JobDue:
    return JobDue.model_validate({
        "execution_id": uuid.uuid4(), "job_id": "export", "run_id": run or uuid.uuid4(),
        "scheduled_at": T0, "reason": reason, "idempotency_key": "k", "job": snapshot,
        "upstream": upstream, **fields}, strict=False)


# -- params ----------------------------------------------------------------------------------

def test_a_runs_params_are_the_jobs_overlaid_key_by_key() -> None:
    definition = job(params={"region": "all", "limit": 10, "nested": {"a": 1}})
    assert run_params(definition, {"region": "eu", "nested": {"b": 2}}) == {
        "region": "eu", "limit": 10, "nested": {"b": 2}}
    assert run_params(definition, None) == definition.params
    assert definition.params == {"region": "all", "limit": 10, "nested": {"a": 1}}, "untouched"


def test_a_runs_params_are_held_to_a_definitions_limits() -> None:
    definition = job(params={"big": "x" * (MAX_PARAMS_BYTES // 2)})
    with pytest.raises(ValueError, match=r"params: .* bytes of JSON; the limit is 65536"):
        run_params(definition, {"more": "y" * (MAX_PARAMS_BYTES // 2)})
    with pytest.raises(ValueError, match="must be a JSON object"):
        run_params(definition, ["region", "eu"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not JSON data"):
        run_params(definition, {"when": object()})


@pytest.mark.parametrize(("given", "expected"), [
    ("region=eu", ("region", "eu")), ("limit=100", ("limit", 100)), ("dry=true", ("dry", True)),
    ('tags=["a","b"]', ("tags", ["a", "b"])), ('q="42"', ("q", "42")), ("x=", ("x", "")),
    ("v=NaN", ("v", "NaN")), ("eq=a=b", ("eq", "a=b")), (" k =1.5", ("k", 1.5)),
    ("o={not json", ("o", "{not json")),
])
def test_a_param_value_that_parses_as_json_is_that_json_otherwise_a_string(
        given: str, expected: tuple[str, Any]) -> None:
    assert parse_param(given) == expected


@pytest.mark.parametrize("given", ["region", "=eu", " =1"])
def test_a_malformed_param_is_a_usage_error_that_names_it(given: str) -> None:
    with pytest.raises(click.BadParameter, match="expected KEY=VALUE") as raised:
        parse_param(given)
    assert repr(given) in str(raised.value.message)


def test_the_params_file_comes_first_and_params_apply_over_it(tmp_path: Any) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"region": "us", "limit": 5}))
    assert given_params(("region=eu",), str(path)) == {"region": "eu", "limit": 5}
    assert given_params((), None) is None
    path.write_text("[1, 2]")
    with pytest.raises(click.BadParameter, match="expected a JSON object"):
        given_params((), str(path))
    assert parse_value("Infinity") == "Infinity", "not JSON: a string"


def test_the_cli_refuses_a_malformed_param_with_exit_2_before_reaching_any_server() -> None:
    result = CliRunner().invoke(cli, ["--bootstrap-servers", "127.0.0.1:1", "--timeout", "0.5",
                                      "trigger", "export", "--param", "region"])
    assert result.exit_code == 2, result.output
    assert "--param" in result.output and "'region'" in result.output


# -- a DAG step's view of its run ------------------------------------------------------------

def test_upstream_results_are_carried_in_order_while_they_fit_together() -> None:
    big = {"blob": "x" * (MAX_UPSTREAM_RESULTS_BYTES * 4 // 10)}  # two fit, not three
    ids = [uuid.uuid4() for _ in range(5)]
    view = UpstreamRecord.of({"region": "eu"}, [
        ("a", ids[0], "COMPLETED", big), ("b", ids[1], "COMPLETED", big),
        ("c", ids[2], "COMPLETED", big), ("d", ids[3], "COMPLETED", {"rows": 3}),
        ("e", ids[4], "SKIPPED", None)])
    carried = {k: (e.result_omitted, e.result is not None) for k, e in view.executions.items()}
    assert carried == {"a": (False, True), "b": (False, True), "c": (True, False),
                       "d": (False, True), "e": (False, False)}
    assert view.executions["d"].result == {"rows": 3} and view.root_params == {"region": "eu"}
    assert [e.execution_id for e in view.executions.values()] == ids


def test_a_join_at_every_limit_stays_a_record_every_consumer_reads() -> None:
    """64 upstreams with 64 KiB results each, the step's own params and the root's at their
    limits: the JobDue (and its retry's RetryRequest) stays under the record limit, the
    results that do not fit are marked omitted, and the fast path and the model read it."""
    full = {"k": "é" * (MAX_PARAMS_BYTES // 2 - 16)}
    result = {"r": "x" * (64 * 1024 - 16)}
    view = UpstreamRecord.of(full, [(f"up-{i}", uuid.uuid4(), "COMPLETED", result) for i in range(64)])
    step = due(JobSnapshot(handler="test.upstream", params=full), upstream=view, reason="DEPENDENCY")
    raw = step.to_json()
    assert len(raw) <= MAX_RECORD_BYTES, len(raw)
    assert sum(e.result_omitted for e in view.executions.values()) == 62
    assert decode(JobDue, raw, key=b"export", key_field="job_id") == step
    assert decode_due(raw, b"export") == step
    retry = next_attempt(step, T0, __import__("random").Random(1))
    assert retry.upstream == view and len(retry.to_json()) <= MAX_RECORD_BYTES
    assert decode(RetryRequest, retry.to_json(), key=None) == retry


def test_the_handler_sees_a_read_only_mapping_and_an_omitted_result_says_where_it_is() -> None:
    done, omitted = uuid.uuid4(), uuid.uuid4()
    view = UpstreamRecord.of({"region": "eu"}, [("extract", done, "COMPLETED", {"rows": 3})])
    view = view.model_copy(update={"executions": {
        **view.executions, "huge": view.executions["extract"].model_copy(
            update={"execution_id": omitted, "result": None, "result_omitted": True})}})
    ctx = Invocation.of(due(JobSnapshot(handler="x", params={"own": 1}), upstream=view)).context(
        lambda p, m: None, CancelSignal().flag, None)
    assert list(ctx.upstream) == ["extract", "huge"]
    assert ctx.upstream["extract"].result == {"rows": 3}
    assert (ctx.upstream["extract"].status, ctx.upstream["extract"].execution_id) == ("COMPLETED", done)
    assert ctx.upstream.root_params == {"region": "eu"}
    with pytest.raises(ResultOmittedError, match=str(omitted)):
        _ = ctx.upstream["huge"].result
    with pytest.raises(KeyError, match="not an upstream"):
        _ = ctx.upstream["nope"]
    with pytest.raises(TypeError):
        ctx.upstream["extract"] = None  # type: ignore[index]
    with pytest.raises(TypeError):
        ctx.upstream.root_params["region"] = "us"  # type: ignore[index]
    plain = Invocation.of(due(JobSnapshot(handler="x", params={"own": 1}))).context(
        lambda p, m: None, CancelSignal().flag, None)
    assert isinstance(plain.upstream, Upstream) and len(plain.upstream) == 0
    assert plain.upstream.root_params == {"own": 1}, "a root's run params are its own"


def test_a_pool_handler_gets_the_steps_upstream_across_the_pipe() -> None:
    view = UpstreamRecord.of({"region": "eu"}, [
        ("extract", uuid.uuid4(), "COMPLETED", {"rows": 3, "line": "a\nb ü"}),
        ("validate", uuid.uuid4(), "SKIPPED", None)])
    step = due(JobSnapshot(handler="test.upstream", params={"own": True}, timeout_seconds=60),
               upstream=view, reason="DEPENDENCY")
    fast = decode_due(step.to_json(), b"export")
    assert isinstance(fast, FastDue), "the usual path: the worker holds the fast record"

    async def scenario() -> Any:
        runner = PoolRunner(REGISTRY, 1, [HANDLERS])
        await runner.start()
        try:
            return await asyncio.wait_for(runner.run(fast, lambda p, m: None, CancelSignal()), 30)
        finally:
            await runner.close()

    outcome = asyncio.run(scenario())
    assert outcome.status == "COMPLETED", outcome
    assert outcome.result == {
        "upstream": {job_id: {"status": e.status, "execution_id": str(e.execution_id),
                              "result": e.result} for job_id, e in view.executions.items()},
        "root_params": {"region": "eu"}, "params": {"own": True}, "attempt": 1}


# -- max_concurrent_runs -----------------------------------------------------------------------

def test_max_concurrent_runs_is_refused_where_it_contradicts_the_policy() -> None:
    assert job(max_concurrent_runs=3).max_concurrent_runs == 3
    assert job(concurrency_policy="FORBID", max_concurrent_runs=1).max_concurrent_runs == 1
    for fields, words in (({"concurrency_policy": "FORBID", "max_concurrent_runs": 2}, "contradicts"),
                          ({"concurrency_policy": "REPLACE", "max_concurrent_runs": 2}, "REPLACE"),
                          ({"max_concurrent_runs": 0}, "greater than or equal to 1")):
        with pytest.raises(ValueError, match=words):
            job(**fields)


def test_a_limit_of_n_skips_the_run_beyond_n_and_frees_a_place_when_one_ends() -> None:
    state = PolicyState()
    snapshot = JobSnapshot.of(job(max_concurrent_runs=2, max_retries=1))
    first, second = due(snapshot, reason="SCHEDULE"), due(snapshot, reason="MANUAL")
    for d in (first, second):
        assert state.decide(d) == "QUEUE"
        state.queued(d, 0)
    third = due(snapshot)
    assert state.decide(third) == "SKIP"
    reason = state.skip_reason(third)
    assert "2 runs of this job are active, max_concurrent_runs is 2" in reason
    assert str(first.execution_id) in reason and str(second.execution_id) in reason
    # A failed attempt with a retry pending still holds its run's place...
    state.observe(ExecutionEvent.for_due(first, "FAILED"), 0)
    assert state.decide(third) == "SKIP"
    # ...its retry continues an admitted run; its end frees the place.
    retry = due(snapshot, reason="RETRY", run=first.run_id, attempt_number=2,
                execution_id=retry_execution_id("export", first.run_id, 2))
    assert state.decide(retry) == "QUEUE"
    state.observe(ExecutionEvent.for_due(retry, "COMPLETED"), 0)
    assert state.decide(third) == "QUEUE"


def test_a_job_with_a_run_limit_is_not_fired_ahead() -> None:
    clock = Clock()
    for job_id, fields in (("free", {}), ("limited", {"max_concurrent_runs": 2})):
        definition = job(job_id=job_id, **fields)
        clock.apply_definition(job_id, definition, definition.to_json(), 0, 0)
    assert Clock.fires_ahead(clock.jobs["free"])
    assert not Clock.fires_ahead(clock.jobs["limited"])
    assert isinstance(clock.jobs["limited"], JobClock)


def test_pooled_and_keyed_jobs_fire_ahead_and_rate_limited_ones_when_due() -> None:
    """The dispatcher admits a pooled or keyed run whenever its JobDue comes (decision
    0056): committing it ahead holds its slot at most the window longer, and cuts the
    scheduler's rounds to the long gap. A rate limit counts starts by admission: its runs
    fire when due."""
    clock = Clock()
    for job_id, fields in (("pooled", {"pool": "etl"}),
                           ("keyed", {"concurrency": {"key": "params.customer", "max_running": 1}}),
                           ("rated", {"rate_limit": "10/m"})):
        definition = job(job_id=job_id, **fields)
        clock.apply_definition(job_id, definition, definition.to_json(), 0, 0)
    assert Clock.fires_ahead(clock.jobs["pooled"]) and Clock.fires_ahead(clock.jobs["keyed"])
    assert not Clock.fires_ahead(clock.jobs["rated"])
