"""Event triggers inside a shard's leader: the EVENT jobs of the shard read their topics,
and each run commits with the positions it consumed (docs/decisions/0057).

Per term of leadership of a shard (leader.py calls these):
1. `load`, at takeover once the predecessor is fenced: the shard's partition of
   `trigger-state` read to its end — every trigger's committed positions.
2. `definitions` / `applied`, around each transaction that applies definitions: a new
   EVENT job gets its first state in the same transaction as its definition (the
   definition's Kafka timestamp is its `start_ms`); a deleted one (or one that is no
   longer EVENT) a tombstone; a changed one restarts its trigger.
3. `start`, once the leader is ready: one task per enabled EVENT job, with a consumer of
   its own assigned to every partition of its topic from the committed positions
   (read_committed, no group). Records go through the job's `Batcher`; the batches one
   read closes are committed through the leader's transaction (`commit`): their runs'
   JobDues and the trigger's new state together, one transaction per read (decision
   0012). Nothing is committed for a batch still open, so a crash loses nothing and the
   successor reads it again. Positions past records that were only passed over are
   committed on their own every IDLE_COMMIT_SECONDS.
4. `stop`, inside the leader's stop: no commit of this term is in flight afterwards.

A paused job (enabled: false) or one whose latest definition does not validate has no
task: its positions stay, its records wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from uuid import uuid5

from confluent_kafka import KafkaError, Message, TopicPartition
from pydantic import ValidationError

from cronstream.services.scheduler.outbound import Applied
from cronstream.services.scheduler.store import ShardStore
from cronstream.services.scheduler.triggers import (
    BEHIND_LOOKS,
    Batcher,
    Closed,
    SourceRecord,
    TriggerState,
    behind,
    behind_floor,
    lag,
    state_of,
)
from cronstream.shared import metrics, telemetry
from cronstream.shared.clients import REAL, KafkaClients
from cronstream.shared.ids import NAMESPACE
from cronstream.shared.kafka.config import OFFSET_BEGINNING, reader_config
from cronstream.shared.kafka.consumer import ConsumerThread
from cronstream.shared.kafka.errors import settled
from cronstream.shared.kafka.reading import offsets_since, position, read_to_end, record_time_ms
from cronstream.shared.logs import log
from cronstream.shared.producers import OutRecord
from cronstream.shared.records import Alert, JobDefinition, JobDue, now_utc
from cronstream.shared.schedule import from_epoch_ms
from cronstream.shared.settings import Settings

logger = logging.getLogger(__name__)

# Records read per call; how long a call waits for the first when no batch is due sooner.
READ_BATCH = 1000
POLL_SECONDS = 0.2
# Positions past records that were only passed over are committed at most this often.
IDLE_COMMIT_SECONDS = 5.0
# How often a trigger looks for new partitions of its topic and measures its lag.
LOOK_SECONDS = 5.0
# A topic that does not exist (yet) is looked for again this often.
MISSING_TOPIC_SECONDS = 2.0

Commit = Callable[[list[OutRecord]], Awaitable[bool]]


def time_ms() -> int:
    return time.time_ns() // 1_000_000


def _definition(raw: bytes | None) -> JobDefinition | None:
    """The definition when it validates (None for a tombstone or one that does not: the
    leader suspends or dead-letters it)."""
    if raw is None:
        return None
    try:
        return JobDefinition.model_validate_json(raw)
    except (ValidationError, ValueError, RecursionError):
        return None


async def _watermarks(reader: ConsumerThread, tp: TopicPartition) -> tuple[int, int]:
    return await settled(lambda: reader.watermarks(tp), f"offsets of {tp.topic}[{tp.partition}]")


def _headers(msg: Message) -> list[tuple[str, bytes | None]] | None:
    headers = msg.headers()
    if not headers:
        return None
    pairs = headers.items() if isinstance(headers, dict) else headers
    return [(k, v.encode() if isinstance(v, str) else v) for k, v in pairs]


@dataclass
class Trigger:
    """One EVENT job of the shard: its definition, committed state and running task."""

    job_id: str
    state: TriggerState
    definition: JobDefinition | None = None
    def_offset: int | None = None
    task: asyncio.Task[None] | None = None
    lag: int = 0
    committed: dict[int, int] = field(default_factory=dict)
    looks: deque[int] = field(default_factory=lambda: deque(maxlen=BEHIND_LOOKS))  # lags, oldest first


class TriggerEngine:
    def __init__(self, settings: Settings, shard: int, store: ShardStore, *, commit: Commit,
                 on_failed: Callable[[BaseException], None], lock: asyncio.Lock, instance: str,
                 kafka: KafkaClients = REAL) -> None:
        self.settings = settings
        self.topics = settings.topics
        self.shard = shard
        self.store = store
        self.commit = commit
        self.on_failed = on_failed
        self.lock = lock  # the leader's transaction lock: a task is cancelled outside a commit
        self.instance = instance
        self.kafka = kafka
        self.triggers: dict[str, Trigger] = {}
        self._staged: dict[str, tuple[TriggerState | None, JobDefinition | None, int]] = {}
        self._started = False
        self._active = True
        self.disabled = False  # no trigger-state topic (`load`)

    # -- takeover -------------------------------------------------------------------

    async def load(self) -> None:
        """The shard's committed trigger states (read to the end: the predecessor is fenced)."""
        states: dict[str, TriggerState | None] = {}

        def handle(messages: list[Message]) -> None:
            for msg in messages:
                key, value = msg.key(), msg.value()
                if key is None:
                    continue
                job_id = key.decode("utf-8", "replace")
                if value is None:
                    states[job_id] = None
                    continue
                try:
                    states[job_id] = TriggerState.model_validate_json(value)
                except (ValidationError, ValueError, RecursionError) as exc:
                    log(logger, "trigger_state_unreadable", logging.WARNING, shard=self.shard,
                        job_id=job_id[:128], error=str(exc)[:300])

        reader = self.kafka.consumer(reader_config(
            self.settings, f"scheduler-{self.instance}-triggers-{self.shard}"), f"triggers-{self.shard}")
        try:
            if not await reader.partitions(self.topics.trigger_state):
                # A deployment made before event triggers: they stay off (a state could not
                # be committed), the clock runs as before.
                self.disabled = True
                log(logger, "triggers_disabled", logging.ERROR, shard=self.shard,
                    reason=f"topic {self.topics.trigger_state} does not exist: run `cronstream init`")
                return
            await read_to_end(reader, [TopicPartition(self.topics.trigger_state, self.shard)], handle)
        finally:
            await reader.close()
        for job_id, state in states.items():
            if state is None:
                continue
            row = self.store.job(job_id)
            definition = _definition(row.raw) if row is not None else None
            trigger = Trigger(job_id, state, definition, row.def_offset if row is not None else None)
            trigger.committed = state.next_offsets()
            self.triggers[job_id] = trigger
        if self.triggers:
            log(logger, "triggers_loaded", shard=self.shard, triggers=len(self.triggers))

    # -- definitions, in the leader's transactions ------------------------------------

    def definitions(self, applied: list[Applied]) -> list[OutRecord]:
        """The trigger-state records that the applied definitions cause (committed in the
        same transaction): a first state for a new EVENT job (or one moved to another
        topic), a tombstone for one deleted or no longer EVENT."""
        records: list[OutRecord] = []
        for a in applied if not self.disabled else ():
            definition = _definition(a.raw)
            known = self._staged[a.job_id][0] if a.job_id in self._staged else (
                self.triggers[a.job_id].state if a.job_id in self.triggers else None)
            if definition is not None and definition.type == "EVENT":
                assert definition.event is not None
                state = known
                if known is None or known.topic != definition.event.topic:
                    state = state_of(a.job_id, definition.event, a.observed_ms)
                    records.append(self._state_record(state))
                    records += self._episode_ends(known, "the trigger reads another topic")
                self._staged[a.job_id] = (state, definition, a.offset)
            elif a.raw is None or (definition is not None and definition.type != "EVENT"):
                if known is not None:
                    records.append(OutRecord(self.topics.trigger_state, a.job_id.encode(), None,
                                             partition=self.shard))
                    records += self._episode_ends(known, "the job was deleted or is no longer EVENT")
                    self._staged[a.job_id] = (None, None, a.offset)
            elif known is not None:  # a definition that does not validate: held, as if paused
                self._staged[a.job_id] = (known, None, a.offset)
        return records

    def applied(self) -> None:
        """The transaction of the last `definitions` committed: its changes take effect (a
        changed trigger's task is stopped and started again with the new definition)."""
        staged, self._staged = self._staged, {}
        for job_id, (state, definition, offset) in staged.items():
            old = self.triggers.pop(job_id, None)
            if state is None:
                if old is not None:
                    self._retire(old)
                    log(logger, "trigger_removed", shard=self.shard, job_id=job_id)
                continue
            same_topic = old is not None and old.state.topic == state.topic
            trigger = Trigger(job_id, old.state if old is not None and same_topic else state,
                              definition, offset)
            # The same topic: the positions stay (one dict, which the old task's last
            # commit may still move on).
            trigger.committed = old.committed if old is not None and same_topic else state.next_offsets()
            self.triggers[job_id] = trigger
            if old is not None and old.task is not None:
                self._retire(old, then=trigger)
            else:
                self._run(trigger)

    def _episode_ends(self, known: TriggerState | None, reason: str) -> list[OutRecord]:
        """The RESOLVED alert of an open TRIGGER_BEHIND episode whose state goes away."""
        if known is None or known.behind_since_ms is None:
            return []
        return [behind_alert(self.topics.alerts, known, firing=False,
                             evidence={"reason": reason})]

    def _state_record(self, state: TriggerState) -> OutRecord:
        return OutRecord(self.topics.trigger_state, state.job_id.encode(), state.to_json(),
                         partition=self.shard)

    # -- tasks ------------------------------------------------------------------------

    def start(self) -> None:
        self._started = True
        for trigger in self.triggers.values():
            self._run(trigger)

    def _run(self, trigger: Trigger) -> None:
        self.triggers[trigger.job_id] = trigger
        if not self._started or not self._active:
            return
        d = trigger.definition
        if d is None or not d.enabled or d.event is None:
            log(logger, "trigger_held", shard=self.shard, job_id=trigger.job_id,
                reason="paused" if d is not None else "no valid definition")
            return
        trigger.task = asyncio.create_task(self._guarded(trigger), name=f"trigger-{trigger.job_id}")

    def _retire(self, old: Trigger, then: Trigger | None = None) -> None:
        """Stop `old`'s task (never inside a commit: under the leader's transaction lock),
        then run `then` if it is still the job's trigger."""
        async def retire() -> None:
            if old.task is not None:
                async with self.lock:
                    old.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await old.task
            if then is not None and self._active and self.triggers.get(then.job_id) is then:
                self._run(then)

        asyncio.create_task(retire(), name=f"trigger-retire-{old.job_id}")  # noqa: RUF006

    async def stop(self) -> None:
        """Called by the leader holding its transaction lock: cancel every task."""
        self._active = False
        for trigger in self.triggers.values():
            if trigger.task is not None:
                trigger.task.cancel()

    async def join(self) -> None:
        for trigger in self.triggers.values():
            if trigger.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await trigger.task

    def lag(self) -> int:
        return sum(t.lag for t in self.triggers.values())

    async def _guarded(self, trigger: Trigger) -> None:
        try:
            await self._read(trigger)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("event trigger failed", extra={
                "action": "trigger_failed", "shard": self.shard, "job_id": trigger.job_id})
            self.on_failed(exc)

    async def _starts(self, reader: ConsumerThread, trigger: Trigger,
                      partitions: list[int]) -> dict[int, int]:
        """Where each partition without a committed position starts."""
        missing = [p for p in partitions if p not in trigger.committed]
        if not missing:
            return {}
        topic = trigger.state.topic
        if trigger.state.start == "earliest":
            return {p: (await _watermarks(reader, TopicPartition(topic, p)))[0] for p in missing}
        found, _ends = await offsets_since(reader, topic, trigger.state.start_ms)
        return {tp.partition: tp.offset for tp in found if tp.partition in missing}

    async def _read(self, trigger: Trigger) -> None:
        d = trigger.definition
        assert d is not None and d.event is not None
        conf = reader_config(self.settings, f"scheduler-{self.instance}-trigger-{self.shard}")
        conf["enable.partition.eof"] = False
        reader = self.kafka.consumer(conf, f"trigger-{trigger.job_id}")
        try:
            partitions = await self._assign(reader, trigger, d.event.topic)
            batcher = Batcher(d.event, committed=trigger.committed)
            last_commit = last_look = time.monotonic()
            while self._active:
                due = batcher.due_ms()
                wait = POLL_SECONDS if due is None else max(0.0, min(POLL_SECONDS, (due - time_ms()) / 1000))
                if await self._feed(trigger, batcher, await reader.consume(READ_BATCH, wait)):
                    last_commit = time.monotonic()
                now = time.monotonic()
                if now - last_commit > IDLE_COMMIT_SECONDS:
                    advanced = batcher.advanced()
                    if advanced is not None:
                        await self._commit_positions(trigger, batcher, advanced)
                    last_commit = now
                if now - last_look > LOOK_SECONDS:
                    last_look = now
                    trigger.lag = await self._lag(reader, trigger, partitions)
                    trigger.looks.append(trigger.lag)
                    await self._judge_lag(trigger)
                    found = await reader.partitions(d.event.topic)
                    if found is not None and found != partitions:
                        log(logger, "trigger_partitions_changed", shard=self.shard, job_id=trigger.job_id,
                            topic=d.event.topic, partitions=len(found))
                        return await self._restart_later(trigger)
        finally:
            await reader.close()

    async def _assign(self, reader: ConsumerThread, trigger: Trigger, topic: str) -> list[int]:
        """Assign every partition of `topic` from the committed positions (or where the
        trigger starts); waits for a topic that does not exist yet."""
        partitions: list[int] | None = None
        while partitions is None:
            partitions = await reader.partitions(topic)
            if partitions is None:
                log(logger, "trigger_topic_missing", logging.WARNING, shard=self.shard,
                    job_id=trigger.job_id, topic=topic)
                await asyncio.sleep(MISSING_TOPIC_SECONDS)
        for p, offset in (await self._starts(reader, trigger, partitions)).items():
            trigger.committed.setdefault(p, offset)
        await reader.assign([TopicPartition(topic, p, trigger.committed.get(p, OFFSET_BEGINNING))
                             for p in partitions])
        log(logger, "trigger_started", shard=self.shard, job_id=trigger.job_id, topic=topic,
            partitions=len(partitions),
            positions=",".join(f"{p}:{o}" for p, o in sorted(trigger.committed.items())))
        return partitions

    async def _feed(self, trigger: Trigger, batcher: Batcher, messages: list[Message]) -> bool:
        """Records read, through the batcher; the batches they close (and one whose wait is
        over) are committed together, in one transaction; whether any was."""
        closed: list[Closed] = []
        unevaluable = batcher.unevaluable
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log(logger, "trigger_read_error", logging.WARNING, job_id=trigger.job_id,
                        error=err.str())
                continue
            t, p, o = position(msg)
            done = batcher.add(SourceRecord(t, p, o, record_time_ms(msg), msg.key(), msg.value(),
                                            _headers(msg)), time_ms())
            if done is not None:
                closed.append(done)
        done = batcher.due(time_ms())
        if done is not None:
            closed.append(done)
        if batcher.unevaluable > unevaluable:
            metrics.TRIGGER_UNEVALUABLE.inc(batcher.unevaluable - unevaluable)
        if closed:
            await self._commit_runs(trigger, batcher, closed)
        return bool(closed)

    async def _restart_later(self, trigger: Trigger) -> None:
        """Read again from the committed positions (new partitions included)."""
        async def again() -> None:
            await asyncio.sleep(0)
            if self._active and self.triggers.get(trigger.job_id) is trigger:
                trigger.task = None
                self._run(trigger)
        asyncio.create_task(again())  # noqa: RUF006

    async def _lag(self, reader: ConsumerThread, trigger: Trigger, partitions: list[int]) -> int:
        ends = {}
        for p in partitions:
            with contextlib.suppress(Exception):
                ends[p] = (await reader.watermarks(TopicPartition(trigger.state.topic, p), cached=True))[1]
        return lag({p: e for p, e in ends.items() if e >= 0}, trigger.committed, {})

    async def _judge_lag(self, trigger: Trigger) -> None:
        """Open or end the trigger's TRIGGER_BEHIND episode after a look at its lag. The
        episode is kept in the trigger's state, committed with its alert, so that the
        leader after this one ends what this one opened."""
        d = trigger.definition
        assert d is not None and d.event is not None
        floor = behind_floor(d.event)
        change = behind(list(trigger.looks), floor, trigger.state.behind_since_ms is not None)
        if change is None:
            return
        opened = trigger.state.model_copy(update={"behind_since_ms": time_ms()}) if change else trigger.state
        alert = behind_alert(self.topics.alerts, opened, firing=change, evidence={
            "lag_records": trigger.lag, "floor_records": floor, "looked_every_seconds": LOOK_SECONDS,
            "lags": list(trigger.looks)})
        state = opened if change else trigger.state.model_copy(update={"behind_since_ms": None})
        if not await self.commit([self._state_record(state), alert]):
            raise asyncio.CancelledError
        trigger.state = state
        log(logger, "trigger_behind" if change else "trigger_caught_up",
            logging.WARNING if change else logging.INFO, shard=self.shard, job_id=trigger.job_id,
            topic=d.event.topic, lag=trigger.lag, floor=floor)

    async def _commit_runs(self, trigger: Trigger, batcher: Batcher, closed: list[Closed]) -> None:
        """The runs of `closed` (in order) and the positions of the last, in one
        transaction: a burst of records is one transaction, not one per run (decision 0012)."""
        d = trigger.definition
        assert d is not None and d.event is not None
        now = from_epoch_ms(time_ms())
        records = []
        for batch in closed:
            due = JobDue.event(d, batch.events, now, definition_offset=trigger.def_offset)
            records.append(OutRecord(self.topics.job_due, trigger.job_id.encode(), due.to_json(),
                                     telemetry.new_headers()))
        positions = closed[-1].positions
        state = state_of(trigger.job_id, d.event, trigger.state.start_ms, {**trigger.committed, **positions},
                         behind_since_ms=trigger.state.behind_since_ms)
        records.append(self._state_record(state))
        if not await self.commit(records):
            raise asyncio.CancelledError
        batcher.commit(positions)
        trigger.state = state
        metrics.FIRES.labels(reason="EVENT").inc(len(closed))
        log(logger, "trigger_fired", logging.DEBUG, shard=self.shard, job_id=trigger.job_id,
            runs=len(closed), events=sum(len(c.events) for c in closed))

    async def _commit_positions(self, trigger: Trigger, batcher: Batcher, positions: dict[int, int]) -> None:
        d = trigger.definition
        assert d is not None and d.event is not None
        state = state_of(trigger.job_id, d.event, trigger.state.start_ms, {**trigger.committed, **positions},
                         behind_since_ms=trigger.state.behind_since_ms)
        if not await self.commit([self._state_record(state)]):
            raise asyncio.CancelledError
        batcher.commit(positions)
        trigger.state = state


def behind_alert(topic: str, state: TriggerState, *, firing: bool, evidence: dict[str, object]) -> OutRecord:
    """The TRIGGER_BEHIND alert of `state`'s open episode (its id: the job and since when),
    FIRING when it opens, RESOLVED when it ends."""
    assert state.behind_since_ms is not None
    since = from_epoch_ms(state.behind_since_ms)
    now = now_utc()
    summary = (f"event trigger {state.job_id} falls behind {state.topic}: "
               f"{evidence.get('lag_records')} records in no run yet, and growing" if firing
               else f"event trigger {state.job_id} caught up with {state.topic}")
    alert = Alert(alert_id=uuid5(NAMESPACE, f"alert|TRIGGER_BEHIND|{state.job_id}|{state.behind_since_ms}"),
                  kind="TRIGGER_BEHIND", state="FIRING" if firing else "RESOLVED", severity="warning",
                  job_id=state.job_id, summary=summary[:1000],
                  evidence={"topic": state.topic, "behind_since": since.isoformat(), **evidence},
                  occurred_at=since if firing else now, raised_at=now)
    return OutRecord(topic, alert.key, alert.to_json(), telemetry.new_headers())
