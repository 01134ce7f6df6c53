"""Trace headers when nothing is recorded (no exporter): a new trace's headers are written
directly, and a lone traceparent read directly, exactly as the configured W3C propagators
would write and read them."""

from __future__ import annotations

from typing import Any

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import TextMapPropagator, default_setter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from cronstream.shared import telemetry


def through_the_propagators(span: trace.Span) -> telemetry.Headers:
    headers: telemetry.Headers = []
    propagate.inject(headers, context=trace.set_span_in_context(span), setter=telemetry.SETTER)
    return headers


def read_by_the_propagators(headers: telemetry.Headers) -> tuple[Any, ...]:
    return what_is_carried(propagate.extract(headers, getter=telemetry.GETTER))


def what_is_carried(ctx: otel_context.Context) -> tuple[Any, ...]:
    ids = trace.get_current_span(ctx).get_span_context()
    return (ids.trace_id, ids.span_id, ids.is_remote, ids.trace_flags, ids.trace_state,
            dict(baggage.get_all(ctx)))


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
RECEIVED: list[telemetry.Headers] = [
    [("traceparent", f"00-{TRACE}-{SPAN}-01".encode())],
    [("traceparent", f"00-{TRACE}-{SPAN}-00".encode()), ("x-other", b"1")],
    [("traceparent", f"00-{TRACE}-{SPAN}-ff".encode())],
    [("traceparent", f"00-{TRACE.upper()}-{SPAN}-01".encode())],  # refused: upper case
    [("traceparent", f"01-{TRACE}-{SPAN}-01-future".encode())],  # a later version
    [("traceparent", f"ff-{TRACE}-{SPAN}-01".encode())],  # an invalid version
    [("traceparent", f"00-{TRACE}-{SPAN}-01-extra".encode())],
    [("traceparent", f" 00-{TRACE}-{SPAN}-01 ".encode())],  # padded
    [("traceparent", f"00-{'0' * 32}-{SPAN}-01".encode())],
    [("traceparent", f"00-{TRACE}-{'0' * 16}-01".encode())],
    [("traceparent", f"00-{TRACE}-{SPAN}-01".encode()), ("tracestate", b"vendor=x")],
    [("traceparent", f"00-{TRACE}-{SPAN}-01".encode()), ("baggage", b"tenant=blue")],
    [("traceparent", f"00-{TRACE}-{SPAN}-01".encode()),
     ("traceparent", f"00-{TRACE}-{SPAN[::-1]}-01".encode())],
    [("traceparent", b""), ("traceparent", f"00-{TRACE}-{SPAN}-01".encode())],
    [("traceparent", b"\xff" * 55)],
    [("traceparent", b"garbage")],
    [],
]


def test_received_headers_read_as_the_propagators_read_them() -> None:
    for headers in RECEIVED:
        assert what_is_carried(telemetry.extract(headers)) == read_by_the_propagators(headers), headers
    configured = propagate.get_global_textmap()
    try:  # another propagator configured: everything through the propagators
        propagate.set_global_textmap(CompositePropagator([configured, Vendor()]))
        for headers in RECEIVED:
            assert what_is_carried(telemetry.extract(headers)) == read_by_the_propagators(headers)
    finally:
        propagate.set_global_textmap(configured)


def test_what_is_read_is_written_back_unchanged() -> None:
    for headers in RECEIVED:
        ctx = telemetry.extract(headers)
        written: telemetry.Headers = []
        propagate.inject(written, context=ctx, setter=telemetry.SETTER)
        assert telemetry.inject(ctx) == written, headers
    lone = RECEIVED[0]
    assert telemetry.inject(telemetry.extract(lone)) == lone
    with telemetry.attached(lone), telemetry.handler_span("noop") as traceparent:
        assert traceparent == lone[0][1].decode()


def test_a_new_trace_s_headers_are_what_the_propagators_write() -> None:
    assert not telemetry.recording()
    for _ in range(200):
        span = telemetry.root("cronstream.fire")
        headers = telemetry.headers_of(span)
        assert headers == through_the_propagators(span)
        assert telemetry.trace_id(telemetry.traceparent_of(headers)) == \
            f"{span.get_span_context().trace_id:032x}"
    sampled = NonRecordingSpan(SpanContext(1, 2, False, TraceFlags(TraceFlags.SAMPLED)))
    assert telemetry.headers_of(sampled) == through_the_propagators(sampled) == [
        ("traceparent", b"00-00000000000000000000000000000001-0000000000000002-01")]
    assert telemetry.Hop("cronstream.queue", []).headers[0][0] == "traceparent"


def test_a_fire_s_fresh_trace_is_written_as_the_propagators_write_a_new_root() -> None:
    """The scheduler writes each fire's new trace directly (telemetry.fresh_traces): the
    same bytes as a root span through the propagators, read back as that trace; not when
    baggage or another propagator must be written."""
    fresh = telemetry.fresh_traces()
    assert fresh is not None
    written = [fresh() for _ in range(200)]
    assert len({h[0][1] for h in written}) == 200  # a new trace each
    for headers in written:
        ids = trace.get_current_span(telemetry.extract(headers)).get_span_context()
        assert ids.is_valid and not ids.trace_flags.sampled
        again = NonRecordingSpan(SpanContext(ids.trace_id, ids.span_id, False, ids.trace_flags))
        assert headers == through_the_propagators(again)
    token = otel_context.attach(baggage.set_baggage("tenant", "blue"))
    try:
        assert telemetry.fresh_traces() is None
    finally:
        otel_context.detach(token)
    configured = propagate.get_global_textmap()
    try:
        propagate.set_global_textmap(CompositePropagator([configured, Vendor()]))
        assert telemetry.fresh_traces() is None
    finally:
        propagate.set_global_textmap(configured)


def test_baggage_trace_state_and_other_propagators_go_through_the_propagators() -> None:
    token = otel_context.attach(baggage.set_baggage("tenant", "blue"))
    try:
        span = telemetry.root("cronstream.fire")
        headers = telemetry.headers_of(span)
        assert headers == through_the_propagators(span)
        assert ("baggage", b"tenant=blue") in headers
    finally:
        otel_context.detach(token)
    stated = NonRecordingSpan(SpanContext(3, 4, False, TraceFlags(0), TraceState([("vendor", "x")])))
    assert ("tracestate", b"vendor=x") in telemetry.headers_of(stated)
    span = telemetry.root("cronstream.fire")
    configured = propagate.get_global_textmap()
    try:
        propagate.set_global_textmap(CompositePropagator([configured, Vendor()]))
        headers = telemetry.headers_of(span)
        assert headers == through_the_propagators(span) and ("x-vendor", b"1") in headers
        propagate.set_global_textmap(TraceContextTextMapPropagator())
        assert telemetry.headers_of(span) == through_the_propagators(span)
    finally:
        propagate.set_global_textmap(configured)


class Vendor(TextMapPropagator):
    """Another propagator a deployment might configure (OTEL_PROPAGATORS)."""

    def extract(self, carrier: Any, context: Any = None, getter: Any = None) -> Any:
        return context

    def inject(self, carrier: Any, context: Any = None, setter: Any = default_setter) -> None:
        setter.set(carrier, "x-vendor", "1")

    @property
    def fields(self) -> set[str]:
        return {"x-vendor"}
