"""One HTTP request as the endpoint picker sees it: an ext_proc stream, message by message.

    request headers ─ request body (buffered here, bounded) ─ key (router_client.keys) ─
      pick (plan, health, subset, in-flight cap) ─ answer: headers + metadata naming the
      endpoints, then the body back ─ response headers ─ response body (usage, TTFT) ─
      end: count the request out of flight, report the outcome, emit usage or error

`Exchange.handle(message)` returns the answers to send, in order; the gRPC shell
(router_client.epp.server) only moves messages. A message that cannot be served (a body
that is not JSON, too large, no endpoint) becomes an ImmediateResponse and ends the
exchange; a stream that ends early (the client went away) still counts the request out
of flight, once.

Body modes, from the gateway's `protocol_config` (or the configured default when an
older gateway sends none):
- FULL_DUPLEX_STREAMED (what GIE gateways configure): the body arrives in pieces and is
  forwarded only as we send it back, so the answer to the headers waits for the whole
  body; the response body is relayed the same way, which lets the picker drop a usage
  chunk it asked for and the client did not;
- BUFFERED: the gateway waits for the answer to the headers, then sends the whole body;
  the endpoint goes on the body's answer (headers may still change then);
- NONE / STREAMED request bodies: the body cannot be read before the headers go, so the
  key comes from the headers alone (a routing-key header, or the model-less default).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from router_client.epp import protocol as proto
from router_client.epp.metrics import EppMetrics
from router_client.epp.picker import EndpointPicker, Pick
from router_client.gateway import jsonio, sse
from router_client.gateway.telemetry import EventSink
from router_client.health import Outcome
from router_client.keys import KeyRule, derive_key, prompt_chars
from router_client.usage import from_openai_usage

if TYPE_CHECKING:  # tracing is optional: its module (and OpenTelemetry) load only when on
    from router_client.tracing import Span, Tracing

# How much of a non-streamed response body is kept to find its usage (the body itself
# is relayed whole whatever its size).
USAGE_SCAN_BYTES = 1 << 20
EPP_MAX_EVENT_BYTES = 1 << 20  # an SSE event held back while it arrives


@dataclass(frozen=True, slots=True, kw_only=True)
class EppSettings:
    router_id: str = "epp"
    keys: KeyRule = field(default_factory=KeyRule)
    max_body_bytes: int = 8 << 20
    max_inflight_per_destination: int = 256
    fallbacks: int = 2  # endpoints after the primary the gateway may retry, in order
    default_request_mode: int = proto.FULL_DUPLEX_STREAMED
    default_response_mode: int = proto.FULL_DUPLEX_STREAMED
    # Ask streamed requests for usage (to measure hits) and drop it from what the client
    # gets, where the modes allow both (full-duplex request and response bodies).
    inject_usage: bool = True
    # ext_proc streams served at once, and request-body bytes held by all of them while
    # they arrive: each stream may hold max_body_bytes, and 60 streams sending 8 MB without
    # ending held 780 MB. Past the budget a request is refused (503) until others finish.
    max_streams: int = 4096
    max_buffered_bytes: int = 256 << 20
    # A stream's request (headers and body) must be routed within request_timeout_s of the
    # stream's start, and the whole stream end within stream_timeout_s; past either the
    # picker ends it (DEADLINE_EXCEEDED) and counts its request out; streams that never end
    # would otherwise hold in-flight slots for good. The stream lasts as long
    # as the HTTP request, streamed answer included: stream_timeout_s is the longest
    # generation the picker follows (with failureMode FailOpen the gateway carries on
    # without it; with FailClose the request is cut there).
    request_timeout_s: float = 30.0
    stream_timeout_s: float = 600.0
    # Traces (router_client.tracing, the `tracing` extra): a span per routed stream,
    # exported over OTLP gRPC to this endpoint (e.g. http://collector:4317); "" = off.
    otlp_endpoint: str = ""

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1 or self.max_inflight_per_destination < 1:
            raise ValueError("max_body_bytes and max_inflight_per_destination must be >= 1")
        if self.fallbacks < 0:
            raise ValueError("fallbacks must be >= 0")
        if self.max_streams < 1 or self.max_buffered_bytes < 1:
            raise ValueError("max_streams and max_buffered_bytes must be >= 1")
        if not (self.request_timeout_s > 0 and self.stream_timeout_s > 0):
            raise ValueError("request_timeout_s and stream_timeout_s must be > 0")


class BodyBudget:
    """Request-body bytes the picker's streams hold at once (one per server; the event loop
    is single-threaded, so a counter suffices)."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, n: int) -> bool:
        if self.held + n > self.limit:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held = max(0, self.held - n)


class Exchange:
    __slots__ = ("_body", "_budget", "_decided_at", "_finished",
                 "_headers_seen", "_injected", "_pick", "_resp_copy", "_span",
                 "_splitter", "_status", "_ttft_s", "_usage", "affinity", "done", "headers",
                 "key", "metrics", "picker", "prefix_chars", "req_mode", "resp_mode",
                 "served_slot", "settings", "sink", "subset", "tracing")

    def __init__(self, picker: EndpointPicker, settings: EppSettings, sink: EventSink,
                 metrics: EppMetrics, budget: BodyBudget | None = None, *,
                 tracing: Tracing | None = None) -> None:
        self.tracing = tracing  # None: off, and nothing below touches OpenTelemetry
        self._span: Span | None = None
        self._budget = budget or BodyBudget(settings.max_buffered_bytes)
        self.picker = picker
        self.settings = settings
        self.sink = sink
        self.metrics = metrics
        self.req_mode: int | None = None
        self.resp_mode = settings.default_response_mode
        self.headers: dict[str, str] = {}
        self.subset: list[str] | None = None
        self.key = ""
        self.affinity: str | None = None
        self.prefix_chars = 0
        self.done = False  # an immediate response was sent: the shell ends the stream
        self.served_slot: int | None = None
        self._body = bytearray()
        self._pick: Pick | None = None
        self._decided_at = 0.0
        self._finished = False
        self._headers_seen = False
        self._injected = False
        self._splitter: sse.SseSplitter | None = None
        self._resp_copy = bytearray()
        self._status = 0
        self._ttft_s: float | None = None
        self._usage: dict[str, Any] | None = None

    # --- the message loop ------------------------------------------------------------

    @property
    def routed(self) -> bool:
        """The request was routed (and is counted in flight until `close`)."""
        return self._pick is not None

    def handle(self, msg: ep.ProcessingRequest) -> list[ep.ProcessingResponse]:
        if self.req_mode is None:
            self._modes(msg)
        kind = msg.WhichOneof("request")
        if kind == "request_headers":
            if self._headers_seen or self._pick is not None:
                # One stream is one request (Envoy never sends its headers twice): a peer
                # that does would open a request per frame and close one at the end.
                return self._refuse(400, "request headers sent twice on one ext_proc stream",
                                    "invalid_request_error")
            self._headers_seen = True
            return self._request_headers(msg)
        if kind == "request_body":
            return self._request_body(msg.request_body)
        if kind == "request_trailers":
            return [proto.passed_trailers(request=True)]
        if kind == "response_headers":
            return self._response_headers(msg)
        if kind == "response_body":
            return self._response_body(msg.response_body)
        if kind == "response_trailers":
            self._finish()
            return [proto.passed_trailers(request=False)]
        return self._refuse(400, "an ext_proc message with no phase", "invalid_request_error")

    def close(self) -> None:
        """The stream ended (normally, or the gateway gave up on the request)."""
        self._release_body()
        self._finish()

    def _release_body(self) -> None:
        self._budget.give(len(self._body))
        self._body.clear()

    # --- request path -------------------------------------------------------------------

    def _modes(self, msg: ep.ProcessingRequest) -> None:
        s = self.settings
        if msg.HasField("protocol_config"):
            self.req_mode = msg.protocol_config.request_body_mode
            self.resp_mode = msg.protocol_config.response_body_mode
        else:
            self.req_mode = s.default_request_mode

    def _request_headers(self, msg: ep.ProcessingRequest) -> list[ep.ProcessingResponse]:
        self.headers = proto.header_map(msg.request_headers)
        self.subset = proto.subset_hint(msg)
        no_body = msg.request_headers.end_of_stream
        mode = self.req_mode
        if no_body or mode in (proto.NONE, proto.STREAMED):
            return self._decide({}, None, body_back=False)
        if mode == proto.FULL_DUPLEX_STREAMED:
            return []  # the answer waits for the body
        return [proto.passed_headers(request=True)]  # buffered: the body comes next

    def _request_body(self, body: ep.HttpBody) -> list[ep.ProcessingResponse]:
        if self._pick is not None:  # streamed mode: routed at the headers already
            return [proto.passed_body(request=True)]
        if len(self._body) + len(body.body) > self.settings.max_body_bytes:
            self._release_body()
            return self._refuse(413, f"the request body exceeds "
                                f"{self.settings.max_body_bytes} bytes", "invalid_request_error")
        if not self._budget.take(len(body.body)):
            self._release_body()
            return self._refuse(503, "the endpoint picker holds too many request bodies at "
                                "once; retry", "overloaded")
        self._body += body.body
        full_duplex = self.req_mode == proto.FULL_DUPLEX_STREAMED
        if full_duplex and not body.end_of_stream:
            return []
        raw = bytes(self._body)
        self._release_body()
        payload: Any = {}
        if raw:
            try:
                payload = jsonio.loads(raw)
            except ValueError:
                return self._refuse(400, "the body is not JSON", "invalid_request_error")
            if not isinstance(payload, dict):
                return self._refuse(400, "the body must be a JSON object",
                                    "invalid_request_error")
        return self._decide(payload, raw, body_back=True)

    def _decide(self, payload: dict[str, Any], raw: bytes | None, *,
                body_back: bool) -> list[ep.ProcessingResponse]:
        if self._pick is not None or self._finished:
            # Counted once per stream: a request after this one, or after the response
            # ended (which counted it out), would stay in flight for ever.
            return self._refuse(400, "a second request on one ext_proc stream",
                                "invalid_request_error")
        started = time.perf_counter()
        derived = derive_key(payload, self.headers, self.settings.keys)
        self.key, self.affinity, self.prefix_chars = (derived.key, derived.affinity,
                                                      derived.prefix_chars)
        if raw is not None and self._wants_usage(payload):
            options = payload.get("stream_options")
            payload["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                         "include_usage": True}
            try:
                raw = jsonio.dumps(payload)
            except jsonio.JSONEncodeError:
                return self._refuse(400, "the body is nested too deeply to relay",
                                    "invalid_request_error")
            self._injected = True
        core = self.picker.core
        # What `--queue-aware` weighs (keys.prompt_chars, in characters / 4), as the gateway.
        size, before_last = prompt_chars(payload) if core.queue_aware else (0, 0)
        before = core.counters() if self.tracing is not None else None
        pick = self.picker.pick(self.key, self.affinity, self.subset,
                                prompt_tokens=size // 4, cacheable_tokens=before_last // 4,
                                reusable_tokens=self.prefix_chars // 4)
        if before is not None:
            self._trace_pick(before, pick)
        if pick is None:
            self.metrics.refused.labels("no_endpoint").inc()
            why = ("no endpoint of the gateway's subset is usable" if self.subset is not None
                   else "no usable endpoint below its in-flight limit")
            return self._refuse(503, why, "overloaded", counted=False)
        self._pick, self._decided_at = pick, time.perf_counter()
        primary = pick.slots[0]
        pick.request.started()
        self.sink.emit_request(
            self.key, self.picker.destination(primary), prompt_tokens=0,
            reusable_prefix_tokens=self.prefix_chars // 4,
            inflight=core.inflight[primary], router_id=self.settings.router_id)
        self.metrics.decided(core.mode, self._decided_at - started)
        value = pick.header_value
        if not body_back or raw is None:
            return [proto.picked_headers(value, None)]
        if self.req_mode == proto.FULL_DUPLEX_STREAMED:
            return [proto.picked_headers(value, len(raw)),
                    *proto.streamed_body(raw, request=True)]
        return [proto.picked_body(value, raw, len(raw))]

    def _wants_usage(self, payload: dict[str, Any]) -> bool:
        if not (self.settings.inject_usage and payload.get("stream") is True):
            return False
        if (self.req_mode not in (proto.FULL_DUPLEX_STREAMED, proto.BUFFERED)
                or self.resp_mode != proto.FULL_DUPLEX_STREAMED):
            return False  # we could not drop it from the response again
        options = payload.get("stream_options")
        return not (isinstance(options, dict) and options.get("include_usage"))

    def _refuse(self, status: int, message: str, kind: str, *,
                counted: bool = True) -> list[ep.ProcessingResponse]:
        if counted:
            self.metrics.refused.labels(kind).inc()
        self.done = True
        return [proto.refused(status, message, kind)]

    # --- response path ------------------------------------------------------------------

    def _response_headers(self, msg: ep.ProcessingRequest) -> list[ep.ProcessingResponse]:
        headers = proto.header_map(msg.response_headers)
        try:
            self._status = int(headers.get(":status", "0"))
        except ValueError:
            self._status = 0
        served = proto.served_endpoint(msg)
        if served is not None:
            self.served_slot = self.picker.slot_of_endpoint(served)
        if "text/event-stream" in headers.get("content-type", ""):
            # Held back at most 1 MiB: on overflow it goes back in one body chunk, well
            # under the 4 MiB a gRPC peer receives by default.
            self._splitter = sse.SseSplitter(max_event_bytes=EPP_MAX_EVENT_BYTES)
        answer = [proto.passed_headers(request=False)]
        if msg.response_headers.end_of_stream:
            self._finish()
        return answer

    def _response_body(self, body: ep.HttpBody) -> list[ep.ProcessingResponse]:
        if self._ttft_s is None and body.body:
            self._ttft_s = time.perf_counter() - self._decided_at
            if self._splitter is not None and self._pick is not None and not self._finished:
                # A stream's first chunk: the request no longer waits for its prefill.
                self._pick.request.first_token()
        data = self._observe(body.body)
        if body.end_of_stream:
            if self._injected and self._splitter is not None:
                data += self._splitter.pending  # an unterminated last event, as it came
            self._finish()
        if self.resp_mode == proto.FULL_DUPLEX_STREAMED:
            return [proto.body_chunk(data, end=body.end_of_stream, request=False)]
        return [proto.passed_body(request=False)]

    def _observe(self, chunk: bytes) -> bytes:
        """Find usage in what the engine sends; return what the client should get."""
        splitter = self._splitter
        if splitter is None:
            if len(self._resp_copy) < USAGE_SCAN_BYTES:
                self._resp_copy += chunk
            return chunk
        try:
            events = splitter.feed(chunk)
        except sse.EventTooLarge:
            # An event without an end: stop looking inside this response (its usage is
            # lost) and pass on what was held back, as it came.
            self._splitter = None
            return splitter.pending if self._injected else chunk
        if not self._injected:
            for event in events:
                info = sse.inspect(event)
                if info.usage is not None:
                    self._usage = info.usage
            return chunk
        kept: list[bytes] = []
        for event in events:
            info = sse.inspect(event)
            if info.usage is not None:
                self._usage = info.usage
                stripped = sse.without_usage(info)
                if stripped is not None:
                    kept.append(stripped)
                continue
            kept.append(event)
        return b"".join(kept)

    # --- tracing (only with tracing on) -------------------------------------------------

    def _trace_pick(self, before: dict[str, int], pick: Pick | None) -> None:
        """The stream's span, continuing the request's `traceparent`, with the pick's
        stages: the core's mode, the counters the decision moved
        (router_client.tracing.decision_stages), the endpoints named, in order."""
        from router_client.tracing import decision_stages

        assert self.tracing is not None
        core = self.picker.core
        span = self._span = self.tracing.request_span("ext_proc pick",
                                                      self.headers.get("traceparent"))
        span.set_attribute("cacheroute.key", self.key)
        if self.affinity is not None:
            span.set_attribute("cacheroute.affinity", self.affinity)
        span.set_attribute("cacheroute.mode", core.mode)
        span.set_attribute("cacheroute.decision", decision_stages(before, core.counters()))
        span.set_attribute("cacheroute.plan_version", str(self.picker.client.version))
        if self.subset is not None:
            span.set_attribute("cacheroute.subset", self.subset)
        if pick is not None:
            span.set_attribute("cacheroute.slot", pick.slots[0])
            span.set_attribute("cacheroute.destination", self.picker.destination(pick.slots[0]))
            span.set_attribute("cacheroute.endpoints", list(pick.endpoints))

    def _trace_end(self) -> None:
        from router_client.tracing import end

        span, self._span = self._span, None
        if span is None:
            return
        if self.served_slot is not None:
            span.set_attribute("cacheroute.served", self.picker.destination(self.served_slot))
        if self._ttft_s is not None:
            span.set_attribute("cacheroute.ttft_ms", self._ttft_s * 1000)
        end(span, (self._status or None) if self._pick is not None else 503,
            "" if self._pick is not None else "no_endpoint")

    def _finish(self) -> None:
        if self._span is not None:
            self._trace_end()
        if self._finished or self._pick is None:
            self._finished = True
            return
        self._finished = True
        slot = self.served_slot if self.served_slot is not None else self._pick.slots[0]
        status = self._status
        outcome = (None if status == 0 else Outcome.SUCCESS if status < 400
                   else Outcome.CLIENT_ERROR if status < 500 else Outcome.HTTP_5XX)
        self._pick.request.finished(time.monotonic())
        dest = self.picker.destination(slot)
        if outcome is not None:
            self.picker.client.report(dest, outcome)
        usage = self._usage
        if usage is None and self._resp_copy and b'"usage"' in self._resp_copy:
            try:
                parsed = jsonio.loads(bytes(self._resp_copy))
                usage = parsed.get("usage") if isinstance(parsed, dict) else None
            except ValueError:
                usage = None
        e2e_ms = (time.perf_counter() - self._decided_at) * 1000
        if isinstance(usage, dict) and outcome is Outcome.SUCCESS:
            counts = from_openai_usage(usage)
            self._pick.request.served(counts.cached_tokens, at=slot)
            ttft_ms = self._ttft_s * 1000 if self._ttft_s is not None else e2e_ms
            self.sink.emit_cache_hit(
                self.key, dest, prompt_tokens=counts.prompt_tokens,
                cached_tokens=counts.cached_tokens, output_tokens=counts.output_tokens,
                ttft_ms=ttft_ms, e2e_ms=e2e_ms)
            self.metrics.usage_seen.inc()
        elif outcome is not None and outcome is not Outcome.SUCCESS:
            self.sink.emit_error(self.key, dest, kind=outcome.value, status_code=status,
                                 router_id=self.settings.router_id)
        self.metrics.completed.labels(
            "unknown" if status == 0 else f"{status // 100}xx").inc()
