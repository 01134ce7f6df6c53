"""Running one handler for one execution and turning what happens into an Outcome.

The registry is the only way from a handler name to code: an unknown name is a
permanent failure before anything runs, whatever the name looks like.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from cronstream.handlers import Context, HandlerRegistry, NonRetryableError
from cronstream.shared.records import MAX_RESULT_BYTES, JobDue

OutcomeStatus = Literal["COMPLETED", "FAILED", "TIMED_OUT", "CANCELLED", "PERMANENTLY_FAILED"]


@dataclass(frozen=True, slots=True)
class Outcome:
    status: OutcomeStatus
    result: Any = None
    error: str | None = None

    @property
    def retryable(self) -> bool:
        return self.status in ("FAILED", "TIMED_OUT")


def check_result(result: Any) -> Outcome:
    try:
        encoded = json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode()
    except (TypeError, ValueError) as exc:
        return Outcome("FAILED", error=f"result is not JSON: {exc}")
    if len(encoded) > MAX_RESULT_BYTES:
        return Outcome("FAILED", error=f"result is {len(encoded)} bytes of JSON; "
                                       f"the limit is {MAX_RESULT_BYTES}")
    return Outcome("COMPLETED", result=result)


def describe_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text[:8000]


def make_context(
    due: JobDue,
    progress: Callable[[float, str | None], None],
    cancel: threading.Event,
) -> Context:
    return Context(
        execution_id=due.execution_id,
        job_id=due.job_id,
        run_id=due.run_id,
        attempt_number=due.attempt_number,
        idempotency_key=due.idempotency_key,
        scheduled_at=due.scheduled_at,
        params=dict(due.job.params),
        _progress=progress,
        _cancel=cancel,
    )


class InlineRunner:
    """Runs handlers in this process: async ones on the loop, sync ones on threads.

    A timeout here is cooperative (the handler is told through its context and no
    longer awaited); `PoolRunner` is the one that can stop any code for real.
    """

    def __init__(self, registry: HandlerRegistry) -> None:
        self.registry = registry

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def run(
        self, due: JobDue, progress: Callable[[float, str | None], None], cancel: threading.Event,
    ) -> Outcome:
        spec = self.registry.get(due.job.handler)
        if spec is None:
            return Outcome("PERMANENTLY_FAILED", error=f"unknown handler {due.job.handler!r}")
        ctx = make_context(due, progress, cancel)
        call = spec.func(ctx) if spec.is_async else asyncio.to_thread(spec.func, ctx)
        try:
            result = await asyncio.wait_for(call, due.job.timeout_seconds)
        except TimeoutError:
            cancel.set()
            return Outcome("TIMED_OUT", error=f"timed out after {due.job.timeout_seconds:g}s")
        except NonRetryableError as exc:
            return Outcome("PERMANENTLY_FAILED", error=describe_error(exc))
        except Exception as exc:
            return Outcome("FAILED", error=describe_error(exc))
        if cancel.is_set():
            return Outcome("CANCELLED", result=result, error="cancelled")
        return check_result(result)
