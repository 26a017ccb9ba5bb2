"""The engines' own load, read from their `/metrics` and fused into the routing decisions
(`--engine-load-period-s`; off by default).

A gateway knows only its own requests. Beside it, other gateway replicas, batch jobs or
clients calling the engines directly load them too, and its least-loaded and P2C choices
cannot see that. Every `period_s` this loop scrapes each usable destination's `/metrics`
(vLLM's `vllm:num_requests_running` + `..._waiting`, SGLang's `sglang:num_running_reqs` +
`..._queue_reqs`; parsed by `cacheroute.engine_metrics`) and hands the fresh figures to the
router client, which plans with the larger of an engine's figure and its own in-flight
count (`RouterCore.report_engine_load`). A scrape that fails, times out or cannot be parsed
leaves that destination out of the round, so it falls back to the gateway's own count:
a figure is never older than one period plus the scrape timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from cacheroute.engine_metrics import MAX_TEXT_BYTES, MetricsError, parse_engine_metrics
from router_client.aio import AsyncRouterClient
from router_client.gateway.http11 import UpstreamError
from router_client.gateway.upstream import UpstreamFailure, Upstreams

log = logging.getLogger("cacheroute.gateway")


class EngineLoadPoller:
    def __init__(self, client: AsyncRouterClient, upstreams: Upstreams, period_s: float,
                 timeout_s: float) -> None:
        self.client, self.upstreams = client, upstreams
        self.period_s, self.timeout_s = period_s, timeout_s
        self.rounds = 0
        self.failures: dict[str, str] = {}  # destination -> why its last scrape failed
        self.latest: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.client.report_engine_load({})  # nothing stale stays behind

    async def _run(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:  # one bad round must not end the loop
                log.exception("engine load round failed")
            await asyncio.sleep(self.period_s)

    async def poll_once(self) -> dict[str, float]:
        core = self.client.core
        dests = [d for d in core.destination_ids if core.is_usable(d)]
        figures = await asyncio.gather(*(self._scrape(d) for d in dests))
        fresh = {d: f for d, f in zip(dests, figures, strict=True) if f is not None}
        self.client.report_engine_load(fresh)
        self.latest = fresh
        self.rounds += 1
        return fresh

    async def _scrape(self, destination: str) -> float | None:
        address = self.client.address_of(destination)
        if not address:
            return None
        try:
            async with asyncio.timeout(self.timeout_s):
                resp = await self.upstreams.send("GET", address, "/metrics", [], b"")
                data = await resp.read()
                resp.release()
            if resp.status != 200:
                raise MetricsError(f"/metrics answered {resp.status}")
            if len(data) > MAX_TEXT_BYTES:
                raise MetricsError(f"/metrics is larger than {MAX_TEXT_BYTES} bytes")
            m = parse_engine_metrics(data.decode("utf-8", "replace"))
        except (TimeoutError, UpstreamFailure, UpstreamError, MetricsError) as exc:
            self.failures[destination] = str(exc) or type(exc).__name__
            return None
        self.failures.pop(destination, None)
        return m.running + m.waiting
