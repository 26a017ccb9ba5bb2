"""`cacheroute epp` driven the way Envoy's ext_proc filter drives an endpoint picker: a
real gRPC server, a client built from Envoy's ext_proc protos, one stream per request
(headers, then the body in pieces, then the response), checked against the plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from router_client.epp import protocol as proto
from router_client.epp.exchange import EppSettings
from router_client.eviction_window import EvictionWindow
from router_client.keys import KeyRule, derive_key
from tests.epp_harness import (
    BUFFERED,
    EppThread,
    ExtProcStream,
    destination_of,
    destinations,
    request_body,
    request_headers,
    response_body,
    response_headers,
    set_header,
    streamed_bytes,
)
from tests.waiting import eventually

pytestmark = pytest.mark.integration

SYSTEM = {"role": "system", "content": "You answer questions about ACME's warranty. " * 30}


def chat(user: str = "hello", **extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [SYSTEM, {"role": "user", "content": user}], **extra}


def key_of(payload: dict[str, object]) -> str:
    return derive_key(payload, {}, KeyRule()).key


@pytest.fixture()
def epp() -> Iterator[EppThread]:
    e = EppThread(destinations(4)).start()
    yield e
    e.stop()


@pytest.fixture()
def channel(epp: EppThread) -> Iterator[grpc.Channel]:
    ch = grpc.insecure_channel(f"127.0.0.1:{epp.port}")
    yield ch
    ch.close()


def route(channel: grpc.Channel, payload: dict[str, object],
          pieces: int = 3, **hdr_kw: object) -> tuple[ExtProcStream, list]:
    """Send one request in full-duplex mode; return the stream and the routing answers."""
    raw = json.dumps(payload).encode()
    s = ExtProcStream(channel)
    s.send(request_headers(**hdr_kw))  # type: ignore[arg-type]
    step = max(1, len(raw) // pieces + 1)
    chunks = [raw[i:i + step] for i in range(0, len(raw), step)]
    for i, c in enumerate(chunks):
        s.send(request_body(c, end=i == len(chunks) - 1))
    first = s.read(1)
    if first[0].HasField("immediate_response"):
        return s, first
    answers = first
    while True:  # the body comes back in pieces until one ends it
        answers += s.read(1)
        if answers[-1].request_body.response.body_mutation.streamed_response.end_of_stream:
            return s, answers


def test_the_answer_names_the_planned_endpoint_in_header_and_metadata(epp, channel):
    payload = chat()
    epp.publish({key_of(payload): (2,)})
    s, answers = route(channel, payload)
    header, meta = destination_of(answers[0])
    assert header == meta  # the protocol: the same value in both
    endpoints = header.split(",")
    assert endpoints[0] == epp.endpoint(2)
    assert len(endpoints) == 1 + epp.settings.fallbacks and len(set(endpoints)) == len(endpoints)
    body, ended = streamed_bytes(answers[1:], request=True)
    assert ended and json.loads(body) == payload  # the body goes on unchanged
    assert set_header(answers[0], "content-length") == str(len(body))
    assert epp.call(lambda: epp.client.core.inflight[2]) == 1
    # the response: headers pass, the body is relayed, usage becomes a cache-hit event
    served = {"id": "x", "choices": [{"message": {"content": "hi"}}],
              "usage": {"prompt_tokens": 400, "completion_tokens": 5,
                        "prompt_tokens_details": {"cached_tokens": 384}}}
    s.send(response_headers(200, "application/json"))
    assert s.read(1)[0].HasField("response_headers")
    s.send(response_body(json.dumps(served).encode(), end=True))
    relayed, end = streamed_bytes(s.read(1), request=False)
    assert end and json.loads(relayed) == served
    assert s.ended()
    eventually(lambda: epp.call(lambda: epp.client.core.inflight[2]) == 0, 5)
    kinds = epp.sink.kinds()
    assert kinds == ["request", "cache_hit"]
    hit = epp.sink.events[1]
    assert hit[1] == key_of(payload) and hit[2] == "pod2"
    assert hit[3]["cached_tokens"] == 384 and hit[3]["prompt_tokens"] == 400


def test_a_replicated_key_is_spread_over_its_set_only(epp, channel):
    payloads = [chat(f"question {i}") for i in range(6)]
    key = key_of(payloads[0])
    assert all(key_of(p) == key for p in payloads)  # one application: one key
    epp.publish({key: (1, 3)})
    primaries, streams = [], []
    for p in payloads:  # held open: in flight, so the set's least-loaded member alternates
        s, answers = route(channel, p)
        primaries.append(destination_of(answers[0])[0].split(",")[0])
        streams.append(s)
    assert set(primaries) == {epp.endpoint(1), epp.endpoint(3)}
    for s in streams:
        s.cancel()
    eventually(lambda: epp.call(lambda: sum(epp.client.core.inflight)) == 0, 5)


def test_without_a_plan_every_request_still_gets_a_usable_endpoint(epp, channel):
    seen = set()
    for i in range(12):
        s, answers = route(channel, chat(f"q{i}", model=f"model-{i}"))
        seen.add(destination_of(answers[0])[0].split(",")[0])
        s.cancel()
    assert seen <= {epp.endpoint(i) for i in range(4)} and len(seen) >= 2
    assert epp.call(lambda: epp.client.core.mode) == "fallback"


def test_unhealthy_endpoints_are_skipped_and_none_left_is_a_503(epp, channel):
    payload = chat()
    epp.publish({key_of(payload): (2,)})
    epp.call(lambda: epp.client.mark_down("pod2"))
    for _ in range(5):
        s, answers = route(channel, payload)
        endpoints = destination_of(answers[0])[0].split(",")
        assert epp.endpoint(2) not in endpoints
        s.cancel()
    for d in ("pod0", "pod1", "pod3"):
        epp.call(lambda d=d: epp.client.mark_down(d))
    s, answers = route(channel, payload)
    refusal = answers[0].immediate_response
    assert refusal.status.code == 503 and b"no usable endpoint" in refusal.body
    assert s.ended()


def test_the_gateways_subset_bounds_the_choice(epp, channel):
    payload = chat()
    epp.publish({key_of(payload): (2,)})
    s, answers = route(channel, payload, subset=[epp.endpoint(0), epp.endpoint(3)])
    endpoints = destination_of(answers[0])[0].split(",")
    assert set(endpoints) == {epp.endpoint(0), epp.endpoint(3)}  # never the planned pod2
    s.cancel()
    s, answers = route(channel, payload, subset=["192.0.2.1:8000"])
    assert answers[0].immediate_response.status.code == 503
    assert b"subset" in answers[0].immediate_response.body


@pytest.mark.parametrize("body, status", [
    (b"{not json", 400),
    (b"[1, 2]", 400),
    (b"{" + b'"pad": "' + b"x" * 70_000 + b'"}', 413),
])
def test_bad_or_oversized_bodies_are_refused_cleanly(body, status):
    e = EppThread(destinations(2), EppSettings(router_id="epp-small", max_body_bytes=64_000))
    e.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{e.port}") as ch:
            s = ExtProcStream(ch)
            s.send(request_headers())
            for i in range(0, len(body), 16_000):
                s.send(request_body(body[i:i + 16_000], end=i + 16_000 >= len(body)))
            answer = s.read(1)[0]
            assert answer.immediate_response.status.code == status
            assert json.loads(answer.immediate_response.body)["error"]["code"] == status
            assert s.ended()
            # the picker still serves the next request
            s2, answers = route(ch, chat())
            assert destination_of(answers[0])[0]
            s2.cancel()
        eventually(lambda: e.call(lambda: sum(e.client.core.inflight)) == 0, 5)
    finally:
        e.stop()


def test_bodies_held_by_many_streams_stay_within_the_budget():
    """Streams that send request bodies and never end them held memory without bound (60 x
    8 MB: 780 MB). With a 200 kB budget over all streams, the stream that would pass it is
    refused 503 at once, and bodies given back by finished streams make room again."""
    e = EppThread(destinations(2), EppSettings(router_id="epp-budget", max_body_bytes=128_000,
                                               max_buffered_bytes=200_000))
    e.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{e.port}") as ch:
            holding = []
            for _ in range(2):  # 2 x 96 kB, neither finished
                s = ExtProcStream(ch)
                s.send(request_headers())
                s.send(request_body(b"x" * 96_000, end=False))
                holding.append(s)
            # streams are served independently: wait until both bodies are held
            eventually(lambda: e.server is not None and e.server.bodies.held == 192_000, 5)
            third = ExtProcStream(ch)
            third.send(request_headers())
            third.send(request_body(b"y" * 16_000, end=False))
            answer = third.read(1)[0]
            assert answer.immediate_response.status.code == 503
            assert e.server is not None and e.server.bodies.held == 192_000
            for s in holding:
                s.cancel()
            eventually(lambda: e.server is not None and e.server.bodies.held == 0, 5)
            s2, answers = route(ch, chat())  # room again
            assert destination_of(answers[0])[0]
            s2.cancel()
    finally:
        e.stop()


def test_buffered_mode_answers_headers_first_and_routes_on_the_body(epp, channel):
    payload = chat()
    epp.publish({key_of(payload): (1,)})
    s = ExtProcStream(channel)
    s.send(request_headers(mode=BUFFERED, response_mode=BUFFERED))
    first = s.read(1)[0]
    assert first.HasField("request_headers") and not first.request_headers.response.HasField(
        "header_mutation")
    s.send(request_body(json.dumps(payload).encode(), end=True))
    answer = s.read(1)[0]
    assert answer.HasField("request_body")
    header, meta = destination_of(answer)
    assert header == meta and header.split(",")[0] == epp.endpoint(1)
    s.cancel()


def test_a_streamed_request_reports_usage_the_client_never_sees(epp, channel):
    payload = chat(stream=True)
    epp.publish({key_of(payload): (0,)})
    s, answers = route(channel, payload)
    forwarded, _ = streamed_bytes(answers[1:], request=True)
    assert json.loads(forwarded)["stream_options"] == {"include_usage": True}
    s.send(response_headers(200, "text/event-stream", served=epp.endpoint(3)))
    s.read(1)
    assert epp.call(lambda: epp.client.core.awaiting[0]) == 1  # no first token yet
    events = [
        {"choices": [{"delta": {"content": "Hel"}}]},
        {"choices": [{"delta": {"content": "lo"}}]},
        {"choices": [], "usage": {"prompt_tokens": 300, "completion_tokens": 2,
                                  "prompt_tokens_details": {"cached_tokens": 256}}},
    ]
    stream = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    stream += b"data: [DONE]\n\n"
    got = b""
    for i in range(0, len(stream), 40):  # split mid-event, as TCP does
        s.send(response_body(stream[i:i + 40], end=i + 40 >= len(stream)))
        got += streamed_bytes(s.read(1), request=False)[0]
        if i == 0:  # the first chunk is the first token: in flight, no longer awaiting it
            assert epp.call(lambda: (epp.client.core.awaiting[0],
                                     epp.client.core.inflight[0])) == (0, 1)
    assert epp.call(lambda: (epp.client.core.awaiting[0], epp.client.core.inflight[0])) == (0, 0)
    assert b"usage" not in got and got.count(b"data: ") == 3 and got.endswith(b"[DONE]\n\n")
    assert s.ended()
    hit = [e for e in epp.sink.events if e[0] == "cache_hit"]
    # the gateway retried on pod3 (the served endpoint): the outcome is pod3's
    assert len(hit) == 1 and hit[0][2] == "pod3" and hit[0][3]["cached_tokens"] == 256


def test_a_stream_broken_off_mid_request_counts_the_request_out(epp, channel):
    payload = chat()
    epp.publish({key_of(payload): (2,)})
    s, _ = route(channel, payload)
    assert epp.call(lambda: epp.client.core.inflight[2]) == 1
    s.cancel()  # the client went away before the engine answered
    eventually(lambda: epp.call(lambda: epp.client.core.inflight[2]) == 0, 5)


def test_engine_errors_are_reported_against_the_endpoint(epp, channel):
    payload = chat()
    epp.publish({key_of(payload): (1,)})
    s, _ = route(channel, payload)
    s.send(response_headers(503, "application/json"))
    s.read(1)
    s.send(response_body(b'{"error": "overloaded"}', end=True))
    s.read(1)
    assert s.ended()
    errors = [e for e in epp.sink.events if e[0] == "error"]
    assert errors and errors[0][2] == "pod1" and errors[0][3]["status_code"] == 503


def test_health_follows_usable_endpoints(epp, channel):
    stub = health_pb2_grpc.HealthStub(channel)
    serving = health_pb2.HealthCheckResponse.SERVING

    def status(name: str) -> int:
        return stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status

    assert status("liveness") == serving
    assert status(proto.SERVICE_NAME) == serving and status("readiness") == serving
    for d in ("pod0", "pod1", "pod2", "pod3"):
        epp.call(lambda d=d: epp.client.mark_down(d))
    eventually(lambda: status("readiness") == health_pb2.HealthCheckResponse.NOT_SERVING, 5)
    assert status("liveness") == serving


def test_the_command_serves_and_refuses_bad_settings(tmp_path):
    env = {**os.environ, "CACHEROUTE_EPP_FALLBACKS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner_svc.cli.main", "epp", "--port", "0", "--probe-path", "",
         "--destinations", "a=http://127.0.0.1:18001,b=http://127.0.0.1:18002"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("CACHEROUTE_EPP="), line
        with grpc.insecure_channel(line.strip().split("=", 1)[1]) as ch:
            s, answers = route(ch, chat())
            endpoints = destination_of(answers[0])[0].split(",")
            assert sorted(endpoints) == ["127.0.0.1:18001", "127.0.0.1:18002"]
            s.cancel()
    finally:
        proc.terminate()
        proc.wait(15)
    bad = subprocess.run(
        [sys.executable, "-m", "planner_svc.cli.main", "epp", "--destinations", "a=x:1"],
        capture_output=True, text=True, env={**os.environ, "CACHEROUTE_EPP_FALLBACKS": "two"},
        timeout=60)
    assert bad.returncode != 0 and "CACHEROUTE_EPP_FALLBACKS='two'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_key_sent_home_after_an_idle_gap_teaches_the_re_homing_window(epp, channel):
    """As in the gateway: a request the core sent home after an idle gap reports whether its
    prefix was cached there (the response's cached tokens against the prefix it reported)."""
    payload = chat()
    epp.publish({key_of(payload): (2,)})

    def learn() -> None:
        core = epp.client.core
        core.idle_rehome_s = 60.0
        core.learn_idle_rehome(EvictionWindow(60.0, min_outcomes=1, refresh_every=1))

    epp.call(learn)
    for cached in (0, 384, 0):  # first sight (no return), then a warm and a cold return
        s, answers = route(channel, payload)
        assert destination_of(answers[0])[0].split(",")[0] == epp.endpoint(2)
        served = {"id": "x", "choices": [{"message": {"content": "hi"}}],
                  "usage": {"prompt_tokens": 400, "completion_tokens": 5,
                            "prompt_tokens_details": {"cached_tokens": cached}}}
        s.send(response_headers(200, "application/json"))
        s.read(1)
        s.send(response_body(json.dumps(served).encode(), end=True))
        s.read(1)
        assert eventually(lambda: epp.call(lambda: epp.client.core.inflight[2]) == 0, 5)
    window = epp.call(lambda: epp.client.core.rehome_window)
    assert window.outcomes == 2  # the two returns, one warm and one cold


def test_queue_aware_moves_a_request_off_an_endpoint_that_owes_a_long_prefill(epp, channel):
    """As the gateway does with `--queue-aware` (on by default): a request does not queue
    behind a long prompt still prefilling on its key's endpoint when a recompute elsewhere
    finishes clearly sooner; once that prompt's first token came, the key's requests go home
    again. The picker weighs the prompt sizes it reads from the body, and gives back what
    each request owed at its first token or its end."""
    epp.call(lambda: setattr(epp.client.core, "queue_aware", True))
    long = chat("summarise this: " + "lorem ipsum " * 4000, stream=True)
    short = chat("a short one")
    assert key_of(long) == key_of(short)
    epp.publish({key_of(long): (0,)})

    def primary(answers: list) -> str:
        return destination_of(answers[0])[0].split(",")[0]

    def owed() -> list[float]:
        return list(epp.call(lambda: epp.client.core.owed))

    s_long, answers = route(channel, long)
    assert primary(answers) == epp.endpoint(0)
    assert owed()[0] > 10_000  # ~48,000 characters not cached there: ~12,000 tokens
    # it would wait behind the long prefill; the gateway's subset rules out one endpoint
    subset = [epp.endpoint(i) for i in (0, 1, 2)]
    s_moved, answers = route(channel, short, subset=subset)
    assert primary(answers) in subset[1:]
    s_long.send(response_headers(200, "text/event-stream"))
    s_long.read(1)
    s_long.send(response_body(b'data: {"choices": [{"delta": {"content": "A"}}]}\n\n',
                              end=False))
    s_long.read(1)
    assert owed()[0] == 0.0  # its first token came: its prefill is paid
    s_home, answers = route(channel, short)
    assert primary(answers) == epp.endpoint(0)
    for s in (s_long, s_moved, s_home):
        s.cancel()
    assert eventually(lambda: epp.call(lambda: sum(epp.client.core.inflight)) == 0, 5)
    assert owed() == [0.0] * 4
