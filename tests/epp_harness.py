"""A real endpoint picker (gRPC server, router client, static plan source) on its own event
loop thread, and a gRPC client that speaks to it as Envoy's ext_proc filter does: one
bidirectional stream per HTTP request, request headers, body pieces, then the response.

The picker never connects to the engines (the gateway does), so the destinations here are
addresses only; active probes are off.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pm
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from google.protobuf import json_format, struct_pb2

from router_client.aio import AsyncRouterClient
from router_client.epp import protocol as proto
from router_client.epp.exchange import EppSettings
from router_client.epp.server import EndpointPickerServer
from router_client.plan import DestinationSpec, KeyTable, PlanConfig, RoutingPlan, Version
from router_client.source import AsyncStaticPlanSource, StaticPlanSource
from tests.gateway_harness import RecordingSink

FULL_DUPLEX = pm.ProcessingMode.FULL_DUPLEX_STREAMED
BUFFERED = pm.ProcessingMode.BUFFERED


def destinations(n: int) -> list[DestinationSpec]:
    return [DestinationSpec(f"pod{i}", f"http://10.1.0.{10 + i}:8000") for i in range(n)]


class EppThread:
    def __init__(self, dests: list[DestinationSpec], settings: EppSettings | None = None) -> None:
        self.static = StaticPlanSource()
        self.dests = dests
        self.settings = settings or EppSettings(router_id="epp-test")
        self.sink = RecordingSink()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.client: AsyncRouterClient | None = None
        self.server: EndpointPickerServer | None = None
        self.port = 0

    def start(self) -> EppThread:
        self._thread.start()
        self.run(self._start())
        return self

    async def _start(self) -> None:
        self.client = AsyncRouterClient(
            AsyncStaticPlanSource(self.static, poll_s=0.02), router_id=self.settings.router_id,
            public_keys=self.static.public_keys, destination_ids=[d.id for d in self.dests],
            addresses={d.id: d.address for d in self.dests}, recheck_s=0.2,
            status_interval_s=0.2)
        await self.client.start()
        self.server = EndpointPickerServer(self.client, self.settings, sink=self.sink,
                                           health_period_s=0.1)
        self.port = await self.server.start("127.0.0.1:0")

    def run(self, coro: Coroutine[Any, Any, Any], timeout_s: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def call(self, fn: Any) -> Any:
        """Run a plain function on the picker's loop (its state is single-threaded)."""
        async def _call() -> Any:
            return fn()
        return self.run(_call())

    def stop(self) -> None:
        async def _stop() -> None:
            if self.server is not None:
                await self.server.stop(1.0)
            if self.client is not None:
                await self.client.stop()
        try:
            self.run(_stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)

    def publish(self, sets: dict[str, tuple[int, ...]], seq: int = 1) -> Version:
        plan = RoutingPlan(
            config=PlanConfig(10.0, 4, 16, built_by="build"), destinations=tuple(self.dests),
            table=KeyTable.from_sets(list(sets), list(sets.values()), [1.0] * len(sets)),
            version=Version(1, seq))
        self.static.publish(plan)
        assert self.client is not None
        assert self.run(self.client.wait_for_version(plan.version, 10.0))
        return plan.version

    def endpoint(self, i: int) -> str:
        return self.dests[i].address.removeprefix("http://")


def headers(items: dict[str, str], *, end: bool = False) -> ep.HttpHeaders:
    return ep.HttpHeaders(end_of_stream=end, headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in items.items()]))


def request_headers(extra: dict[str, str] | None = None, *, mode: int | None = FULL_DUPLEX,
                    response_mode: int = FULL_DUPLEX, end: bool = False,
                    subset: list[str] | None = None) -> ep.ProcessingRequest:
    msg = ep.ProcessingRequest(request_headers=headers(
        {":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw",
         "content-type": "application/json", **(extra or {})}, end=end))
    if mode is not None:
        msg.protocol_config.request_body_mode = mode  # type: ignore[assignment]
        msg.protocol_config.response_body_mode = response_mode  # type: ignore[assignment]
    if subset is not None:
        hint = struct_pb2.Struct()
        hint.update({proto.SUBSET_KEY: subset})
        msg.metadata_context.filter_metadata[proto.SUBSET_NAMESPACE].CopyFrom(hint)
    return msg


def request_body(data: bytes, *, end: bool) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(request_body=ep.HttpBody(body=data, end_of_stream=end))


def response_headers(status: int, content_type: str, served: str | None = None,
                     *, end: bool = False) -> ep.ProcessingRequest:
    msg = ep.ProcessingRequest(response_headers=headers(
        {":status": str(status), "content-type": content_type}, end=end))
    if served is not None:
        meta = struct_pb2.Struct()
        meta.update({proto.SERVED_KEY: served})
        msg.metadata_context.filter_metadata[proto.METADATA_NAMESPACE].CopyFrom(meta)
    return msg


def response_body(data: bytes, *, end: bool) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(response_body=ep.HttpBody(body=data, end_of_stream=end))


class ExtProcStream:
    """One ext_proc stream driven step by step, as Envoy does: write, then read answers."""

    def __init__(self, channel: grpc.Channel, timeout_s: float = 10.0) -> None:
        self._out: queue.Queue[ep.ProcessingRequest | None] = queue.Queue()
        stub = ep_grpc.ExternalProcessorStub(channel)
        self.call = stub.Process(iter(self._out.get, None), timeout=timeout_s)
        self._answers: Iterator[ep.ProcessingResponse] = iter(self.call)

    def send(self, *msgs: ep.ProcessingRequest) -> None:
        for m in msgs:
            self._out.put(m)

    def read(self, n: int = 1) -> list[ep.ProcessingResponse]:
        return [next(self._answers) for _ in range(n)]

    def close(self) -> None:
        self._out.put(None)

    def ended(self) -> bool:
        """True when the server ended the stream (no further answer comes)."""
        self.close()
        try:
            next(self._answers)
        except StopIteration:
            return True
        return False

    def cancel(self) -> None:
        self.call.cancel()


def destination_of(answer: ep.ProcessingResponse) -> tuple[str, str]:
    """(header value, metadata value) of a routing answer."""
    kind = answer.WhichOneof("response")
    common = getattr(answer, kind).response
    header = next(h.header.raw_value.decode() for h in common.header_mutation.set_headers
                  if h.header.key == proto.DESTINATION_HEADER)
    meta = json_format.MessageToDict(answer.dynamic_metadata)
    return header, meta[proto.METADATA_NAMESPACE][proto.DESTINATION_HEADER]


def set_header(answer: ep.ProcessingResponse, name: str) -> str | None:
    kind = answer.WhichOneof("response")
    common = getattr(answer, kind).response
    for h in common.header_mutation.set_headers:
        if h.header.key == name:
            return h.header.raw_value.decode()
    return None


def streamed_bytes(answers: list[ep.ProcessingResponse], *, request: bool) -> tuple[bytes, bool]:
    """The body bytes the answers send on, and whether the last one ended the body."""
    data, end = b"", False
    for a in answers:
        body = a.request_body if request else a.response_body
        piece = body.response.body_mutation.streamed_response
        data += piece.body
        end = piece.end_of_stream
    return data, end
