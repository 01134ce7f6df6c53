"""Tracing: W3C trace context on every record (SPEC §2).

The scheduler (or whoever produces a JobDue) starts a trace per execution; each service
that handles the execution's records continues it with a child span id. The
`traceparent` header travels on every Kafka record, so any OpenTelemetry-aware consumer
of `execution-events` can join the trace. Only the context propagates so far (a few
random bytes per record); exporting spans is left to the observability work.
"""

from __future__ import annotations

import os

TRACEPARENT = "traceparent"

Headers = list[tuple[str, bytes]]


def _hex(nbytes: int) -> str:
    return os.urandom(nbytes).hex()


def new_traceparent() -> str:
    return f"00-{_hex(16)}-{_hex(8)}-01"


def child_traceparent(parent: str | None) -> str:
    """A new span in the parent's trace, or a new trace when there is no valid parent."""
    if parent and len(parent) == 55 and parent[2] == "-" and parent[35] == "-":
        return f"{parent[:36]}{_hex(8)}{parent[52:]}"
    return new_traceparent()


def traceparent_of(headers: object) -> str | None:
    """The traceparent among a record's headers (a list of (name, bytes) from Kafka)."""
    if not isinstance(headers, list):
        return None
    for key, value in headers:
        if key == TRACEPARENT and value:
            try:
                return value.decode("ascii")
            except UnicodeDecodeError:
                return None
    return None


def trace_headers(traceparent: str) -> Headers:
    return [(TRACEPARENT, traceparent.encode("ascii"))]


def trace_id(traceparent: str | None) -> str | None:
    return traceparent[3:35] if traceparent and len(traceparent) == 55 else None
