"""The reference edge gateway: an OpenAI-compatible HTTP front door routed by the plan.

    gateway = Gateway(client, GatewaySettings(port=8000), sink=emitter)
    await gateway.start()      # serves until `await gateway.stop()`

`client` is a started `AsyncRouterClient`; `sink` receives request, usage and error
events (`streams.emitter.EventEmitter` has the methods, or None). Run it from the
command line with `cacheroute gateway` (planner_svc/cli), which wires Redis and Kafka.

Modules: `settings` (what can be configured), `headers` and `sse` (pure: header
filtering, trace propagation, SSE framing and usage stripping), `telemetry` (the event
sink seam), `upstream` (connection pools, timeouts, failure classification), `proxy`
(one request end to end), `metrics` (Prometheus), `app` (the aiohttp application and
its lifecycle). Only this package imports aiohttp: install the `gateway` extra.
"""

from __future__ import annotations

from router_client.gateway.app import Gateway
from router_client.gateway.settings import GatewaySettings

__all__ = ["Gateway", "GatewaySettings"]
