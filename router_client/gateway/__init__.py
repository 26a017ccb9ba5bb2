"""The reference edge gateway: an OpenAI-compatible HTTP front door routed by the plan.

    gateway = Gateway(client, GatewaySettings(port=8000), sink=emitter)
    await gateway.start()      # serves until `await gateway.stop()`

`client` is a started `AsyncRouterClient`; `sink` receives request, usage and error
events (`streams.emitter.EventEmitter` has the methods, or None). Run it from the
command line with `cacheroute gateway` (planner_svc/cli), which wires Redis and Kafka.

Modules: `settings` (what can be configured), `headers` and `sse` (pure: header
filtering, trace propagation, SSE framing and usage stripping), `telemetry` (the event
sink seam), `http11` (HTTP/1.1 server and client connections on httptools), `upstream`
(a pool per destination, failure classification), `proxy` (one request end to end),
`metrics` (Prometheus), `app` (routes and lifecycle). Install the `gateway` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from router_client.gateway.app import Gateway
    from router_client.gateway.settings import GatewaySettings

__all__ = ["Gateway", "GatewaySettings"]


def __getattr__(name: str) -> Any:
    # Lazy, so the pure modules here (sse, headers, telemetry) import without httptools:
    # the endpoint picker (router_client.epp) shares them and has no HTTP server.
    if name == "Gateway":
        from router_client.gateway.app import Gateway

        return Gateway
    if name == "GatewaySettings":
        from router_client.gateway.settings import GatewaySettings

        return GatewaySettings
    raise AttributeError(name)
