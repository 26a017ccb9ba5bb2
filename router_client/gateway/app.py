"""The gateway process's HTTP surface: routes, the aggregated model list, probes, lifecycle.

    POST /v1/chat/completions, /v1/completions   routed by the plan (proxy.Proxy)
    GET  /v1/models                               every usable destination's models, merged
    *    /v1/...                                  other OpenAI paths: forwarded (P2C)
    GET  /healthz                                 200 while the process serves
    GET  /readyz                                  200 when a destination is usable; 503 while
                                                  shutting down or with none
    GET  /metrics                                 Prometheus (gateway + router client)
    anything else                                 404, as JSON

Shutdown is graceful: `stop()` fails readiness first, stops accepting connections,
lets in-flight requests (streams included) finish for up to `shutdown_grace_s`, then
closes the upstream pools.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from router_client.aio import AsyncRouterClient
from router_client.gateway.engine_load import EngineLoadPoller
from router_client.gateway.http11 import HttpServer, Request, Responder, ServerLimits, UpstreamError
from router_client.gateway.metrics import GatewayMetrics
from router_client.gateway.proxy import JSON, Proxy, send_error
from router_client.gateway.settings import GatewaySettings
from router_client.gateway.telemetry import EventSink, NoSink
from router_client.gateway.upstream import UpstreamFailure, Upstreams

log = logging.getLogger("cacheroute.gateway")
ROUTED = {"/v1/chat/completions", "/v1/completions"}


class Gateway:
    def __init__(self, client: AsyncRouterClient, settings: GatewaySettings | None = None,
                 *, sink: EventSink | None = None) -> None:
        self.client = client
        self.settings = settings or GatewaySettings()
        self.upstreams = Upstreams(self.settings)
        self.metrics = GatewayMetrics(client)
        self.proxy = Proxy(client, self.upstreams, self.settings, sink or NoSink(), self.metrics)
        self.stopping = False
        limits = ServerLimits(max_body_bytes=self.settings.max_body_bytes)
        self.server = HttpServer(self.handle, limits, on_exception=self._log_exception)
        self._models: tuple[float, bytes] | None = None
        self.engine_load = (EngineLoadPoller(client, self.upstreams,
                                             self.settings.engine_load_period_s,
                                             self.settings.engine_load_timeout_s)
                            if self.settings.engine_load_period_s > 0 else None)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    async def start(self) -> Gateway:
        await self.server.start(self.settings.host, self.settings.port)
        if self.engine_load is not None:
            self.engine_load.start()
        log.info("gateway %s serving on %s", self.settings.router_id, self.url)
        return self

    async def stop(self) -> None:
        self.stopping = True
        if self.engine_load is not None:
            await self.engine_load.stop()
        await self.server.close(self.settings.shutdown_grace_s)
        self.upstreams.close()

    async def handle(self, request: Request, out: Responder) -> None:
        path = request.path
        if path in ROUTED:
            if request.method != "POST":
                send_error(out, 405, f"{path} takes POST", "invalid_request_error")
                return
            await self.proxy.routed(request, out)
        elif path == "/v1/models" and request.method == "GET":
            out.send(200, [JSON], await self._models_body())
        elif path.startswith("/v1/"):
            await self.proxy.routed(request, out)
        elif path == "/healthz":
            out.send(200, [JSON], b'{"status":"ok"}')
        elif path == "/readyz":
            ready, body = self._readiness()
            out.send(200 if ready else 503, [JSON], body)
        elif path == "/metrics":
            out.send(200, [("Content-Type", CONTENT_TYPE_LATEST)],
                     generate_latest(self.metrics.registry))
        else:
            send_error(out, 404, f"no route for {request.method} {path}: the gateway serves "
                       "/v1/... (OpenAI API), /healthz, /readyz and /metrics", "not_found")

    def _readiness(self) -> tuple[bool, bytes]:
        core = self.client.core
        usable = sum(1 for d in core.destination_ids if core.is_usable(d))
        ready = not self.stopping and usable > 0
        return ready, json.dumps({
            "ready": ready, "stopping": self.stopping, "usable_destinations": usable,
            "plan_version": str(self.client.version), "mode": self.client.mode,
            "fallback_reason": self.client.fallback_reason}).encode()

    def _log_exception(self, request: Request) -> None:
        log.exception("gateway: handler failed on %s %s", request.method, request.target)

    async def _models_body(self) -> bytes:
        now = time.monotonic()
        if self._models is None or now - self._models[0] > self.settings.models_cache_s:
            self._models = (now, await self._gather_models())
        return self._models[1]

    async def _gather_models(self) -> bytes:
        core = self.client.core
        addresses = [self.client.address_of(d) for d in core.destination_ids
                     if core.is_usable(d)]
        lists = await asyncio.gather(*(self._models_of(a) for a in addresses if a))
        merged: dict[str, dict[str, Any]] = {}
        for models in lists:
            for model in models:
                if isinstance(model, dict) and isinstance(model.get("id"), str):
                    merged.setdefault(model["id"], model)
        return json.dumps({"object": "list", "data": list(merged.values())}).encode()

    async def _models_of(self, address: str) -> list[Any]:
        try:
            async with asyncio.timeout(self.settings.connect_timeout_s * 2):
                resp = await self.upstreams.send("GET", address, "/v1/models", [], b"")
                data = await resp.read()
                resp.release()
            body = json.loads(data) if resp.status == 200 else None
        except (TimeoutError, UpstreamFailure, UpstreamError, ValueError):
            return []
        found = body.get("data") if isinstance(body, dict) else None
        return found if isinstance(found, list) else []
