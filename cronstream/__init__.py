"""cronstream: a distributed job scheduler on Apache Kafka.

The public Python API is what this module exports (a test pins the list, and the methods
of the clients); everything else is internal:

- `Client` / `AsyncClient`: publish and control jobs and calendars, read executions
  (client.py), configured from `CRONSTREAM_*` or by plain arguments (`bootstrap_servers`,
  `database_url`, `topic_prefix`, `kafka_config`, `timeout`);
- `JobDefinition` (`JobDefinition.from_dict` for dicts and YAML), `Calendar` (a named
  calendar: `Client.apply_calendars`), `EventTrigger` and `EventBatch` (`event:` of a
  job of type EVENT), `TriggerEvent` (one record of an event trigger's run: `ctx.events`),
  `ExecutionEvent`, `Execution`, `LogEntry` (a line
  of an execution's log), `DefinitionVersion` (a version in a job's history), `Command`
  (what cancel, approve and reject publish): the records;
- `events`: consume `execution-events` from your own systems (`events.subscribe`);
- `handler`, `Context`, `NonRetryableError`: write handlers for workers;
- the errors, each with its data as attributes: `CronstreamError` and its
  `ConfigurationError` (`settings`), `DefinitionError` (`problems`, each a
  `DefinitionProblem`: job_id, field, reason), `ParamsError` (`job_id`, `key`),
  `NotFoundError` (`job_id`, `execution_id`, `version`, `attempt`), `UnavailableError`
  (`service`, `server`) and `ResultOmittedError` (`execution_id`).
"""

from cronstream import events
from cronstream.client import AsyncClient, Client
from cronstream.errors import (
    ConfigurationError,
    CronstreamError,
    DefinitionError,
    DefinitionProblem,
    NotFoundError,
    ParamsError,
    UnavailableError,
)
from cronstream.executions import Execution, LogEntry
from cronstream.handlers import Context, NonRetryableError, ResultOmittedError, handler
from cronstream.shared.records import (
    Calendar,
    Command,
    EventBatch,
    EventTrigger,
    ExecutionEvent,
    JobDefinition,
    TriggerEvent,
)
from cronstream.versions import DefinitionVersion

__all__ = [
    "AsyncClient",
    "Calendar",
    "Client",
    "Command",
    "ConfigurationError",
    "Context",
    "CronstreamError",
    "DefinitionError",
    "DefinitionProblem",
    "DefinitionVersion",
    "EventBatch",
    "EventTrigger",
    "Execution",
    "ExecutionEvent",
    "JobDefinition",
    "LogEntry",
    "NonRetryableError",
    "NotFoundError",
    "ParamsError",
    "ResultOmittedError",
    "TriggerEvent",
    "UnavailableError",
    "events",
    "handler",
]

__version__ = "0.1.0"
