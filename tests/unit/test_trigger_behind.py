"""The TRIGGER_BEHIND alert of an event trigger (services/scheduler/triggers.py `behind`,
sources.py `_judge_lag`; decision 0057): opened when the lag stays above its floor and
grows, ended when it is back under it — by whichever leader the shard has then."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from cronstream.services.scheduler.sources import Trigger, TriggerEngine, behind_alert
from cronstream.services.scheduler.store import ShardStore
from cronstream.services.scheduler.triggers import (
    BEHIND_LOOKS,
    BEHIND_RECORDS,
    TriggerState,
    behind,
    behind_floor,
    state_of,
)
from cronstream.shared.producers import OutRecord
from cronstream.shared.records import Alert, EventTrigger, JobDefinition
from cronstream.shared.settings import Settings

FLOOR = BEHIND_RECORDS


def growing(first: int, step: int = 100, n: int = BEHIND_LOOKS) -> list[int]:
    return [first + i * step for i in range(n)]


def test_a_lag_above_the_floor_that_grows_for_every_look_opens_an_episode() -> None:
    assert behind(growing(FLOOR + 1), FLOOR, open_since=False) is True


def test_fewer_looks_than_the_window_open_nothing() -> None:
    assert behind(growing(FLOOR + 1, n=BEHIND_LOOKS - 1), FLOOR, open_since=False) is None


def test_a_lag_high_but_steady_is_not_falling_behind() -> None:
    assert behind([FLOOR + 500] * BEHIND_LOOKS, FLOOR, open_since=False) is None
    # ... nor one that shrinks: the trigger is catching up.
    assert behind(growing(FLOOR + 5000, step=-100), FLOOR, open_since=False) is None


def test_one_look_at_or_under_the_floor_in_the_window_opens_nothing() -> None:
    looks = growing(FLOOR + 1)
    looks[2] = FLOOR
    assert behind(looks, FLOOR, open_since=False) is None


def test_an_open_episode_ends_when_the_lag_is_back_under_the_floor_and_not_before() -> None:
    assert behind([FLOOR + 9000, FLOOR + 1], FLOOR, open_since=True) is None
    assert behind([FLOOR + 9000, FLOOR], FLOOR, open_since=True) is False


def test_a_trigger_whose_batches_are_large_has_a_floor_of_two_batches() -> None:
    small = EventTrigger.model_validate({"topic": "t", "batch": {"max_events": 10}})
    large = EventTrigger.model_validate({"topic": "t", "batch": {"max_events": 5000}})
    assert (behind_floor(small), behind_floor(large)) == (BEHIND_RECORDS, 10_000)


# -- the engine: the episode committed with the trigger's state ------------------------


EVENT = EventTrigger.model_validate({"topic": "orders"})
DEFINITION = JobDefinition.model_validate(
    {"job_id": "orders-in", "type": "EVENT", "handler": "noop", "event": {"topic": "orders"}})


def engine(commits: list[list[OutRecord]]) -> TriggerEngine:
    async def commit(records: list[OutRecord]) -> bool:
        commits.append(records)
        return True

    # The alert path touches neither the store nor Kafka: a store is never read here.
    return TriggerEngine(Settings(topic_prefix="x."), 0, cast(ShardStore, None), commit=commit,
                         on_failed=lambda _exc: None, lock=asyncio.Lock(), instance="s1")


def judge(engine: TriggerEngine, trigger: Trigger, lags: list[int]) -> None:
    async def run() -> None:
        for value in lags:
            trigger.lag = value
            trigger.looks.append(value)
            await engine._judge_lag(trigger)
    asyncio.run(run())


def written(records: list[OutRecord]) -> tuple[TriggerState, Alert]:
    (state,) = [r for r in records if r.topic == "x.trigger-state"]
    (alert,) = [r for r in records if r.topic == "x.alerts"]
    assert state.value is not None and alert.value is not None
    return TriggerState.model_validate_json(state.value), Alert.model_validate_json(alert.value)


def test_the_episode_opens_and_ends_with_one_alert_id_committed_with_the_state() -> None:
    commits: list[list[OutRecord]] = []
    trigger = Trigger("orders-in", state_of("orders-in", EVENT, 0, {0: 40}), DEFINITION)
    judge(engine(commits), trigger, [*growing(FLOOR + 1), FLOOR + 700, 10])
    assert len(commits) == 2, "one commit to open, one to end; none while it stays open"
    opened, firing = written(commits[0])
    ended, resolved = written(commits[1])
    assert opened.behind_since_ms is not None and opened.next_offsets() == {0: 40}
    assert (firing.kind, firing.state, firing.job_id) == ("TRIGGER_BEHIND", "FIRING", "orders-in")
    assert firing.evidence["lag_records"] == FLOOR + 1 + 100 * (BEHIND_LOOKS - 1)
    assert firing.evidence["topic"] == "orders"
    assert ended.behind_since_ms is None and ended.next_offsets() == {0: 40}
    assert (resolved.state, resolved.alert_id) == ("RESOLVED", firing.alert_id)
    assert trigger.state == ended


def test_a_new_leader_ends_the_episode_its_predecessor_opened() -> None:
    commits: list[list[OutRecord]] = []
    opened = state_of("orders-in", EVENT, 0, {0: 40}, behind_since_ms=1_780_000_000_000)
    # What the new leader reads back from trigger-state at its takeover.
    loaded = TriggerState.model_validate_json(opened.to_json())
    judge(engine(commits), Trigger("orders-in", loaded, DEFINITION), [3])
    (records,) = commits
    state, alert = written(records)
    assert alert.state == "RESOLVED" and state.behind_since_ms is None
    # The id the predecessor's FIRING alert carried: a consumer closes that episode.
    predecessors = behind_alert("x.alerts", opened, firing=True, evidence={})
    assert predecessors.value is not None
    assert alert.alert_id == Alert.model_validate_json(predecessors.value).alert_id
    assert alert.evidence["behind_since"] == "2026-05-28T20:26:40+00:00"


def test_a_deleted_trigger_with_an_open_episode_ends_it_with_its_tombstone() -> None:
    records: Any = engine([])._episode_ends(
        state_of("orders-in", EVENT, 0, behind_since_ms=1_780_000_000_000), "deleted")
    (record,) = records
    alert = Alert.model_validate_json(record.value)
    assert (alert.kind, alert.state, alert.evidence["reason"]) == ("TRIGGER_BEHIND", "RESOLVED", "deleted")
