"""The record contract (docs/reference/records.md): every value that crosses a Kafka topic.

These pydantic models are the source of truth; `schemas/` holds the JSON Schema
generated from them (`python -m cronstream.shared.schemagen`), and a test fails when
the two drift. Models are strict (no coercion: "5" is not 5) and frozen: a record either
is what the contract says or it is dead-lettered. They are open to *unknown* fields
(`extra="allow"`), which are kept and written out again wherever a record passes
through, so that a newer minor version that only adds optional fields never
dead-letters traffic during a rolling upgrade; `schema_version` is the major version, and
an unknown one is refused (decision 0050). What people write (`apply`, the SDK) is held
to the closed contract instead: `Record.from_dict` refuses an unknown field as a typo.
Enumerations are string literals so that they mean the same in JSON, in YAML and in
Python.

Execution states and who moves an execution out of each: `shared/statuses.py`
(`Status`, one member per status with its meaning; the derived sets TERMINAL, FINAL...).

Why one module of this size: it is the whole wire contract — every record a topic
carries, its limits and its validation — and `schemas/` mirrors it file for file;
splitting it would scatter what a reviewer must read together.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from types import UnionType
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    ClassVar,
    Literal,
    Self,
    Union,
    get_args,
    get_origin,
)
from uuid import UUID
from zoneinfo import ZoneInfo, available_timezones

import msgspec
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import to_json

from cronstream.shared.condition import ConditionError, parse_condition, parse_expression, parse_filter
from cronstream.shared.cron import CronError, compiled
from cronstream.shared.escaping import CONTROL
from cronstream.shared.ids import (
    event_run_id,
    execution_id,
    idempotency_key,
    new_event_id,
    retry_execution_id,
    run_id,
    step_idempotency_key,
)
from cronstream.shared.statuses import TERMINAL

if TYPE_CHECKING:  # the fast records are read with these models' rules (fast_records.py)
    from cronstream.shared.fast_records import FastDue, FastSnapshot

SCHEMA_VERSION: Literal[1] = 1

MAX_PARAMS_BYTES = 64 * 1024
MAX_RESULT_BYTES = 64 * 1024
MAX_DEFINITION_BYTES = 256 * 1024
MAX_MESSAGE_CHARS = 8 * 1024
MAX_JITTER_SECONDS = 3600

JobType = Literal["CRON", "INTERVAL", "ONE_TIME", "DEPENDENT", "EVENT"]
TriggerRule = Literal["ALL_SUCCESS", "ALL_DONE", "ONE_SUCCESS", "ONE_FAILED", "NONE_FAILED"]
Priority = Literal["high", "normal", "low"]
ConcurrencyPolicy = Literal["ALLOW", "FORBID", "REPLACE"]
MisfirePolicy = Literal["FIRE_ONCE", "FIRE_ALL", "SKIP"]
DueReason = Literal["SCHEDULE", "RETRY", "DEPENDENCY", "MANUAL", "REQUEUE", "BACKFILL", "EVENT"]
ExecutionStatus = Literal[
    "WAITING",
    "QUEUED",
    "RUNNING",
    "PROGRESS",
    "REQUEUED",
    "AWAITING_APPROVAL",
    "COMPLETED",
    "FAILED",
    "TIMED_OUT",
    "CANCELLED",
    "PERMANENTLY_FAILED",
    "SKIPPED",
]
WorkerStatus = Literal["ACTIVE", "DRAINING", "OFFLINE"]
# What a fire on a day its calendar excludes does (docs/decisions/0055).
OnExcluded = Literal["SKIP", "NEXT_DAY", "PREVIOUS_DAY"]
Weekday = Literal["MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"]
WEEKDAYS: tuple[Weekday, ...] = ("MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN")

PRIORITIES: tuple[Priority, ...] = ("high", "normal", "low")


@lru_cache(maxsize=1)
def _timezones() -> frozenset[str]:
    return frozenset(available_timezones())


_ZERO = timedelta(0)


# Every instant on the wire lies in this range, so that every computation on it (next
# fires, retry delays, DST resolution) stays inside what datetime and PostgreSQL handle:
# a `start_at` in the year 9999 once stopped every scheduler.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2999, 12, 31, 23, 59, 59, tzinfo=UTC)


def _plain_json(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON data")


# Re-encoding JSON read from the wire never makes it more than this many times longer (the
# worst case is an exponent: "1e15" becomes 1000000000000000.0), so a record whose whole
# size (`decode` passes it as the validation context's "raw_size") is this far under a
# limit cannot hold a part over it, and is not re-encoded to prove it: the hot path.
REENCODE_GROWTH = 5


def _json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def _small_on_the_wire(info: ValidationInfo, limit: int) -> bool:
    raw = info.context.get("raw_size") if isinstance(info.context, dict) else None
    return isinstance(raw, int) and raw * REENCODE_GROWTH <= limit


def _params_limit(value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
    if _small_on_the_wire(info, MAX_PARAMS_BYTES):
        return value
    size = _json_size(value)
    if size > MAX_PARAMS_BYTES:
        raise ValueError(f"is {size} bytes of JSON; the limit is {MAX_PARAMS_BYTES}")
    return value


def _result_limit(value: Any, info: ValidationInfo) -> Any:
    if value is not None and not _small_on_the_wire(info, MAX_RESULT_BYTES):
        size = _json_size(value)
        if size > MAX_RESULT_BYTES:
            raise ValueError(f"is {size} bytes of JSON; the limit is {MAX_RESULT_BYTES}")
    return value


class _InUtc:
    """Marks a UtcDatetime field: its model moves the value to UTC (`UtcModel`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "IN_UTC"


IN_UTC = _InUtc()

# Aware and inside [EARLIEST, LATEST], both checked by pydantic-core; the move to UTC (for
# the rare value with another offset) happens once per record, in `UtcModel`. A Python
# validator per datetime cost more than everything else about a datetime: every record
# on the hot path carries two to four of them.
UtcDatetime = Annotated[AwareDatetime, Field(ge=EARLIEST, le=LATEST), IN_UTC]


def _marked(annotation: Any) -> bool:
    return get_origin(annotation) is Annotated and IN_UTC in annotation.__metadata__


def _utc_fields(model: type[BaseModel]) -> tuple[str, ...]:
    """The fields of `model` declared `UtcDatetime` or `UtcDatetime | None`."""
    names = []
    for name, info in model.model_fields.items():
        optional = get_origin(info.annotation) in (Union, UnionType)
        if IN_UTC in info.metadata or (optional and any(map(_marked, get_args(info.annotation)))):
            names.append(name)
        elif "IN_UTC" in repr(info.annotation):
            raise TypeError(f"{model.__name__}.{name}: a UtcDatetime inside a container is not "
                            "moved to UTC; declare it as UtcDatetime or UtcDatetime | None")
    return tuple(names)


class UtcModel(BaseModel):
    """A model whose `UtcDatetime` fields hold UTC values: an aware value with another
    offset is converted once validated (the instant is unchanged)."""

    _utc_names: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._utc_names = _utc_fields(cls)

    @model_validator(mode="after")
    def _in_utc(self) -> Self:
        values = self.__dict__
        for name in self._utc_names:
            value = values[name]
            if value is not None and value.utcoffset() != _ZERO:
                values[name] = value.astimezone(UTC)
        return self


JobId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,128}$")]
CalendarId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,128}$")]
HandlerName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")]
QueueName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
WorkerId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:@-]{1,128}$")]
Params = Annotated[dict[str, Any], AfterValidator(_params_limit)]
MaxConcurrentRuns = Annotated[int, Field(ge=1, le=10_000)]
PoolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,128}$")]
PoolSlots = Annotated[int, Field(ge=1, le=10_000)]
Message = Annotated[str, StringConstraints(max_length=MAX_MESSAGE_CHARS)]
Actor = Annotated[str, StringConstraints(max_length=256)]
# 1 + max_retries (≤ 100); a requeue counts deliveries (bounded so PostgreSQL's integer holds it).
Attempt = Annotated[int, Field(ge=1, le=1_000)]
Delivery = Annotated[int, Field(ge=1, le=1_000_000)]


class Record(UtcModel):
    """Base of every wire record: strict, frozen, versioned, open to newer fields."""

    model_config = ConfigDict(frozen=True, extra="allow", strict=True)

    schema_version: Literal[1] = SCHEMA_VERSION

    def to_json(self) -> bytes:
        return self.model_dump_json(exclude_none=False).encode()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Build a record from plain data (a dict from YAML, JSON or code) exactly as a
        service would read it from Kafka: times as ISO 8601 strings (or aware datetimes),
        no other coercion, and no unknown field (a typo is an error that names it)."""
        raw = json.dumps(data, default=_plain_json)
        return cls.model_validate_json(raw, extra="forbid")


class JobAlerts(BaseModel):
    """A job's own alert thresholds (`alerts:` in a definition); each unset field takes the
    analytics service's global default (`CRONSTREAM_ANALYTICS_*`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    enabled: bool = True
    success_rate_percent: Annotated[float, Field(ge=0, le=100)] | None = None
    min_runs: Annotated[int, Field(ge=1, le=100_000)] | None = None
    window_seconds: Annotated[float, Field(ge=1, le=7 * 86400)] | None = None
    duration_factor: Annotated[float, Field(gt=1, le=1000)] | None = None
    late_after_seconds: Annotated[float, Field(ge=0, le=7 * 86400)] | None = None
    finish_within_seconds: Annotated[float, Field(gt=0, le=7 * 86400)] | None = None


class EventBatch(BaseModel):
    """How many records an event trigger's run takes: a run starts when `max_events`
    matching records wait, or `max_wait_seconds` after the first of them was written
    (its Kafka timestamp), whichever comes first."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    max_events: Annotated[int, Field(ge=1, le=10_000)] = 1
    max_wait_seconds: Annotated[float, Field(ge=0, le=3600)] = 0


# A topic's name as Kafka allows it (249 characters of [A-Za-z0-9._-]).
TopicName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,249}$")]
EventStart = Literal["latest", "earliest"]


class EventTrigger(BaseModel):
    """`event:` of a JobDefinition of type EVENT (docs/decisions/0057): the job runs with
    the records of `topic` (its full name: no prefix is added) that pass `filter`."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    topic: TopicName
    # DAG conditions' language over the record (shared/condition.py: parse_filter).
    filter: Annotated[str, StringConstraints(max_length=2048)] | None = None
    batch: EventBatch = Field(default_factory=EventBatch)
    # latest: the records written after the job was first accepted; earliest: all of them.
    start: EventStart = "latest"

    @field_validator("filter")
    @classmethod
    def _valid_filter(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_filter(value)
            except ConditionError as exc:
                raise ValueError(f"invalid filter: {exc}") from None
        return value


# A rate limit: "N/s", "N/m" or "N/h": at most N starts in any window of that length.
_RATE_LIMIT = re.compile(r"^([1-9][0-9]{0,8})/([smh])$")
RATE_WINDOW_SECONDS = {"s": 1, "m": 60, "h": 3600}
RateLimit = Annotated[str, StringConstraints(max_length=16)]


def parse_rate_limit(text: str) -> tuple[int, int]:
    """(starts, window seconds) of a rate limit; ValueError that shows the form."""
    match = _RATE_LIMIT.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a rate: write N/s, N/m or N/h with N at least 1 "
                         "(e.g. 100/m)")
    return int(match[1]), RATE_WINDOW_SECONDS[match[2]]


def _rate_limit(value: str | None) -> str | None:
    if value is not None:
        parse_rate_limit(value)
    return value


class Concurrency(BaseModel):
    """`concurrency:` of a definition (decision 0056): at most `max_running` executions of the
    job hold a worker at once per value of `key`, an expression over `params` in the
    language of DAG conditions (`params.customer`); without a key, per job."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    key: Annotated[str, StringConstraints(min_length=1, max_length=512)] | None = None
    max_running: Annotated[int, Field(ge=1, le=10_000)]

    @field_validator("key")
    @classmethod
    def _expression(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_expression(value, ("params",))
            except ConditionError as exc:
                raise ValueError(f"not an expression over params: {exc}") from None
        return value


# The Kafka header of a `job-definitions` tombstone that names who deleted the job (a
# tombstone has no value to say it in): the deleted version's `created_by` in history.
DELETED_BY_HEADER = "cronstream-deleted-by"


class JobDefinition(Record):
    """A job as users publish it to `job-definitions` (key: job_id; null value deletes)."""

    job_id: JobId
    name: Annotated[str, StringConstraints(max_length=256)] | None = None
    type: JobType
    schedule: Annotated[str, StringConstraints(max_length=256)] | None = None
    interval_seconds: Annotated[int, Field(ge=1, le=10 * 365 * 86400)] | None = None
    run_at: UtcDatetime | None = None
    timezone: str = "UTC"
    start_at: UtcDatetime | None = None
    end_at: UtcDatetime | None = None
    depends_on: Annotated[list[JobId], Field(max_length=64)] = Field(default_factory=list)
    trigger_rule: TriggerRule = "ALL_SUCCESS"
    condition: Annotated[str, StringConstraints(max_length=2048)] | None = None
    requires_approval: bool = False
    handler: HandlerName
    params: Params = Field(default_factory=dict)
    max_retries: Annotated[int, Field(ge=0, le=100)] = 0
    retry_delay_seconds: Annotated[float, Field(ge=0, le=30 * 86400)] = 10
    max_retry_delay_seconds: Annotated[float, Field(ge=0, le=30 * 86400)] = 3600
    timeout_seconds: Annotated[float, Field(gt=0, le=7 * 86400)] = 3600
    priority: Priority = "normal"
    queue: QueueName = "default"
    concurrency_policy: ConcurrencyPolicy = "ALLOW"
    # At most this many runs of the job at once; a fire beyond is SKIPPED (FORBID is 1).
    max_concurrent_runs: MaxConcurrentRuns | None = None
    misfire_policy: MisfirePolicy = "FIRE_ONCE"
    misfire_grace_seconds: Annotated[float, Field(ge=0, le=30 * 86400)] = 60
    enabled: bool = True
    created_by: Annotated[str, StringConstraints(max_length=256)] | None = None
    created_at: UtcDatetime | None = None
    alerts: JobAlerts | None = None
    # A named calendar (its calendar_id on `calendars`) and what a fire on a day it
    # excludes does; CRON and INTERVAL jobs (NEXT_DAY and PREVIOUS_DAY: CRON only).
    calendar: CalendarId | None = None
    on_excluded: OnExcluded = "SKIP"
    # Each fire delayed by a deterministic amount in [0, jitter_seconds): at most an hour
    # (decision 0055: a spread of start times, not another schedule).
    jitter_seconds: Annotated[int, Field(ge=0, le=MAX_JITTER_SECONDS)] = 0
    # After this many fires the job stops firing (the scheduler counts them).
    max_runs: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = None
    # Type EVENT: the topic whose records start its runs (docs/decisions/0057).
    event: EventTrigger | None = None
    # Flow control (decision 0056): executions beyond these wait (WAITING).
    concurrency: Concurrency | None = None
    pool: PoolName | None = None
    pool_slots: PoolSlots = 1
    rate_limit: Annotated[RateLimit | None, AfterValidator(_rate_limit)] = None

    @field_validator("created_by")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        return _printable(value)

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        return _known_timezone(value)

    @field_validator("schedule")
    @classmethod
    def _valid_cron(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:
            try:
                # Cached: a definition read again (a takeover, a client's read) is not parsed
                # again. An `H` is hashed from the job_id (validated before this field).
                compiled(value, info.data.get("job_id", ""))
            except CronError as exc:
                raise ValueError(f"invalid cron expression '{value}': {exc}") from None
        return value

    @model_validator(mode="after")
    def _type_specific(self) -> JobDefinition:
        needs = {
            "CRON": "schedule",
            "INTERVAL": "interval_seconds",
            "ONE_TIME": "run_at",
        }
        for job_type, field in needs.items():
            present = getattr(self, field) is not None
            if self.type == job_type and not present:
                raise ValueError(f"{field} is required for type {job_type}")
            if self.type != job_type and present:
                raise ValueError(f"{field} is only allowed for type {job_type}, not {self.type}")
        if self.type == "DEPENDENT":
            self._check_dependencies()
        else:
            for field, given in (("depends_on", bool(self.depends_on)),
                                 ("condition", self.condition is not None),
                                 ("requires_approval", self.requires_approval)):
                if given:
                    raise ValueError(f"{field} is only allowed for type DEPENDENT, not {self.type}")
        if self.start_at and self.end_at and self.end_at <= self.start_at:
            raise ValueError("end_at must be later than start_at")
        self._check_event()
        self._check_concurrency()
        self._check_timing()
        return self

    def _check_timing(self) -> None:
        """calendar, on_excluded, jitter_seconds and max_runs, for the types they mean
        something for."""
        if self.calendar is not None and self.type not in ("CRON", "INTERVAL"):
            raise ValueError(f"calendar: only for types CRON and INTERVAL, not {self.type}")
        if self.on_excluded != "SKIP":
            if self.calendar is None:
                raise ValueError(f"on_excluded: {self.on_excluded} needs a calendar")
            if self.type != "CRON":
                raise ValueError(f"on_excluded: {self.on_excluded} moves a fire to another day at "
                                 "the same wall-clock time: only for type CRON (an INTERVAL job "
                                 "can only SKIP)")
        if self.type == "DEPENDENT":
            for field, given in (("jitter_seconds", self.jitter_seconds != 0),
                                 ("max_runs", self.max_runs is not None)):
                if given:
                    raise ValueError(f"{field}: not for type DEPENDENT (it runs with its "
                                     "upstreams, not on a clock)")
        if (self.type == "INTERVAL" and self.interval_seconds is not None
                and self.jitter_seconds >= self.interval_seconds):
            raise ValueError(f"jitter_seconds: {self.jitter_seconds} must be less than "
                             f"interval_seconds ({self.interval_seconds})")

    def _check_event(self) -> None:
        if self.type != "EVENT":
            if self.event is not None:
                raise ValueError(f"event: only for type EVENT, not {self.type}")
            return
        if self.event is None:
            raise ValueError("event is required for type EVENT (event: {topic: ...})")
        for field, given in (("start_at", self.start_at is not None),
                             ("end_at", self.end_at is not None),
                             ("jitter_seconds", self.jitter_seconds != 0),
                             ("max_runs", self.max_runs is not None)):
            if given:
                raise ValueError(f"{field}: not for type EVENT (it runs when records arrive, "
                                 "not on a clock)")

    def _check_concurrency(self) -> None:
        if self.pool is None and self.pool_slots != 1:
            raise ValueError(f"pool_slots: {self.pool_slots} needs a pool (pool_slots are taken "
                             "from the pool the job names)")
        limit = self.max_concurrent_runs
        if limit is None:
            return
        if self.concurrency_policy == "REPLACE":
            raise ValueError("max_concurrent_runs cannot be combined with concurrency_policy "
                             "REPLACE (which cancels the running run instead of skipping)")
        if self.concurrency_policy == "FORBID" and limit != 1:
            raise ValueError(f"max_concurrent_runs: {limit} contradicts concurrency_policy FORBID "
                             "(which is max_concurrent_runs: 1); keep one of them")

    def _check_dependencies(self) -> None:
        if not self.depends_on:
            raise ValueError("depends_on is required for type DEPENDENT (upstream job_ids)")
        if self.job_id in self.depends_on:
            raise ValueError(f"depends_on: job '{self.job_id}' cannot depend on itself")
        if len(set(self.depends_on)) != len(self.depends_on):
            raise ValueError("depends_on: lists an upstream job more than once")
        if self.condition is not None:
            try:
                parse_condition(self.condition, self.depends_on)
            except ConditionError as exc:
                raise ValueError(f"condition: {exc}") from None

    @property
    def zone(self) -> ZoneInfo:
        return zone_named(self.timezone)


@lru_cache(maxsize=1024)
def zone_named(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _printable(value: str | None) -> str | None:
    # Whoever publishes writes it (a claim, not an identity): printed by history and
    # describe, so it never carries what a terminal would act on.
    if value is not None and CONTROL.search(value):
        raise ValueError("printable text without control characters (a user name or an "
                         f"email address), got {value[:64]!r}")
    return value


def _known_timezone(value: str) -> str:
    if value not in _timezones():
        raise ValueError(f"unknown IANA timezone '{value}' (e.g. 'Europe/Berlin')")
    return value


@lru_cache(maxsize=1)
def _holiday_countries() -> dict[str, list[str]]:
    import holidays  # imported once a calendar names holidays: it loads ~250 countries

    return holidays.list_supported_countries(include_aliases=False)


class HolidaySource(BaseModel):
    """The public holidays a calendar excludes: a country of the `holidays` package (ISO
    3166-1 alpha-2) and optionally one of its subdivisions (a state, a province), observed
    days included."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    country: Annotated[str, StringConstraints(pattern=r"^[A-Z]{2}$")]
    subdivision: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = None

    @model_validator(mode="after")
    def _known(self) -> HolidaySource:
        countries = _holiday_countries()
        if self.country not in countries:
            raise ValueError(f"country: {self.country!r} is not a country of the holidays package "
                             "(ISO 3166-1 alpha-2, e.g. 'US', 'DE')")
        subdivisions = countries[self.country]
        if self.subdivision is not None and self.subdivision not in subdivisions:
            known = ", ".join(subdivisions[:20]) + (", ..." if len(subdivisions) > 20 else "")
            raise ValueError(f"subdivision: {self.subdivision!r} is not a subdivision of "
                             f"{self.country} (" + (f"known: {known})" if known else "it has none)"))
        return self


# Dates a calendar lists: as many as ten years of days, each in the range of instants.
MAX_CALENDAR_DATES = 3660
CalendarDate = Annotated[date, Field(ge=EARLIEST.date(), le=LATEST.date())]


class Calendar(Record):
    """A named calendar, on the compacted `calendars` topic (key: calendar_id; null value
    deletes): the days a job that names it does not fire on (docs/decisions/0055).

    A day (in the calendar's `timezone`) is excluded when it is a public holiday of
    `holidays`, is listed in `exclude_dates` or falls on one of `exclude_weekdays` — unless
    `include_dates` lists it: an included date is never excluded.
    """

    calendar_id: CalendarId
    timezone: str = "UTC"
    exclude_dates: Annotated[list[CalendarDate], Field(max_length=MAX_CALENDAR_DATES)] = Field(
        default_factory=list)
    include_dates: Annotated[list[CalendarDate], Field(max_length=MAX_CALENDAR_DATES)] = Field(
        default_factory=list)
    exclude_weekdays: Annotated[list[Weekday], Field(max_length=7)] = Field(default_factory=list)
    holidays: HolidaySource | None = None
    description: Annotated[str, StringConstraints(max_length=1024)] | None = None
    created_by: Annotated[str, StringConstraints(max_length=256)] | None = None
    created_at: UtcDatetime | None = None

    @field_validator("created_by", "description")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        return _printable(value)

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        return _known_timezone(value)

    @field_validator("exclude_weekdays")
    @classmethod
    def _once_each(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("lists a weekday more than once")
        return value


class Pool(Record):
    """A pool of slots shared by the jobs that name it (`pool:`), on the compacted `pools`
    topic (key: pool; null value deletes): at most `slots` slots of its jobs' executions
    are held at once (decision 0056). Zero slots holds every execution of the pool back."""

    pool: PoolName
    slots: Annotated[int, Field(ge=0, le=100_000)]
    description: Annotated[str, StringConstraints(max_length=1024)] | None = None
    created_by: Annotated[str, StringConstraints(max_length=256)] | None = None
    created_at: UtcDatetime | None = None

    @field_validator("created_by", "description")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        return _printable(value)


# An event trigger's records together in one JobDue's snapshot (their values as JSON): with
# the snapshot's params at their limit the record stays under what every consumer reads
# (codec.MAX_RECORD_BYTES). A run's batch closes before it would pass this; a record whose
# value alone passes MAX_EVENT_VALUE_BYTES is carried without it (`value_omitted`).
MAX_EVENTS_BYTES = 160 * 1024
MAX_EVENT_VALUE_BYTES = 64 * 1024


class TriggerEvent(UtcModel):
    """One record of an event trigger's run (`ctx.events`): where it is, when it was
    written, its key and headers as text and its value parsed as JSON when it parses,
    else its text (docs/decisions/0057)."""

    model_config = ConfigDict(frozen=True, extra="allow", strict=True)

    topic: TopicName
    partition: Annotated[int, Field(ge=0)]
    offset: Annotated[int, Field(ge=0)]
    timestamp: UtcDatetime
    key: str | None = None
    value: Any = None
    headers: dict[str, str | None] = Field(default_factory=dict)
    # The value was larger than MAX_EVENT_VALUE_BYTES: read the record at its position.
    value_omitted: bool = False


class JobSnapshot(Record):
    """What a worker needs from the definition to run one execution."""

    handler: HandlerName
    params: Params = Field(default_factory=dict)
    timeout_seconds: Annotated[float, Field(gt=0, le=7 * 86400)] = 3600
    max_retries: Annotated[int, Field(ge=0, le=100)] = 0
    retry_delay_seconds: Annotated[float, Field(ge=0, le=30 * 86400)] = 10
    max_retry_delay_seconds: Annotated[float, Field(ge=0, le=30 * 86400)] = 3600
    priority: Priority = "normal"
    queue: QueueName = "default"
    concurrency_policy: ConcurrencyPolicy = "ALLOW"
    max_concurrent_runs: MaxConcurrentRuns | None = None
    concurrency: Concurrency | None = None
    pool: PoolName | None = None
    pool_slots: PoolSlots = 1
    rate_limit: Annotated[RateLimit | None, AfterValidator(_rate_limit)] = None
    # The `job-definitions` offset of the definition this was taken from: the monitor
    # names the run's definition version by it (job_executions.definition_version).
    definition_offset: Annotated[int, Field(ge=0)] | None = None
    # An event trigger's run: its records (ctx.events), carried with the snapshot so that
    # its retries and requeues (rebuilt from the QUEUED event's snapshot) run with the same
    # records, and the projection keeps them (decision 0057); None for any other run.
    events: Annotated[list[TriggerEvent], Field(max_length=10_000)] | None = None

    @classmethod
    def of(cls, definition: JobDefinition, definition_offset: int | None = None,
           params: dict[str, Any] | None = None,
           events: list[TriggerEvent] | None = None) -> JobSnapshot:
        """The snapshot of `definition` (read at `definition_offset`), running with
        `params` instead of the definition's own when given (`run_params`), and an event
        trigger's run's `events`."""
        return cls(
            handler=definition.handler,
            params=definition.params if params is None else params,
            timeout_seconds=definition.timeout_seconds,
            max_retries=definition.max_retries,
            retry_delay_seconds=definition.retry_delay_seconds,
            max_retry_delay_seconds=definition.max_retry_delay_seconds,
            priority=definition.priority,
            queue=definition.queue,
            concurrency_policy=definition.concurrency_policy,
            max_concurrent_runs=definition.max_concurrent_runs,
            concurrency=definition.concurrency,
            pool=definition.pool,
            pool_slots=definition.pool_slots,
            rate_limit=definition.rate_limit,
            definition_offset=definition_offset,
            events=events,
        )


def run_params(definition: JobDefinition, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The params a run of `definition` runs with: the job's own, overlaid key by key by
    `overrides` (a manual trigger's or a backfill's). ValueError, naming the limit, when the
    result is larger than a definition's params may be."""
    if overrides is not None and not (isinstance(overrides, Mapping)
                                      and all(isinstance(k, str) for k in overrides)):
        raise ValueError("params: must be a JSON object (a mapping with string keys)")
    merged = {**definition.params, **(overrides or {})}
    try:
        size = _json_size(merged)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"params: not JSON data: {exc}") from None
    if size > MAX_PARAMS_BYTES:
        raise ValueError(f"params: the run's params are {size} bytes of JSON; the limit is "
                         f"{MAX_PARAMS_BYTES}")
    return merged


# The upstream results a DAG step's JobDue carries, together: with its own params and the
# run's root params at their limits, the record stays under what every consumer reads
# (codec.MAX_RECORD_BYTES). What does not fit is left out and marked (decision 0035).
MAX_UPSTREAM_RESULTS_BYTES = 128 * 1024


class UpstreamExecution(BaseModel):
    """The final execution of one upstream job in a DAG step's run (`ctx.upstream`)."""

    model_config = ConfigDict(frozen=True, extra="allow", strict=True)

    execution_id: UUID
    status: ExecutionStatus
    result: Annotated[Any, AfterValidator(_result_limit)] = None
    # The upstream results together were larger than MAX_UPSTREAM_RESULTS_BYTES: this one
    # is not carried (its execution still holds it: Client.execution(execution_id)).
    result_omitted: bool = False


class Upstream(BaseModel):
    """What a DAG step's handler sees of its run: the run's root params and the final
    execution of each upstream job (decision 0035)."""

    model_config = ConfigDict(frozen=True, extra="allow", strict=True)

    root_params: Params = Field(default_factory=dict)
    executions: Annotated[dict[JobId, UpstreamExecution], Field(max_length=64)] = Field(
        default_factory=dict)

    @classmethod
    def of(cls, root_params: dict[str, Any],
           finals: list[tuple[str, UUID, str, Any]]) -> Upstream:
        """From (job_id, execution_id, status, result) of each upstream, in depends_on order:
        results are carried in that order while they fit in MAX_UPSTREAM_RESULTS_BYTES
        together; one that does not is omitted (and marked), and smaller ones after it may
        still fit."""
        room = MAX_UPSTREAM_RESULTS_BYTES
        executions: dict[str, UpstreamExecution] = {}
        for job_id, upstream_id, status, result in finals:
            size = 0 if result is None else _json_size(result)
            omitted = size > room
            if not omitted:
                room -= size
            executions[job_id] = UpstreamExecution.model_validate(
                {"execution_id": upstream_id, "status": status,
                 "result": None if omitted else result, "result_omitted": omitted}, strict=False)
        return cls(root_params=root_params, executions=executions)


class JobDue(Record):
    """A request for one execution, on `job-due` (key: job_id) and on the work topics.

    `delivery` counts how many times this execution was handed to a worker: a REQUEUE
    increments it, and events carrying an older delivery are stale (docs/reference/semantics.md#dead-workers).
    """

    execution_id: UUID
    job_id: JobId
    run_id: UUID
    scheduled_at: UtcDatetime
    attempt_number: Attempt = 1
    reason: DueReason
    delivery: Delivery = 1
    idempotency_key: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    job: JobSnapshot
    # Who released it, for a DAG step approved by a person (Command.issued_by).
    approved_by: Actor | None = None
    # Who asked for the run: the person or program behind a trigger or a backfill (kept by
    # its retries and requeues); None for a schedule's fire and a DAG step.
    triggered_by: Actor | None = None
    # A DAG step's view of its run (ctx.upstream); None for every other execution.
    upstream: Upstream | None = None

    # One constructor for each way an execution comes to be asked for; its ids are derived
    # (shared/ids.py), so whoever builds one again gets the same.

    @classmethod
    def first(cls, definition: JobDefinition, scheduled_at: datetime, reason: DueReason, *,
              definition_offset: int | None = None, params: dict[str, Any] | None = None,
              triggered_by: str | None = None) -> JobDue:
        """The first attempt of the run that `definition` (read at `definition_offset`)
        starts at `scheduled_at`: a fire (SCHEDULE; the scheduler renders the same bytes
        itself, clock.render_due), a trigger (MANUAL) or a backfill (BACKFILL), with the run's
        `params` (`run_params`: the job's overlaid) and who asked for it."""
        snapshot = JobSnapshot.of(definition, definition_offset, params)
        return cls(execution_id=execution_id(definition.job_id, scheduled_at, 1),
                   job_id=definition.job_id, run_id=run_id(definition.job_id, scheduled_at),
                   scheduled_at=scheduled_at, attempt_number=1, reason=reason,
                   idempotency_key=idempotency_key(definition.job_id, scheduled_at, snapshot.params),
                   job=snapshot, triggered_by=triggered_by[:256] if triggered_by else None)

    @classmethod
    def step(cls, definition: JobDefinition, run: UUID, scheduled_at: datetime, *,
             definition_offset: int | None = None, upstream: Upstream | None = None) -> JobDue:
        """The DAG step `definition` of the run `run` (DEPENDENCY), once per (job, run), with
        its view of the run's upstreams (ctx.upstream)."""
        snapshot = JobSnapshot.of(definition, definition_offset)
        return cls(execution_id=retry_execution_id(definition.job_id, run, 1),
                   job_id=definition.job_id, run_id=run, scheduled_at=scheduled_at,
                   attempt_number=1, reason="DEPENDENCY",
                   idempotency_key=step_idempotency_key(definition.job_id, run, snapshot.params),
                   job=snapshot, upstream=upstream)

    @classmethod
    def event(cls, definition: JobDefinition, events: list[TriggerEvent], scheduled_at: datetime,
              *, definition_offset: int | None = None) -> JobDue:
        """The run of an EVENT job with `events` (its first record names the run: a record
        is in one run only)."""
        first = events[0]
        snapshot = JobSnapshot.of(definition, definition_offset, events=events)
        run = event_run_id(definition.job_id, first.topic, first.partition, first.offset)
        return cls(execution_id=retry_execution_id(definition.job_id, run, 1),
                   job_id=definition.job_id, run_id=run, scheduled_at=scheduled_at,
                   attempt_number=1, reason="EVENT",
                   idempotency_key=step_idempotency_key(definition.job_id, run, snapshot.params),
                   job=snapshot)

    def next_attempt(self, scheduled_at: datetime) -> JobDue:
        """The attempt after this one (RETRY): a new execution of the same run and key."""
        attempt = self.attempt_number + 1
        return JobDue(execution_id=retry_execution_id(self.job_id, self.run_id, attempt),
                      job_id=self.job_id, run_id=self.run_id, scheduled_at=scheduled_at,
                      attempt_number=attempt, reason="RETRY", idempotency_key=self.idempotency_key,
                      job=self.job, triggered_by=self.triggered_by, upstream=self.upstream)

    def next_delivery(self) -> JobDue:
        """This execution handed out again (REQUEUE: drain, a dead worker): same id, the
        next delivery, whose events make the older delivery's stale."""
        return self.model_copy(update={"reason": "REQUEUE", "delivery": self.delivery + 1})


class RetryRequest(JobDue):
    """The JobDue of the next attempt plus when it is due, on the compacted `retries`
    topic (key: execution_id of the next attempt; a tombstone means fired or cancelled)."""

    due_at: UtcDatetime

    @classmethod
    def of(cls, due: JobDue, due_at: datetime) -> RetryRequest:
        """The timer of `due` (an attempt to come), due at `due_at`."""
        return cls(**dict(due), due_at=due_at)

    def job_due(self) -> JobDue:
        return JobDue.model_validate(self.model_dump(exclude={"due_at"}), strict=False)


class ExecutionEvent(Record):
    """One lifecycle event of one execution, on the public `execution-events` topic."""

    event_id: UUID
    execution_id: UUID
    job_id: JobId
    run_id: UUID
    status: ExecutionStatus
    attempt_number: Attempt
    scheduled_at: UtcDatetime
    occurred_at: UtcDatetime
    delivery: Delivery = 1
    worker_id: WorkerId | None = None
    started_at: UtcDatetime | None = None
    completed_at: UtcDatetime | None = None
    error_message: Message | None = None
    result: Annotated[Any, AfterValidator(_result_limit)] = None
    progress: Annotated[float, Field(ge=0, le=100)] | None = None
    progress_message: Annotated[str, StringConstraints(max_length=1024)] | None = None
    priority: Priority | None = None
    queue: QueueName | None = None
    # On QUEUED events: what a requeue or an approval needs to re-issue the JobDue.
    reason: DueReason | None = None
    idempotency_key: Annotated[str, StringConstraints(max_length=256)] | None = None
    job: JobSnapshot | None = None
    # Who acted, when a person (or a policy) caused this event: the `issued_by` of the
    # APPROVE (on QUEUED), REJECT (on SKIPPED) or CANCEL (on CANCELLED) command.
    approved_by: Actor | None = None
    rejected_by: Actor | None = None
    cancelled_by: Actor | None = None
    # On QUEUED (and a dispatcher's SKIPPED) events: the JobDue's triggered_by.
    triggered_by: Actor | None = None
    # On WAITING events: why the execution is held back, in words a person can act on
    # (`pool etl: 4 of 4 slots in use`).
    waiting_reason: Message | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def for_due(cls, due: JobDue | FastDue, status: ExecutionStatus, **fields: Any) -> ExecutionEvent:
        """An event of the execution `due` asks for (its ids, attempt and delivery), now;
        `fields` add to or override those."""
        values: dict[str, Any] = {
            "event_id": new_event_id(), "execution_id": due.execution_id, "job_id": due.job_id,
            "run_id": due.run_id, "status": status, "attempt_number": due.attempt_number,
            "scheduled_at": due.scheduled_at, "occurred_at": now_utc(), "delivery": due.delivery,
        }
        values.update(fields)
        return cls(**values)


def render_event(due: JobDue | FastDue, status: ExecutionStatus, event_id: str, occurred_at: datetime, *,
                 worker_id: str | None = None, started_at: datetime | None = None,
                 completed_at: datetime | None = None, result: Any = None,
                 progress: float | None = None, priority: str | None = None,
                 queue: str | None = None, reason: str | None = None,
                 idempotency_key: str | None = None, job: JobSnapshot | FastSnapshot | None = None,
                 approved_by: str | None = None, triggered_by: str | None = None) -> bytes:
    """ExecutionEvent.for_due(due, status, ...).to_json() for the fields given (the rest
    null), without building the model: the events every execution goes through (QUEUED,
    RUNNING, COMPLETED) cost more to validate than everything else on their way. Only for
    values validated already — the JobDue's own, a service's settings, UTC times it took,
    a result that passed the worker's check — never for anything read from outside."""
    return b"".join((
        b'{"schema_version":1,"event_id":"', event_id.encode(),
        b'","execution_id":', _encode(due.execution_id),
        b',"job_id":', _encode(due.job_id),
        b',"run_id":', _encode(due.run_id),
        b',"status":"', status.encode(),
        b'","attempt_number":', b"%d" % due.attempt_number,
        b',"scheduled_at":', _encode(due.scheduled_at),
        b',"occurred_at":', _encode(occurred_at),
        b',"delivery":', b"%d" % due.delivery,
        b',"worker_id":', _encode(worker_id),
        b',"started_at":', _encode(started_at),
        b',"completed_at":', _encode(completed_at),
        b',"error_message":null,"result":', to_json(result),
        b',"progress":', to_json(progress),
        b',"progress_message":null,"priority":', _encode(priority),
        b',"queue":', _encode(queue),
        b',"reason":', _encode(reason),
        b',"idempotency_key":', to_json(idempotency_key),
        b',"job":', b"null" if job is None else job.to_json(),
        b',"approved_by":', _NULL if approved_by is None else to_json(approved_by),
        b',"rejected_by":null,"cancelled_by":null,"triggered_by":',
        _NULL if triggered_by is None else to_json(triggered_by), b',"waiting_reason":null}',
    ))


_NULL = b"null"  # what to_json(None) returns, without the call (two per event)


# msgspec writes UUIDs, UTC datetimes and the constrained names (ids, priorities, queues,
# reasons) as pydantic does, in a fifth of the time (str(UUID) alone is 0.8 µs); the
# result, the progress and free text stay with pydantic's own encoder.
_encode = msgspec.json.encode


class Heartbeat(Record):
    """A worker's periodic liveness report, on `heartbeats` (key: worker_id)."""

    worker_id: WorkerId
    hostname: Annotated[str, StringConstraints(max_length=256)]
    status: WorkerStatus
    sent_at: UtcDatetime
    running: Annotated[list[UUID], Field(max_length=10_000)] = Field(default_factory=list)
    capacity: Annotated[int, Field(ge=0, le=100_000)]
    queues: list[QueueName] = Field(default_factory=list)


AlertKind = Literal[
    "EXECUTION_PERMANENTLY_FAILED",  # the monitor: an execution used up its attempts
    "SUCCESS_RATE_LOW",              # analytics: a job's rolling success rate fell below its threshold
    "DURATION_REGRESSION",           # analytics: recent p95 duration above k x the job's baseline
    "QUEUE_GROWING",                 # analytics: a queue's depth rose across consecutive windows
    "FIRE_LATE",                     # analytics: an expected fire did not start or finish in time
    "JOB_SUSPENDED",                 # the scheduler: a definition it cannot compute (job not firing)
    "WAITING_TOO_LONG",              # analytics: an execution held back longer than its job's interval
    "TRIGGER_BEHIND",                # the scheduler: an event trigger's lag stays high and grows
]
AlertState = Literal["FIRING", "RESOLVED"]


class Alert(Record):
    """Something a person must look at, on `alerts` (key: job_id, or `queue:<name>`).

    `alert_id` names one episode and is deterministic, so a consumer that sees an alert
    twice (they are raised at least once) can drop the repeat: a FIRING record opens the
    episode, a RESOLVED record with the same `alert_id` closes it. One-shot alerts
    (EXECUTION_PERMANENTLY_FAILED) are only ever FIRING. `evidence` carries what made it
    fire (window, counts, values), for people and dashboards.
    """

    alert_id: UUID
    kind: AlertKind
    state: AlertState = "FIRING"
    severity: Literal["critical", "error", "warning"]
    job_id: JobId | None = None
    queue: QueueName | None = None
    execution_id: UUID | None = None
    run_id: UUID | None = None
    attempt_number: Attempt | None = None
    error_message: Message | None = None
    summary: Message | None = None
    evidence: Annotated[dict[str, Any], AfterValidator(_params_limit)] = Field(default_factory=dict)
    occurred_at: UtcDatetime
    raised_at: UtcDatetime

    @property
    def key(self) -> bytes:
        return (self.job_id or f"queue:{self.queue or ''}").encode()


LogStream = Literal["stdout", "stderr", "log", "traceback", "cronstream"]
# A line is cut at 16 KiB by the worker (plus the note that says so); a traceback, one
# entry, at 64 KiB (services/worker/capture.py).
MAX_LOG_TEXT_CHARS = 66 * 1024
MAX_LOG_LINES = 10_000


class LogLine(UtcModel):
    """One line of an execution's log: what the handler wrote to `stdout` or `stderr`, a
    `log` record of Python's logging (with its level), the `traceback` of the attempt's
    failure, or a note of the worker's (`cronstream`: what was cut, a killed handler)."""

    model_config = ConfigDict(frozen=True, extra="allow", strict=True)

    seq: Annotated[int, Field(ge=0, le=2**31 - 1)]
    at: UtcDatetime
    stream: LogStream
    level: Annotated[str, StringConstraints(max_length=16)] | None = None
    text: Annotated[str, StringConstraints(max_length=MAX_LOG_TEXT_CHARS)]


class LogBatch(Record):
    """Lines of one delivery of one execution's log, on `execution-logs` (key:
    execution_id, so that an execution's lines stay in order). `seq` numbers the lines of
    a delivery from 0: a batch sent twice adds nothing. `final` marks the delivery's last
    batch (its end was reported); a handler that writes nothing sends no batch at all."""

    execution_id: UUID
    job_id: JobId
    run_id: UUID
    attempt_number: Attempt
    delivery: Delivery = 1
    worker_id: WorkerId | None = None
    trace_id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")] | None = None
    lines: Annotated[list[LogLine], Field(max_length=MAX_LOG_LINES)] = Field(default_factory=list)
    final: bool = False


# The largest log batch a worker writes (its lines' text; services/worker/logs.py), and
# the largest a consumer takes.
LOG_BATCH_TEXT_BYTES = 256 * 1024
MAX_LOG_BATCH_BYTES = 1024 * 1024


def render_log_batch(due: JobDue | FastDue, *, worker_id: str | None, trace_id: str | None,
                     first_seq: int, lines: list[tuple[float, str, str | None, str]],
                     final: bool) -> bytes:
    """LogBatch(...).to_json() of the execution `due` asks for, for lines given as (epoch
    seconds, stream, level, text), numbered from `first_seq`, without building the models:
    a handler's output is data the worker already bounded (capture.py), and a model per
    line would cost more than capturing it. Only for those values."""
    rendered = [b'{"seq":%d,"at":%s,"stream":"%s","level":%s,"text":%s}' % (
        first_seq + i, _encode(datetime.fromtimestamp(at, UTC)), stream.encode(),
        b"null" if level is None else _encode(level), _encode(text))
        for i, (at, stream, level, text) in enumerate(lines)]
    return b"".join((
        b'{"schema_version":1,"execution_id":', _encode(due.execution_id),
        b',"job_id":', _encode(due.job_id), b',"run_id":', _encode(due.run_id),
        b',"attempt_number":%d,"delivery":%d' % (due.attempt_number, due.delivery),
        b',"worker_id":', _encode(worker_id), b',"trace_id":', _encode(trace_id),
        b',"lines":[', b",".join(rendered), b'],"final":', b"true" if final else b"false", b"}",
    ))


CommandKind = Literal["CANCEL", "APPROVE", "REJECT"]


class Command(Record):
    """An operator's instruction about one execution, on `commands` (key: execution_id).

    CANCEL: workers skip the execution if they have not started it and stop it if they
    run it. APPROVE / REJECT: the monitor releases or skips an execution waiting in
    AWAITING_APPROVAL.
    """

    command: CommandKind
    execution_id: UUID
    job_id: JobId | None = None
    reason: Annotated[str, StringConstraints(max_length=1024)] | None = None
    issued_at: UtcDatetime
    issued_by: Annotated[str, StringConstraints(max_length=256)] | None = None


class SchedulerState(Record):
    """The leader's durable per-job clock, on the compacted `scheduler-state` topic.

    `definition_offset` is the `job-definitions` offset the state was computed from: a
    new leader trusts `next_fire_ms` when it matches the live definition's offset and
    recomputes otherwise, so takeover never runs the cron engine for unchanged jobs.
    `calendar_offset` is, for a job that names a calendar, the `calendars` offset of the
    calendar version `next_fire_ms` was computed with (None: no calendar, or it was not
    known): a new leader trusts the timing only while that version is still the current
    one. `runs` counts the job's fires (for `max_runs`; None in records written before it
    was counted: 0). Times are Unix epoch milliseconds: this internal record is read a
    million times at takeover, and integers parse fastest.
    """

    job_id: JobId
    definition_offset: Annotated[int, Field(ge=0)]
    next_fire_ms: int | None
    last_fire_ms: int | None = None
    calendar_offset: Annotated[int, Field(ge=0)] | None = None
    runs: Annotated[int, Field(ge=0)] | None = None


def now_utc() -> datetime:
    return datetime.now(UTC)
