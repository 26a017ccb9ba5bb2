"""HTTP/1.1 for the gateway, on asyncio protocols, parsed by httptools (llhttp).

Why not aiohttp: the first gateway was an aiohttp server with an aiohttp client. Side by
side on this machine (one core, 64 connections, same engines, same load), it proxied
1,144 requests/s against 3,688 for a prototype of this module, and added ~2.4 ms per
request at one connection; the gateway's targets are 5,000 requests/s and 1 ms.
Parsing is the part worth a library (httptools is Node's llhttp, the parser uvicorn
uses); what is here is the framing around
it, which a proxy needs to control anyway: when a stream ends cleanly and when it is cut,
which failure happened before the first byte, which connection may be reused.

Server (`HttpServer`): keep-alive and pipelined requests (answered in order), bounded
header and body sizes (431 / 413), an idle timeout per connection and a time limit on
receiving each request (408: a client trickling a request byte by byte would otherwise hold
its connection, and a socket, for ever), write back-pressure,
a handler per request that is cancelled if the client goes away, graceful close.

Client (`UpstreamPool`, one per destination): keep-alive connections reused in LIFO order,
a connect timeout, responses with a length, chunked or ended by close, read back-pressure,
and errors that say whether the request can have reached the engine (`UpstreamError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import errno
import functools
import resource
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httptools

from router_client.gateway import client_limits
from router_client.gateway.client_limits import ClientLedger, Refusal

_REASONS = {200: b"OK", 201: b"Created", 204: b"No Content", 400: b"Bad Request",
            401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found", 408: b"Request Timeout",
            413: b"Payload Too Large", 414: b"URI Too Long", 429: b"Too Many Requests",
            431: b"Request Header Fields Too Large", 500: b"Internal Server Error",
            502: b"Bad Gateway", 503: b"Service Unavailable", 504: b"Gateway Timeout"}
MAX_HEADER_BYTES = 64 << 10  # a request's head (request line and headers), also the URL's
# Requests received ahead of their answers (HTTP/1.1 pipelining): past the first number
# reading pauses until the answers catch up; past the second (all in one read) the client
# is not speaking HTTP in good faith and the connection is cut. Without a bound, a client
# that pipelines and never reads held every request and its answer in memory.
PIPELINE_PAUSE = 4
PIPELINE_MAX = 1024
# A non-streamed response body the gateway holds whole before answering (OpenAI answers
# are kilobytes; a batch of embeddings a few megabytes): an engine sending more is broken.
MAX_RESPONSE_BYTES = 64 << 20
HIGH_WATER = 1 << 20  # buffered upstream bytes before reading pauses
# Connect errors that are this process's, not the destination's.
LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM,
                          errno.EADDRNOTAVAIL})
LOW_WATER = 256 << 10
# Request-body bytes given back between two returns of freed memory to the OS (`_trim`).
TRIM_AFTER_BYTES = 64 << 20
# A declared body above this is weighed against the body budgets before its upload.
EARLY_CHECK_BYTES = 64 << 10


class ClientGone(ConnectionError):
    """The client closed its connection: stop working on its request."""


# --- server -------------------------------------------------------------------------------

@dataclass(slots=True)
class Request:
    method: str
    target: str  # path and query, as sent
    headers: list[tuple[str, str]]
    body: bytes
    keep_alive: bool
    http_10: bool = False
    held: int = 0  # body bytes counted against the client's budget until it is answered
    _index: dict[str, str] | None = field(default=None, repr=False)

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def header(self, name: str, default: str = "") -> str:
        """The (first) value of header `name`, case-insensitive."""
        if self._index is None:
            index: dict[str, str] = {}
            for k, v in self.headers:
                index.setdefault(k.lower(), v)
            self._index = index
        return self._index.get(name, default)


class Responder:
    """Writes one response: `start` then `write`* then `end`, or `send` for a whole one."""

    __slots__ = ("_chunked", "_conn", "keep_alive", "started", "status")

    def __init__(self, conn: _ServerConnection, keep_alive: bool) -> None:
        self._conn = conn
        self._chunked = False
        self.keep_alive = keep_alive
        self.started = False
        self.status = 0

    def send(self, status: int, headers: Iterable[tuple[str, str]], body: bytes) -> None:
        """A whole response with a Content-Length."""
        self._head(status, headers, b"Content-Length: %d\r\n" % len(body))
        self._conn.write(body)
        self._conn.response_done(self.keep_alive)

    def start(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        """Begin a response whose length is not known: chunked transfer encoding."""
        self._chunked = True
        self._head(status, headers, b"Transfer-Encoding: chunked\r\n")

    async def write(self, data: bytes) -> None:
        if data:
            self._conn.write(b"%x\r\n%s\r\n" % (len(data), data))
            await self._conn.drain()

    def end(self) -> None:
        """The clean end of a chunked response."""
        self._conn.write(b"0\r\n\r\n")
        self._conn.response_done(self.keep_alive)

    def abort(self) -> None:
        """Cut the connection (the client sees an incomplete response)."""
        self._conn.abort()

    def _head(self, status: int, headers: Iterable[tuple[str, str]], framing: bytes) -> None:
        if self.started:
            raise RuntimeError("response already started")
        self.started, self.status = True, status
        parts = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Status")), framing]
        parts.extend(f"{k}: {v}\r\n".encode("latin-1", "replace") for k, v in headers)
        if not self.keep_alive:
            parts.append(b"Connection: close\r\n")
        parts.append(b"\r\n")
        self._conn.write(b"".join(parts))


Handler = Callable[[Request, Responder], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ServerLimits:
    max_body_bytes: int = 8 << 20
    idle_timeout_s: float = 75.0  # a keep-alive connection with no request in flight
    # From a request's first byte to its last (headers and body); nginx's header and body
    # timeouts are 60 s each. A generous bound: a 8 MiB body at 1 MB/s arrives in 8 s.
    request_timeout_s: float = 30.0
    # Client connections open at once; 0: half of this process's file-descriptor limit (the
    # other half is for connections to the engines). Past it a new connection is closed at
    # once: idle sockets must not use up the descriptors the engines' connections need (at
    # the limit, connects failed with EMFILE and a healthy engine was ejected for it).
    max_connections: int = 0
    # How long a response may wait for a client that stopped reading (its socket buffer
    # full); past it the client is treated as gone and its connection cut. A client that
    # stops reading a stream would otherwise hold its in-flight slot, and the engine's, for
    # as long as it liked.
    write_timeout_s: float = 60.0
    # Request-body bytes all connections hold at once, and one client address's share,
    # from a body's first byte until its request is answered (client_limits); and the
    # connections one client address may hold (past it a new one is answered 503 and
    # closed). The per-client limits are 0 (off) unless set: the gateway sets them (for an
    # engine's server, the gateway is its only client).
    max_buffered_bytes: int = client_limits.BUFFERED_BODY_BYTES
    max_buffered_bytes_per_client: int = 0
    max_connections_per_client: int = 0
    # A new connection's first request head must be complete within this of its opening,
    # else it is closed (408 if part of the head came): sockets that never send would hold
    # connection slots for the whole idle timeout.
    header_timeout_s: float = client_limits.HEADER_TIMEOUT_S


class _ServerConnection(asyncio.Protocol):
    """One client connection: parses requests, runs the handler for each, in order."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self._url: list[bytes] = []
        self._url_bytes = 0
        self._headers: list[tuple[str, str]] = []
        self._header_bytes = 0
        # Raw bytes of a head still arriving (httptools buffers a header value whole
        # before `on_header` sees it, so the callbacks alone cannot bound it).
        self._in_head = False
        self._began = False
        self._head_bytes = 0
        self._reading_paused = False
        self._paused_request_at: float | None = None
        self._eof = False
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._queue: deque[Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self._paused = False
        self._drain: asyncio.Future[None] | None = None
        self._closing = False
        self.idle_since: float | None = None
        self.reading_since: float | None = None  # a request begun and not yet received
        self._refused = False
        self._keep_alive = True
        self.peer = ""  # the client's address: what its limits are counted by
        self._counted = False  # its connection is counted in the server's ledger
        self._held = 0  # body bytes this connection holds against the ledger
        self.opened_at: float | None = None  # until its first request head is complete

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        server = self.server
        if len(server._connections) >= server.max_connections:
            server.refused_connections += 1
            self._closing = True
            transport.close()
            return
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not server.ledger.connect(self.peer):
            server.refused_client_connections += 1
            self._closing = True
            self.transport.write(_error_response(  # type: ignore[union-attr]
                503, "too many connections from this client address at once", "overloaded"))
            transport.close()
            return
        self._counted = True
        server._connections.add(self)
        self.opened_at = time.monotonic()
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        continuing, self._began = self._in_head, False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._refuse(400, f"malformed request: {exc}")
        if self._in_head and not self._refused:
            # A head begun in this read holds at most this read; one that spans reads
            # holds all of them.
            self._head_bytes = (self._head_bytes + len(data)
                                if continuing and not self._began else 0)
            if self._head_bytes > MAX_HEADER_BYTES:
                self._refuse(431, "request headers too large")

    def eof_received(self) -> bool:
        """The client closed its sending side (half-close): answer what it sent, then close."""
        self._eof = True
        return self._task is not None or bool(self._queue)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._connections.discard(self)
        self._closing = True
        if self._counted:
            self._counted = False
            self.server.ledger.disconnect(self.peer)
        self._give(self._held)  # every body it held, arriving, queued or being answered
        self._body, self._queue = [], deque()
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client is gone: stop its request (and its upstream)
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ClientGone())

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._url, self._headers, self._body = [], [], []
        self._url_bytes = self._header_bytes = self._body_bytes = 0
        self._in_head, self._began = True, True
        self.idle_since = None
        if self._reading_paused:
            self._paused_request_at = time.monotonic()
        else:
            self.reading_since = time.monotonic()

    def on_url(self, url: bytes) -> None:
        self._url_bytes += len(url)
        if self._url_bytes > MAX_HEADER_BYTES:
            self._refuse(414, "request target too long")
            return
        self._url.append(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > MAX_HEADER_BYTES:
            self._refuse(431, "request headers too large")
            return
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self._in_head = False
        self.opened_at = None
        self._keep_alive = self.parser.should_keep_alive()  # reliable here, not later
        if self._refused:
            return
        length = expect = ""
        for name, value in self._headers:
            low = name.lower()
            if low == "content-length":
                length = value.strip()
            elif low == "expect":
                expect = value.strip().lower()
        declared = int(length) if length.isdigit() else 0
        # Refused now, not after the upload: too large, or past what may be held (a small
        # body is weighed as it arrives, usually in this same read).
        if declared > self.server.limits.max_body_bytes:
            self._refuse(413, "request body too large")
        elif declared > EARLY_CHECK_BYTES and (
                refusal := self.server.ledger.check(self.peer, declared)):
            self._refuse_by(refusal)
        elif (expect == "100-continue" and self.transport is not None
              and self._task is None and not self._queue):  # no answer being written
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return  # the rest of a read the refusal came in
        n = len(body)
        self._body_bytes += n
        if self._body_bytes > self.server.limits.max_body_bytes:
            self._refuse(413, "request body too large")
            return
        refusal = self.server.ledger.take(self.peer, n)
        if refusal is not None:
            self._refuse_by(refusal)
            return
        self._held += n
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.reading_since = self._paused_request_at = None
        if self._refused or self.parser.should_upgrade():
            return  # an upgrade is refused (400) once the parser stops at it
        p = self.parser
        request = Request(
            method=p.get_method().decode("latin-1"),
            target=b"".join(self._url).decode("latin-1"),
            headers=self._headers, body=b"".join(self._body),
            keep_alive=self._keep_alive and not self.server.closing,
            http_10=p.get_http_version() == "1.0", held=self._body_bytes)
        self._body = []
        self._queue.append(request)
        if len(self._queue) >= PIPELINE_PAUSE and not self._reading_paused:
            self._pause_reading(True)
        if len(self._queue) > PIPELINE_MAX:
            self._refused = True
            self.abort()
            return
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._serve())

    def _pause_reading(self, pause: bool) -> None:
        if self.transport is None or self._closing:
            return
        self._reading_paused = pause
        if pause:
            self.transport.pause_reading()
            self._paused_request_at = self.reading_since
            self.reading_since = None  # the wait is ours, not the client's
        else:
            self.transport.resume_reading()
            if self._paused_request_at is not None:  # a request was arriving: its clock
                self.reading_since = time.monotonic()  # starts again
                self._paused_request_at = None

    # the handler side
    async def _serve(self) -> None:
        try:
            while self._queue and not self._closing:
                request = self._queue.popleft()
                if self._reading_paused and len(self._queue) < PIPELINE_PAUSE // 2:
                    self._pause_reading(False)
                responder = Responder(self, request.keep_alive)
                try:
                    await self.server.handler(request, responder)
                except (ClientGone, asyncio.CancelledError):
                    return
                except Exception:  # a bug in a handler: answer 500, keep serving others
                    self.server.log_exception(request)
                    if not responder.started:
                        responder.send(500, [("Content-Type", "application/json")],
                                       b'{"error":{"message":"internal error","code":500}}')
                    else:
                        responder.abort()
                    return
                finally:
                    self._give(request.held)
                if not responder.started:
                    responder.send(500, [], b"")
                if self._queue:
                    # Handlers that never await (health, metrics, 404) would otherwise run
                    # a whole pipeline back to back while every other client waits.
                    await asyncio.sleep(0)
        finally:
            self._task = None
            if self._queue and not self._closing:  # arrived while the last one finished
                self._task = asyncio.get_running_loop().create_task(self._serve())
            elif self._eof and not self._closing:  # half-closed: everything is answered
                self._closing = True
                if self.transport is not None:
                    self.transport.close()
            elif not self._closing:
                self._arm_idle()

    def write(self, data: bytes) -> None:
        if self.transport is None or self._closing:
            raise ClientGone()
        self.transport.write(data)

    async def drain(self) -> None:
        if self._closing:
            raise ClientGone()
        if self._paused:
            self._drain = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(self.server.limits.write_timeout_s):
                    await self._drain
            except TimeoutError:
                self.abort()
                raise ClientGone() from None

    def response_done(self, keep_alive: bool) -> None:
        if not keep_alive and self.transport is not None:
            self._closing = True
            self.transport.close()

    def abort(self) -> None:
        self._closing = True
        if self.transport is not None:
            self.transport.abort()

    def close_if_idle(self) -> bool:
        if self._task is None and not self._queue:
            self._closing = True
            if self.transport is not None:
                self.transport.close()
            return True
        return False

    def _arm_idle(self) -> None:
        self.idle_since = time.monotonic()  # the server's sweep closes it past the timeout

    def _give(self, n: int) -> None:
        n = min(n, self._held)
        if n:
            self._held -= n
            self.server.ledger.give(self.peer, n)

    def refuse_late_head(self) -> None:
        """The first request's head did not arrive in time: close (408 if part of it came)."""
        self.opened_at = None
        if self.reading_since is None and not self._in_head:
            self.close_if_idle()  # nothing came: nothing to answer
        else:
            self._refuse(408, "request head not received in time")

    def refuse_slow_request(self) -> None:
        """The request being received took longer than the server allows: 408 and close."""
        self.reading_since = None
        self._refuse(408, "request not received in time")

    def _refuse_by(self, refusal: Refusal) -> None:
        self.server.refused_bodies += 1
        self._refuse(refusal.status, refusal.message,
                     "overloaded" if refusal.status == 503 else "invalid_request_error")

    def _refuse(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        """Answer an unparseable or oversized request and close (nothing else on this
        connection can be trusted to be framed right)."""
        self._refused = True
        if self.transport is not None and self._task is None:
            self.transport.write(_error_response(status, message, kind))
            self.transport.close()
        else:
            self.abort()


def _error_response(status: int, message: str, kind: str) -> bytes:
    """A whole JSON error answer that closes the connection."""
    text = message.replace('"', "'")
    body = f'{{"error":{{"message":"{text}","type":"{kind}","code":{status}}}}}'.encode()
    return (b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (status, _REASONS.get(status, b""), len(body), body))


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def _trim() -> None:
    """Give freed memory back to the OS. Bodies arrive in reads of up to 256 KiB, which
    glibc serves from its heap (not mmap) once a freed block has raised its threshold; freed,
    that heap stays mapped to the process however many bodies it held at once."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def default_max_connections() -> int:
    """`ServerLimits.max_connections` when it is 0: half the file-descriptor limit."""
    return _half_the_descriptors()


def _half_the_descriptors() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, soft // 2) if soft != resource.RLIM_INFINITY else 1 << 20


class HttpServer:
    """Serves `handler` on (host, port); `port` 0 binds a free port (see `.port`)."""

    def __init__(self, handler: Handler, limits: ServerLimits | None = None,
                 on_exception: Callable[[Request], None] | None = None) -> None:
        self.handler = handler
        self.limits = limits or ServerLimits()
        self.closing = False
        self._connections: set[_ServerConnection] = set()
        self._server: asyncio.Server | None = None
        self._on_exception = on_exception
        self._sweep: asyncio.TimerHandle | None = None
        self.port = 0
        self.slow_requests = 0  # refused with 408: not received within request_timeout_s
        self.refused_connections = 0  # closed at once: max_connections were open
        self.max_connections = self.limits.max_connections or _half_the_descriptors()
        self.refused_client_connections = 0  # 503: its address held its share already
        self.refused_bodies = 0  # 413 / 503: past the client's or the total body budget
        self.late_heads = 0  # closed: the first head did not come within header_timeout_s
        limits = self.limits
        self._trimmed_at = 0  # the ledger's `released` at the last `_trim`
        self.ledger = ClientLedger(
            body_limit=limits.max_buffered_bytes,
            client_body_limit=limits.max_buffered_bytes_per_client,
            client_connection_limit=limits.max_connections_per_client)

    async def start(self, host: str, port: int, backlog: int = 4096) -> HttpServer:
        self.closing = False
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _ServerConnection(self), host, port,
                                                backlog=backlog, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweep = loop.call_later(1.0, self._sweep_idle)
        return self

    def _sweep_idle(self) -> None:
        """Once a second: close keep-alive connections idle past the timeout, and refuse
        requests still arriving past theirs (one timer for the server instead of one per
        request)."""
        now = time.monotonic()
        limit = now - self.limits.idle_timeout_s
        slow = now - self.limits.request_timeout_s
        late = now - self.limits.header_timeout_s
        for c in list(self._connections):
            if c.opened_at is not None and c.opened_at < late:
                self.late_heads += 1
                c.refuse_late_head()
            elif c.idle_since is not None and c.idle_since < limit:
                c.close_if_idle()
            elif c.reading_since is not None and c.reading_since < slow:
                self.slow_requests += 1
                c.refuse_slow_request()
        released = self.ledger.released
        if released - self._trimmed_at >= TRIM_AFTER_BYTES:
            self._trimmed_at = released
            _trim()
        if not self.killed:
            self._sweep = asyncio.get_running_loop().call_later(1.0, self._sweep_idle)

    def log_exception(self, request: Request) -> None:
        if self._on_exception is not None:
            self._on_exception(request)

    @property
    def connections(self) -> int:
        """Open client connections."""
        return len(self._connections)

    @property
    def active(self) -> int:
        """Connections with a request in flight."""
        return sum(1 for c in self._connections if c._task is not None or c._queue)

    @property
    def killed(self) -> bool:
        return self._server is None

    def kill(self) -> None:
        """Stop at once, as a crashed process would: no listener, every connection cut."""
        self.closing = True
        if self._sweep is not None:
            self._sweep.cancel()
        if self._server is not None:
            self._server.close()
            self._server = None
        for c in list(self._connections):
            c.abort()

    async def close(self, grace_s: float) -> None:
        """Stop listening, close idle connections, let in-flight requests finish for up to
        `grace_s`, then cut what is left."""
        self.closing = True
        if self._sweep is not None:
            self._sweep.cancel()
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + grace_s
        while True:
            busy = [c for c in list(self._connections) if not c.close_if_idle()]
            if not busy or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        for c in list(self._connections):
            c.abort()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)


# --- client -------------------------------------------------------------------------------

class UpstreamError(Exception):
    """A request to an upstream failed. `sent` says whether the request may have reached
    it (False: refused or never connected — safe to send elsewhere)."""

    def __init__(self, message: str, *, sent: bool, connect: bool = False,
                 timeout: bool = False, local: bool = False) -> None:
        super().__init__(message)
        self.sent = sent
        self.connect = connect
        self.timeout = timeout
        # This process is out of a resource (file descriptors, ports, buffers): says
        # nothing about the destination, which must not be ejected for it.
        self.local = local


class _UpstreamConnection(asyncio.Protocol):
    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.alive = True
        self.reused = False
        self._head: asyncio.Future[tuple[int, list[tuple[str, str]]]] | None = None
        self._headers: list[tuple[str, str]] = []
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._done = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._close_delimited = False
        self._head_bytes = 0  # of a response head still arriving
        self.keep_alive = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def begin(self) -> asyncio.Future[tuple[int, list[tuple[str, str]]]]:
        self._head = asyncio.get_running_loop().create_future()
        self._headers, self._chunks, self._buffered = [], deque(), 0
        self._done, self._error = False, None
        self._head_bytes = 0
        self.parser = httptools.HttpResponseParser(self)
        return self._head

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"malformed response: {exc}", sent=True))
            self.close()
            return
        head = self._head
        if head is not None and not head.done():  # the head is still arriving
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEADER_BYTES:
                head.set_exception(UpstreamError("response head too large", sent=True))
                self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        self.pool._forget(self)
        if self._head is not None and not self._head.done():
            self._head.set_exception(UpstreamError(
                f"connection closed before a response ({exc or 'EOF'})", sent=True))
        elif not self._done:
            if self._close_delimited:  # no length, not chunked: the close is the end
                self._done = True
                self._wake()
            else:
                self._fail(UpstreamError("connection closed mid-response", sent=True))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        names = {k.lower() for k, _v in self._headers}
        chunked = any(k.lower() == "transfer-encoding" and "chunked" in v.lower()
                      for k, v in self._headers)
        self._close_delimited = "content-length" not in names and not chunked
        self.keep_alive = self.parser.should_keep_alive()  # reads reliably only here
        if self._head is not None and not self._head.done():
            self._head.set_result((self.parser.get_status_code(), self._headers))

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self._done = True
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        self._error = error
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next_chunk(self) -> bytes:
        """The next piece of the body; b"" at its end; UpstreamError if it was cut."""
        while not self._chunks:
            if self._done:
                return b""
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        if self._paused and self._buffered < LOW_WATER and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    def finished(self) -> bool:
        return self._done and not self._chunks

    def close(self) -> None:
        self.alive = False
        if self.transport is not None:
            self.transport.close()


class _FirstByteTimeout(Exception):
    pass


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(_FirstByteTimeout())


class UpstreamResponse:
    """A response whose status and headers arrived; read the body, then `release`."""

    __slots__ = ("_conn", "_released", "headers", "status")

    def __init__(self, conn: _UpstreamConnection, status: int,
                 headers: list[tuple[str, str]]) -> None:
        self._conn = conn
        self.status = status
        self.headers = headers
        self._released = False

    def header(self, name: str, default: str = "") -> str:
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return default

    @property
    def content_type(self) -> str:
        return self.header("content-type").split(";", 1)[0].strip().lower()

    async def read_chunk(self) -> bytes:
        return await self._conn.next_chunk()

    @property
    def complete(self) -> bool:
        """The whole body has arrived (read() will not wait)."""
        return self._conn._done

    async def read(self, max_bytes: int = MAX_RESPONSE_BYTES) -> bytes:
        """The whole body; UpstreamError past `max_bytes` (the connection is closed)."""
        conn = self._conn
        if conn._done and conn._buffered <= max_bytes:  # a small answer: no await, no timer
            data = b"".join(conn._chunks)
            conn._chunks.clear()
            conn._buffered = 0
            return data
        parts: list[bytes] = []
        size = 0
        while True:
            chunk = await self._conn.next_chunk()
            if not chunk:
                return b"".join(parts)
            size += len(chunk)
            if size > max_bytes:
                self.close()
                raise UpstreamError(f"response body over {max_bytes} bytes", sent=True)
            parts.append(chunk)

    def release(self) -> None:
        """Give the connection back for reuse if the response was read to its end and the
        upstream keeps it alive; otherwise close it."""
        if self._released:
            return
        self._released = True
        conn = self._conn
        if conn.finished() and conn.alive and conn.keep_alive:
            conn.pool._put(conn)
        else:
            conn.close()

    def close(self) -> None:
        self._released = True
        self._conn.close()


class UpstreamPool:
    """Keep-alive connections to one upstream (host, port), at most `max_idle` kept."""

    def __init__(self, host: str, port: int, *, max_idle: int = 256,
                 connect_timeout_s: float = 2.0) -> None:
        self.host, self.port = host, port
        self.max_idle = max_idle
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[_UpstreamConnection] = []
        self._all: set[_UpstreamConnection] = set()

    async def request(self, head: bytes, body: bytes,
                      first_byte_timeout_s: float) -> UpstreamResponse:
        """Send a request (`head` ends with the blank line) and wait for its status and
        headers. A reused connection that turns out closed is retried once on a new one:
        the upstream had closed it while idle, so the request never reached it."""
        conn = self._take()
        if conn is not None:
            try:
                return await self._exchange(conn, head, body, first_byte_timeout_s)
            except UpstreamError as exc:
                if exc.timeout or conn.alive:  # only a reused connection found closed
                    raise
        conn = await self._connect()
        return await self._exchange(conn, head, body, first_byte_timeout_s)

    async def _exchange(self, conn: _UpstreamConnection, head: bytes, body: bytes,
                        timeout_s: float) -> UpstreamResponse:
        waiter = conn.begin()
        assert conn.transport is not None
        conn.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            conn.transport.write(body)
        # A plain timer rather than asyncio.timeout(): the same effect at a fraction of the
        # cost, which matters once per request.
        timer = asyncio.get_running_loop().call_later(timeout_s, _expire, waiter)
        try:
            status, headers = await waiter
        except asyncio.CancelledError:
            conn.close()
            raise
        except _FirstByteTimeout:
            conn.close()
            raise UpstreamError("no response within the first-byte timeout", sent=True,
                                timeout=True) from None
        finally:
            timer.cancel()
        return UpstreamResponse(conn, status, headers)

    async def _connect(self) -> _UpstreamConnection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _t, conn = await loop.create_connection(
                    lambda: _UpstreamConnection(self), self.host, self.port)
        except TimeoutError:
            raise UpstreamError(f"connect timeout to {self.host}:{self.port}", sent=False,
                                connect=True, timeout=True) from None
        except OSError as exc:
            raise UpstreamError(f"cannot connect to {self.host}:{self.port}: {exc}",
                                sent=False, connect=True,
                                local=exc.errno in LOCAL_ERRNOS) from None
        self._all.add(conn)
        return conn

    def _take(self) -> _UpstreamConnection | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.alive:
                conn.reused = True
                return conn
        return None

    def _put(self, conn: _UpstreamConnection) -> None:
        if len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn.close()

    def _forget(self, conn: _UpstreamConnection) -> None:
        self._all.discard(conn)
        with contextlib.suppress(ValueError):
            self._idle.remove(conn)

    def close(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._idle.clear()
