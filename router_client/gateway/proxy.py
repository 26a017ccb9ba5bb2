"""One request through the gateway: key, route, forward, relay, report.

    read the body (bounded) ─ derive the key (router_client.keys) and its pool
      (router_client.pools; a model no pool claims: 404) ─ pick a destination
      (plan or P2C, below its in-flight cap) ─ send ─┬─ failure that generated nothing:
                                                     │  report it, try another destination
                                                     └─ response: relay it (whole, or SSE
                                                        event by event), report the outcome,
                                                        emit usage

Every exit path reports the destination's outcome to the router client (outlier
detection), emits exactly one usage or error event after the request event, counts the
request out of flight once, and answers the client with the upstream's status, headers
and body — or, when the gateway itself gives up, an OpenAI-style JSON error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from router_client.aio import AsyncRouterClient
from router_client.gateway import headers as hdr
from router_client.gateway import jsonio, sse
from router_client.gateway.http11 import ClientGone, Request, Responder, UpstreamError
from router_client.gateway.http11 import UpstreamResponse as Upstream
from router_client.gateway.metrics import GatewayMetrics
from router_client.gateway.settings import GatewaySettings
from router_client.gateway.telemetry import EventSink
from router_client.gateway.upstream import Passthrough, UpstreamFailure, Upstreams
from router_client.health import Outcome
from router_client.keys import derive_key, prompt_chars
from router_client.lifecycle import AtCap
from router_client.lifecycle import Request as Routed
from router_client.pools import PoolRoutes
from router_client.usage import from_openai_usage

if TYPE_CHECKING:  # tracing is optional: its module (and OpenTelemetry) load only when on
    from router_client.tracing import Span, Tracing

log = logging.getLogger("cacheroute.gateway")
DESTINATION_HEADER = "x-cacheroute-destination"
ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
JSON = ("Content-Type", "application/json")


def send_error(out: Responder, status: int, message: str, kind: str, *,
               extra: Sequence[tuple[str, str]] = ()) -> None:
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    out.send(status, [JSON, *extra], body)


@dataclass(slots=True)
class _Call:
    """What one request carries between the steps."""

    route: str
    client: AsyncRouterClient  # the router client of the request's pool
    key: str
    affinity: str | None
    prefix_chars: int
    # The prompt's size and the part of it before the last message, in the gateway's
    # tokens (characters / 4): what `--queue-aware` weighs (keys.prompt_chars).
    prompt_tokens: int
    cacheable_tokens: int
    body: bytes
    stream: bool
    injected_usage: bool  # the gateway asked for stream usage, the client did not
    request_id: str
    headers: list[tuple[str, str]]
    started: float
    # Its way through the router core (route, first token, end, retries elsewhere).
    lifecycle: Routed | None = None
    span: Span | None = None  # its request span, with tracing on (router_client.tracing)

    @property
    def slot(self) -> int:
        return self.lifecycle.slot if self.lifecycle is not None else -1


def _end_engine(span: Span, status: int | None, error: str) -> None:
    from router_client.tracing import end

    end(span, status, error)


class Proxy:
    def __init__(self, clients: Mapping[str, AsyncRouterClient], routes: PoolRoutes,
                 upstreams: Upstreams, settings: GatewaySettings, sink: EventSink,
                 metrics: GatewayMetrics, tracing: Tracing | None = None) -> None:
        self.tracing = tracing  # None: off, and nothing below touches OpenTelemetry
        self.clients = clients  # pool -> its router client (router_client.pools)
        self.routes = routes
        self.upstreams = upstreams
        self.settings = settings
        self.sink = sink
        self.metrics = metrics

    # --- the routed endpoints ----------------------------------------------------------

    async def routed(self, request: Request, out: Responder) -> None:
        route = ROUTES.get(request.path, "other")
        started = time.perf_counter()
        if self.tracing is not None:
            await self._routed_traced(request, route, started, out, self.tracing)
            return
        call = self._parse(request, route, started, out)
        if call is not None:
            await self._dispatch(request, call, out)
        self.metrics.answered(route, out.status, time.perf_counter() - started)

    async def _routed_traced(self, request: Request, route: str, started: float,
                             out: Responder, tracing: Tracing) -> None:
        """`routed`, inside a request span that continues the client's trace context."""
        from router_client.tracing import end

        given = next((v for k, v in request.headers if k.lower() == hdr.TRACEPARENT), None)
        span = tracing.request_span(f"{request.method} {request.path}", given)
        span.set_attribute("http.request.method", request.method)
        span.set_attribute("url.path", request.path)
        span.set_attribute("cacheroute.route", route)
        error = ""
        try:
            call = self._parse(request, route, started, out)
            if call is not None:
                call.span = span
                span.set_attribute("cacheroute.key", call.key)
                span.set_attribute("cacheroute.request_id", call.request_id)
                if call.affinity is not None:
                    span.set_attribute("cacheroute.affinity", call.affinity)
                span.set_attribute("cacheroute.stream", call.stream)
                await self._dispatch(request, call, out)
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            end(span, out.status or None, error)
        self.metrics.answered(route, out.status, time.perf_counter() - started)

    def _parse(self, request: Request, route: str, started: float,
               out: Responder) -> _Call | None:
        body = request.body
        payload: Any = None
        if body:
            try:
                payload = jsonio.loads(body)
            except ValueError:
                send_error(out, 400, "the body is not JSON", "invalid_request_error")
                return None
        if not isinstance(payload, dict):
            if route != "other":
                send_error(out, 400, "the body must be a JSON object", "invalid_request_error")
                return None
            payload = {}
        headers = request.headers
        index = {k.lower(): v for k, v in headers}
        derived = derive_key(payload, index, self.settings.keys)
        pool = self.routes.pool_of_key(derived.key)
        client = self.clients.get(pool) if pool is not None else None
        if client is None:
            model = payload.get("model")
            why = ("no pool claims it" if pool is None
                   else f"its pool {pool!r} is served by other gateways")
            send_error(out, 404, f"model {model!r} is not served here: {why}",
                       "model_not_found")
            return None
        stream = payload.get("stream") is True
        injected = False
        if stream:
            options = payload.get("stream_options")
            if not (isinstance(options, dict) and options.get("include_usage")):
                payload["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                             "include_usage": True}
                try:
                    body = jsonio.dumps(payload)
                except jsonio.JSONEncodeError:
                    send_error(out, 400, "the body is nested too deeply to relay",
                               "invalid_request_error")
                    return None
                injected = True
        rid = hdr.request_id(index)
        out_headers = [(k, v) for k, v in hdr.forwarded(headers)
                       if k.lower() not in (hdr.REQUEST_ID, hdr.TRACEPARENT, "content-type")]
        out_headers.append((hdr.REQUEST_ID, rid))
        out_headers.append((hdr.TRACEPARENT, hdr.child_traceparent(index.get(hdr.TRACEPARENT))))
        if body:
            out_headers.append(JSON)
        size, before_last = prompt_chars(payload) if client.core.queue_aware else (0, 0)
        return _Call(route, client, derived.key, derived.affinity, derived.prefix_chars,
                     size // 4, before_last // 4, body, stream, injected, rid, out_headers,
                     started)

    async def _dispatch(self, request: Request, call: _Call, out: Responder) -> None:
        core = call.client.core
        routed = call.lifecycle = Routed(core, call.key, call.affinity,
                                         prompt_tokens=call.prompt_tokens,
                                         cacheable_tokens=call.cacheable_tokens,
                                         reusable_tokens=call.prefix_chars // 4)
        full = AtCap(core.inflight, self.settings.max_inflight_per_destination)
        span = call.span
        for attempt in range(self.settings.max_retries + 1):
            before = core.counters() if span is not None else None
            # Idle re-homing needs a clock; the core has none of its own.
            slot = routed.route(time.monotonic(), full) if attempt == 0 else routed.retry(full)
            if span is not None and before is not None:
                self._trace_decision(span, call, before, attempt, slot)
            if slot is None:
                if attempt == 0:
                    self.metrics.saturated.inc()
                    send_error(out, 503, "every destination is at its in-flight limit",
                               "overloaded", extra=[("retry-after", "1"),
                                                    (hdr.REQUEST_ID, call.request_id)])
                    return
                break
            dest = core.destination_ids[slot]
            address = call.client.address_of(dest)
            routed.started()
            self.sink.emit_request(
                call.key, dest, prompt_tokens=0, reusable_prefix_tokens=call.prefix_chars // 4,
                inflight=core.inflight[slot], router_id=self.settings.router_id)
            headers, engine = call.headers, None
            if span is not None:
                engine, headers = self._trace_engine(span, call, attempt, dest, address)
            try:
                if not address:
                    raise UpstreamFailure(Outcome.CONNECT_ERROR, retryable=True, status=502,
                                          message=f"no address known for {dest}")
                upstream = await self.upstreams.send(request.method, address, request.target,
                                                     headers, call.body)
            except UpstreamFailure as failure:
                if engine is not None:
                    _end_engine(engine, failure.status, failure.kind)
                routed.failed(time.monotonic())
                self._failed(call, dest, failure)
                if failure.retryable and attempt < self.settings.max_retries:
                    self.metrics.retries.labels(failure.kind).inc()
                    continue
                self._give_up(out, call, failure)
                return
            except BaseException as exc:
                if engine is not None:
                    _end_engine(engine, None, type(exc).__name__)
                routed.finished(time.monotonic())
                raise
            try:
                await self._relay(call, dest, upstream, out)
            finally:
                routed.finished(time.monotonic())
                if engine is not None:
                    _end_engine(engine, upstream.status, "")
            return
        send_error(out, 502, "no destination could take the request", "upstream_error",
                   extra=[(hdr.REQUEST_ID, call.request_id)])

    # --- tracing (only with tracing on: call.span is set) ----------------------------------

    def _trace_decision(self, span: Span, call: _Call, before: Mapping[str, int],
                        attempt: int, slot: int | None) -> None:
        """The decision's stages on the request span: the core's mode, the counters this
        decision moved (`planned`, `fallback`, `queue_spilled`, `history_kept`, `rehomed`,
        ...; router_client.tracing.decision_stages) and where it went. A retry's own
        stages go on `cacheroute.retry_decision`."""
        from router_client.tracing import decision_stages

        core = call.client.core
        stages = decision_stages(before, core.counters())
        if attempt == 0:
            span.set_attribute("cacheroute.mode", core.mode)
            span.set_attribute("cacheroute.decision", stages)
            span.set_attribute("cacheroute.plan_version", str(call.client.version))
        else:
            span.set_attribute("cacheroute.retry_decision", stages)
        span.set_attribute("cacheroute.attempts", attempt + 1)
        span.set_attribute("cacheroute.slot", -1 if slot is None else slot)
        if slot is not None:
            span.set_attribute("cacheroute.destination", core.destination_ids[slot])

    def _trace_engine(self, span: Span, call: _Call, attempt: int, dest: str,
                      address: str | None) -> tuple[Span, list[tuple[str, str]]]:
        """A client span for this attempt's engine call, and the request headers whose
        `traceparent` names it (the engine's spans become its children)."""
        assert self.tracing is not None
        engine, parent = self.tracing.engine_span(span, "engine")
        engine.set_attribute("cacheroute.attempt", attempt)
        engine.set_attribute("cacheroute.destination", dest)
        if address:
            engine.set_attribute("server.address", address)
        headers = [(k, parent if k == hdr.TRACEPARENT else v) for k, v in call.headers]
        return engine, headers

    # --- outcomes -------------------------------------------------------------------------

    def _failed(self, call: _Call, dest: str, failure: UpstreamFailure) -> None:
        log.info("request %s to %s failed: %s", call.request_id, dest, failure)
        if failure.local:  # the gateway's own limits (file descriptors): not the engine's
            self.metrics.failures.labels("local").inc()
            return
        call.client.report(dest, failure.outcome)
        self.metrics.failures.labels(failure.kind).inc()
        self.sink.emit_error(call.key, dest, kind=failure.kind, status_code=failure.status,
                             router_id=self.settings.router_id)

    def _give_up(self, out: Responder, call: _Call, failure: UpstreamFailure) -> None:
        extra = [(hdr.REQUEST_ID, call.request_id)]
        if failure.passthrough is not None:
            p: Passthrough = failure.passthrough
            out.send(p.status, [*hdr.forwarded(p.headers), *extra], p.body)
            return
        kind = "timeout" if failure.outcome is Outcome.TIMEOUT else "upstream_error"
        send_error(out, failure.status, str(failure), kind, extra=extra)

    def _finished(self, call: _Call, dest: str, status: int, usage: Any,
                  ttft_s: float | None) -> None:
        outcome = (Outcome.SUCCESS if status < 400 else
                   Outcome.CLIENT_ERROR if status < 500 else Outcome.HTTP_5XX)
        call.client.report(dest, outcome)
        e2e_ms = (time.perf_counter() - call.started) * 1000
        if isinstance(usage, dict):
            counts = from_openai_usage(usage)
            if outcome is Outcome.SUCCESS and call.lifecycle is not None:
                call.lifecycle.served(counts.cached_tokens)
            self.sink.emit_cache_hit(
                call.key, dest, prompt_tokens=counts.prompt_tokens,
                cached_tokens=counts.cached_tokens, output_tokens=counts.output_tokens,
                ttft_ms=(ttft_s * 1000 if ttft_s is not None else e2e_ms), e2e_ms=e2e_ms)
        elif outcome is not Outcome.SUCCESS:
            self.sink.emit_error(call.key, dest, kind=outcome.value, status_code=status,
                                 router_id=self.settings.router_id)

    # --- relaying ---------------------------------------------------------------------------

    def _response_headers(self, upstream: Upstream, call: _Call,
                          dest: str) -> list[tuple[str, str]]:
        out = [(k, v) for k, v in hdr.forwarded(upstream.headers)
               if k.lower() != hdr.REQUEST_ID]
        out.append((hdr.REQUEST_ID, call.request_id))
        if self.settings.expose_destination:
            out.append((DESTINATION_HEADER, dest))
        return out

    async def _relay(self, call: _Call, dest: str, upstream: Upstream, out: Responder) -> None:
        """Relay the response; a streamed one tells the core when its first event arrives
        (`Request.first_token`): the request no longer waits for a prefill
        (`RouterCore.first_token`, `--balance first-token`)."""
        if upstream.status < 300 and upstream.content_type == "text/event-stream":
            await self._relay_stream(call, dest, upstream, out)
            return
        try:
            data = await self._read_all(upstream)
        except UpstreamError as exc:
            upstream.close()
            outcome = Outcome.TIMEOUT if exc.timeout else Outcome.RESET
            failure = UpstreamFailure(outcome, retryable=False, status=502,
                                      message=f"response body cut short: {exc}")
            self._failed(call, dest, failure)
            self._give_up(out, call, failure)
            return
        except BaseException:
            upstream.close()
            raise
        upstream.release()
        usage = None
        if upstream.status < 300 and call.route != "other" and b'"usage"' in data:
            try:
                parsed = jsonio.loads(data)
                usage = parsed.get("usage") if isinstance(parsed, dict) else None
            except ValueError:
                usage = None
        self._finished(call, dest, upstream.status, usage, None)
        out.send(upstream.status, self._response_headers(upstream, call, dest), data)

    async def _read_all(self, upstream: Upstream) -> bytes:
        if upstream.complete:
            return await upstream.read()
        try:
            async with asyncio.timeout(self.settings.idle_timeout_s):
                return await upstream.read()
        except TimeoutError:
            raise UpstreamError("the response body stalled", sent=True, timeout=True) from None

    async def _relay_stream(self, call: _Call, dest: str, upstream: Upstream,
                            out: Responder) -> None:
        splitter = sse.SseSplitter()
        done, usage, first = False, None, None
        idle = self.settings.idle_timeout_s
        out.start(upstream.status, self._response_headers(upstream, call, dest))
        try:
            while not done:
                async with asyncio.timeout(idle):
                    chunk = await upstream.read_chunk()
                if not chunk:
                    break
                events = splitter.feed(chunk)
                if not events:
                    # read_chunk does not suspend while chunks are buffered: an upstream
                    # streaming one endless event would otherwise hold the loop
                    await asyncio.sleep(0)
                    continue
                if first is None:
                    first = time.perf_counter() - call.started
                    self.metrics.ttft.observe(first)
                    if call.lifecycle is not None:
                        call.lifecycle.first_token()
                kept = []
                for event in events:
                    info = sse.inspect(event)
                    if info.usage is not None:
                        usage = info.usage
                        if call.injected_usage:
                            stripped = sse.without_usage(info)
                            if stripped is not None:
                                kept.append(stripped)
                            continue
                    kept.append(event)
                    if info.done:
                        done = True
                        break  # nothing after [DONE] is part of the answer
                if done:
                    # [DONE] ends the answer: count it before the last write, since the
                    # SDKs hang up as soon as they read it, often before the engine has
                    # closed its side of the stream.
                    self._finished(call, dest, upstream.status, usage, first)
                if kept:
                    # A client that stopped reading is cut after the idle timeout
                    # (ServerLimits.write_timeout_s): ClientGone.
                    await out.write(b"".join(kept))
        except (ClientGone, asyncio.CancelledError):
            # The client went away: drop the upstream connection, so the engine sees the
            # disconnect and stops generating. Not the destination's fault.
            upstream.close()
            raise
        except (TimeoutError, UpstreamError, sse.EventTooLarge) as exc:
            upstream.close()
            await self._break(out, call, dest, exc)
            return
        if not done:
            upstream.release()
            await self._break(out, call, dest, None)
            return
        out.end()  # the client's answer is whole: it need not wait for the engine's close
        await self._drain(upstream)

    async def _drain(self, upstream: Upstream) -> None:
        """Read what an engine sends after [DONE] (normally just the end of the body), so
        its connection can be reused; one that stays open past the idle timeout is closed."""
        try:
            async with asyncio.timeout(self.settings.idle_timeout_s):
                while await upstream.read_chunk():
                    pass
        except (TimeoutError, UpstreamError):
            upstream.close()
            return
        except asyncio.CancelledError:
            upstream.close()
            raise
        upstream.release()

    async def _break(self, out: Responder, call: _Call, dest: str,
                     exc: BaseException | None) -> None:
        """The upstream failed mid-stream: the client must see a broken stream, never a
        clean end. An error event first (the SDKs raise on it), then the connection is
        cut without the final chunk (so any HTTP client sees the body as incomplete)."""
        stalled = isinstance(exc, TimeoutError) or getattr(exc, "timeout", False)
        outcome = Outcome.TIMEOUT if stalled else Outcome.RESET
        why = "stalled" if stalled else "ended before [DONE]"
        failure = UpstreamFailure(outcome, retryable=False, status=502,
                                  message=f"upstream stream {why}: {exc or 'EOF'}")
        self._failed(call, dest, failure)
        self.metrics.broken.inc()
        with contextlib.suppress(ClientGone):  # incl. a client not reading (write timeout)
            await out.write(sse.error_event(str(failure), 502))
        out.abort()
