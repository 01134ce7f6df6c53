"""Producers: transactional (with deadlines and a way out) and idempotent.

Transactions follow librdkafka's three error classes (INTRODUCTION.md, "Transactional
producer API"): retriable errors retry the same call, abortable errors abort and replay
the whole transaction (records are materialised so replay is exact), fatal errors — a
fenced producer above all — raise `ProducerFenced` and the owner must stop.

And one class librdkafka does not name: the call that never returns (#5456, #5511 after a
broker restart; docs/decisions/0007). Every transaction runs on a lane with a deadline.
When it expires, the producer is thrown away with its lane and a new one is built with the
same `transactional.id`: its `init_transactions()` fences the stuck one and settles its
open transaction (aborted, or completed if its commit had already been written). The
caller gets `TransactionOutcomeUnknown` and re-reads what the transaction was about from
Kafka, which is settled by then.

Any other failure inside a transaction (a record too large, a local queue error) aborts
it before the error is raised, so a producer is never left "in transaction".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from cronstream.shared import metrics
from cronstream.shared.kafka.errors import NOT_AUTHORIZED_HINT, NotAuthorized, kafka_error, not_authorized
from cronstream.shared.lanes import CallTimedOut, Lane
from cronstream.shared.logs import log
from cronstream.shared.telemetry import Headers

logger = logging.getLogger(__name__)

# A transaction normally commits in milliseconds (a few hundred at the most, under load);
# past this something is stuck. It bounds how long a broker restart can hold a service.
TRANSACTION_DEADLINE = 4.0
# init_transactions() waits out a broker that restarts (its transaction coordinator loads,
# an open transaction of the predecessor is aborted first); past this it is stuck.
INIT_DEADLINE = 60.0
# Between init attempts while the broker is away: short, so that a returning broker is
# used within a second (each attempt already waits `deadline` for an answer).
INIT_BACKOFF_MAX = 1.0
# Largest value we ever produce (the broker's default message.max.bytes is ~1 MB; our own
# records are bounded far below, dead-letter copies are truncated to fit).
MAX_PRODUCE_BYTES = 900 * 1024


class OutRecord(NamedTuple):
    """A record to produce: what every service's pure core returns and a producer writes."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers | None = None
    partition: int | None = None  # None: the partitioner chooses by key


class ProducerFenced(Exception):
    """A fatal producer error: another instance owns this transactional.id now."""


class TransactionAborted(Exception):
    """The transaction was aborted; nothing of it is visible. Read the input again."""


class TransactionOutcomeUnknown(TransactionAborted):
    """The transaction hung and its producer was replaced: it may have committed or not.
    The new producer has settled it, so committed offsets and state topics tell which."""


class ProducerStuck(RuntimeError):
    """A producer call that must not be abandoned (init) did not return: the process must
    exit (its supervisor restarts it), which is the only sure way to end that call."""


class RecordTooLarge(ValueError):
    """A record larger than any topic accepts (a bug: every record we write is bounded)."""


def produce(producer: Producer, record: OutRecord,
            on_delivery: Callable[..., None] | None = None) -> None:
    if record.value is not None and len(record.value) > MAX_PRODUCE_BYTES:
        raise RecordTooLarge(f"a {len(record.value)}-byte record for {record.topic}; "
                             f"the limit is {MAX_PRODUCE_BYTES}")
    kwargs: dict[str, Any] = {"headers": record.headers}
    if on_delivery is not None:
        kwargs["on_delivery"] = on_delivery
    if record.partition is not None:
        kwargs["partition"] = record.partition
    while True:
        try:
            producer.produce(record.topic, record.value, record.key, **kwargs)
            return
        except BufferError:
            producer.poll(0.05)  # local queue full: serve deliveries, then retry


class _Blocking:
    """The blocking transactional API of one librdkafka producer (runs on its lane)."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.transactional_id = conf["transactional.id"]
        self.producer = Producer(conf)

    def init(self, timeout: float) -> None:
        # Connected first: a transactional producer that asks for its id before its broker
        # connection is up retries on librdkafka's 500 ms timer (a new shard leader
        # waited ~0.5 s for its fence one time in three; connected first, never: issue 55).
        self.producer.list_topics(timeout=timeout)
        self._retry(lambda: self.producer.init_transactions(timeout), "init_transactions")

    def commit(self, records: list[OutRecord], offsets: list[TopicPartition] | None,
               group_metadata: Callable[[], Any] | None, attempts: int, timeout: float) -> None:
        for attempt in range(1, attempts + 1):
            try:
                self.producer.begin_transaction()
            except KafkaException as exc:
                self._raise_fatal(exc)
                raise
            try:
                for record in records:
                    produce(self.producer, record)
                if offsets:
                    assert group_metadata is not None
                    self._retry(lambda: self.producer.send_offsets_to_transaction(
                        offsets, group_metadata(), timeout), "send_offsets_to_transaction")
                self._retry(lambda: self.producer.commit_transaction(timeout), "commit_transaction")
                metrics.child(metrics.TRANSACTIONS, metrics.service()).inc()
                return
            except KafkaException as exc:
                err = kafka_error(exc)
                self._raise_fatal(exc)
                if err is not None and err.txn_requires_abort():
                    metrics.TRANSACTION_ABORTS.labels(service=metrics.service()).inc()
                    log(logger, "transaction_aborted", logging.WARNING,
                        transactional_id=self.transactional_id, attempt=attempt, error=err.str())
                    self._abort(timeout)
                    continue
                self._abort(timeout)
                raise TransactionAborted(str(exc)) from exc
            except ProducerFenced:
                raise
            except Exception as exc:
                # Not Kafka's error (a record too large, a bad header...): never leave the
                # producer in a transaction.
                self._abort(timeout)
                raise TransactionAborted(f"{type(exc).__name__}: {exc}") from exc
        raise TransactionAborted(f"transaction aborted {attempts} times")

    def _abort(self, timeout: float) -> None:
        metrics.TRANSACTION_ABORTS.labels(service=metrics.service()).inc()
        try:
            self._retry(lambda: self.producer.abort_transaction(timeout), "abort_transaction")
        except KafkaException as exc:
            self._raise_fatal(exc)
            log(logger, "transaction_abort_failed", logging.WARNING,
                transactional_id=self.transactional_id, error=str(exc))

    @staticmethod
    def _raise_fatal(exc: KafkaException, what: str | None = None) -> None:
        err = kafka_error(exc)
        if err is None:
            return
        said = f"{what}: {err.str()}" if what else err.str()
        if not_authorized(err):
            raise NotAuthorized(f"{said} ({err.name()}): {NOT_AUTHORIZED_HINT}") from exc
        if err.fatal():
            raise ProducerFenced(said) from exc

    def _retry(self, call: Callable[[], object], what: str, attempts: int = 5) -> None:
        for attempt in range(1, attempts + 1):
            try:
                call()
                return
            except KafkaException as exc:
                err = kafka_error(exc)
                self._raise_fatal(exc, what)
                if err is not None and err.retriable() and attempt < attempts:
                    time.sleep(0.05 * attempt)
                    continue
                raise

    def close(self) -> None:
        with contextlib.suppress(KafkaException):
            self.producer.flush(1.0)


class TransactionalProducer:
    """A transactional producer driven from asyncio, with deadlines and self-repair."""

    def __init__(self, conf: dict[str, Any], deadline: float = TRANSACTION_DEADLINE) -> None:
        self.conf = conf
        self.transactional_id: str = conf["transactional.id"]
        self.deadline = deadline
        self._lane = Lane(f"txn-{self.transactional_id}")
        self._blocking = self._lane.run(_Blocking, conf, deadline=deadline)
        self._closed = False

    async def init(self, patience: float | None = None) -> None:
        """Take ownership of the transactional.id, fencing any previous owner. A broker that
        is away is waited for (with backoff) up to `patience` seconds (None: for ever).

        An init call is never abandoned: one left running would bump the epoch when it
        finally returns and fence the producer that replaced it. One that does not return
        within INIT_DEADLINE raises ProducerStuck: the service must exit, which ends it."""
        started = time.monotonic()
        backoff = 0.5
        while True:
            try:
                await self._lane.call(self._blocking.init, self.deadline, deadline=INIT_DEADLINE)
                return
            except CallTimedOut as exc:
                raise ProducerStuck(str(exc)) from None
            except KafkaException as exc:
                if patience is not None and time.monotonic() - started > patience:
                    raise
                log(logger, "transactions_init_retried", logging.WARNING,
                    transactional_id=self.transactional_id, error=str(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, INIT_BACKOFF_MAX)

    async def commit(self, records: Iterable[OutRecord], offsets: list[TopicPartition] | None = None,
                     group_metadata: Callable[[], Any] | None = None, attempts: int = 3) -> None:
        """Produce `records` (and commit `offsets` for the group) in one transaction.

        Raises TransactionAborted (nothing visible), TransactionOutcomeUnknown (the producer
        hung and was replaced; read the outcome back from Kafka) or ProducerFenced.
        """
        materialised = list(records)
        try:
            await self._lane.call(self._blocking.commit, materialised, offsets, group_metadata,
                                  attempts, self.deadline / 2, deadline=self.deadline)
        except CallTimedOut as exc:
            log(logger, "transaction_hung", logging.ERROR, transactional_id=self.transactional_id,
                error=str(exc), action_taken="replacing the producer")
            await self.reset()
            raise TransactionOutcomeUnknown(str(exc)) from None

    async def reset(self) -> None:
        """Throw the producer away (and its lane, which may be stuck in a call) and take
        the transactional.id again with a new one, which fences and settles the old."""
        metrics.PRODUCER_RESETS.labels(service=metrics.service()).inc()
        self._replace()
        await self.init()
        log(logger, "producer_replaced", transactional_id=self.transactional_id)

    async def renew(self) -> None:
        """Swap an idle producer for a fresh one under the same transactional.id (a
        precaution, not a repair: the old one is closed cleanly, not abandoned)."""
        try:
            await self._lane.call(self._blocking.close, deadline=self.deadline)
        except CallTimedOut:
            pass  # stuck after all: _replace abandons its lane
        else:
            self._lane.close(wait=self.deadline)
        self._replace()
        await self.init()
        log(logger, "producer_replaced", transactional_id=self.transactional_id)

    def _replace(self) -> None:
        self._lane.abandon()
        self._lane = Lane(f"txn-{self.transactional_id}")
        self._blocking = self._lane.run(_Blocking, self.conf, deadline=self.deadline)

    async def close(self) -> None:
        """Drop the producer; an open transaction is aborted by the broker or successor.

        Waits for what the lane still runs (an init must finish before anyone else takes
        the transactional.id: it would fence them); ProducerStuck if it does not."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._lane.call(self._blocking.close, deadline=INIT_DEADLINE)
        except CallTimedOut as exc:
            raise ProducerStuck(str(exc)) from None
        finally:
            self._lane.close()


class IdempotentProducer:
    """A non-transactional, idempotent producer with a delivery-report check on flush."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self._producer = Producer(conf)
        self._errors: list[str] = []

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self._errors.append(err.str())

    def produce(self, record: OutRecord,
                on_delivery: Callable[[KafkaError | None, Message], None] | None = None) -> None:
        """Queue one record; `on_delivery` is called (from a later poll) with its outcome."""
        if on_delivery is None:
            produce(self._producer, record, self._on_delivery)
        else:
            def both(err: KafkaError | None, msg: Message) -> None:
                self._on_delivery(err, msg)
                on_delivery(err, msg)

            produce(self._producer, record, both)
        self._producer.poll(0)

    def poll(self, timeout: float = 0) -> None:
        self._producer.poll(timeout)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait for every record; raise if any failed or some are still undelivered."""
        remaining = self._producer.flush(timeout)
        if remaining:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{remaining} records undelivered"))
        if self._errors:
            errors, self._errors = self._errors, []
            raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, "; ".join(errors[:3])))

    async def flush_async(self, timeout: float = 30.0) -> None:
        """flush() off the event loop (it honours its timeout: no coordinator involved)."""
        await asyncio.get_running_loop().run_in_executor(None, self.flush, timeout)
