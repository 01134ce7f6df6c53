"""Structured logging: one line per event, logfmt, with a stable `action` key.

Dashboards and alerts query `action`, `job_id`, `execution_id` — never message text:

    ts=2026-11-29T11:10:01.071Z level=info service=scheduler action=job_fired job_id=etl ...

`log(logger, "job_fired", job_id=...)` is the only way services log events.
`CRONSTREAM_LOG_FORMAT=json` writes the same keys as one JSON object per line. Lines
written while an execution's trace context is current carry `trace_id=` (telemetry.py).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from cronstream.shared.escaping import CONTROL, escaped, json_escaped

_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys()) | {
    "message",
    "asctime",
}


# One line stays readable and cheap to ship whatever a record holds: each value is cut at
# MAX_VALUE characters, a traceback at MAX_TRACEBACK.
MAX_VALUE = 2000
MAX_TRACEBACK = 8000


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more chars)"


def _quoted(text: str) -> str:
    # A record's text reaches an operator's terminal through `kubectl logs`: escaped.
    return '"' + escaped(text.replace("\\", "\\\\").replace('"', '\\"'), one_line=True) + '"'


def _quote(value: Any) -> str:
    text = _cut(str(value), MAX_VALUE)
    if text == "" or any(c in text for c in ' ="') or CONTROL.search(text):
        return _quoted(text)
    return text


class LogfmtFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [
            f"ts={ts}.{int(record.msecs):03d}Z",
            f"level={record.levelname.lower()}",
            f"service={self.service}",
        ]
        action = getattr(record, "action", None)
        if action:
            parts.append(f"action={action}")
        for key, value in record.__dict__.items():
            if key not in _RESERVED and key != "action" and value is not None:
                parts.append(f"{key}={_quote(value)}")
        message = record.getMessage()
        if message and message != action:
            parts.append(f"msg={_quote(message)}")
        if record.exc_info:
            trace = _cut(self.formatException(record.exc_info), MAX_TRACEBACK)
            parts.append("error=" + _quoted(trace))
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """One JSON object per line, the same keys as logfmt (`CRONSTREAM_LOG_FORMAT=json`), for
    log shippers that parse JSON (Loki, Elasticsearch, Cloud Logging)."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line: dict[str, Any] = {"ts": f"{ts}.{int(record.msecs):03d}Z",
                                "level": record.levelname.lower(), "service": self.service}
        action = getattr(record, "action", None)
        if action:
            line["action"] = action
        for key, value in record.__dict__.items():
            if key not in _RESERVED and key != "action" and value is not None:
                line[key] = value if isinstance(value, int | float | bool) else _cut(str(value), MAX_VALUE)
        message = record.getMessage()
        if message and message != action:
            line["msg"] = _cut(message, MAX_VALUE)
        if record.exc_info:
            line["error"] = _cut(self.formatException(record.exc_info), MAX_TRACEBACK)
        return json_escaped(json.dumps(line, ensure_ascii=False))


def configure(service: str, level: str = "INFO", format: str = "logfmt") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service) if format == "json" else LogfmtFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def log(logger: logging.Logger, action: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event with a stable action key and structured fields."""
    if logger.isEnabledFor(level):
        message = fields.pop("msg", action)
        logger.log(level, message, extra={"action": action, **fields})
