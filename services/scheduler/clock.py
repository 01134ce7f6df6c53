"""A shard leader's clock: the next fire of the jobs due soon, pending retries, a timer heap.

Pure logic, no Kafka: the leader feeds it definitions, state and retry records, asks it
for a `FirePlan` when something is due, commits the plan's records in one transaction,
and only then calls `commit(plan)`; an aborted plan is `restore`d. So the in-memory
clock never runs ahead of what Kafka holds.

The near window: with a `horizon_ms`, the clock holds only the jobs and retries due
before it (`admit`); everything due later lives in the shard's store on disk (store.py)
and is admitted as the horizon moves on. A job whose next fire falls beyond the horizon
after it fired or changed is `evict`ed. Without a horizon (unit tests), it holds all.

Misfires (a fire found late by more than `misfire_grace_seconds`, e.g. after an outage
or a failover):
- FIRE_ONCE: fire the first missed instant once, then continue after now;
- FIRE_ALL: fire every missed instant, oldest first, `limit` per plan;
- SKIP: fire nothing for the missed instants, continue after now.
A fire late by less than the grace is simply fired, and with it every later instant due
by now (each is less late): a short outage's backlog goes out in one plan.

Calendars (docs/decisions/0055): a job that names a calendar is computed with its current
version from the process's calendar table (calendars.py), and records that version's
offset (`calendar_offset`) with its timing; a fire planned with another version (the
calendar changed, or is gone) is not fired but planned again (`replan_calendar` does it at
once for every job naming it, held or in the store). A job naming a calendar that is not
known waits: no fire, no suspension, planned as soon as the calendar comes (`waiting`).
Jitter and `max_runs` (the fires are counted in the state, `runs`) take the same path,
`shared/schedule.py`'s; a plain job (no calendar, no jitter, no max_runs) keeps the lean
one, INTERVAL jobs in integers.

A job whose definition cannot be computed — it does not validate, or a computation on it
raises — is suspended (no next fire; `suspensions` tells the leader, which raises an
alert), and the rest keep firing: one record never stops the leader. A new definition of
the job lifts the suspension.

Hot path: a fire's JobDue and state records are rendered straight to JSON from cached
per-job fragments (`render_due`, `render_state`) — byte for byte what the pydantic
models would produce (a unit test holds them to it) at a fraction of the cost.

Why one module of this size: planning, committing and restoring a fire share the timer
heap and the job table; the pure core stays whole so its unit tests read it whole.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple
from uuid import UUID

from pydantic import ValidationError

from cronstream.services.scheduler.calendars import CalendarTable
from cronstream.shared.calendars import CalendarMissingError, ResolvedCalendar
from cronstream.shared.codec import describe
from cronstream.shared.dag import dag_problem
from cronstream.shared.ids import fast_uuid5, given_idempotency_key, wire_time_ms
from cronstream.shared.logs import log
from cronstream.shared.records import JobDefinition, JobSnapshot, RetryRequest
from cronstream.shared.schedule import (
    first_fire,
    next_after_nominal,
    next_fire,
    next_interval_fire_ms,
    plan_next,
    runs_left,
)
from cronstream.shared.schedule import from_epoch_ms as from_ms
from cronstream.shared.schedule import to_epoch_ms as to_ms

logger = logging.getLogger(__name__)

_JOB, _RETRY = 0, 1


@dataclass(slots=True)
class JobClock:
    """One job as the leader knows it. The definition is parsed lazily: at takeover a
    job whose stored state matches its definition needs no parsing until it fires."""

    job_id: str
    offset: int
    raw: bytes
    observed_ms: int = 0  # Kafka timestamp of the definition record
    next_fire_ms: int | None = None
    last_fire_ms: int | None = None
    # The `calendars` offset of the calendar version next_fire_ms was computed with.
    calendar_offset: int | None = None
    runs: int = 0  # fires so far (max_runs)
    # The nominal instant of next_fire_ms (before its jitter), when this clock computed it:
    # the next one follows without a search (memory only; None: searched for).
    next_nominal_ms: int | None = None
    _definition: JobDefinition | None = None
    _snapshot: JobSnapshot | None = None
    _fragments: tuple[str, str, str | None] | None = None
    # Prepared ahead (Clock.prepare): (next_fire_ms it was made for, its JobDue, the fire
    # that follows it). Used by a plan only while next_fire_ms is still that instant.
    _ready: tuple[int, Fire, int | None] | None = None

    @property
    def definition(self) -> JobDefinition:
        if self._definition is None:
            self._definition = JobDefinition.model_validate_json(self.raw)
        return self._definition

    @property
    def snapshot(self) -> JobSnapshot:
        if self._snapshot is None:
            self._snapshot = JobSnapshot.of(self.definition, self.offset)
        return self._snapshot

    def fragments(self) -> tuple[str, str, str | None]:
        """(job_id as JSON, snapshot as JSON, the fixed idempotency key or None), cached."""
        if self._fragments is None:
            snapshot = self.snapshot
            fixed = given_idempotency_key(snapshot.params)
            self._fragments = (json.dumps(self.job_id), snapshot.model_dump_json(), fixed)
        return self._fragments


class Fire(NamedTuple):
    """One JobDue of a plan, rendered."""

    job_id: str
    scheduled_ms: int
    execution_id: str
    value: bytes


class StateChange(NamedTuple):
    """A record for the scheduler-state topic: the new state, or None for a tombstone;
    with the timing it holds, for the shard's store. (A tuple: one is made per fire.)"""

    job_id: str
    value: bytes | None
    next_fire_ms: int | None = None
    offset: int | None = None
    last_fire_ms: int | None = None
    calendar_offset: int | None = None
    runs: int | None = None


def render_state(job_id: str, offset: int, next_ms: int | None, last_ms: int | None, *,
                 calendar_offset: int | None = None, runs: int | None = None) -> bytes:
    """SchedulerState(job_id, offset, next_ms, last_ms, calendar_offset, runs).to_json(), fast."""
    return (f'{{"schema_version":1,"job_id":{json.dumps(job_id)},"definition_offset":{offset},'
            f'"next_fire_ms":{"null" if next_ms is None else next_ms},'
            f'"last_fire_ms":{"null" if last_ms is None else last_ms},'
            f'"calendar_offset":{"null" if calendar_offset is None else calendar_offset},'
            f'"runs":{"null" if runs is None else runs}}}').encode()


def render_due(job: JobClock, fire_ms: int) -> Fire:
    """The first-attempt JobDue of `job` at `fire_ms`, as JobDue(...).to_json() would be."""
    job_json, snapshot_json, fixed_key = job.fragments()
    wire, json_time = wire_time_ms(fire_ms)
    execution = fast_uuid5(f"exec|{job.job_id}|{wire}|1")
    run = fast_uuid5(f"run|{job.job_id}|{wire}")
    key = json.dumps(fixed_key if fixed_key is not None else f"{job.job_id}@{wire}")
    value = (f'{{"schema_version":1,"execution_id":"{execution}","job_id":{job_json},'
             f'"run_id":"{run}","scheduled_at":"{json_time}","attempt_number":1,'
             f'"reason":"SCHEDULE","delivery":1,"idempotency_key":{key},'
             f'"job":{snapshot_json},"approved_by":null,"triggered_by":null,'
             f'"upstream":null}}').encode()
    return Fire(job.job_id, fire_ms, execution, value)


@dataclass(slots=True)
class FirePlan:
    """Everything one transaction commits: due jobs, fired retries, new job states."""

    dues: list[Fire] = field(default_factory=list)
    fired_retries: list[UUID] = field(default_factory=list)
    states: list[StateChange] = field(default_factory=list)
    skipped: int = 0
    # The earliest timer inside the window that waits for its time (it may not fire
    # ahead): when the next round is needed, at the latest.
    held_ms: int | None = None
    # (job_id, next_fire_ms, last_fire_ms, runs, calendar_offset, next nominal) to apply on
    # commit; heap entries to restore.
    _updates: list[tuple[str, int | None, int | None, int, int | None, int | None]] = field(
        default_factory=list)
    _popped: list[tuple[int, int, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.dues or self.fired_retries or self.states)


# (type, depends_on) of a job the clock does not hold (the shard's store), or None.
ShapeOf = Callable[[str], "tuple[str, list[str]] | None"]


class Clock:
    def __init__(self, shape_of: ShapeOf | None = None,
                 dependents: Callable[[], Iterable[tuple[str, list[str]]]] | None = None,
                 calendars: CalendarTable | None = None) -> None:
        self.jobs: dict[str, JobClock] = {}
        self.calendars = calendars if calendars is not None else CalendarTable(ready=True)
        # Jobs this clock found naming a calendar it does not know: job_id -> calendar_id.
        self.waiting: dict[str, str] = {}
        self.retries: dict[UUID, RetryRequest] = {}
        # Timers due at or after this are not held (None: all are): the store has them.
        self.horizon_ms: int | None = None
        self._shape_of = shape_of
        self._dependents_source = dependents
        # Takeover only: job_id -> (definition_offset, next_fire_ms, last_fire_ms,
        # calendar_offset, runs).
        self._state: dict[str, tuple[int, int | None, int | None, int | None, int]] = {}
        self._heap: list[tuple[int, int, str]] = []
        # Reverse DAG index (upstream -> dependents); None until a DAG check needs it.
        self._dependents: dict[str, set[str]] | None = None
        self._upstreams: dict[str, tuple[str, ...]] = {}
        # Jobs suspended because they cannot be computed: job_id -> (offset, reason).
        self.suspended: dict[str, tuple[int, str]] = {}
        self.suspensions: list[tuple[str, int, str]] = []  # new ones, for the leader to report

    # -- takeover -------------------------------------------------------------------

    def load_state(self, job_id: str, value: bytes | None) -> None:
        """Replay one scheduler-state record (our own topic: a record that does not
        read is dropped, and the job's state recomputed)."""
        if value is None:
            self._state.pop(job_id, None)
            return
        try:
            data = json.loads(value)
            self._state[job_id] = (int(data["definition_offset"]), data["next_fire_ms"],
                                   data.get("last_fire_ms"), data.get("calendar_offset"),
                                   int(data.get("runs") or 0))
        except (ValueError, KeyError, TypeError, RecursionError):
            self._state.pop(job_id, None)

    def load_definition(self, job_id: str, raw: bytes | None, offset: int, observed_ms: int) -> None:
        """Replay one job-definitions record during takeover (no validation here: the
        caller validates records the group has not processed yet)."""
        if raw is None:
            self.jobs.pop(job_id, None)
        else:
            self.jobs[job_id] = JobClock(job_id, offset, raw, observed_ms)
        self._dependents = None  # rebuilt on first use, after the replay

    def reconcile(self) -> list[StateChange]:
        """After replay: trust stored state where it matches the definition, recompute
        the rest, drop state of deleted jobs. Returns the state records to write.

        A job whose state is missing or stale fires from its definition record's Kafka
        timestamp, which every leader reads alike.
        """
        changes: list[StateChange] = []
        heap: list[tuple[int, int, str]] = []
        for job_id, job in self.jobs.items():
            state = self._state.get(job_id)
            if state is not None:
                job.last_fire_ms, job.calendar_offset, job.runs = state[2], state[3], state[4]
            if state is not None and state[0] == job.offset and self.trusted(job, state[1]):
                job.next_fire_ms = state[1]
            else:
                self._compute_first(job)
                changes.append(self._state_change(job))
            if job.next_fire_ms is not None:
                heap.append((job.next_fire_ms, _JOB, job_id))
        for job_id in [j for j in self._state if j not in self.jobs]:
            changes.append(StateChange(job_id, None))
        self._state.clear()  # only needed during takeover
        heap.extend(self._heap)
        heapq.heapify(heap)
        self._heap = heap
        return changes

    def trusted(self, job: JobClock, next_fire_ms: int | None) -> bool:
        """Whether a stored timing of `job` (computed from its current definition) still
        holds for its calendar: computed with the calendar's current version, or, for a
        calendar not known, with none (it waits). Parses only definitions that may name a
        calendar."""
        if job._definition is None and (b'"calendar"' not in job.raw or (
                job.raw.count(b'"calendar"') == 1 and b'"calendar":null' in job.raw)):
            return True
        try:
            calendar_id = job.definition.calendar
        except ValidationError:
            return True  # suspended when it is computed
        if calendar_id is None:
            return True
        current = self.calendars.offset(calendar_id)
        if current is None:
            return job.calendar_offset is None and next_fire_ms is None
        return job.calendar_offset == current

    def _first_ms(self, job: JobClock) -> tuple[int | None, int | None]:
        """(next fire, calendar offset) of the job from its definition, its last fire and
        its calendar's current version (CalendarMissingError when that is not known)."""
        definition = job.definition
        if not definition.enabled or definition.type == "DEPENDENT":
            return None, None
        if definition.max_runs is not None and job.runs >= definition.max_runs:
            return None, None
        calendar: ResolvedCalendar | None = None
        calendar_offset = None
        observed_ms = job.observed_ms
        if definition.calendar is not None:
            known = self.calendars.get(definition.calendar)
            if known is None:
                raise CalendarMissingError(definition.calendar)
            calendar, calendar_offset = known.resolved, known.offset
            # A calendar change is an update of the job: it takes effect from its record's
            # time (every leader reads the same), never before.
            observed_ms = max(observed_ms, known.observed_ms)
        last = None if job.last_fire_ms is None else from_ms(job.last_fire_ms)
        fire = first_fire(definition, from_ms(observed_ms), last, calendar=calendar)
        return (None if fire is None else to_ms(fire)), calendar_offset

    def _compute_first(self, job: JobClock) -> None:
        """Set the job's next fire from its definition. A definition that does not
        validate suspends the job (no next fire) until a valid one replaces it; one that
        names a calendar not known waits for it."""
        job.next_fire_ms = job.calendar_offset = job.next_nominal_ms = None
        self.suspended.pop(job.job_id, None)
        self.waiting.pop(job.job_id, None)
        try:
            job.next_fire_ms, job.calendar_offset = self._first_ms(job)
        except CalendarMissingError as exc:
            self._wait(job, str(exc))
        except Exception as exc:
            self._suspend(job, exc)

    def _wait(self, job: JobClock, calendar_id: str) -> None:
        job.next_fire_ms = job.calendar_offset = None
        self._waits(job.job_id, calendar_id)

    def _waits(self, job_id: str, calendar_id: str) -> None:
        if self.waiting.get(job_id) != calendar_id:
            self.waiting[job_id] = calendar_id
            log(logger, "job_waiting_for_calendar", job_id=job_id, calendar_id=calendar_id)

    def _suspend(self, job: JobClock, exc: Exception) -> None:
        job.next_fire_ms = None
        reason = (describe(exc) if isinstance(exc, ValidationError)
                  else f"{type(exc).__name__}: {str(exc)[:300]}")
        if self.suspended.get(job.job_id) != (job.offset, reason):
            self.suspended[job.job_id] = (job.offset, reason)
            self.suspensions.append((job.job_id, job.offset, reason))
            log(logger, "job_suspended", logging.WARNING, job_id=job.job_id, offset=job.offset,
                reason=reason)

    @staticmethod
    def _state_change(job: JobClock) -> StateChange:
        return StateChange(job.job_id, render_state(job.job_id, job.offset, job.next_fire_ms,
                                                    job.last_fire_ms, calendar_offset=job.calendar_offset,
                                                    runs=job.runs),
                           job.next_fire_ms, job.offset, job.last_fire_ms, job.calendar_offset,
                           job.runs)

    def replan_calendar(self, calendar_id: str,
                        others: Iterable[JobClock] | None = None) -> list[StateChange]:
        """A calendar changed (a new version, or it is gone): every job that names it is
        planned again, at once — from its last fire, never before the change — and its new
        state returned, for the shard's durable state. `others`: the jobs naming it that
        the shard's store knows (a held job is taken as the clock holds it); without them,
        the held jobs naming it (unit tests: no horizon)."""
        if others is None:
            found = [job for job in self.jobs.values() if self._names(job, calendar_id)]
        else:
            found = [self.jobs.get(job.job_id, job) for job in others]
        changes = []
        for job in found:
            self._compute_first(job)
            if self._holds(job.next_fire_ms):
                self.jobs[job.job_id] = job
                self._schedule(job)
            changes.append(self._state_change(job))
        return changes

    @staticmethod
    def _names(job: JobClock, calendar_id: str) -> bool:
        if job._definition is None and calendar_id.encode() not in job.raw:
            return False
        try:
            return job.definition.calendar == calendar_id
        except ValidationError:
            return False

    def recompute(self, job: JobClock) -> StateChange:
        """The timing of a job whose stored state does not match its definition (a new
        leader's reconcile, from the shard's store): computed from the definition, kept
        in the clock when it falls inside the horizon."""
        self._compute_first(job)
        if self._holds(job.next_fire_ms):
            self.jobs[job.job_id] = job
            self._schedule(job)
        return self._state_change(job)

    # -- the near window ------------------------------------------------------------

    def _holds(self, due_ms: int | None) -> bool:
        return due_ms is not None and (self.horizon_ms is None or due_ms < self.horizon_ms)

    def admit(self, job: JobClock) -> None:
        """A job due before the horizon, from the store (one held already stays as is)."""
        if job.job_id not in self.jobs and job.next_fire_ms is not None:
            self.jobs[job.job_id] = job
            self._schedule(job)

    def evict(self) -> list[str]:
        """Drop the jobs that no longer fire before the horizon (the store keeps them)."""
        if self.horizon_ms is None:
            return []
        gone = [j for j, job in self.jobs.items() if not self._holds(job.next_fire_ms)]
        for job_id in gone:
            del self.jobs[job_id]
        return gone

    # -- live updates ---------------------------------------------------------------

    def apply_definition(
        self, job_id: str, definition: JobDefinition | None, raw: bytes | None,
        offset: int, observed_ms: int, *, last_fire_ms: int | None = None, runs: int = 0,
    ) -> StateChange:
        """A new, updated or deleted (None) definition; takes effect at its next fire.
        An invalid one (`raw` given, `definition` None) suspends the job. `last_fire_ms`,
        `runs`: its last fire and its count of fires, when the clock does not hold the job
        (the store knows them)."""
        self._unlink(job_id)
        self.suspended.pop(job_id, None)
        self.waiting.pop(job_id, None)
        if raw is None:
            self.jobs.pop(job_id, None)
            return StateChange(job_id, None)
        if definition is not None:
            self._link(job_id, definition)
        previous = self.jobs.get(job_id)
        job = JobClock(job_id, offset, raw, observed_ms, _definition=definition)
        if previous is not None:
            job.last_fire_ms, job.runs = previous.last_fire_ms, previous.runs
        else:
            job.last_fire_ms, job.runs = last_fire_ms, runs
        self.jobs[job_id] = job
        if definition is not None:
            self._compute_first(job)
        if self._holds(job.next_fire_ms):  # else evicted: a timer beyond the horizon would stay
            self._schedule(job)             # in the heap, a job's worth of memory, until it is due
        return self._state_change(job)

    # -- DAG shape (cycles, one root) --------------------------------------------------

    def dag_problem(self, definition: JobDefinition) -> str | None:
        """Why `definition` (not applied yet) would break the DAG rules, or None."""
        if definition.type != "DEPENDENT" and not self._dependents_of(definition.job_id):
            return None

        def lookup(job_id: str) -> tuple[str, list[str]] | None:
            if job_id == definition.job_id:
                return definition.type, list(definition.depends_on)
            job = self.jobs.get(job_id)
            if job is None:
                return None if self._shape_of is None else self._shape_of(job_id)
            try:
                found = job.definition
            except Exception:  # an invalid definition takes no part in any DAG
                return None
            return found.type, list(found.depends_on)

        return dag_problem(definition.job_id, lookup, self._dependents_of)

    def _dependents_of(self, job_id: str) -> list[str]:
        """Jobs whose depends_on names `job_id`, from a reverse index built once (parsing
        only the definitions that look DEPENDENT) and kept current by apply_definition."""
        if self._dependents is None:
            self._dependents, self._upstreams = {}, {}
            if self._dependents_source is not None:
                for dependent, depends_on in self._dependents_source():
                    self._upstreams[dependent] = tuple(depends_on)
                    for upstream in depends_on:
                        self._dependents.setdefault(upstream, set()).add(dependent)
            for job in self.jobs.values():
                if job._definition is None and b"DEPENDENT" not in job.raw:
                    continue
                with contextlib.suppress(Exception):
                    self._link(job.job_id, job.definition)
        return sorted(self._dependents.get(job_id, ()))

    def _link(self, job_id: str, definition: JobDefinition) -> None:
        if self._dependents is None or not definition.depends_on:
            return
        self._upstreams[job_id] = tuple(definition.depends_on)
        for upstream in definition.depends_on:
            self._dependents.setdefault(upstream, set()).add(job_id)

    def _unlink(self, job_id: str) -> None:
        if self._dependents is None:
            return
        for upstream in self._upstreams.pop(job_id, ()):
            self._dependents.get(upstream, set()).discard(job_id)

    def add_retry(self, request: RetryRequest) -> bool:
        """Hold a retry timer; whether it is held (due before the horizon)."""
        due = to_ms(request.due_at)
        if not self._holds(due):
            self.retries.pop(request.execution_id, None)
            return False
        self.retries[request.execution_id] = request
        heapq.heappush(self._heap, (due, _RETRY, str(request.execution_id)))
        return True

    def cancel_retry(self, key: UUID) -> None:
        self.retries.pop(key, None)

    def _schedule(self, job: JobClock) -> None:
        if job.next_fire_ms is not None:
            heapq.heappush(self._heap, (job.next_fire_ms, _JOB, job.job_id))

    # -- firing ---------------------------------------------------------------------

    def next_due_ms(self) -> int | None:
        """When the earliest live timer is due (stale heap entries are discarded)."""
        while self._heap:
            due, kind, key = self._heap[0]
            if self._live(due, kind, key):
                return due
            heapq.heappop(self._heap)
        return None

    def _live(self, due: int, kind: int, key: str) -> bool:
        if kind == _JOB:
            job = self.jobs.get(key)
            return job is not None and job.next_fire_ms == due
        request = self.retries.get(UUID(key))
        return request is not None and to_ms(request.due_at) == due

    def plan(self, now_ms: int, limit: int = 5000, ahead_ms: int = 0) -> FirePlan:
        """Pop what is due at `now_ms` (at most ~`limit` fires) into one plan, and the fires
        of jobs that may fire ahead (`fires_ahead`) due within `ahead_ms` after it."""
        plan = FirePlan()
        seen: set[tuple[int, str]] = set()
        later: list[tuple[int, int, str]] = []
        while self._heap and len(plan.dues) < limit:
            due, kind, key = self._heap[0]
            if due > now_ms + ahead_ms:
                break
            entry = heapq.heappop(self._heap)
            if not self._live(due, kind, key) or (kind, key) in seen:
                continue
            if due > now_ms and not (kind == _JOB and self.fires_ahead(self.jobs[key])):
                later.append(entry)  # fires when it is due
                continue
            seen.add((kind, key))
            plan._popped.append(entry)
            if kind == _RETRY:
                request = self.retries[UUID(key)]
                plan.dues.append(Fire(request.job_id, due, str(request.execution_id),
                                      request.job_due().to_json()))
                plan.fired_retries.append(request.execution_id)
            else:
                self._plan_job(self.jobs[key], now_ms, plan, limit)
        for entry in later:
            heapq.heappush(self._heap, entry)
        plan.held_ms = min((entry[0] for entry in later), default=None)
        return plan

    @staticmethod
    def fires_ahead(job: JobClock) -> bool:
        """Whether `job`'s fires may be committed before they are due: only under
        concurrency_policy ALLOW without max_concurrent_runs or a rate limit, where nothing
        is decided by what else runs at the time (docs/decisions/0027, 0056). A pool or a
        concurrency key does not stop it: the dispatcher admits such a run when its JobDue
        arrives (at most the fire-ahead window early: its slot is held that much longer)
        or when a slot frees, and the worker starts it at its time; a rate limit counts
        starts by the instant they are admitted, so its runs fire when due. Never retries:
        their delay is the backoff."""
        try:
            definition = job.definition
            return (definition.concurrency_policy == "ALLOW" and definition.max_concurrent_runs is None
                    and definition.rate_limit is None)
        except ValidationError:
            return False  # suspended when it is due, by _plan_job

    def _plan_job(self, job: JobClock, now_ms: int, plan: FirePlan, limit: int) -> None:
        try:
            self._plan_fires(job, now_ms, plan, limit)
        except Exception as exc:  # one job that cannot be computed never stops the others
            self._suspend(job, exc)
            self._plan_state(plan, job, None, job.last_fire_ms, runs=job.runs,
                             calendar_offset=job.calendar_offset)

    @staticmethod
    def _plan_state(plan: FirePlan, job: JobClock, next_ms: int | None, last_ms: int | None, *,
                    runs: int, calendar_offset: int | None) -> None:
        plan._updates.append((job.job_id, next_ms, last_ms, runs, calendar_offset, None))
        plan.states.append(StateChange(
            job.job_id, render_state(job.job_id, job.offset, next_ms, last_ms,
                                      calendar_offset=calendar_offset, runs=runs),
            next_ms, job.offset, last_ms, calendar_offset, runs))

    def _plan_fires(self, job: JobClock, now_ms: int, plan: FirePlan, limit: int) -> None:
        assert job.next_fire_ms is not None
        definition = job.definition
        if definition.calendar is not None or definition.max_runs is not None or definition.jitter_seconds:
            self._plan_rich(job, definition, now_ms, plan, limit)
            return
        due_ms = job.next_fire_ms
        late = (now_ms - due_ms) / 1000 > definition.misfire_grace_seconds
        ready = job._ready
        if not late and ready is not None and ready[0] == due_ms and (ready[2] is None or ready[2] > now_ms):
            # Prepared ahead: a burst of jobs due in the same second costs only its records.
            plan.dues.append(ready[1])
            self._plan_fired(plan, job, ready[2], due_ms, job.runs + 1)
            return
        fires: list[int] = []
        following: int | None
        if not late or definition.misfire_policy == "FIRE_ALL":
            # The first instant, and every later one due by now: within the grace each is
            # simply fired (it is less late than the first), so a short outage's backlog
            # goes out in one plan; FIRE_ALL fires a longer one the same way.
            fires.append(due_ms)
            following = self._following(definition, due_ms)
            while following is not None and following <= now_ms \
                    and len(plan.dues) + len(fires) < limit:
                fires.append(following)
                following = self._following(definition, following)
        else:
            if definition.misfire_policy == "FIRE_ONCE":
                fires.append(due_ms)
            else:
                plan.skipped += 1
            following = self._following(definition, now_ms)
        if late:
            log(logger, "misfire", logging.WARNING, job_id=job.job_id,
                policy=definition.misfire_policy, due_ms=due_ms, fired=len(fires))
        rendered = [render_due(job, fire) for fire in fires]  # may raise: nothing added yet
        plan.dues.extend(rendered)
        self._plan_fired(plan, job, following, fires[-1] if fires else job.last_fire_ms,
                         job.runs + len(fires))

    @staticmethod
    def _plan_fired(plan: FirePlan, job: JobClock, following: int | None, last_ms: int | None,
                    runs: int) -> None:
        """A plain job's state after its fires (_plan_state, inlined)."""
        plan._updates.append((job.job_id, following, last_ms, runs, None, None))
        plan.states.append(StateChange(
            job.job_id, render_state(job.job_id, job.offset, following, last_ms, runs=runs),
            following, job.offset, last_ms, None, runs))

    def _plan_rich(self, job: JobClock, definition: JobDefinition, now_ms: int, plan: FirePlan,
                   limit: int) -> None:
        """_plan_fires of a job with a calendar, a jitter or max_runs: its fires through
        shared/schedule.py's Fire (nominal instants), its calendar version checked."""
        assert job.next_fire_ms is not None
        calendar: ResolvedCalendar | None = None
        if definition.calendar is not None:
            known = self.calendars.get(definition.calendar)
            if known is None or known.offset != job.calendar_offset:
                # Planned with another version of its calendar (or it is gone): not fired,
                # planned again with the current one (or it waits).
                self._replan_in(plan, job)
                return
            calendar = known.resolved
        left = runs_left(definition.max_runs, job.runs)
        if left == 0:
            self._plan_state(plan, job, None, job.last_fire_ms, runs=job.runs,
                             calendar_offset=job.calendar_offset)
            return
        due_ms = job.next_fire_ms
        late = (now_ms - due_ms) / 1000 > definition.misfire_grace_seconds
        fires: list[int] = []
        following: tuple[int | None, int | None]  # (fire, its nominal instant)
        if not late or definition.misfire_policy == "FIRE_ALL":  # as in _plan_fires
            fires.append(due_ms)
            following = self._next(definition, due_ms, job.next_nominal_ms, calendar)
            while (following[0] is not None and following[0] <= now_ms
                   and len(plan.dues) + len(fires) < limit and (left is None or len(fires) < left)):
                fires.append(following[0])
                following = self._next(definition, following[0], following[1], calendar)
        else:
            if definition.misfire_policy == "FIRE_ONCE":
                fires.append(due_ms)
            else:
                plan.skipped += 1
            following = self._next(definition, now_ms, None, calendar)
        if left is not None and len(fires) >= left:
            following = (None, None)  # its max_runs are fired
        if late:
            log(logger, "misfire", logging.WARNING, job_id=job.job_id,
                policy=definition.misfire_policy, due_ms=due_ms, fired=len(fires))
        rendered = [render_due(job, fire) for fire in fires]  # may raise: nothing added yet
        plan.dues.extend(rendered)
        last_ms = fires[-1] if fires else job.last_fire_ms
        runs, calendar_offset, next_ms = job.runs + len(fires), job.calendar_offset, following[0]
        plan._updates.append((job.job_id, next_ms, last_ms, runs, calendar_offset, following[1]))
        plan.states.append(StateChange(
            job.job_id, render_state(job.job_id, job.offset, next_ms, last_ms,
                                     calendar_offset=calendar_offset, runs=runs),
            next_ms, job.offset, last_ms, calendar_offset, runs))

    @staticmethod
    def _next(definition: JobDefinition, after_ms: int, nominal_ms: int | None,
              calendar: ResolvedCalendar | None) -> tuple[int | None, int | None]:
        """(fire, nominal instant) of the first fire after `after_ms`: after the fire of
        nominal instant `nominal_ms` when it is known (that fire is `after_ms`), without
        the jitter's search. INTERVAL jobs without a jitter stay in integers while the
        next instant of their grid is on a day their calendar includes (SKIP is all an
        INTERVAL job may do): the first instant of the grid after `after_ms` on an
        included day, as `next_fire` finds it."""
        if definition.type == "INTERVAL" and definition.interval_seconds is not None \
                and not definition.jitter_seconds:
            at = next_interval_fire_ms(definition.interval_seconds, definition.start_at,
                                       definition.end_at, after_ms)
            if at is None or calendar is None or calendar.included(
                    from_ms(at).astimezone(calendar.zone).date()):
                return at, at
        if nominal_ms is not None:
            fire = next_after_nominal(definition, from_ms(nominal_ms), calendar=calendar)
        else:
            fire = plan_next(definition, from_ms(after_ms), calendar=calendar)
        return (None, None) if fire is None else (to_ms(fire.at), to_ms(fire.nominal))

    def _replan_in(self, plan: FirePlan, job: JobClock) -> None:
        """The job's timing computed again in `plan` (committed with it), nothing fired."""
        self.suspended.pop(job.job_id, None)
        self.waiting.pop(job.job_id, None)
        try:
            next_ms, calendar_offset = self._first_ms(job)
        except CalendarMissingError as exc:
            self._waits(job.job_id, str(exc))  # the job itself changes on commit
            next_ms, calendar_offset = None, None
        self._plan_state(plan, job, next_ms, job.last_fire_ms, runs=job.runs,
                         calendar_offset=calendar_offset)

    def prepare(self, job: JobClock) -> bool:
        """Render a plain job's next fire and compute the one after it, ahead of its time
        (the leader's prepare loop); True when there was anything to do. May raise: the
        job is suspended when it is due."""
        due_ms = job.next_fire_ms
        if job._ready is not None and job._ready[0] == due_ms:
            return False
        fresh = job._fragments is None
        job.fragments()
        definition = job.definition
        if due_ms is None or definition.calendar is not None or definition.max_runs is not None \
                or definition.jitter_seconds:
            return fresh  # parsed and rendered once; its fires are computed when due
        job._ready = (due_ms, render_due(job, due_ms), self._following(definition, due_ms))
        return True

    @staticmethod
    def _following(definition: JobDefinition, after_ms: int) -> int | None:
        """The next fire of a plain job (no calendar, jitter nor max_runs) after
        `after_ms`. INTERVAL jobs stay in integers."""
        if definition.type == "INTERVAL" and definition.interval_seconds is not None:
            return next_interval_fire_ms(definition.interval_seconds, definition.start_at,
                                         definition.end_at, after_ms)
        fire = next_fire(definition, from_ms(after_ms))
        return None if fire is None else to_ms(fire)

    def commit(self, plan: FirePlan) -> None:
        """The plan's transaction committed: advance the clock (a job that no longer fires
        before the horizon leaves it: the store keeps its timing)."""
        for job_id, next_ms, last_ms, runs, calendar_offset, nominal_ms in plan._updates:
            job = self.jobs.get(job_id)
            if job is None:
                continue
            job.next_fire_ms, job.last_fire_ms = next_ms, last_ms
            job.runs, job.calendar_offset, job.next_nominal_ms = runs, calendar_offset, nominal_ms
            if self._holds(next_ms):
                self._schedule(job)
            elif self.horizon_ms is not None:
                del self.jobs[job_id]
        for key in plan.fired_retries:
            self.retries.pop(key, None)

    def restore(self, plan: FirePlan) -> None:
        """The plan's transaction aborted: put its timers back as they were."""
        for entry in plan._popped:
            heapq.heappush(self._heap, entry)

    def __iter__(self) -> Iterator[JobClock]:
        return iter(self.jobs.values())
