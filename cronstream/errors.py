"""The SDK's exceptions: one base, each subclass with its meaning (and the CLI's exit code).

    try:
        client.pause("nightly")
    except NotFoundError:      # no such job (CLI exit 4)
        ...
    except UnavailableError:   # Kafka or PostgreSQL cannot be reached (CLI exit 3)
        ...
"""

from __future__ import annotations

__all__ = ["CronstreamError", "DefinitionError", "NotFoundError", "ParamsError", "UnavailableError"]


class CronstreamError(Exception):
    """Base of every error the SDK raises on purpose."""


class DefinitionError(CronstreamError, ValueError):
    """One or more definitions are invalid; the message says which job, field and why.
    Nothing of the batch was sent."""


class ParamsError(CronstreamError, ValueError):
    """The params given for a run (trigger, backfill) are invalid: not a JSON object, or
    larger with the job's own than a definition's params may be. Nothing was sent."""


class NotFoundError(CronstreamError, LookupError):
    """No such job or execution."""


class UnavailableError(CronstreamError, ConnectionError):
    """Kafka or PostgreSQL cannot be reached (or a topic is missing); the message is one
    line naming the server and the cause. Secrets in URLs are redacted."""
