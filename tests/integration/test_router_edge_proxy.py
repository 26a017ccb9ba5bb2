"""The example edge proxy against stub OpenAI-compatible backends (real HTTP on loopback)."""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from router_client import RouterClient, StaticPlanSource
from router_client.plan import DestinationSpec, KeyTable, PlanConfig, RoutingPlan, Version

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.edge_proxy.proxy import EdgeProxy, routing_key

pytestmark = pytest.mark.integration


class StubEngine:
    """An OpenAI-compatible backend with a toy prefix cache: a (model, user) seen before hits."""

    def __init__(self, name: str) -> None:
        self.name, self.seen, self.requests = name, set(), 0
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                self._send(200, {"data": [{"id": "m"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                engine.requests += 1
                ident = (body.get("model"), body.get("user"))
                usage = {
                    "prompt_tokens": 100,
                    "completion_tokens": 5,
                    "prompt_tokens_details": {"cached_tokens": 80 if ident in engine.seen else 0},
                }
                engine.seen.add(ident)
                if body.get("stream"):
                    return self._stream(usage)
                self._send(
                    200,
                    {
                        "id": "x",
                        "object": "chat.completion",
                        "system_fingerprint": engine.name,
                        "choices": [{"message": {"content": "hi"}}],
                        "usage": usage,
                    },
                )

            def _send(self, status, obj) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, usage) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                chunks = [
                    {"choices": [{"delta": {"content": "h"}}]},
                    {"choices": [], "usage": usage},
                ]
                for c in chunks:
                    self.wfile.write(b"data: " + json.dumps(c).encode() + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class RecordingSink:
    def __init__(self) -> None:
        self.requests: list[tuple] = []
        self.hits: list[tuple] = []

    def emit_request(self, routing_key, destination, **kw) -> bool:
        self.requests.append((routing_key, destination, kw["prompt_tokens"]))
        return True

    def emit_cache_hit(self, routing_key, destination, **kw) -> bool:
        self.hits.append((routing_key, destination, kw["cached_tokens"]))
        return True


@pytest.fixture()
def fleet():
    engines = [StubEngine(f"b{i}") for i in range(3)]
    yield engines
    for e in engines:
        e.stop()


def _plan(engines) -> RoutingPlan:
    keys = ["m/alice", "m/bob", "m/carol"]
    return RoutingPlan(
        config=PlanConfig(10.0, 4, 12),
        destinations=tuple(DestinationSpec(e.name, e.address) for e in engines),
        table=KeyTable.from_sets(keys, [(0,), (2,), (1, 2)], [3.0, 2.0, 1.0]),
        version=Version(1, 1),
    )


def _post(url: str, body: dict, key: str | None = None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["X-Routing-Key"] = key
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.headers.get("X-Routed-To"), resp.read()


def _until(cond, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert cond()


@pytest.fixture()
def proxy(fleet):
    src = StaticPlanSource()
    src.publish(_plan(fleet))
    client = RouterClient(
        src, router_id="edge-test", public_keys=src.public_keys, recheck_s=0.05
    ).start(initial_wait_s=5)
    sink = RecordingSink()
    p = EdgeProxy(client, {}, sink=sink, health_every_s=0.2).start()  # addresses from the plan
    yield p, sink
    p.stop()
    client.stop()


def test_routing_key_folds_in_model_and_cache_salt():
    assert routing_key("t1", {"model": "m", "user": "u"}) == "m/t1"
    assert routing_key(None, {"model": "m", "user": "u", "cache_salt": "s"}) == "m/u#s"


def test_requests_follow_the_plan_and_emit_usage_events(proxy, fleet):
    p, sink = proxy
    for i in range(3):
        dest, body = _post(p.url, {"model": "m", "user": "alice", "messages": []})
        assert dest == "b0" and json.loads(body)["system_fingerprint"] == "b0"
        _until(lambda n=i + 1: len(sink.hits) == n)
    dest, _ = _post(p.url, {"model": "m", "messages": []}, key="bob")  # header wins
    assert dest == "b2"
    _until(lambda: len(sink.hits) == 4)
    assert sink.requests[0] == ("m/alice", "b0", 100)
    assert [h[2] for h in sink.hits[:3]] == [0, 80, 80]  # warm after the first request
    dest, _ = _post(p.url, {"model": "m", "user": "zed", "messages": []})  # unadmitted: P2C
    assert dest in {"b0", "b1", "b2"}
    assert p.client.core.unadmitted == 1 and p.client.core.planned == 4
    with urllib.request.urlopen(p.url + "/metrics", timeout=5) as resp:
        assert b'path="planned"} 4' in resp.read()


def test_streaming_passes_through_and_reads_usage_from_the_last_chunk(proxy):
    p, sink = proxy
    body = {
        "model": "m",
        "user": "bob",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [],
    }
    dest, data = _post(p.url, body)
    assert dest == "b2" and data.rstrip().endswith(b"data: [DONE]")
    # events are emitted right after the response is relayed: allow the handler to finish
    deadline = time.monotonic() + 5
    while not sink.hits and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sink.hits[-1] == ("m/bob", "b2", 0)


def test_unreachable_backend_is_marked_down_and_traffic_rerouted_then_restored(proxy, fleet):
    p, _sink = proxy
    fleet[0].stop()
    dest, _ = _post(p.url, {"model": "m", "user": "alice", "messages": []})
    assert dest in {"b1", "b2"}  # retried elsewhere, the client did not see an error
    assert "b0" in p.down and not p.client.core.is_healthy("b0")
    dest, _ = _post(p.url, {"model": "m", "user": "alice", "messages": []})
    assert dest != "b0" and p.client.core.unhealthy_reroute >= 1


def test_events_reach_kafka_through_the_real_emitter(fleet, broker):
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from cacheroute.v1 import events_pb2
    from streams.emitter import EventEmitter

    topic = f"edge-proxy-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    src = StaticPlanSource()
    src.publish(_plan(fleet))
    client = RouterClient(src, router_id="edge-kafka", public_keys=src.public_keys).start(5)
    emitter = EventEmitter(broker.bootstrap, topic, producer_id="edge-kafka-test")
    p = EdgeProxy(client, {}, sink=emitter).start()
    try:
        for _ in range(2):
            _post(p.url, {"model": "m", "user": "alice", "messages": []})
        emitter.flush(10)
    finally:
        p.stop()
        client.stop()
        emitter.close(10)
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "t", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    events = []
    deadline = time.monotonic() + 15
    while len(events) < 4 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            events += list(events_pb2.EventBatch.FromString(msg.value()).events)
    consumer.close()
    assert len(events) == 4
    kinds = sorted(e.WhichOneof("body") for e in events)
    assert kinds == ["cache_hit", "cache_hit", "request", "request"]
    hits = [e.cache_hit for e in events if e.WhichOneof("body") == "cache_hit"]
    assert {(h.routing_key, h.destination) for h in hits} == {("m/alice", "b0")}
    assert sorted(h.cached_tokens for h in hits) == [0, 80]
