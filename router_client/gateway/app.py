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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from router_client.aio import AsyncRouterClient
from router_client.gateway.client_limits import connections_per_client
from router_client.gateway.engine_load import EngineLoadPoller
from router_client.gateway.http11 import (
    HttpServer,
    Request,
    Responder,
    ServerLimits,
    UpstreamError,
    default_max_connections,
)
from router_client.gateway.metrics import GatewayMetrics
from router_client.gateway.paths import normal_target
from router_client.gateway.proxy import JSON, Proxy, send_error
from router_client.gateway.settings import GatewaySettings
from router_client.gateway.telemetry import EventSink, NoSink
from router_client.gateway.upstream import UpstreamFailure, Upstreams
from router_client.pools import DEFAULT_POOL, PoolRoutes
from router_client.trace_setup import start_tracing

if TYPE_CHECKING:
    pass

log = logging.getLogger("cacheroute.gateway")
ROUTED = {"/v1/chat/completions", "/v1/completions"}


class Gateway:
    """One router client (every model, one plan), or one per pool with `routes` saying
    which pool serves each model (router_client.pools)."""

    def __init__(self, client: AsyncRouterClient | Mapping[str, AsyncRouterClient],
                 settings: GatewaySettings | None = None, *, sink: EventSink | None = None,
                 routes: PoolRoutes | None = None) -> None:
        if isinstance(client, Mapping):
            if routes is None or not client:
                raise ValueError("a gateway over several pools needs their routes and clients")
            self.clients: dict[str, AsyncRouterClient] = dict(client)
            unknown = set(self.clients) - set(routes.pools)
            if unknown:
                raise ValueError(f"no routes to pool(s) {sorted(unknown)}")
        else:
            self.clients = {DEFAULT_POOL: client}
            routes = PoolRoutes.single()
        self.routes = routes
        # The default pool's client (the only one without pools): readiness, status.
        self.client = self.clients.get(DEFAULT_POOL) or next(iter(self.clients.values()))
        self.settings = settings or GatewaySettings()
        self.upstreams = Upstreams(self.settings)
        self.metrics = GatewayMetrics(self.clients, pools=isinstance(client, Mapping))
        self.tracing = start_tracing(self.settings.otlp_endpoint, service="cacheroute-gateway",
                                     router_id=self.settings.router_id)
        self.proxy = Proxy(self.clients, routes, self.upstreams, self.settings,
                           sink or NoSink(), self.metrics, tracing=self.tracing)
        self.stopping = False
        connections = self.settings.max_connections or default_max_connections()
        limits = ServerLimits(max_body_bytes=self.settings.max_body_bytes,
                              request_timeout_s=self.settings.request_timeout_s,
                              max_connections=connections,
                              write_timeout_s=self.settings.idle_timeout_s,
                              max_buffered_bytes=self.settings.max_buffered_bytes,
                              max_buffered_bytes_per_client=(
                                  self.settings.max_buffered_bytes_per_client),
                              max_connections_per_client=(
                                  self.settings.max_connections_per_client
                                  or connections_per_client(connections)),
                              header_timeout_s=self.settings.header_timeout_s)
        self.server = HttpServer(self.handle, limits, on_exception=self._log_exception)
        self.metrics.watch_server(self.server)
        self._models: tuple[float, bytes] | None = None
        self.engine_loads = ({pool: EngineLoadPoller(c, self.upstreams,
                                                     self.settings.engine_load_period_s,
                                                     self.settings.engine_load_timeout_s)
                              for pool, c in self.clients.items()}
                             if self.settings.engine_load_period_s > 0 else {})

    async def set_pools(self, clients: Mapping[str, AsyncRouterClient],
                        routes: PoolRoutes) -> list[AsyncRouterClient]:
        """The pools file changed: serve `clients` (started) with `routes` from now on.
        Returns the clients no longer served, for the caller to stop once their requests in
        flight are done (a request holds its client, so it finishes on it)."""
        unknown = set(clients) - set(routes.pools)
        if unknown or not clients:
            raise ValueError(f"no routes to pool(s) {sorted(unknown)}" if unknown
                             else "a gateway needs at least one pool")
        gone = [c for pool, c in self.clients.items() if clients.get(pool) is not c]
        for pool in [p for p in self.engine_loads if clients.get(p) is not self.clients[p]]:
            await self.engine_loads.pop(pool).stop()
        # One swap of the proxy's view; the dict objects the metrics read are edited in place.
        self.clients.clear()
        self.clients.update(clients)
        self.routes = self.proxy.routes = routes
        self.client = self.clients.get(DEFAULT_POOL) or next(iter(self.clients.values()))
        self._models = None
        if self.settings.engine_load_period_s > 0:
            for pool, c in self.clients.items():
                if pool not in self.engine_loads:
                    poller = self.engine_loads[pool] = EngineLoadPoller(
                        c, self.upstreams, self.settings.engine_load_period_s,
                        self.settings.engine_load_timeout_s)
                    poller.start()
        return gone

    @property
    def engine_load(self) -> EngineLoadPoller | None:
        """The default pool's engine-load poller (None when engine load is off)."""
        return next(iter(self.engine_loads.values()), None)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    async def start(self) -> Gateway:
        await self.server.start(self.settings.host, self.settings.port)
        for poller in self.engine_loads.values():
            poller.start()
        log.info("gateway %s serving on %s", self.settings.router_id, self.url)
        return self

    async def stop(self) -> None:
        self.stopping = True
        for poller in self.engine_loads.values():
            await poller.stop()
        await self.server.close(self.settings.shutdown_grace_s)
        self.upstreams.close()
        if self.tracing is not None:  # export the spans still batched
            await asyncio.to_thread(self.tracing.shutdown)

    async def handle(self, request: Request, out: Responder) -> None:
        target = normal_target(request.target)
        if target is None:
            send_error(out, 400, "the request path has a dot segment ('.' or '..', also "
                       "percent-escaped): not forwarded", "invalid_request_error")
            return
        request.target = target  # what is routed and forwarded from here on
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
        """Ready while any pool has a usable destination: one model's engines down must not
        take every model off the load balancer (the body shows each pool)."""
        pools = {}
        for pool, client in self.clients.items():
            core = client.core
            pools[pool] = {
                "usable_destinations": sum(1 for d in core.destination_ids if core.is_usable(d)),
                "plan_version": str(client.version), "mode": client.mode,
                "fallback_reason": client.fallback_reason}
        ready = not self.stopping and any(p["usable_destinations"] for p in pools.values())
        body: dict[str, Any] = {"ready": ready, "stopping": self.stopping,
                                **pools.get(DEFAULT_POOL, next(iter(pools.values())))}
        if len(pools) > 1 or DEFAULT_POOL not in pools:
            body["pools"] = pools
        return ready, json.dumps(body).encode()

    def _log_exception(self, request: Request) -> None:
        log.exception("gateway: handler failed on %s %s", request.method, request.target)

    async def _models_body(self) -> bytes:
        now = time.monotonic()
        if self._models is None or now - self._models[0] > self.settings.models_cache_s:
            self._models = (now, await self._gather_models())
        return self._models[1]

    async def _gather_models(self) -> bytes:
        addresses = [client.address_of(d) for client in self.clients.values()
                     for d in client.core.destination_ids if client.core.is_usable(d)]
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
