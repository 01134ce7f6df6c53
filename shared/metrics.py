"""Every Prometheus metric cronstream exports (docs/reference/operations.md#metrics; docs/metrics.md).

Names are public: dashboards and alerting rules in `deploy/` query them, so they change
only on purpose (a test checks this module against docs/metrics.md). Labels are bounded
by design — the label budget in docs/metrics.md — and never carry a job_id, an
execution_id or a worker_id (the scrape's `instance` label already names the process).

Metrics are created unregistered; `announce(service)` registers the common ones and
that service's own, so a process exports only what the service it runs can move (a
worker has no `cronstream_scheduler_leader` at 0 to confuse a sum).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable
from importlib import metadata
from typing import TypeVar

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client import metrics as client_metrics
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.samples import Exemplar, Sample
from prometheus_client.utils import floatToGoString

# Seconds: from a few milliseconds (fire lag, start lag) to minutes (handlers).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


class LoopHistogram(Histogram):
    """A Histogram that one thread observes (a service's event loop), without locks.

    prometheus_client's `observe` takes a lock for the sum and one for the bucket, walks
    the bounds in Python, and validates and builds its exemplar: ~1.6 µs, and the worker
    observes two per execution. This one finds the bucket by bisection and adds to plain
    numbers; its exemplar (the latest of each bucket, as there) is built when scraped.
    A scrape, on another thread, reads the numbers as they are: a sample can be one
    observation behind another, never wrong. The exposition is the Histogram's own
    (tests/unit/test_health_and_metrics.py compares the two)."""

    def _metric_init(self) -> None:
        self._created = time.time()
        self._counts = [0] * len(self._upper_bounds)
        self._total = 0.0
        self._latest: list[tuple[dict[str, str], float, float] | None] = [None] * len(self._counts)
        self._les = [floatToGoString(b) for b in self._upper_bounds]  # type: ignore[no-untyped-call]

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        """Observe `amount` (from the one thread that observes this histogram)."""
        i = bisect_left(self._upper_bounds, amount)  # the first bound >= amount
        self._counts[i] += 1
        self._total += amount
        if exemplar:
            self._latest[i] = (exemplar, amount, time.time())

    def _child_samples(self) -> Iterable[Sample]:
        samples = []
        cumulative = 0.0
        for le, count, latest in zip(self._les, self._counts, self._latest, strict=True):
            cumulative += count
            samples.append(Sample("_bucket", {"le": le}, cumulative, None,
                                  Exemplar(*latest) if latest is not None else None))
        samples.append(Sample("_count", {}, cumulative, None, None))
        if self._upper_bounds[0] >= 0:
            samples.append(Sample("_sum", {}, self._total, None, None))
        if client_metrics._use_created:  # prometheus_client's switch for `_created`
            samples.append(Sample("_created", {}, self._created, None, None))
        return tuple(samples)


# -- every service ------------------------------------------------------------------------

BUILD_INFO = Gauge(
    "cronstream_build_info",
    "Always 1; the version and service of this process.",
    ["service", "version"],
    registry=None,
)
DEAD_LETTERS = Counter(
    "cronstream_dead_letters",
    "Records dead-lettered, by the topic they came from.",
    ["service", "topic"],
    registry=None,
)
TRANSACTIONS = Counter(
    "cronstream_kafka_transactions",
    "Kafka transactions committed (each costs the broker far more than a record in it).",
    ["service"],
    registry=None,
)
TRANSACTION_ABORTS = Counter(
    "cronstream_kafka_transaction_aborts",
    "Kafka transactions aborted (the batch is read again).",
    ["service"],
    registry=None,
)
PRODUCER_RESETS = Counter(
    "cronstream_kafka_producer_resets",
    "Producers thrown away and rebuilt after a hung or fatal transaction.",
    ["service"],
    registry=None,
)
CONSUMER_LAG = Gauge(
    "cronstream_consumer_lag",
    "Records behind the end of the log (last stable offset), per partition this process consumes.",
    ["service", "group", "topic", "partition"],
    registry=None,
)
TASK_RESTARTS = Counter(
    "cronstream_background_task_restarts",
    "Background tasks restarted after an error.",
    ["service", "task"],
    registry=None,
)

# -- scheduler ----------------------------------------------------------------------------

SCHEDULER_LEADER = Gauge(
    "cronstream_scheduler_leader", "1 while this scheduler leads a shard or more, else 0.",
    registry=None
)
SCHEDULER_JOBS = Gauge("cronstream_scheduler_jobs", "Jobs in the shards this scheduler leads.",
                       registry=None)
SCHEDULER_SUSPENDED = Gauge(
    "cronstream_scheduler_suspended_jobs",
    "Jobs of the shards it leads this scheduler suspended: they cannot be computed.",
    registry=None,
)
SCHEDULER_PENDING_RETRIES = Gauge(
    "cronstream_scheduler_pending_retries", "Retry timers pending in the shards this scheduler leads.",
    registry=None
)
SCHEDULER_SHARDS = Gauge(
    "cronstream_scheduler_shards",
    "Shards of the clock: the partitions of job-definitions, as this scheduler counted them.",
    registry=None)
SCHEDULER_SHARDS_LED = Gauge(
    "cronstream_scheduler_shards_led", "Shards of the clock this scheduler leads (taken over).",
    registry=None)
SCHEDULER_SHARDS_STANDBY = Gauge(
    "cronstream_scheduler_shards_standby", "Shards this scheduler keeps warm for another's lead.",
    registry=None)
SCHEDULER_STANDBY_LAG = Gauge(
    "cronstream_scheduler_standby_lag_records",
    "Records of the shards this scheduler stands by for that it has not applied yet.", registry=None)
SCHEDULER_WAITING = Gauge(
    "cronstream_scheduler_waiting_jobs",
    "Jobs of the shards this scheduler leads that name a calendar it does not know: they "
    "wait (no fire) until the calendar is applied.",
    registry=None)
SCHEDULER_HELD = Gauge(
    "cronstream_scheduler_held_jobs",
    "Jobs due soon, held in memory by the shards this scheduler leads (the near window).",
    registry=None)
TRIGGER_LAG = Gauge(
    "cronstream_trigger_lag_records",
    "Records of the event triggers' topics (in the shards this scheduler leads) not yet in a "
    "committed run nor passed over.", registry=None)
TRIGGER_UNEVALUABLE = Counter(
    "cronstream_trigger_unevaluable_records",
    "Records an event trigger's filter could not evaluate (they do not match).", registry=None)
FIRES = Counter(
    "cronstream_scheduler_fires", "JobDue records committed by the scheduler.", ["reason"], registry=None
)
MISFIRES = Counter(
    "cronstream_scheduler_misfires",
    "Fires missed while no scheduler ran, by what the misfire policy did.",
    ["outcome"],
    registry=None,
)
FIRE_LAG = Histogram(
    "cronstream_scheduler_fire_lag_seconds",
    "From scheduled_at to the JobDue committed.",
    buckets=LATENCY_BUCKETS,
    registry=None,
)

# -- dispatcher ---------------------------------------------------------------------------

DISPATCH_DECISIONS = Counter(
    "cronstream_dispatcher_decisions",
    "What the dispatcher did with each JobDue.",
    ["decision"],
    registry=None,
)
POOL_SLOTS_IN_USE = Gauge(
    "cronstream_pool_slots_in_use",
    "Slots of each pool held by admitted executions, on the pool's admitting dispatcher "
    "(decision 0056).",
    ["pool"],
    registry=None,
)
WAITING = Gauge(
    "cronstream_waiting_executions",
    "Executions held back by flow control on this dispatcher's partitions, by what holds "
    "the first of their line back: pool, key, rate_limit or missing_pool.",
    ["reason"],
    registry=None,
)
DISPATCH_BATCH = Histogram(
    "cronstream_dispatcher_batch_seconds",
    "One dispatcher transaction, from consume to commit.",
    buckets=LATENCY_BUCKETS,
    registry=None,
)

# -- worker -------------------------------------------------------------------------------

WORKER_SLOTS = Gauge("cronstream_worker_slots", "Executions this worker can run at once.", registry=None)
WORKER_SLOTS_BUSY = Gauge("cronstream_worker_slots_busy", "Executions running on this worker.", registry=None)
WORKER_BUFFERED = Gauge("cronstream_worker_buffered", "Work records read but not started yet.", registry=None)
WORKER_HANDLER_PROCESSES = Gauge(
    "cronstream_worker_handler_processes",
    "Handler processes in this worker's pool (started as runs need them, up to its slots).",
    registry=None)
WORKER_EXECUTIONS = Counter(
    "cronstream_worker_executions",
    "Executions this worker finished, by final status.",
    ["status", "queue", "priority"],
    registry=None,
)
EXECUTION_DURATION = LoopHistogram(
    "cronstream_execution_duration_seconds",
    "Handler run time, RUNNING to its end.",
    ["queue", "priority", "status"],
    buckets=DURATION_BUCKETS,
    registry=None,
)
START_LAG = LoopHistogram(
    "cronstream_execution_start_lag_seconds",
    "From scheduled_at to RUNNING.",
    ["queue", "priority"],
    buckets=LATENCY_BUCKETS,
    registry=None,
)

# -- monitor ------------------------------------------------------------------------------

EXECUTIONS = Counter(
    "cronstream_executions",
    "Executions that reached a terminal status (projected, exactly once).",
    ["status", "queue", "priority"],
    registry=None,
)
PROJECTED = Counter(
    "cronstream_projection_records", "Records projected into PostgreSQL.", ["topic"], registry=None
)
PROJECTION_LAG = Gauge(
    "cronstream_projection_lag_events",
    "Execution events on the log not yet projected by this monitor.",
    registry=None,
)
PROJECTION_BATCH = Histogram(
    "cronstream_projection_batch_seconds",
    "One projection transaction.",
    buckets=LATENCY_BUCKETS,
    registry=None,
)
DAG_EVALUATIONS = Counter(
    "cronstream_dag_evaluations", "DAG steps evaluated, by decision.", ["decision"], registry=None
)
ALERTS = Counter(
    "cronstream_alerts",
    "Alerts projected from the alerts topic, by kind and state.",
    ["kind", "state"],
    registry=None,
)
QUEUE_DEPTH = Gauge(
    "cronstream_queue_depth",
    "Work records waiting, per queue and priority.",
    ["queue", "priority"],
    registry=None,
)
WORKERS = Gauge("cronstream_workers", "Known workers by status.", ["status"], registry=None)
LOG_LINES_REFUSED = Counter(
    "cronstream_log_lines_refused",
    "Log lines the monitor did not keep: past an attempt's limit, or after its log ended.",
    ["reason"],
    registry=None,
)
REQUEUES = Counter("cronstream_requeues", "Executions re-queued, by why.", ["reason"], registry=None)

# -- analytics ----------------------------------------------------------------------------

ANALYTICS_EVENTS = Counter(
    "cronstream_analytics_events", "Execution events read by the analytics service.", registry=None
)
ANALYTICS_ALERTS = Counter(
    "cronstream_analytics_alerts",
    "Alert records the analytics service produced, by kind and state.",
    ["kind", "state"],
    registry=None,
)
ANALYTICS_OPEN = Gauge(
    "cronstream_analytics_open_alerts", "Alert episodes open now, by kind.", ["kind"], registry=None
)
ANALYTICS_FIRES = Counter(
    "cronstream_analytics_fires",
    "Expected fires of scheduled jobs, by what became of them (the fire ledger).",
    ["outcome"],
    registry=None,
)
ANALYTICS_LATE = Gauge(
    "cronstream_analytics_late_fires",
    "Expected fires past their deadline and not started, by probable reason.",
    ["reason"],
    registry=None,
)
ANALYTICS_JOBS = Gauge("cronstream_analytics_jobs", "Jobs the analytics service watches.", registry=None)

# The dashboard (cronstream/ui): its live streams and the tokens it refused.
UI_LIVE_STREAMS = Gauge("cronstream_ui_live_streams", "Live Runs streams open.", registry=None)
UI_LIVE_RENDERS = Counter(
    "cronstream_ui_live_renders_total",
    "Reads of the live Runs view, each shared by every stream open at the time.",
    registry=None,
)
UI_LIVE_REFUSED = Counter(
    "cronstream_ui_live_streams_refused_total",
    "Live streams refused with 503 by the per-process or per-client cap.",
    registry=None,
)
UI_TOKEN_FAILURES = Counter(
    "cronstream_ui_token_failures_total",
    "Wrong or throttled tokens (login, bearer, scrape token).",
    registry=None,
)


def version() -> str:
    try:
        return metadata.version("cronstream")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "0+unknown"


COMMON: tuple[MetricWrapperBase, ...] = (
    BUILD_INFO,
    DEAD_LETTERS,
    TRANSACTIONS,
    TRANSACTION_ABORTS,
    PRODUCER_RESETS,
    CONSUMER_LAG,
    TASK_RESTARTS,
)
BY_SERVICE: dict[str, tuple[MetricWrapperBase, ...]] = {
    "scheduler": (
        SCHEDULER_LEADER,
        SCHEDULER_JOBS,
        SCHEDULER_SUSPENDED,
        SCHEDULER_WAITING,
        SCHEDULER_PENDING_RETRIES,
        SCHEDULER_SHARDS,
        SCHEDULER_SHARDS_LED,
        SCHEDULER_SHARDS_STANDBY,
        SCHEDULER_STANDBY_LAG,
        SCHEDULER_HELD,
        TRIGGER_LAG,
        TRIGGER_UNEVALUABLE,
        FIRES,
        MISFIRES,
        FIRE_LAG,
    ),
    "dispatcher": (DISPATCH_DECISIONS, DISPATCH_BATCH, POOL_SLOTS_IN_USE, WAITING),
    "worker": (
        WORKER_SLOTS,
        WORKER_SLOTS_BUSY,
        WORKER_BUFFERED,
        WORKER_HANDLER_PROCESSES,
        WORKER_EXECUTIONS,
        EXECUTION_DURATION,
        START_LAG,
    ),
    "monitor": (
        EXECUTIONS,
        PROJECTED,
        PROJECTION_LAG,
        PROJECTION_BATCH,
        DAG_EVALUATIONS,
        ALERTS,
        QUEUE_DEPTH,
        WORKERS,
        REQUEUES,
        LOG_LINES_REFUSED,
    ),
    "analytics": (
        ANALYTICS_EVENTS,
        ANALYTICS_ALERTS,
        ANALYTICS_OPEN,
        ANALYTICS_FIRES,
        ANALYTICS_LATE,
        ANALYTICS_JOBS,
    ),
    "ui": (UI_LIVE_STREAMS, UI_LIVE_RENDERS, UI_LIVE_REFUSED, UI_TOKEN_FAILURES),
}
_announced: set[int] = set()
_process = {"service": "cronstream"}


M = TypeVar("M", bound=MetricWrapperBase)
_children: dict[tuple[int, tuple[str, ...]], MetricWrapperBase] = {}


def child(metric: M, *values: str) -> M:
    """`metric.labels(*values)` (in the order of its label names), kept: `labels()` takes
    a lock and builds its key on every call, and the hot paths call it for every
    execution. Label values are bounded (never an id), so is this."""
    key = (id(metric), values)
    found = _children.get(key)
    if found is None:
        found = _children[key] = metric.labels(*values)
    return found  # type: ignore[return-value]


def service() -> str:
    """The service this process runs (for the `service` label of the common metrics)."""
    return _process["service"]


def announce(service: str) -> None:
    """Register the metrics `service` exports (once per process) and its build info."""
    _process["service"] = service
    for metric in (*COMMON, *BY_SERVICE.get(service, ())):
        if id(metric) not in _announced:
            REGISTRY.register(metric)
            _announced.add(id(metric))
    BUILD_INFO.labels(service=service, version=version()).set(1)
