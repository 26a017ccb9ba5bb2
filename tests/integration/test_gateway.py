"""The edge gateway with real clients (the openai SDK, sync and async) in front of the
emulated engines (a real HTTP server process). Planner-driven cases are in
test_gateway_planner.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx  # the HTTP client the openai SDK itself uses
import openai
import pytest

from planner_svc.devstack.engines import EngineFleet, start_engines
from router_client.eviction_window import EvictionWindow
from router_client.gateway import GatewaySettings
from router_client.health import HealthPolicy, ProbeSettings
from router_client.keys import derive_key
from router_client.plan import DestinationSpec
from router_client.routing import RouterCore
from tests.gateway_harness import GatewayThread, fault, gateway_process, last_request
from tests.timing import bound
from tests.waiting import eventually

pytestmark = pytest.mark.integration
SYSTEM = {"role": "system", "content": "You are a careful assistant for ACME Corp. " * 20}


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFleet]:
    # Time scale 0.02: a request takes tens of milliseconds, the model's shape kept.
    fleet = start_engines(tmp_path_factory.mktemp("engines"), 4,
                          extra=["--time-scale", "0.02", "--faults"])
    yield fleet
    fleet.stop()


@pytest.fixture()
def fleet(engines: EngineFleet) -> Iterator[EngineFleet]:
    """The engines, every fault cleared before and after the test."""
    for engine in engines.urls:
        fault(engines, engine, "up")
    yield engines
    for engine in engines.urls:
        fault(engines, engine, "up")


def specs(fleet: EngineFleet, **weights: float) -> list[DestinationSpec]:
    return [DestinationSpec(i, u, weights.get(i, 1.0)) for i, u in fleet.urls.items()]


@pytest.fixture()
def gw(fleet: EngineFleet) -> Iterator[GatewayThread]:
    g = GatewayThread(specs(fleet), settings=GatewaySettings(
        port=0, router_id="gw-test", first_byte_timeout_s=1.5, idle_timeout_s=1.0)).start()
    yield g
    g.stop()


def sdk(g: GatewayThread, **kw: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=g.url + "/v1", api_key="sk-test", max_retries=0, **kw)


def chat(client: openai.OpenAI, text: str = "hello", **kw: object):
    return client.chat.completions.create(
        model="m", messages=[SYSTEM, {"role": "user", "content": text}], **{"max_tokens": 8, **kw})


# --- proxying -----------------------------------------------------------------------

def test_chat_and_completions_non_streamed_with_usage_and_events(
        gw: GatewayThread, fleet: EngineFleet) -> None:
    body = {"model": "m", "messages": [SYSTEM, {"role": "user", "content": "hello"}]}
    key = derive_key(body, {}).key
    gw.publish(specs(fleet), {key: (2,)})  # the key admitted, pinned to e2
    assert gw.client is not None and eventually(lambda: gw.client.version.seq == 1)
    c = sdk(gw)
    first, second = chat(c), chat(c)
    assert first.choices[0].message.content and first.usage.prompt_tokens > 200
    # the same leading prefix keys to the same place: the second is served from its cache
    assert second.usage.prompt_tokens_details.cached_tokens >= 200
    done = c.completions.create(model="m", prompt="Once upon a time " * 30, max_tokens=5)
    assert done.choices[0].text and done.usage.completion_tokens == 5
    # events are emitted once a response is sent: the client can be done first
    assert eventually(lambda: Counter(gw.sink.kinds())["cache_hit"] == 3, 5)
    kinds = Counter(gw.sink.kinds())
    assert kinds["request"] == 3 and kinds["cache_hit"] == 3
    hit = [e for e in gw.sink.events if e[0] == "cache_hit"][1]
    assert hit[3]["cached_tokens"] == second.usage.prompt_tokens_details.cached_tokens
    assert hit[3]["prompt_tokens"] == second.usage.prompt_tokens and hit[3]["e2e_ms"] > 0


@pytest.mark.parametrize("include_usage", [False, True])
def test_streams_relay_and_usage_is_emitted_either_way(gw: GatewayThread,
                                                      include_usage: bool) -> None:
    c = sdk(gw)
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = list(chat(c, "stream please", stream=True, max_tokens=12, **options))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert len(text) == 12 * 4  # 12 tokens of 4 bytes
    usage_chunks = [ch for ch in chunks if ch.usage is not None]
    if include_usage:  # exactly what the client asked for: one usage chunk, last
        assert len(usage_chunks) == 1 and chunks[-1].usage.completion_tokens == 12
    else:
        assert usage_chunks == [] and all(ch.choices for ch in chunks)
    # The gateway emits usage after it has sent the last chunk: the client can be done first.
    assert eventually(lambda: any(e[0] == "cache_hit" for e in gw.sink.events), 5)
    hits = [e for e in gw.sink.events if e[0] == "cache_hit"]
    assert len(hits) == 1 and hits[0][3]["output_tokens"] == 12
    assert 0 < hits[0][3]["ttft_ms"] <= hits[0][3]["e2e_ms"]


def test_streamed_completions(gw: GatewayThread) -> None:
    c = sdk(gw)
    chunks = list(c.completions.create(model="m", prompt="abc " * 50, max_tokens=8, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices)
    # the gateway emits usage after the last chunk: the client can be done first
    assert eventually(lambda: len(gw.sink.events) == 2, 10), gw.sink.kinds()
    assert gw.sink.kinds() == ["request", "cache_hit"]


def test_async_sdk_and_500_concurrent_requests_all_answered(gw: GatewayThread) -> None:
    async def main() -> list[int]:
        c = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0,
                               http_client=openai.DefaultAsyncHttpxClient(
                                   limits=httpx.Limits(max_connections=500)))
        async def one(i: int) -> int:
            r = await c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"user {i % 40} asks"}],
                max_tokens=4)
            return r.usage.completion_tokens
        try:
            return await asyncio.gather(*(one(i) for i in range(500)))
        finally:
            await c.close()
    assert asyncio.run(main()) == [4] * 500
    assert Counter(gw.sink.kinds())["cache_hit"] == 500


def test_headers_pass_both_ways_with_request_id_and_trace(gw: GatewayThread,
                                                        fleet: EngineFleet) -> None:
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    c = sdk(gw, default_headers={"x-tenant": "acme", "traceparent": trace,
                                 "x-request-id": "req-123", "x-routing-key": "tenant-acme"})
    raw = c.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert raw.headers["x-request-id"] == "req-123"
    served_by = raw.headers["x-cacheroute-destination"]
    assert raw.headers["x-emulated-engine"] == served_by  # upstream response headers pass
    seen = dict((k.lower(), v) for k, v in last_request(fleet, served_by)["headers"])
    assert seen["authorization"] == "Bearer sk-test" and seen["x-tenant"] == "acme"
    assert seen["x-request-id"] == "req-123"
    version, trace_id, parent, flags = seen["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", trace.split("-")[1], "01")
    assert parent != trace.split("-")[2]  # the gateway is a hop: a new parent span
    assert "connection" not in seen or seen["connection"].lower() == "keep-alive"
    key = next(e for e in gw.sink.events if e[0] == "request")[1]
    assert key == "m/h:tenant-acme"


def test_unknown_paths_are_refused_clearly_and_models_aggregated(gw: GatewayThread) -> None:
    r = httpx.get(gw.url + "/admin")
    assert r.status_code == 404 and "no route" in r.json()["error"]["message"]
    assert [m.id for m in sdk(gw).models.list()] == ["emulated-model"]
    assert httpx.get(gw.url + "/readyz").json()["usable_destinations"] == 4
    assert "cacheroute_gateway_requests_total" in httpx.get(gw.url + "/metrics").text


def test_bad_bodies_get_clear_errors(gw: GatewayThread) -> None:
    r = httpx.post(gw.url + "/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(gw.url + "/v1/chat/completions", content=b"[1, 2]")
    assert r.status_code == 400
    r = httpx.post(gw.url + "/v1/chat/completions", content=b"x" * (9 << 20))
    assert r.status_code == 413


def test_a_request_trickled_past_the_request_timeout_gets_408_and_its_socket_back(
        fleet: EngineFleet) -> None:
    """Slowloris: a client that sends a request's headers a few bytes at a time (or starts
    a body it never finishes) is answered 408 and closed once `request_timeout_s` passes
    from its first byte; other clients are served meanwhile, and a request that arrives
    whole is not affected."""
    g = GatewayThread(specs(fleet), settings=GatewaySettings(
        port=0, router_id="gw-slow", request_timeout_s=1.0)).start()
    try:
        host, port = g.url.removeprefix("http://").split(":")
        slow = [socket.create_connection((host, int(port)), timeout=10) for _ in range(3)]
        slow[0].sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Pad: ")
        slow[1].sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Length: 100\r\n\r\n{\"model\": ")  # a body never finished
        slow[2].sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        while time.monotonic() - started < 0.8:  # trickling: every byte comes in time
            slow[0].sendall(b"a")
            assert chat(sdk(g)).choices  # others are served meanwhile
            time.sleep(0.2)
        for c in slow:
            answer = b""
            while chunk := c.recv(4096):  # read to the close
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
            c.close()
        assert "cacheroute_gateway_slow_requests_total 3.0" in httpx.get(g.url + "/metrics").text
    finally:
        g.stop()


# --- failures -------------------------------------------------------------------------

def pin(g: GatewayThread, fleet: EngineFleet, text: str, members: tuple[int, ...],
        seq: int = 1) -> None:
    """Admit the key of `chat(text)` to `members` in a plan the gateway applies."""
    body = {"model": "m", "messages": [SYSTEM, {"role": "user", "content": text}]}
    g.publish(specs(fleet), {derive_key(body, {}).key: members}, seq=seq)
    assert g.client is not None and eventually(lambda: g.client.version.seq == seq)


def _served_by(g: GatewayThread, text: str, client: openai.OpenAI | None = None) -> str:
    raw = (client or sdk(g)).chat.completions.with_raw_response.create(
        model="m", messages=[SYSTEM, {"role": "user", "content": text}], max_tokens=4)
    return str(raw.headers["x-cacheroute-destination"])


def test_a_backend_dying_mid_stream_reaches_the_client_as_an_error(
        gw: GatewayThread, fleet: EngineFleet) -> None:
    for engine in fleet.urls:
        fault(fleet, engine, "die_mid_stream", after_chunks=2)
    stream = chat(sdk(gw), "will break", stream=True, max_tokens=40)
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for _ in stream:
            pass
    assert eventually(lambda: len(gw.sink.events) == 2, 5)
    assert [e[0] for e in gw.sink.events] == ["request", "error"]
    assert gw.sink.events[1][3]["kind"] == "reset"


@pytest.mark.parametrize("linger_s", [0.3, 2.0])  # inside and past the 1-s idle timeout
def test_a_stream_is_counted_at_its_done_even_if_the_engine_closes_late(
        gw: GatewayThread, fleet: EngineFleet, linger_s: float) -> None:
    # The SDK hangs up as soon as it reads [DONE]; the engine here closes its side later.
    # The answer was whole: one usage event, no error, and the client saw a clean end.
    for engine in fleet.urls:
        fault(fleet, engine, "linger", delay_s=linger_s)
    chunks = list(chat(sdk(gw), "a whole answer", stream=True,
                       stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    assert eventually(lambda: "cache_hit" in gw.sink.kinds(), 10), gw.sink.kinds()
    time.sleep(linger_s + 0.2)  # past the engine's close: still no error recorded
    assert gw.sink.kinds() == ["request", "cache_hit"]


def test_a_streamed_request_stops_awaiting_at_its_first_event_and_ends_at_its_close(
        gw: GatewayThread, fleet: EngineFleet) -> None:
    """`--balance first-token` counts a request as awaiting a first token until its stream's
    first event: while an engine keeps a finished stream open it is in flight, not waiting.
    A non-streamed request waits until it ends."""
    assert gw.client is not None
    core = gw.client.core
    for engine in fleet.urls:
        fault(fleet, engine, "linger", delay_s=3.0)
    body = {"model": "m", "stream": True, "max_tokens": 8,
            "messages": [SYSTEM, {"role": "user", "content": "a whole answer"}]}
    # The client holds its connection open (an SDK that read [DONE] hangs up, which ends the
    # request at once): the gateway is still draining the lingering engine, so the request is
    # in flight, its first token long past.
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=10) as reply:
        lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        assert eventually(lambda: sum(core.inflight) == 1, 2.0)
        assert sum(core.awaiting) == 0
    assert eventually(lambda: sum(core.inflight) == 0, 10.0)
    assert sum(core.awaiting) == 0
    for engine in fleet.urls:
        fault(fleet, engine, "up")
    chat(sdk(gw), "not streamed")
    # The answer reaches this thread as the gateway's thread writes it, a moment before that
    # thread counts the request out (CI caught the moment between).
    assert eventually(lambda: sum(core.inflight) == 0 and sum(core.awaiting) == 0, 2.0)


@pytest.mark.parametrize("queue_aware", [False, True])
def test_queue_aware_sends_a_burst_past_the_queued_warm_engine_and_settles_its_books(
        fleet: EngineFleet, queue_aware: bool) -> None:
    """A burst of one tenant's new conversations, its key planned on one engine that is
    slow to answer: with --queue-aware, once waiting there costs more than recomputing the
    prompt elsewhere, requests go elsewhere (the rest stay); without it, all wait there.
    Either way the prefill work the core counted as owed is repaid to the last token."""
    g = GatewayThread(specs(fleet), settings=GatewaySettings(
        port=0, router_id="gw-queue", first_byte_timeout_s=10, idle_timeout_s=10)).start()
    try:
        assert g.client is not None
        core = g.client.core
        core.queue_aware = queue_aware
        pin(g, fleet, "burst", (0,))
        warm = next(iter(fleet.urls))
        fault(fleet, warm, "slow", delay_s=1.0)

        async def one(client: httpx.AsyncClient, n: int) -> str:
            body = {"model": "m", "stream": True, "max_tokens": 4,
                    "messages": [SYSTEM, {"role": "user", "content": f"question {n}"}]}
            async with client.stream("POST", g.url + "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                [line async for line in r.aiter_lines()]
                return str(r.headers["x-cacheroute-destination"])

        async def burst() -> list[str]:
            async with httpx.AsyncClient(timeout=20) as client:
                return list(await asyncio.gather(*(one(client, n) for n in range(12))))

        served = Counter(asyncio.run(burst()))
        if queue_aware:
            assert 1 <= served[warm] < 12, served
            assert core.counters()["queue_spilled"] == 12 - served[warm]
        else:
            assert served == {warm: 12}
            assert core.counters()["queue_spilled"] == 0
        assert eventually(lambda: sum(core.inflight) == 0, 5.0)
        assert core.owed == [0.0] * len(core.owed) and sum(core.awaiting) == 0
    finally:
        fault(fleet, next(iter(fleet.urls)), "up")
        g.stop()


def test_a_slow_backend_is_not_sent_the_request_twice(gw: GatewayThread,
                                                     fleet: EngineFleet) -> None:
    before = {i: last_request(fleet, i).get("received", 0) for i in fleet.urls}
    for engine in fleet.urls:
        fault(fleet, engine, "slow", delay_s=0.6)  # slower than usual, inside the 1.5 s first byte
    assert chat(sdk(gw), "patience").usage.completion_tokens == 8
    for engine in fleet.urls:
        fault(fleet, engine, "slow", delay_s=3.0)  # past the first-byte timeout: 504, never a retry
    with pytest.raises(openai.APIStatusError) as err:
        chat(sdk(gw), "too slow")
    assert err.value.status_code == 504
    after = {i: last_request(fleet, i).get("received", 0) for i in fleet.urls}
    assert sum(after.values()) - sum(before.values()) == 2  # each request reached one engine


def test_connect_refused_is_retried_elsewhere_invisibly(gw: GatewayThread,
                                                       fleet: EngineFleet) -> None:
    pin(gw, fleet, "sticky question", (1,))
    victim = _served_by(gw, "sticky question")
    assert victim == "e1"
    fault(fleet, victim, "down")
    for _ in range(10):
        assert _served_by(gw, "sticky question") != victim
    assert Counter(e[3]["kind"] for e in gw.sink.events if e[0] == "error")["connect_error"] >= 1


def test_5xx_ejects_then_traffic_moves_and_recovery_readmits(fleet: EngineFleet) -> None:
    # Ejected for 8 s: long enough for the 10 requests below on a loaded machine (with 1 s,
    # and once on a loaded CI run with 4 s and a new client per check, the victim was
    # readmitted in their midst and its next 500 reached the client).
    g = GatewayThread(specs(fleet), health=HealthPolicy(
        consecutive_failures=3, base_ejection_s=8.0, max_ejection_s=8.0),
        settings=GatewaySettings(port=0, router_id="gw-5xx")).start()
    try:
        c = sdk(g)
        pin(g, fleet, "the same question", (2,))
        victim = _served_by(g, "the same question")
        fault(fleet, victim, "status", status=500)
        codes = []
        for _ in range(3):  # a 500 may have generated: passed through, not retried
            with pytest.raises(openai.InternalServerError):
                chat(c, "the same question")
            codes.append(500)
        assert g.client is not None and not g.client.core.is_usable(victim)
        assert all(_served_by(g, "the same question", c) != victim for _ in range(10))
        fault(fleet, victim, "ok")
        assert eventually(lambda: g.client.core.is_usable(victim), 15.0)
        assert g.client.ejections >= 1 and g.client.readmissions >= 1
    finally:
        g.stop()


def test_a_hanging_backend_times_out_is_ejected_and_comes_back_by_probe(
        fleet: EngineFleet) -> None:
    g = GatewayThread(
        specs(fleet), health=HealthPolicy(consecutive_failures=2, base_ejection_s=60.0,
                                          unhealthy_after=1, healthy_after=1),
        probe=ProbeSettings(path="/health", period_s=0.2, timeout_s=0.5),
        settings=GatewaySettings(port=0, router_id="gw-hang", first_byte_timeout_s=0.5)).start()
    try:
        pin(g, fleet, "hang on", (0,))
        victim = _served_by(g, "hang on")
        fault(fleet, victim, "hang")
        for _ in range(2):
            with pytest.raises(openai.APIStatusError) as err:
                chat(sdk(g), "hang on")
            assert err.value.status_code == 504
        assert g.client is not None and not g.client.core.is_usable(victim)
        assert _served_by(g, "hang on") != victim
        fault(fleet, victim, "unhealthy")  # probes now fail too
        assert eventually(lambda: any(v.probed_down for v in g.client.health_views()), 3.0)
        fault(fleet, victim, "ok")
        # The 60 s ejection still holds: probes alone do not override outlier detection.
        time.sleep(0.6)
        assert not g.client.core.is_usable(victim)
    finally:
        g.stop()


def test_503_overload_is_retried_on_another_destination(gw: GatewayThread,
                                                       fleet: EngineFleet) -> None:
    pin(gw, fleet, "overloaded key", (3,))
    victim = _served_by(gw, "overloaded key")
    fault(fleet, victim, "status", status=503)
    assert _served_by(gw, "overloaded key") != victim
    assert gw.gateway is not None
    for engine in fleet.urls:
        fault(fleet, engine, "status", status=503)
    with pytest.raises(openai.APIStatusError) as err:  # everything overloaded: passed through
        chat(sdk(gw), "overloaded key")
    assert err.value.status_code == 503 and err.value.response.headers["retry-after"] == "1"


# --- drain and weights (through the plan the router follows) ---------------------------

def test_drain_moves_every_new_request_off_within_a_second(gw: GatewayThread,
                                                          fleet: EngineFleet) -> None:
    dests = specs(fleet)
    gw.publish(dests, {"m/h:k1": (0, 3)})
    assert gw.client is not None and eventually(lambda: gw.client.version.seq == 1)
    drained = dests[3].id
    gw.publish([*dests[:3], DestinationSpec(drained, dests[3].address, draining=True)],
               {"m/h:k1": (0, 3)}, seq=2)
    t0 = time.monotonic()
    assert eventually(lambda: gw.client.version.seq == 2, 10.0)
    bound(time.monotonic() - t0, 1.0, "drained plan applied after, s")
    c = sdk(gw, default_headers={"x-routing-key": "k1"})
    seen = Counter()
    for i in range(60):
        raw = c.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=2)
        seen[raw.headers["x-cacheroute-destination"]] += 1
        seen[_served_by(gw, f"unplanned {i}")] += 1
    assert seen[drained] == 0 and sum(seen.values()) == 120


def test_capacity_weights_4_to_1_split_the_load_4_to_1(tmp_path: Path) -> None:
    # Engines whose model costs nothing, each request held 200 ms: equal service times, and
    # the 50 clients' own time is small beside it, so ~50 are in flight all along.
    fleet = start_engines(tmp_path, 2, extra=["--time-scale", "0", "--faults"])
    big, small = list(fleet.urls)
    dests = [DestinationSpec(big, fleet.urls[big], 4.0),
             DestinationSpec(small, fleet.urls[small], 1.0)]
    g = GatewayThread(dests, settings=GatewaySettings(port=0, router_id="gw-w")).start()
    try:
        g.publish(dests)
        assert g.client is not None and eventually(lambda: g.client.version.seq == 1)
        for engine in (big, small):
            fault(fleet, engine, "slow", delay_s=0.2)

        core = g.client.core
        slot_big, slot_small = core.destination_ids.index(big), core.destination_ids.index(small)
        # what the weights decide: the split of requests in flight, sampled while most of the
        # 50 are out (20 or more: a loaded machine keeps fewer out, the split holds at any count)
        held: list[tuple[int, int]] = []

        async def main() -> Counter[str]:
            seen: Counter[str] = Counter()
            async with httpx.AsyncClient(base_url=g.url, timeout=30) as h:
                async def worker(w: int) -> None:
                    rng = random.Random(w)
                    for i in range(16):
                        # a think time, so the 50 clients do not move in lockstep
                        await asyncio.sleep(rng.random() * 0.02)
                        r = await h.post("/v1/completions", json={
                            "model": "m", "prompt": f"w{w} n{i}", "max_tokens": 2})
                        seen[r.headers["x-cacheroute-destination"]] += 1

                async def sample(done: asyncio.Event) -> None:
                    while not done.is_set():
                        # the gateway's own loop writes these; a torn read is one sample
                        inflight = list(core.inflight)
                        if inflight[slot_big] + inflight[slot_small] >= 20:
                            held.append((inflight[slot_big], inflight[slot_small]))
                        await asyncio.sleep(0.01)

                done = asyncio.Event()
                sampler = asyncio.create_task(sample(done))
                await asyncio.gather(*(worker(w) for w in range(50)))
                done.set()
                await sampler
            return seen
        seen = asyncio.run(main())
        assert sum(seen.values()) == 800
        # At 4:1 the lighter engine holds a fifth of what is in flight (10 of 50): on average
        # within one request of it (0.3-0.5 measured on 2 cores under three busy loops or CI; equal
        # weights would be ~15 off, 3:1 ~2.5 off).
        assert len(held) >= 20, f"only {len(held)} samples with 20 or more in flight"
        off = sum(abs(s - (b + s) / 5) for b, s in held) / len(held)
        assert off <= 1.0, f"lighter engine {off:.2f} requests off a fifth: {held[:20]}"
        # Every request waits the same 200 ms at either engine, so the served split follows the
        # in-flight split (Little's law). Looser: while fewer than five are in flight (the
        # ramp-up and the tail, longer on a loaded CI machine) the lighter engine takes none,
        # which pushed this ratio to 4.41 twice against a 10 % bound.
        assert seen[big] / seen[small] == pytest.approx(4.0, rel=0.2)
    finally:
        g.stop()
        fleet.stop()


def test_graceful_shutdown_finishes_in_flight_streams(fleet: EngineFleet) -> None:
    g = GatewayThread(specs(fleet), settings=GatewaySettings(port=0, router_id="gw-stop",
                                                             shutdown_grace_s=10)).start()
    for engine in fleet.urls:
        fault(fleet, engine, "slow", delay_s=0.5)
    stream = chat(sdk(g), "long answer", stream=True, max_tokens=20)
    stopping = asyncio.run_coroutine_threadsafe(g.gateway.stop(), g.loop)  # type: ignore[union-attr]
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert len(text) == 80
    stopping.result(10)
    with pytest.raises(httpx.ConnectError):
        httpx.get(g.url + "/healthz")
    g.gateway = None
    g.stop()


def test_readiness_fails_while_stopping(gw: GatewayThread) -> None:
    assert httpx.get(gw.url + "/readyz").status_code == 200
    assert gw.gateway is not None
    gw.gateway.stopping = True
    assert httpx.get(gw.url + "/readyz").status_code == 503
    gw.gateway.stopping = False


def test_gateway_cli_serves_and_stops(tmp_path: Path, fleet: EngineFleet) -> None:
    with gateway_process("--destinations", fleet.destinations(), "--probe-path", "") as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                      max_tokens=3)
        assert r.usage.completion_tokens == 3


def test_clients_gone_mid_response_do_not_end_the_gateway_process(tmp_path: Path) -> None:
    """Clients that close their connection before the response (a load tester stopping, a
    browser tab closed) cost the gateway a write error each, not its life: the process runs
    on, serves, and stops cleanly (gateway_process checks the exit code). The command line
    once restored SIGPIPE's default action for every command, servers included: the
    response's first write drew a reset from the closed socket and the second one killed
    the gateway (found when `wrk` ended a run of bench/gateway.py). Instant engines: the
    response is written before the gateway reads the client's close."""
    instant = start_engines(tmp_path, 2, extra=["--time-scale", "0"])
    with contextlib.ExitStack() as stack:
        stack.callback(instant.stop)
        url = stack.enter_context(gateway_process("--destinations", instant.destinations(),
                                                  "--probe-path", ""))
        host, port = url.removeprefix("http://").split(":")
        for stream in (True, False):
            body = json.dumps({"model": "m", "stream": stream, "max_tokens": 64,
                               "messages": [{"role": "user", "content": "hi " * 50}]})
            request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
                       f"Content-Type: application/json\r\nContent-Length: {len(body)}"
                       f"\r\n\r\n{body}").encode()
            for delay_ms in range(0, 24, 2):  # closed as the gateway begins to answer
                conns = [socket.create_connection((host, int(port)), timeout=10)
                         for _ in range(64)]
                for c in conns:
                    c.sendall(request)
                time.sleep(delay_ms / 1000)
                for c in conns:
                    c.close()  # the gateway writes the rest of its answer into it
                time.sleep(0.05)
        c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                      max_tokens=3)
        assert r.usage.completion_tokens == 3


def test_a_key_sent_home_after_an_idle_gap_teaches_the_re_homing_window(
        gw: GatewayThread, fleet: EngineFleet) -> None:
    """With `--idle-rehome-s` learned (`--idle-rehome-learn`, on by default), each request the
    core sends back to its key's home after an idle gap reports, from the response's cached
    tokens, whether the prefix was still there; the window and what it rests on are in the
    router's metrics."""
    assert gw.client is not None
    core = gw.client.core
    gw.publish(specs(fleet))  # a plan (re-homing steps aside in fallback): every key cold tail
    assert eventually(lambda: core.mode == "planned", 5.0)
    core.idle_rehome_s = 60.0
    gw.run(_learn(core))
    client = sdk(gw)
    chat(client, "first sight: no return")
    assert core.rehome_window is not None and core.rehome_window.outcomes == 0
    chat(client, "back soon: home, and its system prompt is cached there")
    list(chat(client, "streamed back", stream=True))
    assert eventually(lambda: core.rehome_window is not None
                      and core.rehome_window.outcomes == 2, 5.0)
    assert core.idle_rehome_s >= 60.0  # every return warm: nothing says it is shorter
    text = httpx.get(gw.url + "/metrics", timeout=5).text
    assert 'cacheroute_router_rehome_outcomes{router="gw-test"} 2.0' in text
    assert "cacheroute_router_rehome_window_s{" in text


async def _learn(core: RouterCore) -> None:
    # On the gateway's loop, where the core is used; min_outcomes=1: each outcome counts.
    core.learn_idle_rehome(EvictionWindow(60.0, min_outcomes=1, refresh_every=1))


def test_idle_sockets_at_the_descriptor_limit_neither_starve_connected_clients_nor_eject_engines(
        tmp_path: Path, fleet: EngineFleet) -> None:
    """The gateway with 256 file descriptors and 300 idle client sockets opened at it: the
    connections past half its descriptors are closed at once, so a client already
    connected is still served and no engine is ejected. (Without the cap the engines'
    connects failed with EMFILE and a healthy engine was ejected as unreachable.)"""
    import resource
    import subprocess
    import sys

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    log = (tmp_path / "gw.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner_svc.cli.main", "gateway", "--port", "0",
         "--destinations", fleet.destinations(), "--probe-path", ""],
        stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=limit)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip().split("=", 1)[1]
        host, port = url.removeprefix("http://").split(":")
        with httpx.Client(base_url=url, timeout=10) as kept:  # connected before the flood
            assert kept.get("/healthz").status_code == 200
            idle = []
            for _ in range(300):
                try:
                    idle.append(socket.create_connection((host, int(port)), timeout=5))
                except OSError:
                    break
            for i in range(8):
                r = kept.post("/v1/chat/completions", json={
                    "model": "m", "max_tokens": 2,
                    "messages": [{"role": "user", "content": f"q {i}"}]})
                assert r.status_code == 200, r.text
            for s in idle:
                s.close()
            ready = kept.get("/readyz").json()
        assert ready["usable_destinations"] == len(fleet.urls)
        metrics = httpx.get(url + "/metrics", timeout=5).text
        refused = next(line for line in metrics.splitlines()
                       if line.startswith("cacheroute_gateway_refused_connections_total"))
        assert float(refused.split()[-1]) > 0
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()
