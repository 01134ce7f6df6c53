"""Flow control's admission core without Kafka (services/dispatcher/admission.py): limits
hold, keys are served in order and fairly, and every way an execution ends settles it."""

from __future__ import annotations

import dataclasses
import json
import random
import uuid
from collections import Counter
from typing import Any

import pytest

from cronstream.services.dispatcher.admission import Admission, Ask, key_of
from cronstream.shared.records import Concurrency

NOW = 1_800_000_000.0


def ask(job: str = "export", key: str = "", **limits: Any) -> Ask:
    return Ask(execution_id=uuid.uuid4(), job_id=job, key=key, **limits)


def test_a_pool_of_two_never_holds_three_and_frees_a_slot_on_each_end() -> None:
    admission = Admission(pools={"etl": 2})
    asks = [ask(job=f"job-{i % 3}", pool="etl") for i in range(6)]
    started = [a for a in asks if admission.ask(a, NOW)[0]]
    assert len(started) == 2 and admission.in_use_of("etl") == 2
    _, reason = admission.ask(asks[2], NOW)  # asking again changes nothing
    assert reason == "pool etl: 2 of 2 slots in use"
    assert admission.admit(NOW) == []
    done = 0
    while admission.holds:
        assert admission.in_use_of("etl") <= 2
        admission.release(next(iter(admission.holds)))
        done += 1
        admission.admit(NOW)
    assert done == 6 and admission.in_use_of("etl") == 0 and admission.waiting_count() == 0


def test_a_key_runs_one_at_a_time_in_order_while_another_key_runs_beside_it() -> None:
    admission = Admission()
    limit: dict[str, Any] = {"max_running": 1}
    a = [ask(key="customer=1", **limit) for _ in range(3)]
    b = [ask(key="customer=2", **limit) for _ in range(2)]
    decided = [admission.ask(x, NOW) for x in [*a, *b]]
    assert [started for started, _ in decided] == [True, False, False, True, False]
    assert decided[1][1] == "key customer=1: 1 of 1 running"
    assert decided[2][1] == "key customer=1: 1 of 1 running; 1 earlier waiting"
    order = []
    for first in (a[0], b[0], a[1], b[1], a[2]):
        admission.release(first.execution_id)
        order += [x.execution_id for x in admission.admit(NOW)]
    assert order == [a[1].execution_id, b[1].execution_id, a[2].execution_id]


def test_keys_take_turns_so_a_backlog_never_starves_another_key() -> None:
    admission = Admission(pools={"api": 1})
    backlog = [ask(key="tenant=big", pool="api") for _ in range(50)]
    late = ask(key="tenant=small", pool="api")
    for x in backlog:
        admission.ask(x, NOW)
    admission.ask(late, NOW)
    starts = []
    while admission.holds:
        held = next(iter(admission.holds))
        admission.release(held)
        starts += [x.key for x in admission.admit(NOW)]
    assert starts.index("tenant=small") <= 1, "the small key's run went next or after one more"


def test_fairness_under_random_arrivals_and_ends() -> None:
    rng = random.Random(57)
    admission = Admission(pools={"p": 3})
    keys = [f"k={i}" for i in range(5)]
    started: Counter[str] = Counter()
    for _ in range(400):
        if rng.random() < 0.6:
            admission.ask(ask(key=rng.choice(keys[:1] * 8 + keys), pool="p", max_running=2), NOW)
        elif admission.holds:
            admission.release(rng.choice(list(admission.holds)))
        started.update(x.key for x in admission.admit(NOW))
        assert admission.in_use_of("p") <= 3
        assert all(n <= 2 for n in admission.running.values())
    # Every key that waited got starts: none was starved by k=0's flood.
    assert all(started[k] > 0 for k in keys)


def test_a_rate_limit_starts_at_most_n_in_any_window_and_says_when_next() -> None:
    admission = Admission()
    asks = [ask(rate_limit="2/m") for _ in range(5)]
    decided = [admission.ask(x, NOW + i) for i, x in enumerate(asks)]
    assert [s for s, _ in decided] == [True, True, False, False, False]
    assert decided[2][1] == "rate limit 2/m, next start at 2027-01-15T08:01:00.000+00:00"
    assert admission.next_wakeup() == NOW + 60
    assert admission.admit(NOW + 59.9) == []
    assert [x.execution_id for x in admission.admit(NOW + 60)] == [asks[2].execution_id]
    assert [x.execution_id for x in admission.admit(NOW + 61)] == [asks[3].execution_id]
    assert admission.admit(NOW + 119) == []
    assert len(admission.admit(NOW + 120)) == 1


def test_a_rate_limit_with_a_key_is_per_key() -> None:
    admission = Admission()
    assert admission.ask(ask(key="c=1", rate_limit="1/s"), NOW)[0]
    assert not admission.ask(ask(key="c=1", rate_limit="1/s"), NOW)[0]
    assert admission.ask(ask(key="c=2", rate_limit="1/s"), NOW)[0]


def test_a_cancelled_waiting_execution_releases_nothing_and_a_requeue_keeps_its_slot() -> None:
    admission = Admission(pools={"etl": 1})
    running, waiting = ask(pool="etl"), ask(pool="etl")
    admission.ask(running, NOW)
    admission.ask(waiting, NOW)
    assert admission.withdraw(waiting.execution_id) == dataclasses.replace(waiting, seq=2)
    assert admission.in_use_of("etl") == 1 and admission.waiting_count() == 0
    # A dead worker's requeue is not an end: the same execution asks nothing and keeps
    # its hold; asking again (a redelivered JobDue) is a no-op.
    assert admission.ask(running, NOW) == (True, None)
    assert admission.in_use_of("etl") == 1
    assert admission.end(running.execution_id) and not admission.end(running.execution_id)
    assert admission.in_use_of("etl") == 0


def test_a_missing_pool_holds_back_until_it_is_set_and_more_slots_start_more() -> None:
    pools: dict[str, int] = {}
    admission = Admission(pools=pools)
    asks = [ask(pool="etl") for _ in range(3)]
    assert admission.ask(asks[0], NOW) == (
        False, "pool etl does not exist (cronstream pool set etl --slots N)")
    admission.ask(asks[1], NOW)
    admission.ask(asks[2], NOW)
    pools["etl"] = 2
    assert len(admission.admit(NOW)) == 2
    pools["etl"] = 3
    assert len(admission.admit(NOW)) == 1


def test_an_execution_taking_several_slots_waits_for_all_of_them() -> None:
    admission = Admission(pools={"gpu": 4})
    assert admission.ask(ask(pool="gpu", slots=3), NOW)[0]
    big = ask(pool="gpu", slots=2)
    assert admission.ask(big, NOW) == (False, "pool gpu: 3 of 4 slots in use, needs 2")


def test_the_state_read_back_from_its_records_is_the_same_state() -> None:
    admission = Admission(pools={"etl": 2})
    asks = [ask(key=f"c={i % 2}", pool="etl", max_running=1, rate_limit="10/m", due=f"due {i}")
            for i in range(6)]
    records: dict[str, bytes | None] = {}
    for i, x in enumerate(asks):
        admission.ask(x, NOW + i)
        records.update(admission.drain_dirty())
    admission.release(asks[0].execution_id)
    admission.admit(NOW + 10)
    records.update(admission.drain_dirty())
    again = Admission(pools={"etl": 2})
    again.load(records.items())
    assert again.holds == admission.holds
    assert {k: list(v) for k, v in again.waiting.items()} == \
        {k: list(v) for k, v in admission.waiting.items()}
    assert sorted(again.turns) == sorted(admission.turns)
    assert again.in_use == admission.in_use and again.running == admission.running
    assert {k: list(v) for k, v in again.starts.items()} == \
        {k: list(v) for k, v in admission.starts.items()}
    # ...and starts the same executions from there (lanes may take turns in another order).
    for state in (admission, again):
        while state.holds:
            state.release(next(iter(sorted(state.holds))))
            state.admit(NOW + 120)
    assert again.drain_dirty() and admission.drain_dirty()
    assert again.waiting == admission.waiting == {}


@pytest.mark.parametrize(("concurrency", "params", "key"), [
    (None, {"customer": 1}, ""),
    (Concurrency(max_running=1), {"customer": 1}, ""),
    (Concurrency(key="params.customer", max_running=1), {"customer": 42}, "customer=42"),
    (Concurrency(key="params.customer", max_running=1), {"customer": "acme"}, "customer=acme"),
    (Concurrency(key="params.customer", max_running=1), {}, "customer=null"),
    (Concurrency(key="params.region", max_running=1), {"region": {"b": 1, "a": 2}},
     'region={"a":2,"b":1}'),
])
def test_the_lane_key_names_the_key_and_its_value(concurrency: Concurrency | None,
                                                  params: dict[str, Any], key: str) -> None:
    assert key_of(concurrency, params) == key


def test_a_fan_out_of_thousands_starts_in_arrival_order_within_the_pool() -> None:
    admission = Admission(pools={"db": 10})
    asks = [ask(key=f"customer={i % 3}", pool="db") for i in range(5000)]
    for x in asks:
        admission.ask(x, NOW)
    started: list[uuid.UUID] = list(admission.holds)
    while admission.holds:
        for held in list(admission.holds)[:5]:
            admission.release(held)
        started += [x.execution_id for x in admission.admit(NOW)]
        assert admission.in_use_of("db") <= 10
    assert len(started) == 5000 and not admission.where
    for key in ("customer=0", "customer=1", "customer=2"):  # first come first served per key
        mine = [x.execution_id for x in asks if x.key == key]
        of_key = set(mine)
        assert [e for e in started if e in of_key] == mine


def test_a_rate_log_is_forgotten_once_its_last_start_left_the_window() -> None:
    admission = Admission()
    admission.ask(ask(key="c=1", rate_limit="1/m"), NOW)
    admission.ask(ask(key="c=2", rate_limit="1/m"), NOW + 30)
    admission.drain_dirty()
    assert admission.sweep(NOW + 60) == 1
    assert admission.drain_dirty() == [("flow:rate:export/c=1", None)]
    again = Admission()
    again.load([("flow:rate:export/c=2", json.dumps({"window": 60, "starts": [NOW + 30]}).encode())])
    assert again.sweep(NOW + 89) == 0 and again.sweep(NOW + 90) == 1
