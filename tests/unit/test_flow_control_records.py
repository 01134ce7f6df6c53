"""Flow control's records (decision 0056): a definition's `concurrency`, `pool`,
`pool_slots` and `rate_limit`, the Pool record, the WAITING status — validated with errors
that name the field, in the SDK and the CLI."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from click.testing import CliRunner

from cronstream.cli import cli
from cronstream.definitions import check_pools, parse_definitions, pool_record
from cronstream.errors import DefinitionError
from cronstream.shared.condition import ConditionError, parse_expression
from cronstream.shared.fast_records import FastDue, decode_due
from cronstream.shared.records import (
    ExecutionEvent,
    JobDefinition,
    JobDue,
    JobSnapshot,
    Pool,
    parse_rate_limit,
)
from cronstream.shared.statuses import ACTIVE, TERMINAL, Status

BASE: dict[str, Any] = {"job_id": "export", "type": "INTERVAL", "interval_seconds": 60,
                        "handler": "noop", "params": {"customer": 42}}


def definition(**fields: Any) -> JobDefinition:
    return parse_definitions([{**BASE, **fields}], "test")[0]


def test_a_definition_takes_every_flow_control_field_and_its_snapshot_carries_them() -> None:
    d = definition(concurrency={"key": "params.customer", "max_running": 2}, pool="etl",
                   pool_slots=3, rate_limit="100/m")
    snapshot = JobSnapshot.of(d)
    assert (snapshot.concurrency, snapshot.pool, snapshot.pool_slots, snapshot.rate_limit) == \
        (d.concurrency, "etl", 3, "100/m")
    assert definition().concurrency is None and definition().pool_slots == 1


@pytest.mark.parametrize(("fields", "field", "needle"), [
    ({"concurrency": {"key": "customer", "max_running": 1}}, "concurrency.key",
     "does not start with 'params'"),
    ({"concurrency": {"key": "params.a ==", "max_running": 1}}, "concurrency.key",
     "unexpected end"),
    ({"concurrency": {"key": "params.a", "max_running": 0}}, "concurrency.max_running", "greater than or equal to 1"),
    ({"concurrency": {"key": "params.a"}}, "concurrency.max_running", "required"),
    ({"concurrency": {"max_running": 1, "keys": "x"}}, "concurrency.keys", "not permitted"),
    ({"rate_limit": "100/d"}, "rate_limit", "write N/s, N/m or N/h"),
    ({"rate_limit": "0/s"}, "rate_limit", "N at least 1"),
    ({"pool": "no spaces"}, "pool", "pattern"),
    ({"pool": "etl", "pool_slots": 0}, "pool_slots", "greater than or equal to 1"),
    ({"pool_slots": 2}, "pool_slots", "needs a pool"),
])
def test_bad_flow_control_is_refused_naming_the_field(fields: dict[str, Any], field: str,
                                                     needle: str) -> None:
    with pytest.raises(DefinitionError) as caught:
        definition(**fields)
    assert [p.field for p in caught.value.problems] == [field]
    assert needle in str(caught.value)


def test_a_key_is_an_expression_over_params_in_the_conditions_language() -> None:
    assert parse_expression("params.customer", ["params"]).value({"params": {"customer": 42}}) == 42
    assert parse_expression("params.tenants[1]", ["params"]).value(
        {"params": {"tenants": ["a", "b"]}}) == "b"
    assert parse_expression('params.tier == "gold"', ["params"]).value({"params": {"tier": "gold"}}) is True
    assert parse_expression("params.missing.deeper", ["params"]).value({"params": {}}) is None
    with pytest.raises(ConditionError):
        parse_expression("extract.result.rows", ["params"])


@pytest.mark.parametrize(("text", "rate"), [("1/s", (1, 1)), ("100/m", (100, 60)), ("5/h", (5, 3600))])
def test_a_rate_limit_is_starts_per_window(text: str, rate: tuple[int, int]) -> None:
    assert parse_rate_limit(text) == rate


def test_a_pool_is_validated_naming_the_field() -> None:
    assert pool_record("etl", 4, "the warehouse", "ann").slots == 4
    assert Pool.from_dict({"pool": "paused", "slots": 0}).slots == 0
    with pytest.raises(DefinitionError) as caught:
        pool_record("etl", -1, None, "ann")
    assert [p.field for p in caught.value.problems] == ["slots"]


def test_apply_refuses_a_job_naming_a_missing_pool_or_more_slots_than_it_has() -> None:
    pools = {"etl": Pool.from_dict({"pool": "etl", "slots": 2})}
    check_pools([definition(pool="etl", pool_slots=2)], pools)
    with pytest.raises(DefinitionError, match=r"no pool .other.*cronstream pool set other"):
        check_pools([definition(pool="other")], pools)
    with pytest.raises(DefinitionError, match="pool_slots: 3 is more than pool 'etl' has"):
        check_pools([definition(pool="etl", pool_slots=3)], pools)


def test_waiting_is_an_active_status_with_its_reason_on_the_event() -> None:
    assert Status.WAITING not in TERMINAL and "QUEUED" in (Status.WAITING.__doc__ or "")
    due = JobDue.first(definition(), datetime(2026, 1, 1, tzinfo=UTC), "SCHEDULE")
    event = ExecutionEvent.for_due(due, "WAITING", waiting_reason="pool etl: 4 of 4 slots in use")
    assert ExecutionEvent.model_validate_json(event.to_json()).waiting_reason == \
        "pool etl: 4 of 4 slots in use"
    assert {Status.QUEUED, Status.RUNNING} <= ACTIVE


def test_a_keyed_due_is_read_by_the_model_which_parses_its_key() -> None:
    plain = JobDue.first(definition(pool="etl", rate_limit="2/s"), datetime(2026, 1, 1, tzinfo=UTC), "SCHEDULE")
    keyed = JobDue.first(definition(concurrency={"key": "params.customer", "max_running": 1}),
                         datetime(2026, 1, 1, tzinfo=UTC), "SCHEDULE")
    assert isinstance(decode_due(plain.to_json(), b"export"), FastDue)
    assert isinstance(decode_due(keyed.to_json(), b"export"), JobDue)
    bad = json.loads(keyed.to_json())
    bad["job"]["concurrency"]["key"] = "nope"
    with pytest.raises(ValueError, match="concurrency"):
        decode_due(json.dumps(bad).encode(), b"export")


def test_pool_set_refuses_before_connecting_naming_the_field() -> None:
    result = CliRunner().invoke(cli, ["--bootstrap-servers", "127.0.0.1:1", "pool", "set",
                                      "etl", "--slots", "-3"])
    assert result.exit_code == 1, result.output
    assert "nothing was sent" in result.output and "slots" in result.output


def test_describe_job_says_what_holds_its_executions_back(capsys: pytest.CaptureFixture[str]) -> None:
    from cronstream.cli.inspect_cmds import _flow_fields

    _flow_fields(definition(concurrency={"key": "params.customer", "max_running": 2}, pool="etl",
                            pool_slots=2, rate_limit="100/m"))
    out = capsys.readouterr().out
    assert "2 running at once per params.customer; pool etl (2 slots each); at most 100/m starts" in out
    _flow_fields(definition())
    assert capsys.readouterr().out == ""


def test_the_dispatcher_reads_an_events_end_from_its_top_level_fields_only() -> None:
    """Flow control reads only `status` and `execution_id` of a followed job's events
    (fast_records.ending_of): a result or a message that holds the same names, nested or
    in text, never stands for them."""
    from cronstream.shared.fast_records import ending_of

    d = JobDue(execution_id=uuid.uuid4(), job_id="job", run_id=uuid.uuid4(),
               scheduled_at=datetime(2026, 11, 30, tzinfo=UTC), reason="MANUAL",
               idempotency_key="k", job=JobSnapshot(handler="noop", pool="etl"))
    completed = ExecutionEvent.for_due(
        d, "COMPLETED", completed_at=datetime(2026, 11, 30, 0, 1, tzinfo=UTC),
        result={"status": "RUNNING", "execution_id": str(uuid.uuid4())},
        error_message='"status":"QUEUED"')
    assert ending_of(completed.to_json()) == ("COMPLETED", d.execution_id)
    running = ExecutionEvent.for_due(d, "RUNNING", worker_id="w", result={"status": "COMPLETED"})
    assert ending_of(running.to_json()) == ("RUNNING", d.execution_id)
    assert ending_of(b"not json") is None and ending_of(None) is None
