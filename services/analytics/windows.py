"""Per-job rolling windows: success rate and duration regression. Pure logic, no Kafka.

A job's window is fed with the terminal events of its executions (in log order: one job
lives on one partition) and asked, at a given instant, two questions:

- success rate, per run: of the runs that ended within the last `window_seconds` —
  their last attempt COMPLETED or PERMANENTLY_FAILED (`statuses.RUN_OUTCOMES`) — how many
  COMPLETED. A failed attempt with a retry to come is not counted, so a first try that
  fails and a retry that succeeds is one success; CANCELLED and SKIPPED are decisions,
  not outcomes (docs/decisions/0053). Judged only from `min_runs` ended runs on.
- duration regression: the p95 duration of the last `recent_runs` COMPLETED executions
  against the p95 of up to `baseline_runs` before them. The baseline follows the job, so
  a duration that stays high becomes the new normal and the episode resolves by itself.

Worked example (recent_runs=3, factor 2): durations 0.3 0.3 0.3 0.3 0.3 | 1.2 1.2 1.2
→ baseline p95 0.3, recent p95 1.2 = 4 × baseline > 2 × → regression.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from uuid import UUID

from cronstream.shared.records import JobAlerts
from cronstream.shared.settings import Settings
from cronstream.shared.statuses import RUN_OUTCOMES, SUCCESS

# Bound on the finished executions one job keeps (a job firing 100 times a second over a
# one-hour window would otherwise hold 360,000 entries).
MAX_FINISHED = 20_000


@dataclass(frozen=True, slots=True)
class Thresholds:
    """A job's effective thresholds: its `alerts:` block over the global defaults."""

    enabled: bool
    success_rate_percent: float
    min_runs: int
    window_seconds: float
    duration_factor: float
    recent_runs: int
    baseline_runs: int
    late_after_seconds: float
    finish_within_seconds: float | None

    @classmethod
    def of(cls, settings: Settings, alerts: JobAlerts | None) -> Thresholds:
        a = alerts or JobAlerts()

        def pick(own: float | None, default: float) -> float:
            return default if own is None else own

        return cls(
            enabled=a.enabled,
            success_rate_percent=pick(a.success_rate_percent, settings.analytics_success_rate_percent),
            min_runs=int(pick(a.min_runs, settings.analytics_min_runs)),
            window_seconds=pick(a.window_seconds, settings.analytics_window_seconds),
            duration_factor=pick(a.duration_factor, settings.analytics_duration_factor),
            recent_runs=settings.analytics_recent_runs,
            baseline_runs=settings.analytics_baseline_runs,
            late_after_seconds=pick(a.late_after_seconds, settings.analytics_late_after_seconds),
            finish_within_seconds=a.finish_within_seconds,
        )


def p95(values: list[float]) -> float:
    """Nearest-rank 95th percentile (of a non-empty list)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class SuccessRate:
    finished: int
    succeeded: int
    window_seconds: float

    @property
    def percent(self) -> float:
        return 100.0 * self.succeeded / self.finished if self.finished else 100.0


@dataclass(frozen=True, slots=True)
class Durations:
    recent_p95: float
    baseline_p95: float
    recent_runs: int
    baseline_runs: int

    @property
    def factor(self) -> float:
        return self.recent_p95 / self.baseline_p95 if self.baseline_p95 > 0 else math.inf


class JobWindow:
    """The finished executions of one job that its alerts look at."""

    def __init__(self, duration_samples: int) -> None:
        # (finished at, epoch s; succeeded), oldest first; ids seen, to count each once.
        self._finished: deque[tuple[float, bool, UUID]] = deque()
        self._ids: set[UUID] = set()
        self._durations: deque[float] = deque(maxlen=duration_samples)

    def add(self, execution_id: UUID, status: str, finished_at: float, duration: float | None) -> None:
        if status not in RUN_OUTCOMES or execution_id in self._ids:
            return
        self._ids.add(execution_id)
        self._finished.append((finished_at, status in SUCCESS, execution_id))
        if len(self._finished) > MAX_FINISHED:
            self._ids.discard(self._finished.popleft()[2])
        if status == "COMPLETED" and duration is not None and duration >= 0:
            self._durations.append(duration)

    def trim(self, before: float) -> None:
        """Forget what finished before `before` (beyond every window)."""
        while self._finished and self._finished[0][0] < before:
            self._ids.discard(self._finished.popleft()[2])

    @property
    def empty(self) -> bool:
        return not self._finished and not self._durations

    def success_rate(self, now: float, window_seconds: float) -> SuccessRate:
        since = now - window_seconds
        finished = succeeded = 0
        for at, ok, _ in reversed(self._finished):
            if at < since:
                break
            finished += 1
            succeeded += ok
        return SuccessRate(finished, succeeded, window_seconds)

    def durations(self, recent_runs: int) -> Durations | None:
        """Recent against baseline p95, once there are `recent_runs` recent samples and at
        least as many before them."""
        samples = list(self._durations)
        if len(samples) < 2 * recent_runs:
            return None
        recent, baseline = samples[-recent_runs:], samples[:-recent_runs]
        return Durations(p95(recent), p95(baseline), len(recent), len(baseline))


def success_rate_low(rate: SuccessRate, t: Thresholds) -> bool:
    return rate.finished >= t.min_runs and rate.percent < t.success_rate_percent


def duration_regressed(d: Durations | None, t: Thresholds) -> bool:
    return d is not None and d.recent_p95 > t.duration_factor * d.baseline_p95
