"""`cronstream analytics`: the windowed alerts, raised on `alerts` as FIRING / RESOLVED.

A consumer of the public `execution-events` topic outside the correctness path (it
writes nothing but alerts; while it is down, nothing else is affected). Built on
confluent-kafka with `read_committed`, not faust: docs/decisions/0020.

Start, in this order (no offsets are committed, no internal topics are created):
1. Read `alerts` to its end: the open analytics episodes (episodes.py).
2. Read `job-definitions` and `scheduler-state` to their end: every job's thresholds and
   schedule, and where the scheduler's clock stands (ledger.py).
3. Replay `execution-events` from `now − analytics_lookback_seconds` (offsets_for_times)
   to the end it had at start: the windows (windows.py). Its offsets are asked first,
   waiting out a broker that settles (`kafka.settled`: a topic created a moment before).
   Nothing is judged until then, so a restart mid-window sees the same windows as before
   and raises no duplicate.
Then, live: every second the jobs with news (and every job every ten seconds) are judged;
every `analytics_queue_window_seconds` the work queues' depths are sampled (queues.py).

Alerts: SUCCESS_RATE_LOW, DURATION_REGRESSION, FIRE_LATE, WAITING_TOO_LONG (key: job_id)
and QUEUE_GROWING (key: `queue:<queue>`). A transition's record is produced and flushed before the episode
changes state here, so a crash in between repeats it at most once, with the same
`alert_id`.

Garbage: the monitor dead-letters undecodable `execution-events` and the scheduler
undecodable `job-definitions`; this service, which replays the log at every start, would
only copy them again. It reads through the shared inbound path with the SKIP policy
(`shared/inbound.py`): it logs them (`action=record_skipped`) and goes on.

Why one module of this size: the consume loop and the windows it feeds share one state;
the judgements are pure modules (windows.py, ledger.py, queues.py, episodes.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Message, TopicPartition

from cronstream.services.analytics.episodes import (
    ANALYTICS_KINDS,
    Episodes,
    Transition,
    queue_subject,
)
from cronstream.services.analytics.ledger import ALERTING, FireLedger, LateStatus
from cronstream.services.analytics.queues import QueueTrends, Trend
from cronstream.services.analytics.waits import Waits
from cronstream.services.analytics.windows import (
    JobWindow,
    Thresholds,
    duration_regressed,
    success_rate_low,
)
from cronstream.shared import metrics
from cronstream.shared.clients import REAL, KafkaClients
from cronstream.shared.codec import decode_key
from cronstream.shared.health import Health
from cronstream.shared.inbound import SKIP, Batch, Inbound
from cronstream.shared.kafka.config import producer_config, reader_config
from cronstream.shared.kafka.consumer import ConsumerThread
from cronstream.shared.kafka.lag import WorkLag
from cronstream.shared.kafka.reading import offsets_since, position, read_to_end, record_time_ms
from cronstream.shared.lifecycle import wait_or_stop
from cronstream.shared.logs import log
from cronstream.shared.producers import IdempotentProducer, OutRecord
from cronstream.shared.records import (
    Alert,
    ExecutionEvent,
    JobDefinition,
    SchedulerState,
)
from cronstream.shared.settings import Settings
from cronstream.shared.statuses import TERMINAL
from cronstream.shared.telemetry import new_headers

logger = logging.getLogger(__name__)

SERVICE = "analytics"
BATCH = 5000
TICK_SECONDS = 1.0
FULL_ROUND_EVERY = 10  # ticks between judging every job (windows also move with time)
SEVERITY: dict[str, Any] = {"SUCCESS_RATE_LOW": "error", "DURATION_REGRESSION": "warning",
                            "QUEUE_GROWING": "warning", "FIRE_LATE": "error",
                            "WAITING_TOO_LONG": "warning"}


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


class AnalyticsService:
    name = SERVICE

    def __init__(self, settings: Settings, instance: str | None = None,
                 kafka: KafkaClients = REAL) -> None:
        self.settings = settings
        self.kafka = kafka
        self.topics = settings.topics
        self.instance = settings.instance(instance)
        self.health = Health(self.name)
        self.health.require("replay")
        self.defaults = Thresholds.of(settings, None)
        self.lookback = max(settings.analytics_lookback_seconds, settings.analytics_window_seconds)
        self.inbound = Inbound(SERVICE, self.topics, SKIP)
        self.episodes = Episodes()
        self.windows: dict[str, JobWindow] = {}
        self.thresholds: dict[str, Thresholds] = {}
        self.ledger = FireLedger(int((time.time() - self.lookback) * 1000))
        self.trends = QueueTrends(settings.analytics_queue_windows)
        self._dirty: set[str] = set()
        self.waits = Waits()
        self._producer: IdempotentProducer | None = None
        self._flusher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="analytics-produce")

    # -- lifecycle ---------------------------------------------------------------------

    async def run(self, stopping: asyncio.Event) -> None:
        reader, producer = self.open()
        sampler: asyncio.Task[None] | None = None
        try:
            ends = await self._start(reader)
            sampler = asyncio.create_task(self._sample_queues(stopping))
            await self._consume(reader, ends, stopping)
        finally:
            if sampler is not None:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
            await reader.close()
            producer.flush(5.0)
            self._flusher.shutdown(wait=True)

    def open(self) -> tuple[ConsumerThread, IdempotentProducer]:
        """Make the Kafka clients (none is contacted yet): the reader, the alerts' producer."""
        producer = self._producer = self.kafka.idempotent(
            producer_config(self.settings, f"analytics-{self.instance}"))
        reader = self.kafka.consumer(reader_config(self.settings, f"analytics-{self.instance}"), SERVICE)
        return reader, producer

    async def _start(self, reader: ConsumerThread) -> dict[tuple[str, int], int]:
        """Steps 1-2, then the assignment of step 3; returns the replay's ends."""
        t = self.topics
        # Where the replay starts and ends (it may end later than this: what comes in
        # meanwhile is read live). First, so that a missing topic is said at once.
        since_ms = int((time.time() - self.lookback) * 1000)
        starts, ends = await offsets_since(reader, t.execution_events, since_ms)
        await read_to_end(reader, [TopicPartition(t.alerts, 0)], self._restore)
        opened = len(self.episodes.open)
        # Every shard of the clock's compacted topics (shared/shards.py).
        compacted = [TopicPartition(topic, p) for topic in (t.job_definitions, t.scheduler_state)
                     for p in await reader.partitions(topic) or [0]]
        await read_to_end(reader, compacted, self._apply)
        positions = await reader.position(compacted)
        await reader.assign([
            *[TopicPartition(p.topic, p.partition, p.offset if p.offset >= 0 else -2) for p in positions],
            *starts])
        log(logger, "analytics_replaying", open_episodes=opened, jobs=len(self.ledger.jobs),
            lookback_seconds=self.lookback,
            events=sum(ends[(tp.topic, tp.partition)] - tp.offset for tp in starts))
        return {k: v for k, v in ends.items() if v > 0}

    async def _consume(self, reader: ConsumerThread, ends: dict[tuple[str, int], int],
                       stopping: asyncio.Event) -> None:
        replaying = set(ends)  # execution-events partitions not replayed to their start end yet
        next_tick, ticks = 0.0, 0
        while not stopping.is_set():
            messages = await reader.consume(BATCH, 0.2)
            self._apply(messages)
            if replaying:
                await self._replayed(reader, messages, ends, replaying)
                if replaying:
                    continue
            if ticks == 0:
                self.health.set("replay", True)
                log(logger, "analytics_caught_up", jobs=len(self.windows),
                    open_episodes=len(self.episodes.open))
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + TICK_SECONDS
                ticks += 1
                await self._judge(everything=ticks % FULL_ROUND_EVERY == 1)

    @staticmethod
    async def _replayed(reader: ConsumerThread, messages: list[Message],
                        ends: dict[tuple[str, int], int], replaying: set[tuple[str, int]]) -> None:
        """Drop from `replaying` the partitions read to the end they had at start."""
        for msg in messages:
            topic, partition, offset = position(msg)
            if offset + 1 >= ends.get((topic, partition), 0):
                replaying.discard((topic, partition))
        if replaying and not messages:
            # Transaction markers take offsets too: the end is known by position.
            now_at = await reader.position([TopicPartition(t, p) for t, p in replaying])
            replaying -= {(tp.topic, tp.partition) for tp in now_at
                          if tp.offset >= ends[(tp.topic, tp.partition)]}

    # -- input ---------------------------------------------------------------------------

    def _restore(self, messages: list[Message]) -> None:
        batch = self.inbound.batch(messages)
        for msg in batch.records:
            alert = batch.decode(Alert, msg)
            if alert is not None:
                self.episodes.restore(alert)

    def _apply(self, messages: list[Message]) -> None:
        t = self.topics
        batch = self.inbound.batch(messages)
        for msg in batch.records:
            topic = msg.topic()
            if topic == t.execution_events:
                event = batch.decode(ExecutionEvent, msg, key_field="job_id")
                if event is not None:
                    self._event(event)
            elif topic == t.job_definitions:
                self._definition(batch, msg)
            elif topic == t.scheduler_state:
                state = batch.decode(SchedulerState, msg, key_field="job_id")
                if state is not None:
                    self.ledger.scheduler_state(state.job_id, state.next_fire_ms, state.last_fire_ms)

    def _event(self, event: ExecutionEvent) -> None:
        metrics.ANALYTICS_EVENTS.inc()
        self.waits.event(event.job_id, event.execution_id, event.status, _ms(event.occurred_at),
                         event.waiting_reason)
        terminal = event.status in TERMINAL
        self.ledger.event(event.job_id, event.execution_id, status=event.status,
                          attempt=event.attempt_number, scheduled_ms=_ms(event.scheduled_at),
                          terminal=terminal)
        if terminal:
            window = self.windows.get(event.job_id)
            if window is None:
                window = self.windows[event.job_id] = JobWindow(
                    self.settings.analytics_baseline_runs + self.settings.analytics_recent_runs)
            finished = event.completed_at or event.occurred_at
            duration = (finished - event.started_at).total_seconds() if event.started_at else None
            window.add(event.execution_id, event.status, finished.timestamp(), duration)
            self._dirty.add(event.job_id)

    def _definition(self, batch: Batch, msg: Message) -> None:
        job_id = batch.read(lambda _value, key: decode_key(key), msg)
        if job_id is None:
            return
        observed = record_time_ms(msg)
        if msg.value() is None:
            self.waits.definition(job_id, None)
            self.thresholds.pop(job_id, None)
            self.ledger.definition(job_id, None, valid=True, observed_ms=observed)
            self._dirty.add(job_id)
            return
        definition = batch.decode(JobDefinition, msg, key_field="job_id")
        if definition is None:
            self.ledger.definition(job_id, None, valid=False, observed_ms=observed)
            return
        th = self.thresholds[job_id] = Thresholds.of(self.settings, definition.alerts)
        self.waits.definition(job_id, definition)
        self.ledger.definition(job_id, definition, valid=True, observed_ms=observed,
                               late_after_s=th.late_after_seconds,
                               finish_within_s=th.finish_within_seconds)
        self._dirty.add(job_id)

    # -- judging -------------------------------------------------------------------------

    async def _judge(self, everything: bool) -> None:
        now = time.time()
        now_ms = int(now * 1000)
        open_jobs = {s for k, s in self.episodes.open if k != "QUEUE_GROWING"}
        jobs = set(self.windows) if everything else (self._dirty | open_jobs) & set(self.windows)
        self._dirty.clear()
        out: list[tuple[Transition, Alert]] = []
        for job_id in sorted(jobs):
            out += self._judge_window(job_id, now, now_ms)
        for job_id in sorted(self.ledger.jobs):
            th = self.thresholds.get(job_id, self.defaults)
            status = self.ledger.judge(job_id, now_ms)
            late = status.late and th.enabled
            transition = self.episodes.evaluate("FIRE_LATE", job_id, late, late, now_ms)
            if transition is not None:
                out.append((transition, self._late_alert(transition, job_id, status, th, now_ms)))
        out += self._judge_waits(now_ms)
        # Subjects that vanished (a deleted job) close their episodes.
        for kind in ("SUCCESS_RATE_LOW", "DURATION_REGRESSION", "FIRE_LATE"):
            tracked = self.ledger.jobs if kind == "FIRE_LATE" else self.windows
            for job_id in self.episodes.subjects(kind):
                if job_id not in tracked:
                    transition = self.episodes.evaluate(kind, job_id, False, False, now_ms)
                    assert transition is not None
                    out.append((transition, self._alert(transition, now_ms, job_id=job_id,
                                summary=f"{job_id}: no longer tracked (deleted)",
                                evidence={"reason": "job deleted or out of the window"})))
        for job_id in [j for j, w in self.windows.items() if j in jobs]:
            window = self.windows[job_id]
            window.trim(now - self.lookback)
            if window.empty and job_id not in self.ledger.jobs:
                del self.windows[job_id]
        await self._publish(out)
        self._measure()

    def _judge_window(self, job_id: str, now: float, now_ms: int) -> list[tuple[Transition, Alert]]:
        window = self.windows[job_id]
        th = self.thresholds.get(job_id, self.defaults)
        out = []
        rate = window.success_rate(now, th.window_seconds)
        low = th.enabled and success_rate_low(rate, th)
        transition = self.episodes.evaluate("SUCCESS_RATE_LOW", job_id, low, low, now_ms)
        if transition is not None:
            evidence = {"window_seconds": th.window_seconds, "finished": rate.finished,
                        "succeeded": rate.succeeded,
                        "success_rate_percent": round(rate.percent, 2),
                        "threshold_percent": th.success_rate_percent, "min_runs": th.min_runs}
            verb = "below" if transition.state == "FIRING" else "back at or above"
            out.append((transition, self._alert(
                transition, now_ms, job_id=job_id, evidence=evidence,
                summary=f"{job_id}: success rate {rate.percent:.1f}% over the last "
                        f"{th.window_seconds:g}s ({rate.succeeded}/{rate.finished}), {verb} "
                        f"{th.success_rate_percent:g}%")))
        durations = window.durations(th.recent_runs)
        slow = th.enabled and duration_regressed(durations, th)
        transition = self.episodes.evaluate("DURATION_REGRESSION", job_id, slow, slow, now_ms)
        if transition is not None:
            evidence = {"threshold_factor": th.duration_factor}
            summary = f"{job_id}: duration back to normal"
            if durations is not None:
                evidence |= {"recent_p95_seconds": round(durations.recent_p95, 3),
                             "baseline_p95_seconds": round(durations.baseline_p95, 3),
                             "factor": round(durations.factor, 2), "recent_runs": durations.recent_runs,
                             "baseline_runs": durations.baseline_runs}
                if transition.state == "FIRING":
                    summary = (f"{job_id}: p95 duration of the last {durations.recent_runs} runs "
                               f"{durations.recent_p95:.2f}s is {durations.factor:.1f}x its baseline "
                               f"{durations.baseline_p95:.2f}s (threshold {th.duration_factor:g}x)")
            out.append((transition, self._alert(transition, now_ms, job_id=job_id,
                                                evidence=evidence, summary=summary)))
        return out

    def _judge_waits(self, now_ms: int) -> list[tuple[Transition, Alert]]:
        """WAITING_TOO_LONG per job with waiting executions or an open episode."""
        out = []
        for job_id in sorted(self.waits.jobs() | set(self.episodes.subjects("WAITING_TOO_LONG"))):
            wait = self.waits.judge(job_id, now_ms)
            th = self.thresholds.get(job_id, self.defaults)
            late = wait.too_long and th.enabled
            transition = self.episodes.evaluate("WAITING_TOO_LONG", job_id, late, late, now_ms)
            if transition is None:
                continue
            summary = (f"{job_id}: an execution has waited {wait.oldest_seconds:.0f}s, longer than "
                       f"the job's interval of {wait.interval_seconds or 0:g}s ({wait.reason})"
                       if transition.state == "FIRING" else f"{job_id}: nothing waits too long")
            out.append((transition, self._alert(
                transition, now_ms, job_id=job_id, summary=summary,
                evidence={"waiting": wait.waiting, "oldest_waiting_seconds": round(wait.oldest_seconds, 3),
                          "interval_seconds": wait.interval_seconds, "waiting_reason": wait.reason,
                          "execution_id": str(wait.oldest_execution) if wait.oldest_execution else None})))
        return out

    def _late_alert(self, transition: Transition, job_id: str, status: LateStatus,
                    th: Thresholds, now_ms: int) -> Alert:
        reasons: dict[str, int] = {}
        for p in status.starts:
            reasons[p.reason] = reasons.get(p.reason, 0) + 1
        evidence: dict[str, Any] = {
            "late_after_seconds": th.late_after_seconds, "late_starts": len(status.starts),
            "late_finishes": len(status.finishes), "reasons": reasons,
            "missed_by_reason": {k: n for k, n in status.history.items() if k != "on_time"}}
        if transition.state == "RESOLVED":
            return self._alert(transition, now_ms, job_id=job_id, evidence=evidence,
                               summary=f"{job_id}: fires on time again")
        if status.starts:
            first = status.starts[0]
            evidence |= {"phase": "start", "scheduled_at": _iso(first.scheduled_ms),
                         "reason": first.reason}
            summary = (f"{job_id}: the fire due {_iso(first.scheduled_ms)} has not started "
                       f"{th.late_after_seconds:g}s later ({first.reason.replace('_', ' ')})")
        else:
            execution, scheduled = status.finishes[0]
            evidence |= {"phase": "finish", "scheduled_at": _iso(scheduled),
                         "execution_id": str(execution),
                         "finish_within_seconds": th.finish_within_seconds}
            summary = (f"{job_id}: the run due {_iso(scheduled)} has not finished "
                       f"{th.finish_within_seconds:g}s later")
        return self._alert(transition, now_ms, job_id=job_id, evidence=evidence, summary=summary)

    def _alert(self, transition: Transition, now_ms: int, *, summary: str, evidence: dict[str, Any],
               job_id: str | None = None, queue: str | None = None) -> Alert:
        episode = transition.episode
        # A FIRING record's occurred_at is the episode's opening: `Episodes.restore` reads
        # it back after a restart.
        occurred = episode.opened_ms if transition.state == "FIRING" else now_ms
        return Alert(alert_id=episode.alert_id, kind=episode.kind, state=transition.state,
                     severity=SEVERITY[episode.kind], job_id=job_id, queue=queue,
                     summary=summary[:1000], evidence=evidence,
                     occurred_at=datetime.fromtimestamp(occurred / 1000, UTC),
                     raised_at=datetime.fromtimestamp(now_ms / 1000, UTC))

    async def _publish(self, out: list[tuple[Transition, Alert]]) -> None:
        if not out:
            return
        assert self._producer is not None
        for _, alert in out:
            self._producer.produce(OutRecord(self.topics.alerts, alert.key, alert.to_json(), new_headers()))
        await asyncio.get_running_loop().run_in_executor(self._flusher, self._producer.flush, 30.0)
        for transition, alert in out:
            self.episodes.commit(transition)
            metrics.ANALYTICS_ALERTS.labels(kind=alert.kind, state=alert.state).inc()
            log(logger, "alert_" + ("raised" if alert.state == "FIRING" else "resolved"),
                logging.WARNING if alert.state == "FIRING" else logging.INFO,
                kind=alert.kind, alert_id=str(alert.alert_id), job_id=alert.job_id, queue=alert.queue,
                summary=alert.summary)

    def _measure(self) -> None:
        for kind in ANALYTICS_KINDS:
            metrics.ANALYTICS_OPEN.labels(kind=kind).set(len(self.episodes.subjects(kind)))
        late = self.ledger.pending_by_reason()
        finishes = sum(len(j.running) for j in self.ledger.jobs.values()
                       if j.finish_within_ms is not None)
        for reason in ALERTING:
            metrics.ANALYTICS_LATE.labels(reason=reason).set(late.get(reason, 0))
        metrics.ANALYTICS_LATE.labels(reason="finish").set(finishes)
        for outcome, count in self.ledger.outcomes.items():
            counter = metrics.ANALYTICS_FIRES.labels(outcome=outcome)
            counter.inc(count)
        self.ledger.outcomes.clear()
        metrics.ANALYTICS_JOBS.set(len(set(self.windows) | set(self.ledger.jobs)))

    # -- queues ----------------------------------------------------------------------------

    async def _sample_queues(self, stopping: asyncio.Event) -> None:
        window = self.settings.analytics_queue_window_seconds
        windows = self.settings.analytics_queue_windows
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="analytics-lag") as pool:
            lag = await loop.run_in_executor(pool, WorkLag, self.settings)
            try:
                while not await wait_or_stop(stopping, window):
                    try:
                        depths = await loop.run_in_executor(pool, lag.measure)
                    except Exception as exc:  # loss-tolerant: a missed sample only delays
                        log(logger, "queue_sample_failed", logging.WARNING, error=str(exc))
                        continue
                    now_ms = int(time.time() * 1000)
                    out = []
                    for priority, queue, depth in depths:
                        trend = self.trends.sample(priority, queue, depth)
                        transition = self.episodes.evaluate(
                            "QUEUE_GROWING", queue_subject(priority, queue), trend.growing(windows),
                            not trend.relieved(), now_ms)
                        if transition is not None:
                            out.append((transition, self._queue_alert(
                                transition, priority, queue, trend=trend, window=window,
                                now_ms=now_ms)))
                    await self._publish(out)
            finally:
                await loop.run_in_executor(pool, lag.close)

    def _queue_alert(self, transition: Transition, priority: str, queue: str, *, trend: Trend,
                     window: float, now_ms: int) -> Alert:
        evidence = {"priority": priority, "depths": list(trend.depths), "window_seconds": window,
                    "windows": self.settings.analytics_queue_windows}
        if transition.state == "FIRING":
            summary = (f"queue {queue} ({priority}): depth rose in each of the last "
                       f"{self.settings.analytics_queue_windows} windows of {window:g}s, now "
                       f"{trend.latest}")
        else:
            summary = f"queue {queue} ({priority}): depth no longer growing ({trend.latest})"
        return self._alert(transition, now_ms, queue=queue, evidence=evidence, summary=summary)

