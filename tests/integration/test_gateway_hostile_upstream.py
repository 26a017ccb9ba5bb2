"""The gateway in front of a broken (or hostile) engine: a real HTTP server on loopback that
sends what no engine should. Each case once had the gateway hold memory without bound or
stall every other client (an adversarial review of 2026-12-05); now each ends in a clear
error for the one request, and the gateway serves on."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx2 as httpx
import pytest

from router_client.gateway import GatewaySettings
from router_client.gateway.http11 import MAX_HEADER_BYTES, MAX_RESPONSE_BYTES
from router_client.gateway.sse import MAX_EVENT_BYTES
from router_client.plan import DestinationSpec
from tests.gateway_harness import GatewayThread

pytestmark = pytest.mark.integration
PIECE = 1 << 16
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class HostileEngine:
    """Answers every request in `mode`, up to `limit` bytes, then holds the connection."""

    def __init__(self, mode: str, limit: int) -> None:
        self.mode, self.limit = mode, limit
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        async def start() -> None:
            server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
        self.loop.run_until_complete(start())
        self.loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            if self.mode == "body":  # a length it never reaches, and more bytes than any answer
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 1000000000000\r\n\r\n")
                piece = b"a" * PIECE
            elif self.mode == "headers":  # a head that never ends
                writer.write(b"HTTP/1.1 200 OK\r\n")
                piece = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 50) for i in range(1000))
            elif self.mode == "sse_long":  # a valid stream, just long: `limit` bytes of events
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
                event = (b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":'
                         b'0,"delta":{"content":"' + b"tok " * 200 + b'"}}]}\n\n')
                piece = b"%x\r\n%s\r\n" % (len(event), event)
            else:  # an SSE event that never ends
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n6\r\ndata: \r\n")
                piece = b"%x\r\n%s\r\n" % (PIECE, b"a" * PIECE)
            sent = 0
            while sent < self.limit:
                writer.write(piece)
                sent += len(piece)
                await writer.drain()
            await asyncio.sleep(30)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


@pytest.fixture()
def hostile(request: pytest.FixtureRequest) -> Iterator[tuple[GatewayThread, HostileEngine]]:
    mode, limit = request.param
    engine = HostileEngine(mode, limit)
    g = GatewayThread([DestinationSpec("e0", f"http://127.0.0.1:{engine.port}")],
                      settings=GatewaySettings(port=0, router_id="gw-hostile",
                                               idle_timeout_s=20.0,
                                               first_byte_timeout_s=20.0)).start()
    yield g, engine
    g.stop()
    engine.stop()


def healthz_meanwhile(g: GatewayThread, stop: threading.Event, answered: list[bool]) -> None:
    while not stop.is_set():
        answered.append(httpx.get(g.url + "/healthz", timeout=5).status_code == 200)
        time.sleep(0.1)


@pytest.mark.parametrize("hostile", [("body", 2 * MAX_RESPONSE_BYTES)], indirect=True)
def test_a_response_body_past_the_cap_is_a_502(
        hostile: tuple[GatewayThread, HostileEngine]) -> None:
    g, _ = hostile
    r = httpx.post(g.url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 502 and "over" in r.json()["error"]["message"]


@pytest.mark.parametrize("hostile", [("headers", 64 * MAX_HEADER_BYTES)], indirect=True)
def test_a_response_head_that_never_ends_is_a_502(
        hostile: tuple[GatewayThread, HostileEngine]) -> None:
    g, _ = hostile
    r = httpx.post(g.url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 502  # at 64 KiB of head, not at --first-byte-timeout-s


@pytest.mark.parametrize("hostile", [("sse", 4 * MAX_EVENT_BYTES)], indirect=True)
def test_an_sse_event_that_never_ends_breaks_that_stream_not_the_gateway(
        hostile: tuple[GatewayThread, HostileEngine]) -> None:
    g, _ = hostile
    stop, answered = threading.Event(), list[bool]()
    watcher = threading.Thread(target=healthz_meanwhile, args=(g, stop, answered))
    watcher.start()
    try:
        with httpx.stream("POST", g.url + "/v1/chat/completions",
                          json={**CHAT, "stream": True}, timeout=30) as r:
            body = b""
            with pytest.raises(httpx.RemoteProtocolError):  # cut, never a clean end
                for chunk in r.iter_bytes():
                    body += chunk
    finally:
        stop.set()
        watcher.join()
    event = json.loads(body.split(b"data: ", 1)[1])
    assert event["error"]["code"] == 502
    assert answered and all(answered)  # other clients were served all along


def inflight(g: GatewayThread) -> float:
    for line in httpx.get(g.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("cacheroute_gateway_inflight{"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def test_a_client_that_stops_reading_frees_its_slot_after_the_idle_timeout() -> None:
    """A client that requests a long stream and never reads it held its in-flight slot (and
    the engine's connection) for ever; with the cap at 1, every other request got 503."""
    engine = HostileEngine("sse_long", 64 << 20)
    g = GatewayThread([DestinationSpec("e0", f"http://127.0.0.1:{engine.port}")],
                      settings=GatewaySettings(port=0, router_id="gw-noread",
                                               max_inflight_per_destination=1,
                                               idle_timeout_s=1.0)).start()
    try:
        host, port = g.url.removeprefix("http://").split(":")
        body = json.dumps({**CHAT, "stream": True}).encode()
        idle = socket.socket()
        idle.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting
        idle.connect((host, int(port)))
        idle.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # never read
        deadline = time.monotonic() + 5
        while inflight(g) != 1.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert inflight(g) == 1.0  # the stream is running and the client not reading
        deadline = time.monotonic() + 20
        while inflight(g) != 0.0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert inflight(g) == 0.0  # the slot came back while the client still holds its socket
        with httpx.stream("POST", g.url + "/v1/chat/completions",
                          json={**CHAT, "stream": True}, timeout=10) as r:
            assert r.status_code == 200  # served, not 503
        idle.close()
    finally:
        g.stop()
        engine.stop()
