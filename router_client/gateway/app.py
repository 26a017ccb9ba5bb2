"""The aiohttp application: routes, the aggregated model list, probes, lifecycle.

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

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from router_client.aio import AsyncRouterClient
from router_client.gateway.metrics import GatewayMetrics
from router_client.gateway.proxy import Proxy, error_response
from router_client.gateway.settings import GatewaySettings
from router_client.gateway.telemetry import EventSink, NoSink
from router_client.gateway.upstream import Upstreams

log = logging.getLogger("cacheroute.gateway")


class Gateway:
    def __init__(self, client: AsyncRouterClient, settings: GatewaySettings | None = None,
                 *, sink: EventSink | None = None) -> None:
        self.client = client
        self.settings = settings or GatewaySettings()
        self.upstreams = Upstreams(self.settings)
        self.metrics = GatewayMetrics(client)
        self.proxy = Proxy(client, self.upstreams, self.settings, sink or NoSink(), self.metrics)
        self.port = 0
        self.stopping = False
        self._runner: web.AppRunner | None = None
        self._models: tuple[float, bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body_bytes)
        app.router.add_post("/v1/chat/completions", self.proxy.routed)
        app.router.add_post("/v1/completions", self.proxy.routed)
        app.router.add_get("/v1/models", self._models_handler)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_route("*", "/v1/{tail:.*}", self.proxy.routed)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        return app

    async def start(self) -> Gateway:
        await self.upstreams.open()
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False,
                                     shutdown_timeout=self.settings.shutdown_grace_s)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port, backlog=4096)
        await site.start()
        self.port = self._runner.addresses[0][1]  # the bound port, when 0 was asked for
        log.info("gateway %s serving on %s", self.settings.router_id, self.url)
        return self

    async def stop(self) -> None:
        self.stopping = True
        if self._runner is not None:
            await self._runner.cleanup()  # waits for in-flight handlers (shutdown_timeout)
        await self.upstreams.close()

    # --- handlers ----------------------------------------------------------------------

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, _request: web.Request) -> web.Response:
        core = self.client.core
        usable = [d for d in core.destination_ids if core.is_usable(d)]
        ready = not self.stopping and bool(usable)
        body = {
            "ready": ready,
            "stopping": self.stopping,
            "usable_destinations": len(usable),
            "plan_version": str(self.client.version),
            "mode": self.client.mode,
            "fallback_reason": self.client.fallback_reason,
        }
        return web.json_response(body, status=200 if ready else 503)

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _not_found(self, request: web.Request) -> web.Response:
        return error_response(404, f"no route for {request.method} {request.path}: the gateway "
                              "serves /v1/... (OpenAI API), /healthz, /readyz and /metrics",
                              "not_found")

    async def _models_handler(self, _request: web.Request) -> web.Response:
        now = time.monotonic()
        if self._models is None or now - self._models[0] > self.settings.models_cache_s:
            self._models = (now, await self._gather_models())
        return web.Response(body=self._models[1], content_type="application/json")

    async def _gather_models(self) -> bytes:
        core = self.client.core
        targets = [(d, self.client.address_of(d)) for d in core.destination_ids
                   if core.is_usable(d)]
        lists = await asyncio.gather(*(self._models_of(a) for _d, a in targets if a))
        merged: dict[str, dict[str, Any]] = {}
        for models in lists:
            for model in models:
                if isinstance(model, dict) and isinstance(model.get("id"), str):
                    merged.setdefault(model["id"], model)
        return json.dumps({"object": "list", "data": list(merged.values())}).encode()

    async def _models_of(self, address: str) -> list[Any]:
        try:
            async with asyncio.timeout(self.settings.connect_timeout_s * 2):
                async with self.upstreams.session.get(address.rstrip("/") + "/v1/models") as r:
                    if r.status != 200:
                        return []
                    body = await r.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return []
        data = body.get("data") if isinstance(body, dict) else None
        return data if isinstance(data, list) else []
