"""Dispatcher and worker benchmarks (docs/reference/performance.md).

    python -m bench.worker                  # both
    python -m bench.worker pool_overhead

- pool_overhead: per-execution cost of the kill-able process-pool runner, against the
  same no-op run inline (no Kafka: the runner alone).
- pool_cpu: CPU per execution of the pool path (the worker's side and its processes'),
  a no-op in the pool 64 runs at a time, and the floor under it: the CPU of one bare
  round trip between two processes over a socket pair.
- dispatch_throughput: a backlog of JobDue records through one dispatcher and two
  workers; executions/s until every COMPLETED event is visible, for a no-op inline and
  a no-op in the pool.
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
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


def _process_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _round_trip_us(n: int, parent_cpu: int, child_cpu: int) -> dict[str, float]:
    """CPU of one write-and-answer between two processes pinned to the given CPUs (both
    sides), no Python work: the floor under a pool run."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {child_cpu})
        ours.close()
        while data := os.read(theirs.fileno(), 65536):
            os.write(theirs.fileno(), data)
        os._exit(0)
    theirs.close()
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {parent_cpu})
    line = b"x" * 200
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(n):
        os.write(ours.fileno(), line)
        os.read(ours.fileno(), 65536)
    after, child = resource.getrusage(resource.RUSAGE_SELF), _process_cpu(pid)
    os.sched_setaffinity(0, affinity)
    ours.close()
    os.waitpid(pid, 0)
    parent = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {"parent": round(parent / n * 1e6, 1), "child": round(child / n * 1e6, 1)}


def pool_cpu() -> dict[str, Any]:
    n = int(os.environ.get("BENCH_EXECUTIONS", "30000"))
    batch = 64
    cpus = sorted(os.sched_getaffinity(0))

    async def measure() -> dict[str, Any]:
        runner = PoolRunner(REGISTRY, batch, ["bench.handlers"], cpus=2)
        await runner.start()
        try:
            dues = [_due("bench.echo", i) for i in range(n + 2000)]
            await asyncio.gather(*(runner.run(d, lambda p, m: None, CancelSignal()) for d in dues[:2000]))
            pids = [child.pid for child in runner._children]
            children = sum(map(_process_cpu, pids))
            before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            for i in range(2000, n + 2000, batch):
                outcomes = await asyncio.gather(*(runner.run(d, lambda p, m: None, CancelSignal())
                                                  for d in dues[i:i + batch]))
                assert all(o.status == "COMPLETED" for o in outcomes), outcomes[:3]
            elapsed, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
            assert [child.pid for child in runner._children][:len(pids)] == pids, "the pool changed"
            children = sum(map(_process_cpu, [child.pid for child in runner._children])) - children
            parent = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            return {"processes": len(runner._children),
                    "executions_per_second": round(n / elapsed),
                    "cpu_us_per_execution": {"worker": round(parent / n * 1e6, 1),
                                             "processes": round(children / n * 1e6, 1),
                                             "total": round((parent + children) / n * 1e6, 1)}}
        finally:
            await runner.close()

    return {"params": {"executions": n, "runs_at_a_time": batch, "handler": "bench.echo"},
            **asyncio.run(measure()),
            # Waking a process on the other CPU costs far more than on the same one (on a
            # VM, an interprocessor interrupt, often to an idle CPU).
            "round_trip_cpu_us": {
                "same_cpu": _round_trip_us(n, cpus[0], cpus[0]),
                "other_cpu": _round_trip_us(n, cpus[0], cpus[-1]) if len(cpus) > 1 else None}}


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


BENCHES = {"pool_overhead": pool_overhead, "pool_cpu": pool_cpu, "dispatch_throughput": dispatch_throughput}


def main(names: list[str] | None = None) -> None:
    run_benches("worker", BENCHES, names)


if __name__ == "__main__":
    main(sys.argv[1:] or None)
