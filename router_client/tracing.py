"""OpenTelemetry traces of the gateway and the picker, exported over OTLP (the `tracing` extra).

Off unless an OTLP endpoint is configured (`--otlp-endpoint`, or `OTEL_EXPORTER_OTLP_ENDPOINT`
at the entry points). Off, nothing imports this module: the gateway's and the picker's hot
paths check one attribute (`tracing is None`) and create no tracer objects.

On, each request is a server span that continues the client's W3C `traceparent` (a new trace
without one), carrying the routing decision as attributes; the gateway adds one client span
per engine attempt, whose id is the `traceparent` the engine receives. Spans are batched
(BatchSpanProcessor) and sent by the OTLP gRPC exporter from its own thread; `shutdown()`
flushes what is left.

    request span  cacheroute.key, .affinity, .mode, .slot, .destination, .decision, .attempts
      └ engine span  (one per attempt) cacheroute.attempt, http.response.status_code, error
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = ["Span", "Tracing", "decision_stages", "end", "traceparent_of"]

_PROPAGATOR = TraceContextTextMapPropagator()


def decision_stages(before: Mapping[str, int], after: Mapping[str, int]) -> str:
    """The router core's counters that one decision moved (RouterCore.counters), joined by
    `,` in their order: e.g. `planned`, `fallback`, `planned,queue_spilled`,
    `unadmitted,history_kept`, `unadmitted,rehomed`. Read from the core's own counts, so the
    attribute says what the core did, not what the gateway guesses."""
    return ",".join(name for name, value in after.items() if value != before.get(name, 0))


class Tracing:
    """A tracer provider exporting to one OTLP endpoint, and the spans the edges make."""

    def __init__(self, endpoint: str, *, service: str, router_id: str,
                 exporter: SpanExporter | None = None, schedule_delay_ms: float = 1000) -> None:
        resource = Resource.create({"service.name": service, "service.instance.id": router_id})
        self.provider = TracerProvider(resource=resource)
        # `http://` endpoints are plain gRPC, `https://` TLS (the exporter's own rule).
        self.exporter = exporter or OTLPSpanExporter(endpoint=endpoint)
        self.provider.add_span_processor(
            BatchSpanProcessor(self.exporter, schedule_delay_millis=schedule_delay_ms))
        self.tracer = self.provider.get_tracer("cacheroute")
        self.endpoint = endpoint

    def request_span(self, name: str, traceparent: str | None) -> Span:
        """A server span for one request, child of the client's `traceparent` if it has a
        valid one (a malformed one starts a new trace, as the W3C spec asks)."""
        parent: Context | None = (_PROPAGATOR.extract({"traceparent": traceparent})
                                  if traceparent else None)
        return self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER)

    def engine_span(self, parent: Span, name: str = "engine") -> tuple[Span, str]:
        """A client span under `parent` for one call to an engine, and the `traceparent`
        that call carries (naming this span as the engine's parent)."""
        span = self.tracer.start_span(name, context=trace.set_span_in_context(parent),
                                      kind=SpanKind.CLIENT)
        return span, traceparent_of(span)

    def shutdown(self) -> None:
        """Export what is batched and stop (blocks up to the exporter's timeout)."""
        self.provider.shutdown()


def traceparent_of(span: Span) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def end(span: Span, status: int | None, error: str = "") -> None:
    """Close a span with the HTTP status it ended with (>= 500, or an error: span error)."""
    if status is not None:
        span.set_attribute("http.response.status_code", status)
    if error or (status is not None and status >= 500):
        span.set_status(Status(StatusCode.ERROR, error or f"HTTP {status}"))
        if error:
            span.set_attribute("error.type", error)
    span.end()
