"""What one client of an edge may hold, and what it may send on: the endpoint picker's
in-flight counts and streams, the gateway's body memory, connections and paths (issue 55,
items 10-14). Each test is the attack scaled down to seconds through the settings, on the
real servers (the picker's gRPC server, the gateway's HTTP server) and raw sockets."""

from __future__ import annotations

import contextlib
import json
import random
import socket
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from grpc_health.v1 import health_pb2, health_pb2_grpc

from planner_svc.devstack.engines import EngineFleet, start_engines
from router_client.epp.exchange import EppSettings
from router_client.gateway import GatewaySettings
from router_client.plan import DestinationSpec
from tests.epp_harness import (
    BUFFERED,
    EppThread,
    ExtProcStream,
    destinations,
    request_body,
    request_headers,
    response_body,
    response_headers,
)
from tests.gateway_harness import GatewayThread
from tests.waiting import eventually

pytestmark = pytest.mark.integration
SERVING, NOT_SERVING = (health_pb2.HealthCheckResponse.SERVING,
                        health_pb2.HealthCheckResponse.NOT_SERVING)


# --- the endpoint picker ----------------------------------------------------------------

@pytest.fixture()
def channel_to() -> Iterator[list[grpc.Channel]]:
    opened: list[grpc.Channel] = []
    yield opened
    for ch in opened:
        ch.close()


def _channel(e: EppThread, opened: list[grpc.Channel]) -> grpc.Channel:
    ch = grpc.insecure_channel(f"127.0.0.1:{e.port}")
    opened.append(ch)
    return ch


def _inflight(e: EppThread) -> int:
    return int(e.call(lambda: sum(e.client.core.inflight)))  # type: ignore[union-attr]


def _routed(s: ExtProcStream) -> bool:
    """Send a body-less request on `s`; whether the picker routed it (not refused)."""
    s.send(request_headers(end=True))
    return not s.read(1)[0].HasField("immediate_response")


def test_request_headers_sent_again_open_one_request_per_stream(channel_to) -> None:
    """Item 10: request headers sent over and over on one ext_proc stream opened a request
    each time and the stream's end closed one: 255 of 256 stayed in flight for ever. Now a
    stream is one request whatever frames arrive: headers sent again are refused (400), and
    what the stream opened is counted out when it ends."""
    cap = 8
    e = EppThread(destinations(1), EppSettings(router_id="epp-leak",
                                               max_inflight_per_destination=cap)).start()
    try:
        ch = _channel(e, channel_to)
        s = ExtProcStream(ch)
        answers = []
        for _ in range(cap):
            s.send(request_headers(end=True))
            answers.append(s.read(1)[0])
            if answers[-1].HasField("immediate_response"):
                break
        assert _inflight(e) <= 1, "one stream opened several requests"
        assert answers[-1].immediate_response.status.code == 400
        assert s.ended()
        assert eventually(lambda: _inflight(e) == 0, 5)
        # every slot is free again: `cap` requests at once are all routed
        held = [ExtProcStream(ch) for _ in range(cap)]
        assert all(_routed(h) for h in held)
        for h in held:
            h.cancel()
        assert eventually(lambda: _inflight(e) == 0, 5)
    finally:
        e.stop()


def _frames(rng: random.Random) -> list[ep.ProcessingRequest]:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    choices = [
        lambda: request_headers(end=True), lambda: request_headers(),
        lambda: request_headers(mode=BUFFERED, response_mode=BUFFERED),
        lambda: request_body(body, end=True), lambda: request_body(body[:9], end=False),
        lambda: response_headers(200, "text/event-stream"),
        lambda: response_headers(200, "application/json", end=True),
        lambda: response_body(b'data: {"choices": []}\n\n', end=False),
        lambda: response_body(b"{}", end=True),
        lambda: ep.ProcessingRequest(response_trailers=ep.HttpTrailers()),
    ]
    return [rng.choice(choices)() for _ in range(rng.randint(1, 8))]


def test_no_sequence_of_frames_leaves_a_request_in_flight(channel_to) -> None:
    """Item 10, whatever frames arrive: streams of random ext_proc frames (headers, bodies
    and response phases, repeated and out of order), each ended by the gateway, leave
    nothing in flight and no body held."""
    rng = random.Random(55)
    e = EppThread(destinations(2), EppSettings(router_id="epp-frames")).start()
    try:
        ch = _channel(e, channel_to)
        for _ in range(30):
            s = ExtProcStream(ch)
            s.send(*_frames(rng))
            s.close()
            with contextlib.suppress(grpc.RpcError):
                for _answer in s._answers:
                    pass
            assert eventually(lambda: _inflight(e) == 0, 5)
            assert e.server is not None and e.server.bodies.held == 0
    finally:
        e.stop()


def test_readiness_fails_while_every_slot_is_held(channel_to) -> None:
    """Item 11: streams that never end held every in-flight slot (new requests got 503)
    while readiness stayed SERVING, so the gateway kept sending. Readiness now says whether
    the picker can take work: NOT_SERVING while every usable endpoint is at its cap, back
    to SERVING once the holders go."""
    cap = 3
    e = EppThread(destinations(2), EppSettings(router_id="epp-full",
                                               max_inflight_per_destination=cap)).start()
    try:
        ch = _channel(e, channel_to)
        stub = health_pb2_grpc.HealthStub(ch)

        def readiness() -> int:
            return stub.Check(health_pb2.HealthCheckRequest(service="readiness"),
                              timeout=5).status

        assert readiness() == SERVING
        held = [ExtProcStream(ch, timeout_s=60) for _ in range(2 * cap)]
        assert all(_routed(h) for h in held)
        assert not _routed(ExtProcStream(ch))  # the next one is refused (503)
        assert eventually(lambda: readiness() == NOT_SERVING, 5)
        for h in held:
            h.cancel()
        assert eventually(lambda: readiness() == SERVING, 5)
    finally:
        e.stop()


def test_streams_that_never_end_are_ended_at_their_deadline(channel_to) -> None:
    """Item 11: 1,000 streams that never end held every slot until a restart. Each stream
    now has deadlines: its request must be routed within `request_timeout_s` (a body that
    never ends holds the body budget) and the stream end within `stream_timeout_s`; past
    either the picker ends it (DEADLINE_EXCEEDED) and gives back what it held."""
    e = EppThread(destinations(2), EppSettings(
        router_id="epp-deadline", max_inflight_per_destination=50,
        request_timeout_s=1.0, stream_timeout_s=3.0)).start()
    try:
        ch = _channel(e, channel_to)
        trickle = ExtProcStream(ch, timeout_s=60)
        trickle.send(request_headers(), request_body(b'{"model": "m", ', end=False))
        held = [ExtProcStream(ch, timeout_s=60) for _ in range(100)]
        assert all(_routed(h) for h in held)
        assert eventually(lambda: _inflight(e) == 0, 15)
        assert e.server is not None and e.server.bodies.held == 0
        codes = set()
        for h in [trickle, *held]:
            with pytest.raises(grpc.RpcError) as ended:
                h.read(1)
            codes.add(ended.value.code())  # type: ignore[attr-defined]
        assert codes == {grpc.StatusCode.DEADLINE_EXCEEDED}
        assert _routed(ExtProcStream(ch))  # slots free again
    finally:
        e.stop()


# --- the gateway ------------------------------------------------------------------------

CHAT = json.dumps({"model": "m", "max_tokens": 4,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()
MIB = 1 << 20


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFleet]:
    fleet = start_engines(tmp_path_factory.mktemp("engines"), 2, extra=["--time-scale", "0"])
    yield fleet
    fleet.stop()


def _gateway(engines: EngineFleet, **limits: Any) -> GatewayThread:
    return GatewayThread([DestinationSpec(i, u) for i, u in engines.urls.items()],
                         settings=GatewaySettings(port=0, router_id="gw-bounds",
                                                  **limits)).start()


def _connect(g: GatewayThread, client: str) -> socket.socket:
    """A connection from `client` (an address of the loopback /8: each is another client)."""
    host, port = g.url.removeprefix("http://").split(":")
    s = socket.socket()
    s.settimeout(5)
    s.bind((client, 0))
    s.connect((host, int(port)))
    return s


def _answer(s: socket.socket) -> bytes:
    """What the gateway sends until it closes (or 5 s of silence: a socket.timeout)."""
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def _hold_body(g: GatewayThread, client: str, size: int) -> socket.socket:
    """A request whose body (`size` bytes declared) stops one byte short of its end."""
    s = _connect(g, client)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
              % size + b"x" * (size - 1))
    return s


def _held(g: GatewayThread) -> int:
    assert g.gateway is not None
    return g.gateway.server.ledger.held


def test_request_bodies_held_at_once_are_bounded_in_total_and_per_client(engines) -> None:
    """Item 12: bodies held one byte short of their end (250 x 8 MiB: 2.4 GB, not given
    back) had no bound but the connection count. Now what one client address may hold is
    bounded (413 past it) and what all of them hold (503), each refused before its upload
    when the body declares its length, and all of it is given back when they close."""
    g = _gateway(engines, max_body_bytes=MIB, max_buffered_bytes=3 * MIB,
                 max_buffered_bytes_per_client=2 * MIB)
    holders: list[socket.socket] = []
    try:
        holders += [_hold_body(g, "127.0.0.2", MIB) for _ in range(2)]
        assert eventually(lambda: _held(g) == 2 * (MIB - 1), 5)
        with _connect(g, "127.0.0.2") as s:  # a third from the same client: past its share
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Length: %d\r\n\r\n" % MIB)
            refused = _answer(s)
        assert refused.startswith(b"HTTP/1.1 413") and b"one client may hold" in refused
        with _connect(g, "127.0.0.2") as s:  # chunked: refused as the bytes arrive
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n40\r\n%s\r\n" % (b"y" * 64))
            assert _answer(s).startswith(b"HTTP/1.1 413")
        holders.append(_hold_body(g, "127.0.0.3", MIB))
        assert eventually(lambda: _held(g) == 3 * (MIB - 1), 5)
        with _connect(g, "127.0.0.4") as s:  # a new client, but the total is held
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Length: %d\r\n\r\n" % (128 << 10))
            refused = _answer(s)
        assert refused.startswith(b"HTTP/1.1 503") and b"limit of request bodies" in refused
        with _connect(g, "127.0.0.4") as s:  # a small body: weighed as it arrives
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Length: 4096\r\n\r\n" + b"z" * 4096)
            assert _answer(s).startswith(b"HTTP/1.1 503")
        for s in holders:
            s.close()
        assert eventually(lambda: _held(g) == 0, 5)
        with _connect(g, "127.0.0.4") as s:  # room again
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(CHAT), CHAT))
            assert _answer(s).startswith(b"HTTP/1.1 200")
        assert _held(g) == 0
    finally:
        for s in holders:
            s.close()
        g.stop()


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_body_memory_goes_back_to_the_os_once_the_holders_close(engines) -> None:
    """Item 12, the memory: after the holders of the bodies closed, the gateway process kept
    the 2.4 GB they had taken. Freed bodies are now returned to the OS, so the process's RSS
    falls back to about where it started."""
    size, holders = 8 * MIB, 12
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner_svc.cli.main", "gateway", "--port", "0",
         "--destinations", engines.destinations(), "--probe-path", "",
         "--max-buffered-bytes", str(holders * size), "--max-buffered-bytes-per-client", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    held: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip().split("=", 1)[1]
        host, port = url.removeprefix("http://").split(":")
        base = _rss_mb(proc.pid)
        for _ in range(holders):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Length: %d\r\n\r\n" % size + b"x" * (size - 1))
            held.append(s)
        assert eventually(lambda: _rss_mb(proc.pid) > base + 0.8 * holders * size / MIB, 10)
        for s in held:
            s.close()
        assert eventually(lambda: _rss_mb(proc.pid) < base + 32, 10), _rss_mb(proc.pid)
    finally:
        for s in held:
            s.close()
        proc.terminate()
        proc.wait(15)


def test_idle_connections_of_one_client_neither_starve_others_nor_stay(engines) -> None:
    """Item 13: 10,000 connections that never sent a byte held every slot for the 75-s idle
    timeout, and every other client was refused. One client address now holds at most its
    share of the connections (503 past it), and a connection whose first request head does
    not come within `header_timeout_s` is closed."""
    g = _gateway(engines, max_connections=60, max_connections_per_client=20,
                 header_timeout_s=1.0)
    idle: list[socket.socket] = []
    try:
        for _ in range(60):  # as many as the gateway takes in all, from one address
            idle.append(_connect(g, "127.0.0.2"))
        beyond = idle[20:]
        for s in beyond:
            assert _answer(s).startswith(b"HTTP/1.1 503")
        with _connect(g, "127.0.0.3") as s:  # another client is served meanwhile
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert _answer(s).startswith(b"HTTP/1.1 200")
        slow = _connect(g, "127.0.0.3")  # part of a head, never finished
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        idle.append(slow)
        for s in idle[:20]:  # closed at the header timeout, with nothing to answer
            assert _answer(s) == b""
        assert _answer(slow).startswith(b"HTTP/1.1 408")
        assert g.gateway is not None
        assert eventually(lambda: g.gateway.server.connections == 0, 5)  # type: ignore[union-attr]
        with _connect(g, "127.0.0.2") as s:  # the same client, in good faith now
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert _answer(s).startswith(b"HTTP/1.1 200")
    finally:
        for s in idle:
            s.close()
        g.stop()


class _RecordingUpstream:
    """An upstream that records each request line it receives and answers 200 `{}`: what
    an engine behind the gateway would have been sent."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        lines = self.lines

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                while line := self.rfile.readline():
                    lines.append(line.decode("latin-1").strip())
                    length = 0
                    while (header := self.rfile.readline()) not in (b"\r\n", b""):
                        name, _, value = header.decode("latin-1").partition(":")
                        if name.strip().lower() == "content-length":
                            length = int(value)
                    self.rfile.read(length)
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                     b"Content-Length: 2\r\n\r\n{}")

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("path", [
    "/v1/../metrics", "/v1/../../etc/passwd", "/v1/%2e%2e/metrics", "/v1/.%2E/metrics",
    "/v1/..%2fmetrics", "/v1/%252e%252e/metrics", "/v1/..\\metrics", "/v1/./models",
])
def test_dot_segments_are_refused_before_anything_is_forwarded(path: str) -> None:
    """Item 14: `/v1/../metrics` and `/v1/../../etc/passwd` were forwarded verbatim. A path
    with a dot segment, in any spelling, is refused 400 and the engine sees nothing; other
    paths are forwarded normalised."""
    upstream = _RecordingUpstream()
    g = GatewayThread([DestinationSpec("e0", upstream.url)],
                      settings=GatewaySettings(port=0, router_id="gw-paths")).start()
    try:
        with _connect(g, "127.0.0.2") as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            answer = _answer(s)
        assert answer.startswith(b"HTTP/1.1 400") and b"dot segment" in answer
        with _connect(g, "127.0.0.2") as s:  # an ordinary path goes through, normalised
            s.sendall(b"POST //v1//chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close"
                      b"\r\nContent-Length: %d\r\n\r\n%s" % (len(CHAT), CHAT))
            assert _answer(s).startswith(b"HTTP/1.1 200")
        forwarded = [line for line in upstream.lines if not line.startswith("GET /health")]
        assert forwarded == ["POST /v1/chat/completions HTTP/1.1"]
    finally:
        g.stop()
        upstream.close()
