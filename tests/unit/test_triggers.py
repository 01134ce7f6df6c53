"""Event triggers' pure core (services/scheduler/triggers.py, decision 0057): filters over
a record, batches by count, wait and size, and the positions each batch commits."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cronstream.services.scheduler.triggers import (
    Batcher,
    SourceRecord,
    TriggerState,
    decoded_value,
    fed,
    filter_view,
    lag,
    state_of,
)
from cronstream.shared.condition import ConditionError, parse_filter
from cronstream.shared.records import MAX_EVENTS_BYTES, EventTrigger

T = 1_780_000_000_000  # epoch ms


def trigger(**fields: Any) -> EventTrigger:
    return EventTrigger.model_validate({"topic": "orders", **fields})


def rec(offset: int, value: Any = None, *, partition: int = 0, ts: int = T, key: bytes | None = b"k",
        raw: bytes | None = None, headers: list[tuple[str, bytes | None]] | None = None) -> SourceRecord:
    body = raw if raw is not None else json.dumps(value if value is not None else {"n": offset}).encode()
    return SourceRecord("orders", partition, offset, ts, key, body, headers)


# -- filters ------------------------------------------------------------------------


def test_a_filter_reads_every_field_of_the_record() -> None:
    record = rec(41, {"job_id": "etl", "status": "COMPLETED", "rows": [3, 4]}, partition=2,
                 headers=[("source", b"billing"), ("empty", None)])
    view = filter_view(record)
    assert view == {"key": "k", "value": {"job_id": "etl", "status": "COMPLETED", "rows": [3, 4]},
                    "headers": {"source": "billing", "empty": None}, "topic": "orders",
                    "partition": 2, "offset": 41, "timestamp": T}
    for text in ['value.job_id == "etl" and value.status == "COMPLETED"', "value.rows[1] == 4",
                 'headers.source == "billing"', "partition == 2 and offset >= 41",
                 f"timestamp >= {T}", 'key == "k"', 'topic == "orders"', "headers.empty == null"]:
        assert parse_filter(text).matches(view), text
    assert not parse_filter('value.status == "FAILED"').matches(view)


def test_a_value_that_is_not_json_is_its_text() -> None:
    assert decoded_value(b"plain text") == "plain text"
    assert decoded_value(b"\xff\xfeoops") == "\ufffd\ufffdoops"
    assert decoded_value(b"[" * 100_000) == "[" * 100_000  # deeper than a parser goes
    assert decoded_value(None) is None
    assert parse_filter('value == "plain text"').matches(filter_view(rec(0, raw=b"plain text")))
    # A path into a text value is null, never an error.
    assert not parse_filter('value.status == "x"').matches(filter_view(rec(0, raw=b"text")))


@pytest.mark.parametrize(("text", "reason"), [
    ("extract.result.rows > 0", "a filter reads key, value, headers"),
    ("offset.x == 1", "offset has no fields"),
    ("value ==", "unexpected end"),
])
def test_a_filter_that_does_not_parse_says_why(text: str, reason: str) -> None:
    with pytest.raises(ConditionError, match=reason):
        parse_filter(text)


def test_a_record_the_filter_cannot_evaluate_is_counted_and_passed_over() -> None:
    class Exploding:
        def matches(self, view: Any) -> bool:
            raise RecursionError("maximum recursion depth exceeded")

    batcher = Batcher(trigger(filter="value.n > 0"))
    batcher.condition = Exploding()  # type: ignore[assignment]
    assert batcher.add(rec(0), T) is None
    assert (batcher.unevaluable, batcher.passed_over, batcher.events) == (1, 1, [])
    assert batcher.positions == {0: 1}
    batcher.condition = parse_filter("value.n > 0")
    closed = batcher.add(rec(1), T)
    assert closed is not None and [e.offset for e in closed.events] == [1]


# -- batches ------------------------------------------------------------------------


def test_one_event_per_run_by_default() -> None:
    batcher = Batcher(trigger())
    closed = fed(batcher, [rec(0), rec(1), rec(2)], T)
    assert [[e.offset for e in c.events] for c in closed] == [[0], [1], [2]]
    assert [c.positions for c in closed] == [{0: 1}, {0: 2}, {0: 3}]
    event = closed[0].events[0]
    assert (event.topic, event.partition, event.key, event.value, event.headers) == (
        "orders", 0, "k", {"n": 0}, {})
    assert event.timestamp.timestamp() * 1000 == T


def test_a_batch_closes_at_max_events_with_the_positions_of_everything_read() -> None:
    batcher = Batcher(trigger(filter="value.even == true",
                              batch={"max_events": 2, "max_wait_seconds": 60}))
    records = [rec(i, {"even": i % 2 == 0}, partition=i % 3) for i in range(8)]
    closed = fed(batcher, records, T)
    assert [[e.offset for e in c.events] for c in closed] == [[0, 2], [4, 6]]
    # Every record read before the batch's end is in it or was passed over.
    assert closed[0].positions == {0: 1, 1: 2, 2: 3}
    assert closed[1].positions == {0: 7, 1: 5, 2: 6}
    assert batcher.passed_over == 4


def test_a_batch_waits_max_wait_seconds_from_its_first_records_timestamp() -> None:
    batcher = Batcher(trigger(batch={"max_events": 100, "max_wait_seconds": 5}))
    assert fed(batcher, [rec(0, ts=T), rec(1, ts=T + 3000)], T + 4000) == []
    assert batcher.due_ms() == T + 5000
    assert batcher.due(T + 4999) is None
    closed = batcher.due(T + 5000)
    assert closed is not None and [e.offset for e in closed.events] == [0, 1]
    assert closed.positions == {0: 2}
    assert batcher.due_ms() is None and batcher.due(T + 10_000) is None


def test_a_record_stamped_in_the_future_does_not_hold_its_batch_back() -> None:
    batcher = Batcher(trigger(batch={"max_events": 100, "max_wait_seconds": 1}))
    batcher.add(rec(0, ts=T + 3_600_000), T)
    assert batcher.due_ms() == T + 1000


def test_zero_wait_runs_what_was_read_at_once() -> None:
    batcher = Batcher(trigger(batch={"max_events": 10, "max_wait_seconds": 0}))
    fed(batcher, [rec(0), rec(1), rec(2)], T)
    closed = batcher.due(T)
    assert closed is not None and len(closed.events) == 3


def test_a_batch_closes_before_its_records_pass_what_a_job_due_carries() -> None:
    big = {"blob": "x" * 40_000}
    batcher = Batcher(trigger(batch={"max_events": 10_000, "max_wait_seconds": 60}))
    closed = fed(batcher, [rec(i, big) for i in range(10)], T)
    assert closed and all(sum(len(json.dumps(e.value)) for e in c.events) <= MAX_EVENTS_BYTES
                          for c in closed)
    first = closed[0]
    # The record that did not fit starts the next batch: the positions stop before it.
    assert first.positions == {0: len(first.events)}
    assert batcher.events[0].offset == len(first.events) * len(closed)


def test_a_value_too_large_to_carry_is_omitted_and_marked() -> None:
    closed = fed(Batcher(trigger()), [rec(0, {"blob": "x" * 70_000})], T)
    event = closed[0].events[0]
    assert event.value is None and event.value_omitted


def test_records_read_again_are_not_batched_twice() -> None:
    batcher = Batcher(trigger(batch={"max_events": 2, "max_wait_seconds": 60}), committed={0: 5})
    assert batcher.add(rec(3), T) is None and batcher.add(rec(4), T) is None
    assert batcher.events == []
    closed = fed(batcher, [rec(5), rec(6)], T)
    assert [e.offset for e in closed[0].events] == [5, 6]


def test_a_failed_commit_rewinds_to_the_committed_positions() -> None:
    batcher = Batcher(trigger(batch={"max_events": 2, "max_wait_seconds": 60}))
    (first,) = fed(batcher, [rec(0), rec(1), rec(2)], T)
    batcher.commit(first.positions)
    batcher.rewind()
    assert batcher.positions == {0: 2} and batcher.events == []
    (again,) = fed(batcher, [rec(2), rec(3)], T)
    assert [e.offset for e in again.events] == [2, 3]


def test_positions_past_records_passed_over_are_worth_committing_alone() -> None:
    batcher = Batcher(trigger(filter="value.n > 100"))
    assert batcher.advanced() is None
    fed(batcher, [rec(0), rec(1)], T)
    assert batcher.advanced() == {0: 2}
    batcher.commit({0: 2})
    assert batcher.advanced() is None


# -- state --------------------------------------------------------------------------


def test_the_state_round_trips_with_its_positions() -> None:
    state = state_of("j", trigger(start="earliest"), T, {3: 10, 0: 2})
    read = TriggerState.model_validate_json(state.to_json())
    assert read == state and read.next_offsets() == {0: 2, 3: 10}
    assert (read.topic, read.start, read.start_ms) == ("orders", "earliest", T)


def test_lag_counts_what_is_not_yet_in_a_run() -> None:
    assert lag({0: 10, 1: 5, 2: 7}, {0: 4, 1: 5}, {2: 3}) == 6 + 0 + 4


def test_events_built_on_the_hot_path_are_what_the_model_validates() -> None:
    from cronstream.shared.records import JobDefinition, JobDue, TriggerEvent

    records = [rec(0, {"n": 1.5, "s": "é"}, headers=[("h", b"v"), ("bin", b"\xff")]),
               rec(1, raw=b"\xfe text", key=None), rec(2, raw=b"[" * 5000), rec(3, raw=b"1e400")]
    closed = fed(Batcher(trigger(batch={"max_events": 4})), records, T)
    events = closed[0].events
    assert [TriggerEvent.model_validate_json(e.model_dump_json()) for e in events] == events
    d = JobDefinition.from_dict({"job_id": "j", "type": "EVENT", "handler": "h", "event": {"topic": "orders"}})
    due = JobDue.event(d, events, events[0].timestamp)
    assert JobDue.model_validate_json(due.to_json()) == due
    assert events[1].key is None and events[1].value == "\ufffd text" and events[3].value == "1e400"
