"""router_client: follow the planner's plan and route keys in microseconds.

Pure modules: `plan` (model + codec), `routing` (the decision), `delta`,
`signing`, `layout`, `follow`. Shells: `client.RouterClient` (thread),
`aio.AsyncRouterClient` (asyncio). Sources: `source.StaticPlanSource` (tests)
and `redis_source.RedisPlanSource` (the only module importing redis; loaded
lazily so importing this package does not import redis).
"""

from __future__ import annotations

from typing import Any

from router_client.aio import AsyncRouterClient
from router_client.client import RouterClient
from router_client.errors import NoPlanAvailable, PlanRejected, RouterClientError
from router_client.routing import RouterCore, RoutingTable
from router_client.source import (
    AsyncPlanSource,
    AsyncStaticPlanSource,
    PlanSource,
    SourceUnavailable,
    StaticPlanSource,
)

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
    if name in ("RedisPlanSource", "AsyncRedisPlanSource"):
        from router_client import redis_source

        return getattr(redis_source, name)
    raise AttributeError(f"module 'router_client' has no attribute {name!r}")
