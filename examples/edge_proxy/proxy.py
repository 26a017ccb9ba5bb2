"""An OpenAI-compatible HTTP proxy that routes each request with the router client.

    POST /v1/chat/completions, /v1/completions   routed and forwarded to a backend
    GET  /metrics                                 the router's Prometheus metrics
    GET  /healthz                                 200 with the plan version and mode

The routing key comes from the `X-Routing-Key` header, else the body's `user`
field; it is prefixed with the model (and suffixed with `cache_salt` when given),
since an engine never shares a prefix cache across those (design notes §5).
The proxy counts each request in flight on its destination while it runs, marks
a destination down when it cannot be reached (and retries once elsewhere), and a
health thread marks it up again when its `/v1/models` answers. From each
response's `usage` it emits a request event and a cache-hit event
(`prompt_tokens_details.cached_tokens`) to a pluggable sink: `EventEmitter`
(Kafka) in production, anything with the same two methods in tests, or nothing.

Standard library only (http.server + http.client); non-streaming and streaming
(SSE) responses are both passed through; for streams, usage is read from the
final chunk when the client asked for it (`stream_options.include_usage`).
"""

from __future__ import annotations

import functools
import http.client
import json
import logging
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import urlsplit

from router_client.client_base import BaseRouterClient
from router_client.usage import from_openai_usage

log = logging.getLogger("edge_proxy")
ROUTED_PATHS = ("/v1/chat/completions", "/v1/completions")
MAX_BODY_BYTES = 8 << 20


class EventSink(Protocol):
    """What the proxy emits to: `streams.emitter.EventEmitter` has exactly these."""

    def emit_request(
        self,
        routing_key: str,
        destination: str,
        *,
        prompt_tokens: int,
        reusable_prefix_tokens: int = 0,
        inflight: int | None = None,
        router_id: str = "",
        timestamp_ms: int | None = None,
    ) -> bool: ...

    def emit_cache_hit(
        self,
        routing_key: str,
        destination: str,
        *,
        prompt_tokens: int,
        cached_tokens: int,
        output_tokens: int = 0,
        queue_depth: int | None = None,
        ttft_ms: float = 0.0,
        e2e_ms: float = 0.0,
        timestamp_ms: int | None = None,
    ) -> bool: ...


def routing_key(header_key: str | None, body: Mapping[str, Any]) -> str:
    """model / (X-Routing-Key header or user) [# cache_salt]."""
    who = header_key or str(body.get("user") or "")
    key = f"{body.get('model', '')}/{who}"
    salt = body.get("cache_salt")
    return f"{key}#{salt}" if salt else key


class EdgeProxy:
    """Owns the HTTP server; `client` must already be started."""

    def __init__(
        self,
        client: BaseRouterClient,
        backends: Mapping[str, str],
        *,
        sink: EventSink | None = None,
        listen: tuple[str, int] = ("127.0.0.1", 0),
        timeout_s: float = 120.0,
        health_every_s: float = 2.0,
    ) -> None:
        self.client = client
        self.backends = dict(backends)  # destination id -> "http://host:port"
        self.sink = sink
        self.timeout_s = timeout_s
        self.health_every_s = health_every_s
        self.down: set[str] = set()
        self._stop = threading.Event()
        self.server = ThreadingHTTPServer(listen, _handler_for(self))
        self.server.daemon_threads = True
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> EdgeProxy:
        for target in (functools.partial(self.server.serve_forever, 0.05), self._health_loop):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()

    # --- routing and forwarding -------------------------------------------------------

    def base_url(self, destination: str) -> str:
        url = self.backends.get(destination)
        if url:
            return url
        table = self.client.table
        address = table.address_of(destination) if table is not None else ""
        return address if "://" in address else f"http://{address}"

    def mark_down(self, destination: str) -> None:
        self.down.add(destination)
        self.client.mark_down(destination)

    def _health_loop(self) -> None:
        while not self._stop.wait(self.health_every_s):
            for dest in list(self.down):
                if _answers(self.base_url(dest)):
                    self.down.discard(dest)
                    self.client.mark_up(dest)

    def emit(self, key: str, dest: str, usage: Mapping[str, Any] | None, e2e_ms: float) -> None:
        if self.sink is None or not usage:
            return
        counts = from_openai_usage(usage)
        rid = self.client.router_id
        self.sink.emit_request(key, dest, prompt_tokens=counts.prompt_tokens, router_id=rid)
        self.sink.emit_cache_hit(
            key,
            dest,
            prompt_tokens=counts.prompt_tokens,
            cached_tokens=counts.cached_tokens,
            output_tokens=counts.output_tokens,
            e2e_ms=e2e_ms,
        )


def _answers(base_url: str) -> bool:
    try:
        conn = _connect(base_url, 1.0)
        conn.request("GET", "/v1/models")
        ok = conn.getresponse().status < 500
        conn.close()
        return ok
    except OSError:
        return False


def _connect(base_url: str, timeout_s: float) -> http.client.HTTPConnection:
    parts = urlsplit(base_url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.hostname or "127.0.0.1", parts.port, timeout=timeout_s)


def _handler_for(proxy: EdgeProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(_ProxyHandler):
        pass

    Handler.proxy = proxy
    return Handler


class _ProxyHandler(BaseHTTPRequestHandler):
    proxy: EdgeProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        c = self.proxy.client
        if self.path == "/metrics":
            self._reply(200, c.metrics_text().encode(), "text/plain; version=0.0.4")
        elif self.path == "/healthz":
            body = {"version": str(c.version), "mode": c.mode, "plan_age_s": c.plan_age_s}
            self._reply(200, json.dumps(body).encode(), "application/json")
        else:
            self._error(404, "not found")

    def do_POST(self) -> None:
        if self.path not in ROUTED_PATHS:
            return self._error(404, "not found")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return self._error(400, "bad Content-Length")
        if length < 0 or length > MAX_BODY_BYTES:
            return self._error(413, "request body too large")
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return self._error(400, "body is not JSON")
        key = routing_key(self.headers.get("X-Routing-Key"), body)
        for _attempt in range(2):  # one retry elsewhere if the destination is unreachable
            if self._forward(key, raw, body):
                return None
        return self._error(502, "no backend reachable")

    def _forward(self, key: str, raw: bytes, body: Mapping[str, Any]) -> bool:
        proxy, client = self.proxy, self.proxy.client
        t0 = time.monotonic()
        with client.request(key) as dest:
            try:
                conn = _connect(proxy.base_url(dest), proxy.timeout_s)
                conn.request("POST", self.path, raw, {"Content-Type": "application/json"})
                resp = conn.getresponse()
            except OSError as exc:
                log.warning("backend %s unreachable: %s", dest, exc)
                proxy.mark_down(dest)
                return False
            try:
                usage = self._relay(resp, dest, stream=bool(body.get("stream")))
            finally:
                conn.close()
        proxy.emit(key, dest, usage, (time.monotonic() - t0) * 1000)
        return True

    def _relay(self, resp: http.client.HTTPResponse, dest: str, *, stream: bool) -> Any:
        if not stream:
            data = resp.read()
            self._reply(resp.status, data, resp.getheader("Content-Type", "application/json"), dest)
            return _usage_of(data) if resp.status == 200 else None
        self.send_response(resp.status)
        self.send_header("Content-Type", resp.getheader("Content-Type", "text/event-stream"))
        self.send_header("X-Routed-To", dest)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        usage = None
        for line in resp:
            usage = _usage_of_sse(line) or usage
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
        self.wfile.write(b"0\r\n\r\n")
        return usage

    def _reply(self, status: int, data: bytes, ctype: str, dest: str = "") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        if dest:
            self.send_header("X-Routed-To", dest)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        body = {"error": {"message": message, "type": "edge_proxy_error", "code": status}}
        self._reply(status, json.dumps(body).encode(), "application/json")


def _usage_of(data: bytes) -> Any:
    try:
        return json.loads(data).get("usage")
    except (ValueError, AttributeError):
        return None


def _usage_of_sse(line: bytes) -> Any:
    if not line.startswith(b"data: {"):
        return None
    return _usage_of(line[6:])
