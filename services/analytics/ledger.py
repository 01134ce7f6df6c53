"""The fire ledger: every fire a schedule should have made, against the fires that happened.

Pure logic, no Kafka. Expected fires come from the scheduler's own function
(`shared/schedule.next_fire`) applied to each definition on `job-definitions`; fires that
happened are the first-attempt events of `execution-events` at that `scheduled_at`; where
the scheduler's clock stands is its compacted `scheduler-state` (next and last fire of
each job). Together they tell *why* an expected fire did not happen, which no single
source can (Airflow dropped its SLA misses for lack of exactly this):

| outcome              | how it is told                                                   | alert |
|----------------------|------------------------------------------------------------------|-------|
| on_time              | an event at that scheduled_at arrived within `late_after`        | no    |
| late                 | it arrived, after `late_after` (the episode then resolves)       | while it waited |
| concurrency_policy   | the event is SKIPPED (FORBID: the previous run still ran)        | no    |
| paused               | the definition was disabled at that instant                      | no    |
| misfire_policy       | scheduler-state went past it without firing it (SKIP/FIRE_ONCE)  | no    |
| invalid_definition   | the job's latest definition does not validate: it is suspended   | yes   |
| not_queued           | scheduler-state says it fired, but no event came (dispatcher?)   | yes   |
| scheduler_down       | the scheduler's clock has not reached it                         | yes   |

The last three are *pending*: they stay open (and alerting) until the fire happens or the
scheduler passes over it. A fire that started but has no terminal event
`finish_within_seconds` after `scheduled_at` is a late finish (alerting too).

Worked example (INTERVAL 1 s, late_after 3 s, scheduler stopped at 10 s, restarted with
FIRE_ONCE at 20 s): fires 11…16 are judged at 14…19 s as scheduler_down (alert); at 20 s
the scheduler fires 11 once (→ late) and moves on to 21: 12…20 become misfire_policy,
nothing is pending, the episode resolves.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from uuid import UUID

from cronstream.shared.records import JobDefinition
from cronstream.shared.schedule import from_epoch_ms, next_fire, to_epoch_ms

ALERTING = ("scheduler_down", "not_queued", "invalid_definition")
# The scheduler writes a job's state in the transaction of the fire; the fire's QUEUED
# event follows through the dispatcher. Wait this long after the state moved past a fire
# before calling it skipped by the misfire policy.
SETTLE_MS = 5_000
# Bound on the fires judged for one job in one round (a paused every-second job after a
# day would otherwise be 86,400 at once; the rest follow in later rounds).
MAX_JUDGED_PER_ROUND = 10_000


@dataclass(slots=True)
class Pending:
    """An expected fire that has not happened, past its deadline."""

    scheduled_ms: int
    reason: str
    passed_since_ms: int | None = None  # when scheduler-state was first seen past it


@dataclass(slots=True)
class LedgerJob:
    definition: JobDefinition | None
    late_after_ms: int
    finish_within_ms: int | None
    invalid: bool = False
    cursor_ms: int | None = None  # the next expected fire not judged yet
    seen: dict[int, str] = field(default_factory=dict)  # scheduled_ms -> first status seen
    pending: dict[int, Pending] = field(default_factory=dict)
    running: dict[UUID, int] = field(default_factory=dict)  # execution -> scheduled_ms
    state_next_ms: int | None = None
    state_last_ms: int | None = None
    # This job's judged fires by outcome, since the ledger's horizon: its alerts' evidence.
    outcomes: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True, slots=True)
class LateStatus:
    """What is late for one job now (empty lists: nothing)."""

    starts: list[Pending]
    finishes: list[tuple[UUID, int]]
    # The job's fires judged so far, by outcome (LedgerJob.outcomes).
    history: dict[str, int] = field(default_factory=dict)

    @property
    def late(self) -> bool:
        return bool(self.starts or self.finishes)


class FireLedger:
    def __init__(self, start_ms: int) -> None:
        # Fires before this instant are not judged: their events may be older than what
        # the service replayed.
        self.start_ms = start_ms
        self.jobs: dict[str, LedgerJob] = {}
        # Every job's outcomes since the caller last cleared it (the service's metrics).
        self.outcomes: Counter[str] = Counter()

    # -- inputs ------------------------------------------------------------------------

    def definition(self, job_id: str, definition: JobDefinition | None, *, valid: bool,
                   observed_ms: int, late_after_s: float = 0,
                   finish_within_s: float | None = None) -> None:
        """A job-definitions record: a tombstone (None, valid), an invalid record (None,
        not valid: the scheduler suspends the job), or a definition."""
        job = self.jobs.get(job_id)
        if definition is None and valid:
            self.jobs.pop(job_id, None)
            return
        if definition is None:
            if job is not None:
                job.invalid = True
            return
        if definition.type == "DEPENDENT" or definition.calendar is not None:
            # DEPENDENT: started by its upstreams, never on a clock. A calendar: its fires
            # need the calendar, which analytics does not read (yet): not judged.
            self.jobs.pop(job_id, None)
            return
        late_ms = int(late_after_s * 1000)
        finish_ms = None if finish_within_s is None else int(finish_within_s * 1000)
        if job is None:
            job = self.jobs[job_id] = LedgerJob(definition, late_ms, finish_ms)
        job.definition, job.invalid = definition, False
        job.late_after_ms, job.finish_within_ms = late_ms, finish_ms
        # From now on the new definition decides; never before the ledger's horizon and
        # never again over instants already judged.
        after = max(observed_ms, self.start_ms) - 1
        if job.cursor_ms is not None:
            after = max(after, job.cursor_ms - 1)
        job.cursor_ms = _next(definition, after)

    def scheduler_state(self, job_id: str, next_ms: int | None, last_ms: int | None) -> None:
        job = self.jobs.get(job_id)
        if job is not None:
            job.state_next_ms, job.state_last_ms = next_ms, last_ms

    def event(self, job_id: str, execution_id: UUID, *, status: str, attempt: int,
              scheduled_ms: int, terminal: bool) -> None:
        job = self.jobs.get(job_id)
        if job is None or attempt != 1:
            return
        if terminal:
            job.running.pop(execution_id, None)
        if scheduled_ms not in job.seen:
            job.seen[scheduled_ms] = status
            if not terminal and job.finish_within_ms is not None:
                job.running[execution_id] = scheduled_ms

    # -- judging -----------------------------------------------------------------------

    def judge(self, job_id: str, now_ms: int) -> LateStatus:
        job = self.jobs[job_id]
        judged = 0
        while (job.cursor_ms is not None and job.definition is not None
               and job.cursor_ms + job.late_after_ms <= now_ms and judged < MAX_JUDGED_PER_ROUND):
            t = job.cursor_ms
            judged += 1
            status = job.seen.get(t)
            if status is not None:
                self._count(job, "concurrency_policy" if status == "SKIPPED" else "on_time")
            elif not job.definition.enabled and not job.invalid:
                self._count(job, "paused")
            else:
                job.pending[t] = Pending(t, "scheduler_down")
            job.cursor_ms = _next(job.definition, t)
        for pending in list(job.pending.values()):
            self._recheck(job, pending, now_ms)
        horizon = min([job.cursor_ms or now_ms, *job.pending])
        for t in [t for t in job.seen if t < horizon]:
            del job.seen[t]
        finishes = [(e, t) for e, t in job.running.items()
                    if job.finish_within_ms is not None and t + job.finish_within_ms <= now_ms]
        return LateStatus(sorted(job.pending.values(), key=lambda p: p.scheduled_ms), finishes,
                          dict(job.outcomes))

    def _count(self, job: LedgerJob, outcome: str) -> None:
        self.outcomes[outcome] += 1
        job.outcomes[outcome] += 1

    def _recheck(self, job: LedgerJob, pending: Pending, now_ms: int) -> None:
        t = pending.scheduled_ms
        if t in job.seen:
            del job.pending[t]
            self._count(job, "late")
            return
        passed = job.state_next_ms is not None and job.state_next_ms > t and job.state_last_ms != t
        if passed:
            if pending.passed_since_ms is None:
                pending.passed_since_ms = now_ms
            if now_ms - pending.passed_since_ms >= SETTLE_MS:
                del job.pending[t]
                self._count(job, "misfire_policy")
                return
        else:
            pending.passed_since_ms = None
        if job.invalid:
            pending.reason = "invalid_definition"
        elif job.state_last_ms is not None and job.state_last_ms >= t:
            pending.reason = "not_queued"
        else:
            pending.reason = "scheduler_down"

    def pending_by_reason(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for job in self.jobs.values():
            for pending in job.pending.values():
                counts[pending.reason] += 1
        return counts


def _next(definition: JobDefinition, after_ms: int) -> int | None:
    fire = next_fire(definition, from_epoch_ms(after_ms))
    return None if fire is None else to_epoch_ms(fire)
