"""Dispatcher and worker benchmarks (SPEC §9).

    python -m bench.worker                  # both
    python -m bench.worker pool_overhead

- pool_overhead: per-execution cost of the kill-able process-pool runner, against the
  same no-op run inline (no Kafka: the runner alone).
- dispatch_throughput: a backlog of JobDue records through one dispatcher and two
  workers; executions/s until every COMPLETED event is visible, for a no-op inline and
  a no-op in the pool.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Producer

import bench.handlers  # noqa: F401  (registers bench.echo)
from bench.harness import BenchSystem, run_benches
from bench.scheduler import tail_topic
from cronstream.handlers import REGISTRY
from cronstream.services.worker import builtins  # noqa: F401
from cronstream.services.worker.pool import PoolRunner
from cronstream.services.worker.runner import CancelSignal
from cronstream.shared.ids import execution_id, run_id
from cronstream.shared.records import JobDue, JobSnapshot


def _due(handler: str, i: int) -> JobDue:
    t = datetime.now(UTC)
    return JobDue(execution_id=execution_id(f"b{i}", t, 1), job_id=f"b{i}", run_id=run_id(f"b{i}", t),
                  scheduled_at=t, reason="MANUAL", idempotency_key=f"k{i}",
                  job=JobSnapshot(handler=handler, params={"i": i}))


def pool_overhead() -> dict[str, Any]:
    n = int(os.environ.get("BENCH_EXECUTIONS", "3000"))
    size = int(os.environ.get("BENCH_POOL", "4"))

    async def measure(handler: str) -> float:
        runner = PoolRunner(REGISTRY, size, ["bench.handlers"])
        await runner.start()
        try:
            dues = [_due(handler, i) for i in range(n)]
            await asyncio.gather(*(runner.run(d, lambda p, m: None, CancelSignal()) for d in dues[:50]))
            started = time.perf_counter()
            outcomes = await asyncio.gather(*(runner.run(d, lambda p, m: None, CancelSignal())
                                              for d in dues))
            elapsed = time.perf_counter() - started
            assert all(o.status == "COMPLETED" for o in outcomes), outcomes[:3]
            return elapsed
        finally:
            await runner.close()

    pool = asyncio.run(measure("bench.echo"))
    inline = asyncio.run(measure("noop"))
    return {"params": {"executions": n, "pool_processes": size},
            "pool_executions_per_second": round(n / pool),
            "inline_executions_per_second": round(n / inline),
            "pool_overhead_us_per_execution": round((pool - inline) / n * 1e6, 1)}


def dispatch_throughput() -> dict[str, Any]:
    n = int(os.environ.get("BENCH_BACKLOG", "30000"))
    figures: dict[str, Any] = {"params": {"backlog": n, "workers": 2}}
    for handler in ("noop", "bench.echo"):
        system = BenchSystem(f"dispatch_{handler.replace('.', '_')}")
        try:
            env = {"PYTHONPATH": os.getcwd()}
            system.start("dispatcher", name="dispatcher").wait_for_log("action=partitions_assigned")
            workers = [system.start("worker", "--worker-id", f"w{i}", "--concurrency", "32",
                                    "--import", "bench.handlers", name=f"worker-{i}", env=env)
                       for i in range(2)]
            for w in workers:
                w.wait_for_log("action=partitions_assigned")
            producer = Producer({"bootstrap.servers": system.settings.kafka_bootstrap_servers,
                                 "linger.ms": 20, "partitioner": "murmur2_random",
                                 "enable.idempotence": True})
            completed: list[float] = []
            def on_record(msg: Any, now: float, completed: list[float] = completed) -> None:
                if b'"COMPLETED"' in msg.value():
                    completed.append(now)

            tail = threading.Thread(target=tail_topic, args=(
                system.settings, system.settings.topics.execution_events, 300, on_record,
                lambda completed=completed: len(completed) >= n))
            tail.start()
            time.sleep(2)  # the tail is assigned before the first record exists
            started = time.time()
            for i in range(n):
                due = _due(handler, i).model_copy(update={"execution_id": uuid.uuid4()})
                while True:
                    try:
                        producer.produce(system.settings.topics.job_due, due.to_json(), due.job_id.encode())
                        break
                    except BufferError:
                        producer.poll(0.05)
            producer.flush(60)
            tail.join()
            elapsed = max(completed) - started if completed else float("nan")
            figures[handler] = {"completed": len(completed), "seconds": round(elapsed, 2),
                                "executions_per_second": round(len(completed) / elapsed)}
        finally:
            system.close()
    return figures


BENCHES = {"pool_overhead": pool_overhead, "dispatch_throughput": dispatch_throughput}


def main(names: list[str] | None = None) -> None:
    run_benches("worker", BENCHES, names)


if __name__ == "__main__":
    main(sys.argv[1:] or None)
