"""The SDK's exceptions: one base, each subclass with its meaning (and the CLI's exit code)
and the data it is about, as attributes, so that code never parses a message.

    try:
        client.pause("nightly")
    except NotFoundError as exc:     # no such job (CLI exit 4): exc.job_id == "nightly"
        ...
    except UnavailableError as exc:  # Kafka or PostgreSQL cannot be reached (CLI exit 3)
        print(exc.service, exc.server)

    try:
        client.apply(definitions)
    except DefinitionError as exc:   # nothing of the batch was sent
        for problem in exc.problems:
            print(problem.job_id, problem.field, problem.reason)

The message (`str(exc)`) is the one line, or the lines, that a person reads; the
attributes say the same for code. An attribute the error cannot know is None.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal
from uuid import UUID

__all__ = [
    "ConfigurationError", "CronstreamError", "DefinitionError", "DefinitionProblem",
    "NotFoundError", "ParamsError", "UnavailableError",
]


class CronstreamError(Exception):
    """Base of every error the SDK raises on purpose."""


@dataclass(frozen=True, slots=True)
class DefinitionProblem:
    """One thing wrong with one definition (`DefinitionError.problems`): where it is
    (`source`, the file or `apply`, and `index`, the definition's place in it from 1), the
    job (`job_id`, when the definition names one), the field at fault (`field`, dotted for
    a nested one: `params.region`; None when the problem is the whole definition or the
    file) and `reason`."""

    reason: str
    job_id: str | None = None
    field: str | None = None
    source: str | None = None
    index: int | None = None

    def __str__(self) -> str:
        return ": ".join(part for part in (
            self.source, f"job_id {self.job_id!r}" if self.job_id else None, self.field,
            self.reason) if part)


class DefinitionError(CronstreamError, ValueError):
    """One or more definitions are invalid; the message says which job, field and why.
    Nothing of the batch was sent.

    `problems` lists them one by one (a `DefinitionProblem` each: job_id, field,
    reason); `job_ids` the jobs they are about."""

    def __init__(self, message: str, problems: Iterable[DefinitionProblem] = ()) -> None:
        super().__init__(message)
        self.problems: tuple[DefinitionProblem, ...] = tuple(problems) or (DefinitionProblem(message),)

    @property
    def job_ids(self) -> list[str]:
        """The job_ids the problems name, in their order, each once."""
        return list(dict.fromkeys(p.job_id for p in self.problems if p.job_id))


class ParamsError(CronstreamError, ValueError):
    """The params given for a run (trigger, backfill) are invalid: not a JSON object, or
    larger with the job's own than a definition's params may be. Nothing was sent.

    `job_id` is the job; `key`, the param at fault when one is (a value that is not JSON
    data), else None (the params as a whole)."""

    def __init__(self, message: str, *, job_id: str | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.key = key


class NotFoundError(CronstreamError, LookupError):
    """No such job, execution or version.

    The attributes name what was looked for: `job_id` (and `version`, for a version of a
    job's definition), or `execution_id` (and `attempt`, for an attempt of its run)."""

    def __init__(self, message: str, *, job_id: str | None = None,
                 execution_id: UUID | None = None, version: int | None = None,
                 attempt: int | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.execution_id = execution_id
        self.version = version
        self.attempt = attempt


class UnavailableError(CronstreamError, ConnectionError):
    """Kafka or PostgreSQL cannot be reached; the message is one line naming the server
    and the cause. Secrets in URLs are redacted. (A missing topic or table is a
    `CronstreamError` that says to run `cronstream init`.)

    `service` is `"kafka"` or `"postgresql"`; `server`, its bootstrap servers or its URL
    (redacted)."""

    def __init__(self, message: str, *, service: Literal["kafka", "postgresql"] | None = None,
                 server: str | None = None) -> None:
        super().__init__(message)
        self.service = service
        self.server = server


class ConfigurationError(CronstreamError, ValueError):
    """A client's configuration is invalid (an argument, or a `CRONSTREAM_*` variable);
    the message names each setting and why. `settings` lists the settings at fault
    (`topic_prefix`, `database_url`...)."""

    def __init__(self, message: str, settings: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.settings: tuple[str, ...] = tuple(settings)
