"""One request through the gateway: key, route, forward, relay, report.

    read the body (bounded) ─ derive the key (router_client.keys) ─ pick a destination
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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from router_client.aio import AsyncRouterClient
from router_client.gateway import headers as hdr
from router_client.gateway import sse
from router_client.gateway.metrics import GatewayMetrics
from router_client.gateway.settings import GatewaySettings
from router_client.gateway.telemetry import EventSink
from router_client.gateway.upstream import Passthrough, UpstreamFailure, Upstreams
from router_client.health import Outcome
from router_client.keys import derive_key
from router_client.usage import from_openai_usage

log = logging.getLogger("cacheroute.gateway")
DESTINATION_HEADER = "x-cacheroute-destination"
ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


def error_response(status: int, message: str, kind: str, *,
                   extra: Sequence[tuple[str, str]] = ()) -> web.Response:
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}})
    resp = web.Response(status=status, text=body, content_type="application/json")
    for name, value in extra:
        resp.headers[name] = value
    return resp


@dataclass(slots=True)
class _Call:
    """What one request carries between the steps."""

    route: str
    key: str
    prefix_chars: int
    body: bytes
    stream: bool
    injected_usage: bool  # the gateway asked for stream usage, the client did not
    request_id: str
    headers: list[tuple[str, str]]
    started: float


class Proxy:
    def __init__(self, client: AsyncRouterClient, upstreams: Upstreams,
                 settings: GatewaySettings, sink: EventSink, metrics: GatewayMetrics) -> None:
        self.client = client
        self.core = client.core
        self.upstreams = upstreams
        self.settings = settings
        self.sink = sink
        self.metrics = metrics

    # --- the routed endpoints ----------------------------------------------------------

    async def routed(self, request: web.Request) -> web.StreamResponse:
        route = ROUTES.get(request.path, "other")
        started = time.perf_counter()
        call_or_error = await self._parse(request, route, started)
        if isinstance(call_or_error, web.Response):
            self.metrics.answered(route, call_or_error.status, time.perf_counter() - started)
            return call_or_error
        resp = await self._dispatch(request, call_or_error)
        self.metrics.answered(route, resp.status, time.perf_counter() - started)
        return resp

    async def _parse(self, request: web.Request, route: str,
                     started: float) -> _Call | web.Response:
        if request.content_length is not None and (
                request.content_length > self.settings.max_body_bytes):
            return error_response(413, "request body too large", "invalid_request_error")
        try:
            body = await request.content.read(self.settings.max_body_bytes + 1)
        except (aiohttp.ClientError, ConnectionError) as exc:
            return error_response(400, f"could not read the body: {exc}", "invalid_request_error")
        if len(body) > self.settings.max_body_bytes:
            return error_response(413, "request body too large", "invalid_request_error")
        payload: Any = None
        if body:
            try:
                payload = json.loads(body)
            except ValueError:
                return error_response(400, "the body is not JSON", "invalid_request_error")
        if not isinstance(payload, dict):
            payload = {} if route == "other" else None
        if payload is None:
            return error_response(400, "the body must be a JSON object", "invalid_request_error")
        derived = derive_key(payload, request.headers, self.settings.keys)
        stream = payload.get("stream") is True
        injected = False
        if stream:
            options = payload.get("stream_options")
            if not (isinstance(options, dict) and options.get("include_usage")):
                payload["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                             "include_usage": True}
                body = json.dumps(payload, separators=(",", ":")).encode()
                injected = True
        rid = hdr.request_id(request.headers)
        out_headers = [
            (k, v) for k, v in hdr.forwarded(request.headers.items())
            if k.lower() not in (hdr.REQUEST_ID, hdr.TRACEPARENT, "content-type")
        ]
        out_headers += [
            (hdr.REQUEST_ID, rid),
            (hdr.TRACEPARENT, hdr.child_traceparent(request.headers.get(hdr.TRACEPARENT))),
        ]
        if body:
            out_headers.append(("Content-Type", "application/json"))
        return _Call(route, derived.key, derived.prefix_chars, body, stream, injected, rid,
                     out_headers, started)

    async def _dispatch(self, request: web.Request, call: _Call) -> web.StreamResponse:
        tried: list[int] = []
        core = self.core
        for attempt in range(self.settings.max_retries + 1):
            slot = self._pick(call.key, tried)
            if slot is None:
                if not tried:
                    self.metrics.saturated.inc()
                    return error_response(
                        503, "every destination is at its in-flight limit", "overloaded",
                        extra=[("retry-after", "1"), (hdr.REQUEST_ID, call.request_id)])
                break
            dest = core.destination_ids[slot]
            address = self.client.address_of(dest)
            core.started(slot)
            self.sink.emit_request(
                call.key, dest, prompt_tokens=0, reusable_prefix_tokens=call.prefix_chars // 4,
                inflight=core.inflight[slot], router_id=self.settings.router_id)
            try:
                if not address:
                    raise UpstreamFailure(Outcome.CONNECT_ERROR, retryable=True, status=502,
                                          message=f"no address known for {dest}")
                upstream = await self.upstreams.send(
                    request.method, address.rstrip("/") + request.path_qs, call.headers,
                    call.body)
            except UpstreamFailure as failure:
                core.finished(slot)
                tried.append(slot)
                self._failed(call, dest, failure)
                if failure.retryable and attempt < self.settings.max_retries:
                    self.metrics.retries.labels(failure.kind).inc()
                    continue
                return self._give_up(call, failure)
            try:
                return await self._relay(request, call, dest, upstream)
            finally:
                core.finished(slot)
        return error_response(502, "no destination could take the request", "upstream_error",
                              extra=[(hdr.REQUEST_ID, call.request_id)])

    def _pick(self, key: str, tried: list[int]) -> int | None:
        core, cap = self.core, self.settings.max_inflight_per_destination
        if not tried:
            slot = core.route_index(key)
            if core.inflight[slot] < cap:
                return slot
        inflight = core.inflight
        full = {s for s, n in enumerate(inflight) if n >= cap}
        return core.route_avoiding(key, full.union(tried))

    # --- outcomes -------------------------------------------------------------------------

    def _failed(self, call: _Call, dest: str, failure: UpstreamFailure) -> None:
        log.info("request %s to %s failed: %s", call.request_id, dest, failure)
        self.client.report(dest, failure.outcome)
        self.metrics.failures.labels(failure.kind).inc()
        self.sink.emit_error(call.key, dest, kind=failure.kind, status_code=failure.status,
                             router_id=self.settings.router_id)

    def _give_up(self, call: _Call, failure: UpstreamFailure) -> web.Response:
        extra = [(hdr.REQUEST_ID, call.request_id)]
        if failure.passthrough is not None:
            return self._passthrough(failure.passthrough, extra)
        kind = "timeout" if failure.outcome is Outcome.TIMEOUT else "upstream_error"
        return error_response(failure.status, str(failure), kind, extra=extra)

    @staticmethod
    def _passthrough(p: Passthrough, extra: list[tuple[str, str]]) -> web.Response:
        resp = web.Response(status=p.status, body=p.body)
        for name, value in hdr.forwarded(p.headers):
            resp.headers.add(name, value)
        for name, value in extra:
            resp.headers[name] = value
        return resp

    def _finished(self, call: _Call, dest: str, status: int, usage: Any,
                  ttft_s: float | None) -> None:
        outcome = (Outcome.SUCCESS if status < 400 else
                   Outcome.CLIENT_ERROR if status < 500 else Outcome.HTTP_5XX)
        self.client.report(dest, outcome)
        e2e_ms = (time.perf_counter() - call.started) * 1000
        if isinstance(usage, dict):
            counts = from_openai_usage(usage)
            self.sink.emit_cache_hit(
                call.key, dest, prompt_tokens=counts.prompt_tokens,
                cached_tokens=counts.cached_tokens, output_tokens=counts.output_tokens,
                ttft_ms=(ttft_s * 1000 if ttft_s is not None else e2e_ms), e2e_ms=e2e_ms)
        elif outcome is not Outcome.SUCCESS:
            self.sink.emit_error(call.key, dest, kind=outcome.value, status_code=status,
                                 router_id=self.settings.router_id)

    # --- relaying ---------------------------------------------------------------------------

    def _response_headers(self, upstream: aiohttp.ClientResponse, call: _Call,
                          dest: str) -> list[tuple[str, str]]:
        out = [(k, v) for k, v in hdr.forwarded(upstream.headers.items())
               if k.lower() != hdr.REQUEST_ID]
        out.append((hdr.REQUEST_ID, call.request_id))
        if self.settings.expose_destination:
            out.append((DESTINATION_HEADER, dest))
        return out

    async def _relay(self, request: web.Request, call: _Call, dest: str,
                     upstream: aiohttp.ClientResponse) -> web.StreamResponse:
        event_stream = upstream.content_type == "text/event-stream"
        if event_stream and upstream.status < 300:
            return await self._relay_stream(request, call, dest, upstream)
        try:
            async with asyncio.timeout(self.settings.idle_timeout_s):
                data = await upstream.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            failure = UpstreamFailure(
                Outcome.TIMEOUT if isinstance(exc, TimeoutError) else Outcome.RESET,
                retryable=False, status=502, message=f"response body cut short: {exc!r}")
            self._failed(call, dest, failure)
            return self._give_up(call, failure)
        finally:
            upstream.release()
        usage = None
        if upstream.status < 300 and call.route != "other" and b'"usage"' in data:
            try:
                parsed = json.loads(data)
                usage = parsed.get("usage") if isinstance(parsed, dict) else None
            except ValueError:
                usage = None
        self._finished(call, dest, upstream.status, usage, None)
        resp = web.Response(status=upstream.status, body=data)
        for name, value in self._response_headers(upstream, call, dest):
            resp.headers.add(name, value)
        return resp

    async def _relay_stream(self, request: web.Request, call: _Call, dest: str,
                            upstream: aiohttp.ClientResponse) -> web.StreamResponse:
        out = web.StreamResponse(status=upstream.status)
        for name, value in self._response_headers(upstream, call, dest):
            out.headers.add(name, value)
        splitter = sse.SseSplitter()
        done, usage, first = False, None, None
        idle = self.settings.idle_timeout_s
        try:
            await out.prepare(request)
            while True:
                async with asyncio.timeout(idle):
                    chunk = await upstream.content.readany()
                if not chunk:
                    break
                events = splitter.feed(chunk)
                if not events:
                    continue
                if first is None:
                    first = time.perf_counter() - call.started
                    self.metrics.ttft.observe(first)
                kept = []
                for event in events:
                    info = sse.inspect(event)
                    done = done or info.done
                    if info.usage is not None:
                        usage = info.usage
                        if call.injected_usage:
                            stripped = sse.without_usage(info)
                            if stripped is not None:
                                kept.append(stripped)
                            continue
                    kept.append(event)
                if kept:
                    await out.write(b"".join(kept))
        except (ConnectionResetError, asyncio.CancelledError):
            # The client went away: stop reading, so the engine sees the disconnect and
            # stops generating. Not the destination's fault.
            upstream.close()
            raise
        except (TimeoutError, aiohttp.ClientError) as exc:
            upstream.close()
            return await self._break(request, out, call, dest, exc)
        finally:
            upstream.release()
        if not done:
            return await self._break(request, out, call, dest, None)
        self._finished(call, dest, upstream.status, usage, first)
        await out.write_eof()
        return out

    async def _break(self, request: web.Request, out: web.StreamResponse, call: _Call,
                     dest: str, exc: BaseException | None) -> web.StreamResponse:
        """The upstream failed mid-stream: the client must see a broken stream, never a
        clean end. An error event first (the SDKs raise on it), then the connection is
        cut without the final chunk (so any HTTP client sees the body as incomplete)."""
        outcome = Outcome.TIMEOUT if isinstance(exc, TimeoutError) else Outcome.RESET
        why = "stalled" if outcome is Outcome.TIMEOUT else "ended before [DONE]"
        failure = UpstreamFailure(outcome, retryable=False, status=502,
                                  message=f"upstream stream {why}: {exc!r}")
        self._failed(call, dest, failure)
        self.metrics.broken.inc()
        if out.prepared:
            with contextlib.suppress(ConnectionError):
                await out.write(sse.error_event(str(failure), 502))
            if request.transport is not None:
                request.transport.abort()
        return out
