"""Trace headers when nothing is recorded (no exporter): a new trace's headers are written
directly, exactly as the configured W3C propagators would write them."""

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
    return telemetry.inject(trace.set_span_in_context(span))


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
