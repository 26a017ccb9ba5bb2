"""The gateway's HTTP/1.1 server against clients that bend the protocol, on raw sockets:
pipelining, oversized heads arriving in pieces, half-close, `Expect: 100-continue`,
declared bodies over the limit, upgrades. Each case once found the gateway holding memory
without bound, stalling its event loop, or answering wrongly (an adversarial review of
2026-12-05)."""

from __future__ import annotations

import json
import select
import socket
from collections.abc import Iterator

import pytest

from planner_svc.devstack.engines import EngineFleet, start_engines
from router_client.gateway import GatewaySettings
from router_client.gateway.http11 import MAX_HEADER_BYTES, PIPELINE_MAX
from router_client.plan import DestinationSpec
from tests.gateway_harness import GatewayThread

pytestmark = pytest.mark.integration
CHAT = json.dumps({"model": "m", "max_tokens": 4,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFleet]:
    fleet = start_engines(tmp_path_factory.mktemp("engines"), 2, extra=["--time-scale", "0"])
    yield fleet
    fleet.stop()


@pytest.fixture()
def gw(engines: EngineFleet) -> Iterator[GatewayThread]:
    g = GatewayThread([DestinationSpec(i, u) for i, u in engines.urls.items()],
                      settings=GatewaySettings(port=0, router_id="gw-http",
                                               request_timeout_s=5.0)).start()
    yield g
    g.stop()


def connect(g: GatewayThread) -> socket.socket:
    host, port = g.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def read_until_closed(s: socket.socket) -> bytes:
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except ConnectionResetError:
        out += b"<reset>"
    return out


def chat_request(extra_headers: bytes = b"", body: bytes = CHAT) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n%s\r\n" % (len(body), extra_headers)) + body


def test_a_short_pipeline_is_answered_in_order(gw: GatewayThread) -> None:
    with connect(gw) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 9
                  + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert read_until_closed(s).count(b"HTTP/1.1 200 OK") == 10


def test_a_pipeline_too_deep_to_be_in_good_faith_is_cut_not_buffered(gw: GatewayThread) -> None:
    """Reading pauses once a few requests wait for their answers; a client that still
    packs more than PIPELINE_MAX into what was already read loses the connection (it was
    held in memory, request and answer, for as long as the client did not read)."""
    with connect(gw) as s:
        s.sendall(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n" * (PIPELINE_MAX + 100))
        out = read_until_closed(s)
    assert out.count(b"HTTP/1.1 404") <= PIPELINE_MAX
    with connect(gw) as s:  # the gateway serves on
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert read_until_closed(s).startswith(b"HTTP/1.1 200 OK")


@pytest.mark.parametrize(("what", "status"), [("url", b"414"), ("header", b"431")])
def test_an_oversized_head_in_pieces_is_refused_before_it_is_whole(
        gw: GatewayThread, what: str, status: bytes) -> None:
    """The request line and a single header value were unbounded (the parser buffers a
    value whole before the gateway sees it): 150 MB of either sat in memory. Now the
    answer comes once the head passes MAX_HEADER_BYTES, with the head still incomplete."""
    with connect(gw) as s:
        s.sendall(b"GET /" if what == "url" else b"GET / HTTP/1.1\r\nX-Pad: ")
        sent = 0
        while sent < 16 * MAX_HEADER_BYTES and not select.select([s], [], [], 0.05)[0]:
            s.sendall(b"a" * 8192)  # a piece at a time, never a whole head
            sent += 8192
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:60]
    assert sent <= 4 * MAX_HEADER_BYTES


def test_a_half_closed_client_gets_its_answer(gw: GatewayThread) -> None:
    with connect(gw) as s:
        s.sendall(chat_request())
        s.shutdown(socket.SHUT_WR)  # done sending; still reading
        out = read_until_closed(s)
    assert out.startswith(b"HTTP/1.1 200 OK") and b'"choices"' in out


def test_expect_100_continue_is_answered_before_the_body(gw: GatewayThread) -> None:
    with connect(gw) as s:
        head, body = chat_request(b"Expect: 100-continue\r\n").split(b"\r\n\r\n", 1)
        s.sendall(head + b"\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(body)
        assert s.recv(65536).startswith(b"HTTP/1.1 200 OK")


def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(gw: GatewayThread) -> None:
    with connect(gw) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Length: 9000000000\r\n\r\n")
        assert read_until_closed(s).startswith(b"HTTP/1.1 413")


def test_an_upgrade_is_refused_with_400(gw: GatewayThread) -> None:
    with connect(gw) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                  b"Upgrade: websocket\r\n\r\n")
        assert read_until_closed(s).startswith(b"HTTP/1.1 400")
