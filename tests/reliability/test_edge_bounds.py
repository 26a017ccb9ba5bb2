"""What one client of an edge may hold, and what it may send on: the endpoint picker's
in-flight counts and streams, the gateway's body memory, connections and paths (issue 55,
items 10-14). Each test is the attack scaled down to seconds through the settings, on the
real servers (the picker's gRPC server, the gateway's HTTP server) and raw sockets."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from router_client.epp.exchange import EppSettings
from tests.epp_harness import (
    EppThread,
    ExtProcStream,
    destinations,
    request_body,
    request_headers,
)
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
