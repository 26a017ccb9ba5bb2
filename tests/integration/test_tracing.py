"""Traces (router_client.tracing): one request through a real gateway (and one ext_proc stream
through a real endpoint picker), with tracing pointed at an in-process OTLP collector, arrives
there as the expected spans; with tracing off nothing arrives and OpenTelemetry is never
imported.

The collector is a gRPC server implementing OTLP's TraceService.Export (from the
opentelemetry-proto package) on a free port; the engines are the emulator's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import httpx2 as httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as pb_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from planner_svc.devstack.engines import EngineFleet, start_engines
from router_client.epp.exchange import EppSettings
from router_client.gateway import GatewaySettings
from router_client.keys import derive_key
from router_client.plan import DestinationSpec
from tests.epp_harness import (
    EppThread,
    ExtProcStream,
    destination_of,
    destinations,
    request_body,
    request_headers,
    response_body,
    response_headers,
)
from tests.gateway_harness import GatewayThread, gateway_process, last_request
from tests.waiting import eventually

pytestmark = pytest.mark.integration
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
BODY = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}


class Collector(pb_grpc.TraceServiceServicer):
    """Keeps every span exported to it, with its resource's attributes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[tuple[dict[str, Any], Span]] = []

    def Export(self, request: pb.ExportTraceServiceRequest,  # the gRPC method's name
               context: grpc.ServicerContext) -> pb.ExportTraceServiceResponse:
        with self.lock:
            for rs in request.resource_spans:
                resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    self.spans.extend((resource, s) for s in ss.spans)
        return pb.ExportTraceServiceResponse()

    def of_trace(self, trace_id: str) -> list[tuple[dict[str, Any], Span]]:
        with self.lock:
            return [(r, s) for r, s in self.spans if s.trace_id.hex() == trace_id]


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind is not None else None


def attrs(span: Span) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in span.attributes}


@pytest.fixture(scope="module")
def collector() -> Iterator[tuple[Collector, str]]:
    servicer = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"http://127.0.0.1:{port}"
    server.stop(None)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFleet]:
    engines = start_engines(tmp_path_factory.mktemp("engines"), 3,
                            extra=["--time-scale", "0", "--faults"])
    yield engines
    engines.stop()


def post(url: str, traceparent: str, key: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json=BODY, timeout=10,
                      headers={"traceparent": traceparent, "x-routing-key": key})


def test_one_request_yields_a_server_span_and_an_engine_span(
        collector: tuple[Collector, str], fleet: EngineFleet) -> None:
    spans, endpoint = collector
    dests = [DestinationSpec(i, u) for i, u in fleet.urls.items()]
    gw = GatewayThread(dests, settings=GatewaySettings(
        port=0, router_id="gw-traced", otlp_endpoint=endpoint)).start()
    try:
        gw.publish(dests, {"m/h:tenant-acme": (2,)})  # the key planned on the third engine
        assert gw.client is not None and eventually(lambda: gw.client.version.seq == 1)
        r = post(gw.url, TRACEPARENT, "tenant-acme")
        assert r.status_code == 200
        served = r.headers["x-cacheroute-destination"]
        seen = dict((k.lower(), v) for k, v in last_request(fleet, served)["headers"])
        assert eventually(lambda: len(spans.of_trace(TRACE_ID)) >= 2, 15.0)
    finally:
        gw.stop()  # flushes the batch: nothing else may arrive after this
    got = spans.of_trace(TRACE_ID)
    assert len(got) == 2, [s.name for _, s in got]
    (resource, server), = [(r, s) for r, s in got if s.kind == Span.SPAN_KIND_SERVER]
    engine, = [s for _, s in got if s.kind == Span.SPAN_KIND_CLIENT]
    assert resource["service.name"] == "cacheroute-gateway"
    assert resource["service.instance.id"] == "gw-traced"
    # The client's trace continued: the request span's parent is the client's span, the
    # engine span's parent is the request span, and the engine was told the engine span.
    assert server.name == "POST /v1/chat/completions"
    assert server.parent_span_id.hex() == CLIENT_SPAN
    assert engine.name == "engine" and engine.parent_span_id == server.span_id
    assert seen["traceparent"] == f"00-{TRACE_ID}-{engine.span_id.hex()}-01"
    a = attrs(server)
    assert a["cacheroute.key"] == "m/h:tenant-acme"
    assert a["cacheroute.mode"] == "planned"
    assert a["cacheroute.decision"] == "planned"  # the counter the core moved
    assert a["cacheroute.slot"] == 2 and a["cacheroute.destination"] == dests[2].id == served
    assert a["cacheroute.attempts"] == 1 and a["http.response.status_code"] == 200
    e = attrs(engine)
    assert e["cacheroute.attempt"] == 0 and e["cacheroute.destination"] == served
    assert e["server.address"] == dests[2].address and e["http.response.status_code"] == 200
    assert server.start_time_unix_nano <= engine.start_time_unix_nano
    assert engine.end_time_unix_nano <= server.end_time_unix_nano


def test_the_flag_turns_tracing_on_and_without_it_nothing_is_sent(
        collector: tuple[Collector, str], fleet: EngineFleet,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`cacheroute gateway --otlp-endpoint`: the process's spans arrive (flushed at its
    SIGTERM); without the flag (nor OTEL_EXPORTER_OTLP_ENDPOINT) none do."""
    spans, endpoint = collector
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    on, off = "11" * 16, "22" * 16
    argv = ("--destinations", fleet.destinations(), "--probe-path", "")
    with gateway_process(*argv, "--otlp-endpoint", endpoint) as url:
        assert post(url, f"00-{on}-{CLIENT_SPAN}-01", "t-on").status_code == 200
    assert sorted(s.name for _, s in spans.of_trace(on)) == ["POST /v1/chat/completions",
                                                             "engine"]
    with gateway_process(*argv) as url:
        assert post(url, f"00-{off}-{CLIENT_SPAN}-01", "t-off").status_code == 200
    time.sleep(0.5)
    assert spans.of_trace(off) == []


def test_tracing_off_never_imports_opentelemetry() -> None:
    """Off (the default), building and serving a gateway loads no OpenTelemetry module."""
    code = """
import asyncio, json, sys
from router_client.aio import AsyncRouterClient
from router_client.gateway import Gateway, GatewaySettings
from router_client.source import AsyncStaticPlanSource, StaticPlanSource
import planner_svc.cli.gateway_cmd

async def main():
    static = StaticPlanSource()
    client = AsyncRouterClient(AsyncStaticPlanSource(static), router_id="g",
                               public_keys=static.public_keys, destination_ids=["e0"],
                               addresses={"e0": "http://127.0.0.1:9"})
    gw = Gateway(client, GatewaySettings(port=0))
    await gw.start()
    await gw.stop()
    return gw.tracing, gw.proxy.tracing

result = asyncio.run(main())
print(json.dumps([repr(result), sorted(m for m in sys.modules if m.startswith("opentelemetry"))]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={k: v for k, v in os.environ.items()
                                                   if not k.startswith("OTEL_")})
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["(None, None)", []]


def test_the_picker_traces_each_stream_with_its_pick(collector: tuple[Collector, str]) -> None:
    """The endpoint picker (ext_proc): one span per routed stream, continuing the request's
    traceparent, with the pick's stages and the endpoint the gateway reported serving."""
    spans, endpoint = collector
    trace_id = "33" * 16
    epp = EppThread(destinations(3), EppSettings(router_id="epp-traced",
                                                 otlp_endpoint=endpoint)).start()
    try:
        payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        key = derive_key(payload, {}).key
        epp.publish({key: (1,)})
        with grpc.insecure_channel(f"127.0.0.1:{epp.port}") as channel:
            s = ExtProcStream(channel)
            s.send(request_headers({"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"}),
                   request_body(json.dumps(payload).encode(), end=True))
            answers = s.read(2)
            named = destination_of(answers[0])[0].split(",")
            assert named[0] == epp.endpoint(1)
            s.send(response_headers(200, "application/json", served=epp.endpoint(1)))
            s.read(1)
            s.send(response_body(b'{"choices": []}', end=True))
            s.read(1)
            assert s.ended()
        assert eventually(lambda: len(spans.of_trace(trace_id)) >= 1, 15.0)
    finally:
        epp.stop()
    (resource, span), = spans.of_trace(trace_id)
    assert resource["service.name"] == "cacheroute-epp"
    assert span.name == "ext_proc pick" and span.kind == Span.SPAN_KIND_SERVER
    assert span.parent_span_id.hex() == CLIENT_SPAN
    a = attrs(span)
    assert a["cacheroute.key"] == key and a["cacheroute.mode"] == "planned"
    assert a["cacheroute.decision"] == "planned"
    assert a["cacheroute.slot"] == 1 and a["cacheroute.destination"] == "pod1"
    assert a["cacheroute.served"] == "pod1" and a["http.response.status_code"] == 200
    assert [v.string_value for v in a["cacheroute.endpoints"].values] == named
