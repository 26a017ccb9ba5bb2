"""router_client: follow the planner's plan and route keys in microseconds.

Pure modules: `plan` (model + codec), `routing` (the decision), `delta`,
`signing`, `layout`, `follow`, `health`. Shells: `client.RouterClient` (thread),
`aio.AsyncRouterClient` (asyncio). Sources: `source.StaticPlanSource` (tests)
and `redis_source.RedisPlanSource` (the only module importing redis).

Every public name is loaded on first use, so importing one pure module (say
`router_client.plan` from the planner) loads neither the clients nor redis.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from router_client.aio import AsyncRouterClient
    from router_client.client import RouterClient
    from router_client.errors import NoPlanAvailable, PlanRejected, RouterClientError
    from router_client.redis_source import AsyncRedisPlanSource, RedisPlanSource
    from router_client.routing import RouterCore, RoutingTable
    from router_client.source import (
        AsyncPlanSource,
        AsyncStaticPlanSource,
        PlanSource,
        SourceUnavailable,
        StaticPlanSource,
    )

# public name -> the module that defines it
_EXPORTS = {
    "AsyncPlanSource": "router_client.source",
    "AsyncRedisPlanSource": "router_client.redis_source",
    "AsyncRouterClient": "router_client.aio",
    "AsyncStaticPlanSource": "router_client.source",
    "NoPlanAvailable": "router_client.errors",
    "PlanRejected": "router_client.errors",
    "PlanSource": "router_client.source",
    "RedisPlanSource": "router_client.redis_source",
    "RouterClient": "router_client.client",
    "RouterClientError": "router_client.errors",
    "RouterCore": "router_client.routing",
    "RoutingTable": "router_client.routing",
    "SourceUnavailable": "router_client.source",
    "StaticPlanSource": "router_client.source",
}

__all__ = [
    "AsyncPlanSource",
    "AsyncRedisPlanSource",
    "AsyncRouterClient",
    "AsyncStaticPlanSource",
    "NoPlanAvailable",
    "PlanRejected",
    "PlanSource",
    "RedisPlanSource",
    "RouterClient",
    "RouterClientError",
    "RouterCore",
    "RoutingTable",
    "SourceUnavailable",
    "StaticPlanSource",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'router_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
