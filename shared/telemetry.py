"""Tracing with OpenTelemetry: W3C trace context on every record, one trace per execution.

Configured the standard way (`configure`): `OTEL_SERVICE_NAME` (default
`cronstream-<service>`), `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`(`_ARG`),
`OTEL_PROPAGATORS` (default `tracecontext,baggage`), and `OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, exporting OTLP over HTTP.

One trace per execution: the scheduler's fire span is the root; the dispatcher's queue
span, the worker's run span (with the handler's span inside it, in the pool process) and
the monitor's projection and DAG spans are its descendants. Retries, requeues and DAG
steps link to the execution they come from. The context travels in Kafka record headers
(`traceparent`, `tracestate`, `baggage`) through the standard propagators, with the
getter and setter below.

Without an endpoint nothing is exported and nothing is recorded, and the hot path pays
(almost) nothing: the root of each execution still gets its ids (so the trace id is
stored in `job_executions.trace_id` and written in log lines), and every later hop
forwards the context it received unchanged instead of making spans nobody will see
(`Hop`). With an endpoint, every hop makes its span.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags

TRACEPARENT = "traceparent"
TRACER = "cronstream"

Headers = list[tuple[str, bytes]]

_state: dict[str, Any] = {"configured": False, "recording": False, "provider": None}


class _KafkaSetter(Setter[Headers]):
    def set(self, carrier: Headers, key: str, value: str) -> None:
        carrier.append((key, value.encode()))


class _KafkaGetter(Getter[Headers]):
    def get(self, carrier: Headers, key: str) -> list[str] | None:
        found = [v.decode("utf-8", "replace") for k, v in carrier if k == key and v]
        return found or None

    def keys(self, carrier: Headers) -> list[str]:
        return [k for k, _ in carrier]


SETTER = _KafkaSetter()
GETTER = _KafkaGetter()


def _endpoint() -> str | None:
    return os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT")


def configure(service: str) -> None:
    """Once per process: the tracer provider of `service`."""
    if _state["configured"]:
        return
    _state["configured"] = True
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": f"cronstream-{service}"}
    resource = Resource.create(attributes)
    if _endpoint():
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        _state["recording"] = True
    else:
        provider = TracerProvider(resource=resource, sampler=ALWAYS_OFF)
    _state["provider"] = provider
    trace.set_tracer_provider(provider)
    for handler in logging.getLogger().handlers:
        handler.addFilter(TraceIdFilter())


def recording() -> bool:
    """Whether spans are made and exported (an OTLP endpoint is configured)."""
    return bool(_state["recording"])


def flush(timeout_ms: int = 5000) -> None:
    provider = _state["provider"]
    if provider is not None and recording():
        provider.force_flush(timeout_ms)


def shutdown() -> None:
    provider = _state["provider"]
    if provider is not None:
        provider.shutdown()


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER)


# -- record headers ---------------------------------------------------------------------


def inject(ctx: otel_context.Context | None = None) -> Headers:
    """The headers that carry `ctx` (default: the current context)."""
    direct = _written_directly(trace.get_current_span(ctx).get_span_context(), ctx)
    if direct is not None:
        return direct
    headers: Headers = []
    propagate.inject(headers, context=ctx, setter=SETTER)
    return headers


def extract(headers: object) -> otel_context.Context:
    """The context carried by a record's headers (empty when there is none)."""
    carrier = headers if isinstance(headers, list) else []
    return _extract_traceparent(carrier) or propagate.extract(carrier, getter=GETTER)


# A lone version-00 traceparent, as the W3C propagator writes it (it accepts more: the
# rest is left to it).
_LONE_TRACEPARENT = re.compile(rb"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def _extract_traceparent(carrier: Headers) -> otel_context.Context | None:
    """What the default propagators extract from headers that carry a well-formed
    traceparent and no other trace header, without their machinery (about 25 µs of every
    execution the worker runs, twice); None for anything else, which they decide."""
    found = None
    for key, value in carrier:
        if key == TRACEPARENT and found is None:
            found = value
        elif key in _W3C_FIELDS:
            return None  # a second traceparent, tracestate or baggage
    match = _LONE_TRACEPARENT.fullmatch(found) if found is not None else None
    if match is None or not _w3c_textmap():
        return None
    trace_id, span_id = int(match[1], 16), int(match[2], 16)
    if not trace_id or not span_id:
        return None
    ids = SpanContext(trace_id, span_id, True, TraceFlags(int(match[3], 16)))
    return trace.set_span_in_context(NonRecordingSpan(ids))


def lone_traceparent(headers: object) -> str | None:
    """The traceparent of headers that carry a well-formed one and nothing else the
    propagators read — exactly what `inject()` writes again while their context is
    current and nothing records (`handler_span`); None for anything else."""
    carrier = headers if isinstance(headers, list) else []
    found = None
    for key, value in carrier:
        if key == TRACEPARENT and found is None:
            found = value
        elif key in _W3C_FIELDS:
            return None
    match = _LONE_TRACEPARENT.fullmatch(found) if found is not None else None
    if match is None or not _w3c_textmap() or not int(match[1], 16) or not int(match[2], 16):
        return None
    return match[0].decode()


def carried(headers: object) -> Headers:
    """The trace headers among a record's headers, to forward them unchanged."""
    if not isinstance(headers, list):
        return []
    return [(k, v) for k, v in headers if k in ("traceparent", "tracestate", "baggage")]


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


def trace_id(traceparent: str | None) -> str | None:
    """The 32-hex trace id of a traceparent (None for none or an invalid one)."""
    if traceparent and len(traceparent) == 55 and traceparent[2] == "-" and traceparent[35] == "-":
        value = traceparent[3:35]
        return value if value != "0" * 32 else None
    return None


def trace_id_of(span: Span) -> str | None:
    context = span.get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


# -- spans --------------------------------------------------------------------------------


def _root_context() -> SpanContext:
    return SpanContext(random.getrandbits(128) or 1, random.getrandbits(64) or 1, False,
                       TraceFlags(TraceFlags.DEFAULT))


def root(name: str, attributes: dict[str, Any] | None = None,
         links: Sequence[Link] = (), kind: SpanKind = SpanKind.PRODUCER) -> Span:
    """A new trace (an execution's fire). Not recording: ids only, no SDK work."""
    if not recording():
        return NonRecordingSpan(_root_context())
    return tracer().start_span(name, context=otel_context.Context(), kind=kind,
                               attributes=attributes, links=links)


def link_to(headers: object) -> list[Link]:
    """A span link to the context a record carries (a retry, requeue or DAG step links to
    the execution it comes from)."""
    if not recording():
        return []
    span_context = trace.get_current_span(extract(headers)).get_span_context()
    return [Link(span_context)] if span_context.is_valid else []


class Hop:
    """One service's part of an execution's trace: a span that is a child of the context a
    consumed record carries, and the headers that carry the span onwards.

    Not recording, there is no span: the received trace headers are forwarded unchanged
    (the trace id is what matters then, and it is the same)."""

    __slots__ = ("headers", "span")

    def __init__(self, name: str, received: object, kind: SpanKind = SpanKind.CONSUMER,
                 attributes: dict[str, Any] | None = None, links: Sequence[Link] = ()) -> None:
        if recording():
            self.span: Span | None = tracer().start_span(
                name, context=extract(received), kind=kind, attributes=attributes, links=links)
            self.headers = inject(trace.set_span_in_context(self.span))
        else:
            self.span = None
            self.headers = carried(received) or headers_of(NonRecordingSpan(_root_context()))

    @property
    def traceparent(self) -> str | None:
        return traceparent_of(self.headers)

    def context(self) -> otel_context.Context:
        return extract(self.headers)

    def end(self, error: str | None = None) -> None:
        if self.span is not None:
            if error:
                self.span.set_status(trace.Status(trace.StatusCode.ERROR, error[:500]))
            self.span.end()


def headers_of(span: Span) -> Headers:
    """The headers that carry `span` (in the current context)."""
    # Directly when it can be: a context made only to be injected costs a microsecond of
    # every fire.
    return _written_directly(span.get_span_context()) or inject(trace.set_span_in_context(span))


def _written_directly(ids: SpanContext, ctx: otel_context.Context | None = None) -> Headers | None:
    """What the configured propagators write for the span `ids` in `ctx`, without their
    machinery, when that is a lone traceparent; None when it is theirs to write."""
    if ids.is_valid and not ids.trace_state and _traceparent_only(ctx):
        return [(TRACEPARENT,
                 f"00-{ids.trace_id:032x}-{ids.span_id:016x}-{ids.trace_flags:02x}".encode())]
    return None


_W3C_FIELDS = frozenset({"traceparent", "tracestate", "baggage"})


def _w3c_textmap() -> bool:
    """Whether the configured propagators are W3C trace context, with or without W3C
    baggage (the default)."""
    textmap = propagate.get_global_textmap()
    known = _state.get("textmap")
    if known is None or known[0] is not textmap:
        fields = set(textmap.fields)
        known = _state["textmap"] = (textmap, TRACEPARENT in fields and fields <= _W3C_FIELDS)
    return bool(known[1])


def _traceparent_only(ctx: otel_context.Context | None = None) -> bool:
    """Whether the configured propagators write only `traceparent` for the span of `ctx`
    (default: the current context): W3C, and no baggage in it."""
    return _w3c_textmap() and not baggage.get_all(ctx)


def fresh_traces() -> Callable[[], Headers] | None:
    """A writer of the headers of new traces that nothing records, when the propagators
    write only a traceparent (the default): what `headers_of(root(...))` writes, without
    a span object or the propagators' machinery (per fire, on the scheduler's hot path).
    None when spans are recorded or other propagators are configured: then `root` and
    `headers_of`."""
    if recording() or not _traceparent_only():
        return None
    bits = random.getrandbits

    def write() -> Headers:
        return [(TRACEPARENT, f"00-{bits(128) or 1:032x}-{bits(64) or 1:016x}-00".encode())]
    return write


def new_headers() -> Headers:
    """Headers of a fresh trace, for records that start one (commands, heartbeats...)."""
    return headers_of(root("cronstream.record"))


@contextlib.contextmanager
def attached(headers: object) -> Iterator[None]:
    """Make the context a record carries current (for log lines and handler spans)."""
    token = otel_context.attach(extract(headers))
    try:
        yield
    finally:
        otel_context.detach(token)


@contextlib.contextmanager
def handler_span(handler: str, current: str | None = None, **cronstream: Any) -> Iterator[str | None]:
    """The handler's own span, current while it runs (user spans nest in it); yields the
    traceparent of the current context, for the handler's Context. `current`: that
    traceparent when the caller knows it already (`lone_traceparent` of the headers it
    attached), used as it is when nothing records."""
    if recording():
        attributes = {f"cronstream.{k}": str(v) for k, v in cronstream.items()}
        attributes["cronstream.handler"] = handler
        with tracer().start_as_current_span(f"cronstream.handler {handler}", kind=SpanKind.INTERNAL,
                                            attributes=attributes):
            yield traceparent_of(inject())
    else:
        yield current if current is not None else traceparent_of(inject())


class TraceIdFilter(logging.Filter):
    """Adds `trace_id=` to every log line written while a traced context is current."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "trace_id", None) is None:
            span_context = trace.get_current_span().get_span_context()
            if span_context.is_valid:
                record.trace_id = format(span_context.trace_id, "032x")
        return True


def messaging(topic: str, partition: int | None = None, offset: int | None = None,
              **cronstream: Any) -> dict[str, Any]:
    """Span attributes: the OpenTelemetry messaging conventions plus ours."""
    attributes: dict[str, Any] = {"messaging.system": "kafka", "messaging.destination.name": topic}
    if partition is not None:
        attributes["messaging.destination.partition.id"] = str(partition)
    if offset is not None:
        attributes["messaging.kafka.offset"] = offset
    for key, value in cronstream.items():
        if value is not None:
            attributes[f"cronstream.{key}"] = str(value) if not isinstance(value, int | float) else value
    return attributes
