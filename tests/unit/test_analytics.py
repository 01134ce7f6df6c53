"""The analytics service's pure core: windows, episodes, the fire ledger, queue trends."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from cronstream.services.analytics.episodes import Episodes, queue_subject
from cronstream.services.analytics.ledger import SETTLE_MS, FireLedger
from cronstream.services.analytics.queues import QueueTrends
from cronstream.services.analytics.service import AnalyticsService
from cronstream.services.analytics.windows import (
    JobWindow,
    Thresholds,
    duration_regressed,
    p95,
    success_rate_low,
)
from cronstream.shared.records import Alert, JobAlerts, JobDefinition
from cronstream.shared.settings import Settings

SETTINGS = Settings(analytics_recent_runs=3, analytics_baseline_runs=10)


def thresholds(**alerts: object) -> Thresholds:
    return Thresholds.of(SETTINGS, JobAlerts.model_validate(alerts) if alerts else None)


# -- thresholds ---------------------------------------------------------------------------


def test_a_jobs_alerts_block_overrides_the_global_defaults_field_by_field() -> None:
    t = thresholds(success_rate_percent=80, min_runs=5)
    assert (t.success_rate_percent, t.min_runs) == (80, 5)
    assert t.window_seconds == SETTINGS.analytics_window_seconds
    assert t.duration_factor == SETTINGS.analytics_duration_factor


def test_a_bad_alerts_block_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match=r"alerts\.success_rate_percent"):
        JobDefinition.model_validate({"job_id": "j", "type": "INTERVAL", "interval_seconds": 1,
                                      "handler": "noop", "alerts": {"success_rate_percent": 120}})
    with pytest.raises(ValidationError, match=r"alerts\.treshold"):
        JobDefinition.model_validate({"job_id": "j", "type": "INTERVAL", "interval_seconds": 1,
                                      "handler": "noop", "alerts": {"treshold": 1}})


# -- success rate and durations -------------------------------------------------------------


def test_success_rate_counts_each_runs_outcome_in_the_window_once() -> None:
    window = JobWindow(20)
    t = thresholds(success_rate_percent=90, min_runs=4, window_seconds=60)
    ids = [uuid.uuid4() for _ in range(6)]
    for i, status in enumerate(["COMPLETED", "COMPLETED", "PERMANENTLY_FAILED", "PERMANENTLY_FAILED",
                                "CANCELLED", "SKIPPED"]):
        window.add(ids[i], status, 100.0 + i, 1.0)
    window.add(ids[2], "PERMANENTLY_FAILED", 106.0, 1.0)  # the same execution reported again
    rate = window.success_rate(110.0, 60)
    assert (rate.finished, rate.succeeded) == (4, 2)  # CANCELLED and SKIPPED are not outcomes
    assert success_rate_low(rate, t)
    # Three minutes later the failures have left the window; nothing finished since.
    assert window.success_rate(300.0, 60).finished == 0
    assert not success_rate_low(window.success_rate(300.0, 60), t)


def test_a_failed_attempt_that_a_retry_makes_good_is_one_successful_run() -> None:
    window = JobWindow(20)
    window.add(uuid.uuid4(), "FAILED", 100.0, 1.0)  # attempt 1: a retry follows
    window.add(uuid.uuid4(), "TIMED_OUT", 101.0, 1.0)  # attempt 2: another follows
    window.add(uuid.uuid4(), "COMPLETED", 102.0, 1.0)  # attempt 3: the run succeeded
    rate = window.success_rate(110.0, 60)
    assert (rate.finished, rate.succeeded, rate.percent) == (1, 1, 100.0)


def runs(window: JobWindow, completed: int, failed: int, at: float = 100.0) -> None:
    for status, count in (("COMPLETED", completed), ("PERMANENTLY_FAILED", failed)):
        for _ in range(count):
            window.add(uuid.uuid4(), status, at, 1.0)


def test_the_default_success_rate_threshold_is_99_percent_of_at_least_10_runs() -> None:
    defaults = Thresholds.of(Settings(), None)
    at_threshold, below, too_few, enough = JobWindow(200), JobWindow(200), JobWindow(20), JobWindow(20)
    runs(at_threshold, 99, 1)
    runs(below, 98, 2)
    runs(too_few, 0, 9)
    runs(enough, 0, 10)
    assert not success_rate_low(at_threshold.success_rate(110.0, 3600), defaults)  # 99 % is not below
    assert success_rate_low(below.success_rate(110.0, 3600), defaults)
    assert not success_rate_low(too_few.success_rate(110.0, 3600), defaults)
    assert success_rate_low(enough.success_rate(110.0, 3600), defaults)
    # An hour by default: what finished an hour and a second ago is out of the window.
    assert below.success_rate(100.0 + 3601, defaults.window_seconds).finished == 0


def test_too_few_runs_never_alert() -> None:
    window = JobWindow(20)
    window.add(uuid.uuid4(), "FAILED", 1.0, None)
    assert not success_rate_low(window.success_rate(2.0, 60), thresholds(min_runs=2))


def test_duration_regression_compares_recent_p95_with_the_baseline() -> None:
    window = JobWindow(13)
    t = thresholds(duration_factor=2)
    for _ in range(5):
        window.add(uuid.uuid4(), "COMPLETED", 1.0, 0.3)
    assert window.durations(3) is None  # fewer than 2 x recent_runs samples
    for _ in range(3):
        window.add(uuid.uuid4(), "COMPLETED", 1.0, 1.2)
    d = window.durations(3)
    assert d is not None and (d.recent_p95, d.baseline_p95) == (1.2, 0.3)
    assert duration_regressed(d, t)
    # It stays slow: the baseline follows, and the regression is the new normal.
    for _ in range(10):
        window.add(uuid.uuid4(), "COMPLETED", 1.0, 1.2)
    assert not duration_regressed(window.durations(3), t)


def test_the_default_regression_is_a_recent_p95_above_twice_the_baseline_of_50_runs() -> None:
    defaults = Thresholds.of(Settings(), None)
    assert (defaults.duration_factor, defaults.recent_runs, defaults.baseline_runs) == (2, 5, 50)

    def window(recent: float) -> JobWindow:
        made = JobWindow(defaults.baseline_runs + defaults.recent_runs)
        for duration in [0.5] * 60 + [recent] * 5:
            made.add(uuid.uuid4(), "COMPLETED", 1.0, duration)
        return made

    exactly_twice = window(1.0).durations(defaults.recent_runs)
    assert exactly_twice is not None and exactly_twice.baseline_runs == 50
    assert not duration_regressed(exactly_twice, defaults)  # twice is not above twice
    assert duration_regressed(window(1.01).durations(defaults.recent_runs), defaults)


def test_p95_is_nearest_rank() -> None:
    assert p95([1.0]) == 1.0
    assert p95([float(i) for i in range(1, 101)]) == 95.0
    assert p95([1.0, 2.0, 3.0]) == 3.0


# -- episodes -----------------------------------------------------------------------------


def test_an_episode_fires_once_and_resolves_with_the_same_id() -> None:
    episodes = Episodes()
    opened = episodes.evaluate("SUCCESS_RATE_LOW", "j", True, True, 1000)
    assert opened is not None and opened.state == "FIRING"
    episodes.commit(opened)
    assert episodes.evaluate("SUCCESS_RATE_LOW", "j", True, True, 2000) is None  # still bad
    closed = episodes.evaluate("SUCCESS_RATE_LOW", "j", False, False, 3000)
    assert closed is not None and closed.state == "RESOLVED"
    assert closed.episode.alert_id == opened.episode.alert_id


def _alert(transition_state: str, episode_id: uuid.UUID, opened: datetime, **fields: object) -> Alert:
    return Alert.model_validate({
        "alert_id": episode_id, "kind": fields.pop("kind", "SUCCESS_RATE_LOW"), "state": transition_state,
        "severity": "error", "occurred_at": opened, "raised_at": opened, **fields}, strict=False)


def test_restored_episodes_raise_no_second_firing_and_resolve_under_their_id() -> None:
    before = Episodes()
    opened = before.evaluate("FIRE_LATE", "nightly", True, True, 1_700_000_000_000)
    assert opened is not None
    at = datetime.fromtimestamp(1_700_000_000, UTC)
    after = Episodes()  # a restarted service reads the alerts topic
    after.restore(_alert("FIRING", opened.episode.alert_id, at, kind="FIRE_LATE", job_id="nightly"))
    after.restore(_alert("FIRING", uuid.uuid4(), at, kind="EXECUTION_PERMANENTLY_FAILED", job_id="x"))
    assert list(after.open) == [("FIRE_LATE", "nightly")]
    assert after.evaluate("FIRE_LATE", "nightly", True, True, 1_700_000_060_000) is None
    closed = after.evaluate("FIRE_LATE", "nightly", False, False, 1_700_000_060_000)
    assert closed is not None and closed.episode.alert_id == opened.episode.alert_id
    # A RESOLVED on the topic closes it for the next restart.
    again = Episodes()
    again.restore(_alert("FIRING", opened.episode.alert_id, at, kind="FIRE_LATE", job_id="nightly"))
    again.restore(_alert("RESOLVED", opened.episode.alert_id, at, kind="FIRE_LATE", job_id="nightly"))
    assert again.open == {}


def test_queue_episodes_are_restored_by_queue_and_priority() -> None:
    episodes = Episodes()
    at = datetime.fromtimestamp(1_700_000_000, UTC)
    episodes.restore(_alert("FIRING", uuid.uuid4(), at, kind="QUEUE_GROWING", queue="etl",
                            evidence={"priority": "high"}))
    assert episodes.subjects("QUEUE_GROWING") == [queue_subject("high", "etl")]


# -- queue trends ---------------------------------------------------------------------------


def test_a_queue_grows_when_it_rose_in_each_of_the_last_windows() -> None:
    trends = QueueTrends(windows=3)
    seen = [trends.sample("normal", "q", d) for d in (0, 1, 2, 2, 3, 4, 5)]
    assert [t.growing(3) for t in seen] == [False, False, False, False, False, False, True]
    assert not trends.sample("normal", "q", 5).relieved()  # flat: still open if open
    assert trends.sample("normal", "q", 4).relieved()


# -- the fire ledger ------------------------------------------------------------------------

S = 1_800_000_000_000  # epoch ms, a whole minute


def every_second(**fields: object) -> JobDefinition:
    return JobDefinition.model_validate({"job_id": "tick", "type": "INTERVAL", "interval_seconds": 1,
                                         "handler": "noop", **fields})


def ledger_with(definition: JobDefinition, late_after: float = 3) -> FireLedger:
    ledger = FireLedger(start_ms=S)
    ledger.definition("tick", definition, valid=True, observed_ms=S, late_after_s=late_after)
    return ledger


def fire(ledger: FireLedger, at_ms: int, status: str = "QUEUED") -> None:
    ledger.event("tick", uuid.uuid4(), status=status, attempt=1, scheduled_ms=at_ms, terminal=False)


def test_fires_that_happen_in_time_are_on_time_and_not_late() -> None:
    ledger = ledger_with(every_second())
    for k in range(5):
        fire(ledger, S + k * 1000)
    status = ledger.judge("tick", S + 7000)
    assert not status.late
    assert ledger.outcomes["on_time"] == 5


def test_a_stopped_scheduler_makes_fires_late_then_misfire_policy_accounts_for_them() -> None:
    ledger = ledger_with(every_second())
    fire(ledger, S)
    ledger.scheduler_state("tick", S + 1000, S)
    status = ledger.judge("tick", S + 6000)  # fires at 1, 2, 3 s are 3 s overdue
    assert [p.scheduled_ms - S for p in status.starts] == [1000, 2000, 3000]
    assert {p.reason for p in status.starts} == {"scheduler_down"}
    # The scheduler comes back (FIRE_ONCE): fires 1 s late, then moves past the rest.
    fire(ledger, S + 1000)
    ledger.scheduler_state("tick", S + 9000, S + 1000)
    status = ledger.judge("tick", S + 8500)
    assert ledger.outcomes["late"] == 1
    assert status.late  # 2 s and 3 s wait for the state to settle
    status = ledger.judge("tick", S + 8500 + SETTLE_MS)
    assert ledger.outcomes["misfire_policy"] >= 2


def test_missed_fires_are_told_apart_by_reason() -> None:
    paused = ledger_with(every_second(enabled=False))
    assert not paused.judge("tick", S + 5000).late
    assert paused.outcomes["paused"] == 3  # fires at 0, 1 and 2 s (late_after 3 s)

    skipped = ledger_with(every_second())
    fire(skipped, S, status="SKIPPED")
    skipped.judge("tick", S + 3000)
    assert skipped.outcomes["concurrency_policy"] == 1

    fired_not_queued = ledger_with(every_second())
    fired_not_queued.scheduler_state("tick", S + 1000, S)
    assert [p.reason for p in fired_not_queued.judge("tick", S + 3000).starts] == ["not_queued"]

    invalid = ledger_with(every_second())
    invalid.definition("tick", None, valid=False, observed_ms=S)
    assert {p.reason for p in invalid.judge("tick", S + 4000).starts} == {"invalid_definition"}

    deleted = ledger_with(every_second())
    deleted.definition("tick", None, valid=True, observed_ms=S)
    assert "tick" not in deleted.jobs


def test_a_run_that_does_not_finish_in_time_is_a_late_finish() -> None:
    ledger = ledger_with(every_second(alerts={"finish_within_seconds": 2}))
    ledger.definition("tick", every_second(end_at=datetime.fromtimestamp(S / 1000, UTC)), valid=True,
                      observed_ms=S, late_after_s=3, finish_within_s=2)
    execution = uuid.uuid4()
    ledger.event("tick", execution, status="QUEUED", attempt=1, scheduled_ms=S, terminal=False)
    assert ledger.judge("tick", S + 2500).finishes == [(execution, S)]
    ledger.event("tick", execution, status="COMPLETED", attempt=1, scheduled_ms=S, terminal=True)
    assert not ledger.judge("tick", S + 3000).late


def test_only_first_attempts_tell_whether_a_fire_happened() -> None:
    ledger = ledger_with(every_second(end_at=datetime.fromtimestamp((S + 500) / 1000, UTC)))
    # A retry scheduled, by chance, at the instant of a fire that never happened.
    ledger.event("tick", uuid.uuid4(), status="QUEUED", attempt=2, scheduled_ms=S, terminal=False)
    status = ledger.judge("tick", S + 4000)
    assert [(p.scheduled_ms, p.reason) for p in status.starts] == [(S, "scheduler_down")]
    assert ledger.outcomes["on_time"] == 0


def test_a_late_alerts_evidence_is_its_own_jobs_history() -> None:
    service = AnalyticsService(SETTINGS)
    ledger = service.ledger = FireLedger(start_ms=S)
    th = thresholds()
    ledger.definition("idle", every_second(job_id="idle", enabled=False), valid=True, observed_ms=S,
                      late_after_s=3)
    ledger.definition("tick", every_second(), valid=True, observed_ms=S, late_after_s=3)
    fire(ledger, S)
    ledger.scheduler_state("tick", S + 1000, S)  # the scheduler stops after its first fire

    def evidence(now_ms: int) -> dict[str, object]:
        ledger.judge("idle", now_ms)  # another job's fires are judged in the same round
        status = ledger.judge("tick", now_ms)
        transition = service.episodes.evaluate("FIRE_LATE", "tick", True, True, now_ms)
        assert transition is not None
        return service._late_alert(transition, "tick", status, th, now_ms).evidence

    assert evidence(S + 6000)["missed_by_reason"] == {}  # idle's paused fires are not tick's
    service._measure()  # the round's end: the service-wide counts go to the metrics
    fire(ledger, S + 1000)  # the scheduler is back and fires the first missed one, late
    assert evidence(S + 7000)["missed_by_reason"] == {"late": 1}
    assert ledger.jobs["idle"].outcomes["paused"] == 5


def test_a_cron_schedule_uses_the_schedulers_own_fire_times() -> None:
    cron = JobDefinition.model_validate({"job_id": "tick", "type": "CRON", "schedule": "*/2 * * * * *",
                                         "handler": "noop"})
    ledger = FireLedger(start_ms=S)
    ledger.definition("tick", cron, valid=True, observed_ms=S + 1, late_after_s=1)
    status = ledger.judge("tick", S + 6000)
    assert [p.scheduled_ms - S for p in status.starts] == [2000, 4000]
