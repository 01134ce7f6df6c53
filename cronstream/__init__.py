"""cronstream: a distributed job scheduler on Apache Kafka.

The public Python API is what this module exports (a test pins the list); everything
else is internal:

- `Client` / `AsyncClient`: publish and control jobs, read executions (client.py);
- `JobDefinition` (`JobDefinition.from_dict` for dicts and YAML), `Calendar` (a named
  calendar: `Client.apply_calendars`), `ExecutionEvent`,
  `Execution`, `LogEntry` (a line of an execution's log): the records;
- `events`: consume `execution-events` from your own systems (`events.subscribe`);
- `handler`, `Context`, `NonRetryableError`: write handlers for workers;
- the errors: `CronstreamError` and its `DefinitionError`, `NotFoundError`,
  `UnavailableError`.
"""

from cronstream import events
from cronstream.client import AsyncClient, Client
from cronstream.errors import CronstreamError, DefinitionError, NotFoundError, UnavailableError
from cronstream.executions import Execution, LogEntry
from cronstream.handlers import Context, NonRetryableError, handler
from cronstream.shared.records import Calendar, ExecutionEvent, JobDefinition

__all__ = [
    "AsyncClient",
    "Calendar",
    "Client",
    "Context",
    "CronstreamError",
    "DefinitionError",
    "Execution",
    "ExecutionEvent",
    "JobDefinition",
    "LogEntry",
    "NonRetryableError",
    "NotFoundError",
    "UnavailableError",
    "events",
    "handler",
]

__version__ = "0.1.0"
