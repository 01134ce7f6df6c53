"""Actions publish exactly what the CLI publishes: through the SDK's `Client`.

The Client is synchronous and not thread-safe, so every action runs on one thread of
its own (a single-worker executor) with one long-lived Client, and the event loop only
awaits it. Each call has a deadline: a Kafka outage answers the request with an error
instead of holding it open.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from uuid import UUID

from cronstream.client import Client
from cronstream.shared.logs import log
from cronstream.shared.settings import Settings

logger = logging.getLogger(__name__)

T = TypeVar("T")
ACTION_TIMEOUT_SECONDS = 30.0


class ActionFailed(RuntimeError):
    """The action could not be published (Kafka unreachable, job unknown...)."""


class ActionRefused(ActionFailed):
    """The action's input was refused before anything was sent (invalid params...)."""


class Actions:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ui-actions")
        self._client: Client | None = None

    def _with_client(self, work: Callable[[Client], T]) -> T:
        if self._client is None:
            self._client = Client(self.settings)
        return work(self._client)

    async def _run(self, action: str, subject: str, by: str, work: Callable[[Client], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            result = await asyncio.wait_for(
                loop.run_in_executor(self._executor, self._with_client, work), ACTION_TIMEOUT_SECONDS)
        except TimeoutError:
            log(logger, "ui_action_failed", logging.WARNING, ui_action=action, subject=subject,
                by=by, error="timed out")
            raise ActionFailed(f"{action} timed out after {ACTION_TIMEOUT_SECONDS:.0f}s "
                               "(is Kafka reachable?)") from None
        except ValueError as exc:  # DefinitionError, invalid input
            log(logger, "ui_action_failed", logging.WARNING, ui_action=action, subject=subject,
                by=by, error=str(exc))
            raise ActionRefused(str(exc)) from None
        except Exception as exc:  # KafkaException and the like: say so, keep serving
            log(logger, "ui_action_failed", logging.ERROR, ui_action=action, subject=subject,
                by=by, error=f"{type(exc).__name__}: {exc}")
            raise ActionFailed(f"{action} could not be published: {exc}") from None
        log(logger, "ui_action", ui_action=action, subject=subject, by=by)
        return result

    async def trigger(self, job_id: str, by: str, params: dict[str, Any] | None = None) -> UUID:
        """Run `job_id` now with its params overlaid by `params`; `by` is recorded as the
        execution's triggered_by."""
        return await self._run("trigger", job_id, by,
                               lambda c: c.trigger(job_id, params=params, by=by))

    async def pause(self, job_id: str, by: str) -> None:
        await self._run("pause", job_id, by, lambda c: c.pause(job_id, by=by))

    async def resume(self, job_id: str, by: str) -> None:
        await self._run("resume", job_id, by, lambda c: c.resume(job_id, by=by))

    async def cancel(self, execution_id: UUID, reason: str | None, by: str) -> None:
        await self._run("cancel", str(execution_id), by,
                        lambda c: c.cancel(execution_id, reason, issued_by=by))

    async def approve(self, execution_id: UUID, job_id: str, reason: str | None, by: str) -> None:
        await self._run("approve", str(execution_id), by,
                        lambda c: c.approve(execution_id, reason, issued_by=by, job_id=job_id))

    async def reject(self, execution_id: UUID, job_id: str, reason: str | None, by: str) -> None:
        await self._run("reject", str(execution_id), by,
                        lambda c: c.reject(execution_id, reason, issued_by=by, job_id=job_id))

    def close(self) -> None:
        def shutdown() -> None:
            if self._client is not None:
                self._client.close()

        self._executor.submit(shutdown).result(timeout=15)
        self._executor.shutdown(wait=True)
