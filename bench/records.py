"""Decoding cost of the open record contract (decision 0050), no servers needed.

    python -m bench.records

The monitor validates each batch of execution events in one pydantic pass
(`codec.decode_many`). Figures: events/s for records closed to unknown fields (the old
`extra="forbid"`), open (`extra="allow"`, today), and open with two fields of a newer minor
version in every record (kept, so they pass through).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from pydantic import ConfigDict, TypeAdapter

from bench.harness import run_benches
from cronstream.shared.records import ExecutionEvent

BATCH = 20_000
ROUNDS = 7


class _Closed(ExecutionEvent):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


def _event(**more: Any) -> bytes:
    return json.dumps({
        "event_id": str(uuid.uuid4()), "execution_id": str(uuid.uuid4()), "job_id": "bench.job",
        "run_id": str(uuid.uuid4()), "status": "COMPLETED", "attempt_number": 1, "worker_id": "w1",
        "scheduled_at": "2026-03-01T12:00:00Z", "occurred_at": "2026-03-01T12:00:01.250Z",
        "started_at": "2026-03-01T12:00:01Z", "completed_at": "2026-03-01T12:00:01.250Z",
        "result": {"rows": 3}, **more}).encode()


def _rate(model: type[ExecutionEvent], values: list[bytes]) -> float:
    adapter = TypeAdapter(list[model])  # type: ignore[valid-type]
    raw = b"[" + b",".join(values) + b"]"
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter()
        adapter.validate_json(raw)
        best = min(best, time.perf_counter() - started)
    return len(values) / best


def decode() -> dict[str, Any]:
    plain = [_event() for _ in range(BATCH)]
    newer = [_event(cost_cents=12, labels={"team": "data"}) for _ in range(BATCH)]
    return {
        "batch": BATCH, "rounds": ROUNDS, "unit": "events/s (best round)",
        "closed_forbid": round(_rate(_Closed, plain)),
        "open_allow": round(_rate(ExecutionEvent, plain)),
        "open_allow_with_newer_fields": round(_rate(ExecutionEvent, newer)),
    }


def main() -> None:
    run_benches("records", {"decode": decode})


if __name__ == "__main__":
    main()
