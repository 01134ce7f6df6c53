"""What one Kafka transaction costs the broker, by partitions and records.

    python -m bench.transactions

Every hop of an execution (scheduler, dispatcher, worker) commits its batch in one
transaction. This measures the broker's CPU per transaction — the process's CPU seconds
(`/proc`) over a run of committed transactions, divided by their number — for
transactions that write 1 or 6 partitions, with a few or many records each, through
the same producer configuration the services use. The figure that matters: a
transaction costs the broker milliseconds, a record in it microseconds, so the broker's
share of an execution follows how many transactions the services commit, not how many
records they write (decision 0012).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Producer

from bench.harness import server_pids, tree_cpu, write_result
from cronstream.shared.kafka.admin import delete_topics, ensure_topics
from cronstream.shared.kafka.config import producer_config
from cronstream.shared.settings import Settings
from cronstream.shared.topics import TopicSpec

VALUE = b'{"schema_version":1,' + b'"x":"' + b"0" * 400 + b'"}'  # an event's size
WARMUP = 100
# (partitions written, records per partition, transactions)
CASES = [(1, 1, 400), (6, 1, 400), (6, 10, 400), (6, 100, 150)]


def _broker_cpu(pids: list[int]) -> float:
    return sum(tree_cpu(pid) for pid in pids)


def _commit(producer: Producer, topic: str, partitions: int, per_partition: int) -> None:
    producer.begin_transaction()
    for i in range(partitions * per_partition):
        producer.produce(topic, VALUE, key=str(i).encode(), partition=i % partitions)
    producer.commit_transaction(30)


def main() -> dict[str, Any]:
    settings = Settings.from_env()
    brokers = server_pids(settings)["kafka"]
    if not brokers:
        raise SystemExit("no Kafka broker process on this machine (cronstream infra up)")
    settings = settings.model_copy(update={"topic_prefix": f"t{uuid.uuid4().hex[:8]}."})
    topic = f"{settings.topic_prefix}transactions"
    ensure_topics(settings, [TopicSpec(topic, 6, {})])
    conf = producer_config(settings, "bench-transactions", transactional_id=topic)
    producer = Producer(conf)
    producer.init_transactions(30)
    results = []
    try:
        for _ in range(WARMUP):
            _commit(producer, topic, 6, 10)
        for partitions, per_partition, count in CASES:
            broker0, began = _broker_cpu(brokers), time.monotonic()
            for _ in range(count):
                _commit(producer, topic, partitions, per_partition)
            elapsed = time.monotonic() - began
            broker_ms = (_broker_cpu(brokers) - broker0) / count * 1000
            row = {"partitions": partitions, "records": partitions * per_partition,
                   "transactions": count, "broker_cpu_ms_per_transaction": round(broker_ms, 2),
                   "transactions_per_second": round(count / elapsed)}
            results.append(row)
            print(f"{partitions} partition(s), {row['records']:>3} records: broker "
                  f"{broker_ms:.2f} ms CPU per transaction, {row['transactions_per_second']} "
                  "transactions/s (one producer, one after another)", flush=True)
    finally:
        producer.flush(10)
        delete_topics(settings)
    figures = {"cases": results}
    write_result("transactions", figures)
    return figures


if __name__ == "__main__":
    main()
