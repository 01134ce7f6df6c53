"""The generated JSON Schemas match the models; definition files load with clear errors."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cronstream.definitions import check_dags, load_definitions
from cronstream.errors import DefinitionError
from cronstream.handlers import Context, Upstream, UpstreamResult
from cronstream.shared.fast_records import FastTriggerEvent
from cronstream.shared.schemagen import MODELS, render

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", list(MODELS))
def test_schema_files_match_the_models(name: str) -> None:
    path = ROOT / "schemas" / f"{name}.schema.json"
    assert path.read_text() == render(name, MODELS[name]), \
        f"{path} is stale: run `make schemas` and commit the result"


def test_examples_are_valid() -> None:
    definitions = load_definitions(ROOT / "examples" / "jobs.yaml")
    assert {d.type for d in definitions} >= {"CRON", "INTERVAL"}
    pipeline = load_definitions(ROOT / "examples" / "pipeline.yaml")
    check_dags(pipeline, {d.job_id: d for d in definitions})
    assert [d.type for d in pipeline] == ["CRON", "DEPENDENT", "DEPENDENT", "EVENT"]


def test_the_example_pipeline_passes_its_data_along() -> None:
    """The example's handlers, given what their upstreams return (as a worker gives it)."""
    import examples.pipeline_handlers as steps

    def context(params: dict[str, Any], upstream: dict[str, Any], root: dict[str, Any]) -> Context:
        ids = {job_id: uuid.uuid4() for job_id in upstream}
        return Context(execution_id=uuid.uuid4(), job_id="x", run_id=uuid.uuid4(), attempt_number=1,
                       idempotency_key="k", scheduled_at=datetime.now(UTC), params=params,
                       _upstream=Upstream({j: UpstreamResult(ids[j], "COMPLETED", False, r)
                                           for j, r in upstream.items()}, root))

    root = {"region": "eu", "rows": 2}
    extracted = steps.extract(context(root, {}, root))
    transformed = steps.transform(context({"factor": 10}, {"example.pipeline.extract": extracted}, root))
    loaded = steps.load(context({}, {"example.pipeline.transform": transformed}, root))
    assert transformed == {"rows": [{"region": "eu", "n": 0}, {"region": "eu", "n": 10}]}
    assert (loaded["loaded"], loaded["region"]) == (2, "eu")
    # The audit's records: the loads' COMPLETED events, as the trigger hands them over.
    completed = [FastTriggerEvent(topic="cronstream.execution-events", partition=0, offset=o,
                                  timestamp=datetime.now(UTC), value={"status": "COMPLETED", "result": r})
                 for o, r in ((4, loaded), (9, {**loaded, "region": "us"}))]
    audit = context({}, {}, {})
    audit._events = completed
    assert steps.audit(audit) == {"audited": 2, "regions": ["eu", "us"], "offsets": [4, 9]}


def test_multi_document_yaml_lists_and_jobs_key(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text("jobs:\n  - {job_id: a, type: INTERVAL, interval_seconds: 5, handler: noop}\n"
                    "  - {job_id: b, type: ONE_TIME, run_at: 2030-01-01T00:00:00Z, handler: noop}\n")
    assert [d.job_id for d in load_definitions(path)] == ["a", "b"]


def test_every_problem_is_reported_with_its_place(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text("job_id: a\ntype: CRON\nschedule: '* *'\nhandler: noop\n---\n"
                    "job_id: a\ntype: INTERVAL\ninterval_seconds: 5\nhandler: noop\n---\n"
                    "- not a mapping\n")
    with pytest.raises(DefinitionError) as caught:
        load_definitions(path)
    message = str(caught.value)
    assert "definition #1 (job_id 'a'): schedule: invalid cron expression" in message
    assert "definition #3: expected a mapping" in message


def test_naive_times_in_yaml_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text("job_id: a\ntype: ONE_TIME\nrun_at: 2030-01-01 10:00:00\nhandler: noop\n")
    with pytest.raises(DefinitionError, match="run_at: Input should have timezone info"):
        load_definitions(path)
