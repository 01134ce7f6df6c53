"""cronstream: a distributed job scheduler on Apache Kafka.

The public Python API is what this module exports; everything else is internal.
"""

from cronstream.client import Client, DefinitionError
from cronstream.handlers import Context, NonRetryableError, handler
from cronstream.shared.records import ExecutionEvent, JobDefinition

__all__ = [
    "Client",
    "Context",
    "DefinitionError",
    "ExecutionEvent",
    "JobDefinition",
    "NonRetryableError",
    "handler",
]

__version__ = "0.1.0"
