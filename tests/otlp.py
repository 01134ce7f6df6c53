"""An OTLP/HTTP traces endpoint on loopback that decodes what the services export (with
the OpenTelemetry proto package): for the telemetry tests, and for the benchmark that
measures what tracing costs (which only counts)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent: str
    name: str
    service: str
    links: list[tuple[str, str]] = field(default_factory=list)


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP traces endpoint on loopback: decodes what the services export."""

    daemon_threads = True

    def __init__(self, keep: bool = True) -> None:
        self.spans: list[Span] = []
        self.received = 0
        self.keep = keep
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    @classmethod
    @contextlib.contextmanager
    def serving(cls, keep: bool = True) -> Iterator[Receiver]:
        """A receiver answering on its own thread until the block ends. `keep=False`
        only counts the spans (a benchmark's millions)."""
        server = cls(keep)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield server
        finally:
            server.shutdown()
            server.server_close()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        request = ExportTraceServiceRequest.FromString(body)
        found = []
        for resource_spans in request.resource_spans:
            service = next((a.value.string_value for a in resource_spans.resource.attributes
                            if a.key == "service.name"), "")
            for scope in resource_spans.scope_spans:
                for s in scope.spans:
                    found.append(Span(s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                                      s.name, service,
                                      [(link.trace_id.hex(), link.span_id.hex()) for link in s.links]))
        with self.server.lock:
            self.server.received += len(found)
            if self.server.keep:
                self.server.spans.extend(found)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass
