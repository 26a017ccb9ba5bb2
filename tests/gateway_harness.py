"""A real gateway on its own event loop thread, for tests that call it with the sync SDK.

The engines are the emulator process (planner_svc.devstack.engines, started by a fixture);
the gateway, its router client and its plan source are the production classes, run on a
loop in a background thread so the test can use blocking clients and read the client's
state (`run(coro)` runs a coroutine on that loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Coroutine, Iterator
from typing import Any

from planner_svc.devstack.engines import EngineFleet
from router_client.aio import AsyncRouterClient
from router_client.gateway import Gateway, GatewaySettings
from router_client.health import HealthPolicy, ProbeSettings
from router_client.plan import DestinationSpec, KeyTable, PlanConfig, RoutingPlan, Version
from router_client.redis_history import RedisHistoryExchange
from router_client.source import AsyncPlanSource, AsyncStaticPlanSource, StaticPlanSource


class RecordingSink:
    """Collects the gateway's events (thread-safe enough for a test: appends only)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, dict[str, Any]]] = []

    def emit_request(self, routing_key: str, destination: str, **kw: Any) -> bool:
        self.events.append(("request", routing_key, destination, kw))
        return True

    def emit_cache_hit(self, routing_key: str, destination: str, **kw: Any) -> bool:
        self.events.append(("cache_hit", routing_key, destination, kw))
        return True

    def emit_error(self, routing_key: str, destination: str, **kw: Any) -> bool:
        self.events.append(("error", routing_key, destination, kw))
        return True

    def kinds(self) -> list[str]:
        return [e[0] for e in self.events]


class GatewayThread:
    def __init__(self, destinations: list[DestinationSpec], *,
                 source: AsyncPlanSource | None = None, public_keys: Any = None,
                 settings: GatewaySettings | None = None, health: HealthPolicy | None = None,
                 probe: ProbeSettings | None = None, share_history_url: str = "") -> None:
        self.static = StaticPlanSource()
        self.source = source or AsyncStaticPlanSource(self.static, poll_s=0.02)
        self.public_keys = public_keys or self.static.public_keys
        self.destinations = destinations
        self.settings = settings or GatewaySettings(port=0, router_id="gw-test")
        self.health = health
        self.probe = probe
        self.share_history_url = share_history_url  # Redis: share conversation placements
        self.sink = RecordingSink()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.client: AsyncRouterClient | None = None
        self.gateway: Gateway | None = None

    def start(self) -> GatewayThread:
        self._thread.start()
        self.run(self._start())
        return self

    async def _start(self) -> None:
        self.client = AsyncRouterClient(
            self.source, router_id=self.settings.router_id, public_keys=self.public_keys,
            destination_ids=[d.id for d in self.destinations],
            addresses={d.id: d.address for d in self.destinations},
            health=self.health, probe=self.probe, recheck_s=0.2, status_interval_s=0.2)
        if self.share_history_url:
            self.client.core.history_slack = 1.0  # the gateway command's default
            self.client.companions.append(RedisHistoryExchange(
                self.client.core, self.share_history_url, router_id=self.settings.router_id))
        await self.client.start()
        self.gateway = Gateway(self.client, self.settings, sink=self.sink)
        await self.gateway.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout_s: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        async def _stop() -> None:
            if self.gateway is not None:
                await self.gateway.stop()
            if self.client is not None:
                await self.client.stop()
        try:
            self.run(_stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)

    @property
    def url(self) -> str:
        assert self.gateway is not None
        return self.gateway.url

    def publish(self, destinations: list[DestinationSpec],
                sets: dict[str, tuple[int, ...]] | None = None, seq: int = 1) -> Version:
        """Install a plan through the static source (as the planner would through Redis)."""
        sets = sets or {}
        plan = RoutingPlan(
            config=PlanConfig(10.0, 4, 16, built_by="build"), destinations=tuple(destinations),
            table=KeyTable.from_sets(list(sets), list(sets.values()), [1.0] * len(sets)),
            version=Version(1, seq))
        self.static.publish(plan)
        return plan.version


def _control(fleet: EngineFleet, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(fleet.control_url + path, data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def fault(fleet: EngineFleet, engine: str, mode: str, **kw: Any) -> None:
    """Make one emulated engine misbehave (planner_svc.devstack.engines modes)."""
    _control(fleet, f"/engines/{engine}/fault", {"mode": mode, **kw})


def last_request(fleet: EngineFleet, engine: str) -> Any:
    return _control(fleet, f"/engines/{engine}/last_request")


@contextlib.contextmanager
def gateway_process(*argv: str) -> Iterator[str]:
    """`cacheroute gateway --port 0 ARGV` as its own process (the console script's path):
    its URL once it prints it; stopped with SIGTERM at the end, which must exit cleanly."""
    # Its log goes to a file, not the pipe: nobody reads the pipe after the first line, and
    # a full pipe would block the gateway.
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "planner_svc.cli.main", "gateway", "--port", "0", *argv],
            stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("CACHEROUTE_GATEWAY="):
                log.seek(0)
                raise AssertionError(f"the gateway did not start:\n{line}{log.read()[-4000:]}")
            yield line.strip().split("=", 1)[1]
        finally:
            proc.terminate()
            try:
                code = proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
    assert code == 0  # a clean stop (checked only when the test itself got this far)
