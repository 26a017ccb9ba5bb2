"""The endpoint picker's gRPC edge: Envoy's ExternalProcessor, health and reflection.

    epp = EndpointPickerServer(client, EppSettings(), sink=emitter)
    port = await epp.start("127.0.0.1:0")      # serves until `await epp.stop()`

One ext_proc stream is one HTTP request: the servicer feeds each message to an
`Exchange` and sends back what it answers. A stream the gateway breaks off (client gone,
timeout) still counts its request out of flight. Health follows GIE's picker protocol:
`liveness` is SERVING while the process runs; `readiness` and the ext_proc service name
are SERVING while the picker can take a request: not draining, below `max_streams`, and an
endpoint usable and below its in-flight cap. A stream whose request is not routed within
`request_timeout_s`, or that lasts past `stream_timeout_s`, is ended (DEADLINE_EXCEEDED).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from router_client.aio import AsyncRouterClient
from router_client.epp import protocol as proto
from router_client.epp.exchange import BodyBudget, EppSettings, Exchange
from router_client.epp.metrics import EppMetrics
from router_client.epp.picker import EndpointPicker
from router_client.gateway.telemetry import EventSink, NoSink
from router_client.trace_setup import start_tracing

if TYPE_CHECKING:
    pass

log = logging.getLogger("cacheroute.epp")
LIVENESS, READINESS = "liveness", "readiness"


class _Processor(ep_grpc.ExternalProcessorServicer):
    def __init__(self, owner: EndpointPickerServer) -> None:
        self.owner = owner

    async def Process(  # the generated servicer's method name
        self, request_iterator: AsyncIterator[ep.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        # Written with context.write rather than as a generator, so that every await of the
        # stream is in this frame and the sweep's cancellation at its deadline lands here.
        o, settings = self.owner, self.owner.settings
        exchange = Exchange(o.picker, settings, o.sink, o.metrics, o.bodies, tracing=o.tracing)
        task = asyncio.current_task()
        assert task is not None
        started = asyncio.get_running_loop().time()
        stream = _Stream(task, started + min(settings.request_timeout_s,
                                             settings.stream_timeout_s))
        o.streams.add(stream)
        try:
            async for message in request_iterator:
                for answer in exchange.handle(message):
                    await context.write(answer)
                if exchange.done:
                    return
                if not stream.routed and exchange.routed:
                    stream.routed = True
                    stream.deadline = started + settings.stream_timeout_s
        except asyncio.CancelledError:
            if not stream.expired:
                o.metrics.streams_failed.inc()
                raise
            task.uncancel()  # the sweep's: the stream outlived its deadline
            o.metrics.streams_expired.inc()
            exchange.close()  # counted out before the gateway hears of it
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                "the ext_proc stream outlived the picker's deadline")
        finally:
            o.streams.discard(stream)
            exchange.close()


class _Stream:
    """An ext_proc stream being served, for the sweep that ends it past its deadline."""

    __slots__ = ("deadline", "expired", "routed", "task")

    def __init__(self, task: asyncio.Task[object], deadline: float) -> None:
        self.task = task
        self.deadline = deadline  # loop time
        self.routed = False
        self.expired = False


class EndpointPickerServer:
    def __init__(self, client: AsyncRouterClient, settings: EppSettings | None = None, *,
                 sink: EventSink | None = None, health_period_s: float = 1.0) -> None:
        self.client = client
        self.settings = settings or EppSettings()
        self.sink = sink or NoSink()
        self.metrics = EppMetrics(client)
        self.bodies = BodyBudget(self.settings.max_buffered_bytes)
        self.tracing = start_tracing(self.settings.otlp_endpoint, service="cacheroute-epp",
                                     router_id=self.settings.router_id)
        self.picker = EndpointPicker(
            client, max_inflight=self.settings.max_inflight_per_destination,
            fallbacks=self.settings.fallbacks)
        self.health = health.aio.HealthServicer()
        self.health_period_s = health_period_s
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.draining = False
        self.streams: set[_Stream] = set()  # ext_proc streams being served
        self._ticker: asyncio.Task[None] | None = None

    async def start(self, address: str = "127.0.0.1:0") -> int:
        # Past max_streams a new stream is refused (RESOURCE_EXHAUSTED) instead of queued.
        server = grpc.aio.server(maximum_concurrent_rpcs=self.settings.max_streams, options=[
            ("grpc.max_receive_message_length", 16 << 20),
            ("grpc.max_send_message_length", 16 << 20),
        ])
        ep_grpc.add_ExternalProcessorServicer_to_server(_Processor(self), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (proto.SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        self.port = server.add_insecure_port(address)
        if not self.port:
            raise OSError(f"cannot listen on {address}")
        await server.start()
        self.server = server
        await self.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        await self._update_health()
        self._ticker = asyncio.create_task(self._health_loop())
        log.info("endpoint picker %s serving ext_proc on port %d", self.settings.router_id,
                 self.port)
        return self.port

    def ready(self) -> bool:
        """Whether a new request would be served: not draining, a stream free, and a usable
        endpoint below its in-flight cap (every slot held is a 503 for the next request)."""
        return (not self.draining and len(self.streams) < self.settings.max_streams
                and self.picker.has_room())

    async def _update_health(self) -> None:
        status = (health_pb2.HealthCheckResponse.SERVING if self.ready()
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", READINESS, proto.SERVICE_NAME):
            await self.health.set(name, status)

    def _end_expired(self) -> None:
        """End the streams past their deadline (one sweep for all instead of a timer per
        stream, as the gateway does; a deadline is kept to within a health period)."""
        now = asyncio.get_running_loop().time()
        for stream in [s for s in self.streams if s.deadline <= now and not s.expired]:
            stream.expired = True
            stream.task.cancel()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_period_s)
            try:
                self._end_expired()
                await self._update_health()
            except Exception:  # a failed sweep or health update must not stop the loop
                log.exception("endpoint picker: health update failed")

    async def stop(self, grace_s: float = 5.0) -> None:
        """Fail readiness first (the gateway stops sending), then let streams finish."""
        self.draining = True
        if self._ticker is not None:
            self._ticker.cancel()
        await self._update_health()
        if self.server is not None:
            await self.server.stop(grace_s)
        if self.tracing is not None:  # export the spans still batched
            await asyncio.to_thread(self.tracing.shutdown)
