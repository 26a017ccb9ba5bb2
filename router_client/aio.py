"""The asyncio router client: the same as `RouterClient`, with a task instead of a thread.

`route` is synchronous (it never waits); plan following runs as a task on the
running loop. Everything but the waiting is shared (`client_base`, `follow`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from router_client.client_base import BaseRouterClient, log
from router_client.follow import MAX_DELTA_CHAIN, Ask, Backoff, Want, sync_round
from router_client.layout import Pointer
from router_client.plan import Version
from router_client.probe import http_probe
from router_client.source import AsyncPlanSource, SourceUnavailable

RELEASE_RETIRED_AFTER_S = 0.25
MAX_CONCURRENT_PROBES = 16
AsyncProber = Callable[[str, str, float], Awaitable[bool]]


async def threaded_http_probe(address: str, path: str, timeout_s: float) -> bool:
    """`http_probe` in a worker thread (the default when the host has no HTTP client)."""
    return await asyncio.to_thread(http_probe, address, path, timeout_s)


class AsyncRouterClient(BaseRouterClient):
    """Routes with the newest verified plan from an `AsyncPlanSource`."""

    def __init__(
        self,
        source: AsyncPlanSource,
        *,
        router_id: str,
        prober: AsyncProber = threaded_http_probe,
        **options: Any,
    ) -> None:
        super().__init__(router_id=router_id, **options)
        self.source = source
        self._prober = prober
        self._probe_task: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._applied: asyncio.Event | None = None
        self._backoff = Backoff()
        self._stopping = False
        # Tasks that live and die with the client (e.g. router_client.redis_history's
        # exchange): anything with async start() / stop() and metrics().
        self.companions: list[Any] = []

    async def start(self, initial_wait_s: float = 0.0) -> AsyncRouterClient:
        self.restore_from_disk()
        self._applied = asyncio.Event()
        self._task = asyncio.create_task(self._follow(), name=f"router-client-{self.router_id}")
        if self.probe is not None:
            self._probe_task = asyncio.create_task(
                self._probe_loop(), name=f"router-probe-{self.router_id}")
        for companion in self.companions:
            await companion.start()
        if initial_wait_s > 0:
            await self.wait_for_version(Version(0, 1), initial_wait_s)
        return self

    async def stop(self) -> None:
        self._stopping = True
        for companion in self.companions:
            await companion.stop()
        for task in (self._task, self._probe_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.source.close()

    async def __aenter__(self) -> AsyncRouterClient:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_for_version(self, version: Version, timeout_s: float) -> bool:
        """Wait until a version >= `version` is applied; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.version < version:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._applied is None:
                return False
            self._applied.clear()
            try:
                await asyncio.wait_for(self._applied.wait(), remaining)
            except TimeoutError:
                return self.version >= version
        return True

    def _after_install(self) -> None:
        if self._applied is not None:
            self._applied.set()

    def metrics(self) -> dict[str, float]:
        m = super().metrics()
        for companion in self.companions:
            m.update(companion.metrics())
        return m

    def _reconnects(self) -> int:
        return self.source.reconnects

    async def _follow(self) -> None:
        while not self._stopping:
            try:
                await self._round()
                await self._housekeeping()
                self._backoff.reset()
                self.follower.note_hint(await self._wait_for_change())
            except SourceUnavailable:
                self.unavailable_rounds += 1
                self.check_age()
                await asyncio.sleep(self._backoff.next_delay())
            except Exception:  # a bug must not stop plan following; routing goes on
                log.exception("router %s: plan-following round failed", self.router_id)
                self.failed_rounds += 1
                self.check_age()
                await asyncio.sleep(self._backoff.next_delay())

    async def _wait_for_change(self) -> Version | None:
        # A short first wait, then free the old table (see `_off_burst_work`).
        first = min(RELEASE_RETIRED_AFTER_S, self.recheck_s)
        hint = await self.source.wait_for_change(first)
        self._off_burst_work()
        self._health_tick()
        now = time.monotonic()
        if self._status_due(now):
            self._note_peers(await self.source.report(self._status(now)))
        if hint is None and self.recheck_s > first:
            hint = await self.source.wait_for_change(self.recheck_s - first)
        return hint

    async def _round(self) -> None:
        self._start_round()
        rnd = sync_round(self.follower)
        try:
            want = next(rnd)
            while True:
                want = rnd.send(self._remember_fetched(want, await self._ask(want)))
        except StopIteration as done:
            self._finish_round(done.value)

    async def _ask(self, want: Want) -> Pointer | bytes | list[bytes] | None:
        if want.ask is Ask.CURRENT:
            return await self.source.current()
        assert want.version is not None
        if want.ask is Ask.DELTAS:
            assert want.after is not None
            return await self.source.fetch_deltas(want.after, want.version, MAX_DELTA_CHAIN)
        return await self.source.fetch_plan(want.version)

    async def _housekeeping(self) -> None:
        # Save first: see RouterClient._housekeeping.
        self._save_chain()
        if self._chain_too_long():
            self._restart_chain(await self.source.fetch_plan(self.version))
            self._save_chain()

    async def _probe_loop(self) -> None:
        assert self.probe is not None
        settings = self.probe
        limit = asyncio.Semaphore(MAX_CONCURRENT_PROBES)

        async def one(dest: str, address: str) -> None:
            async with limit:
                try:
                    ok = await self._prober(address, settings.path, settings.timeout_s)
                except Exception:  # a prober bug counts as a failed probe, never a crash
                    log.exception("router %s: probe of %s failed", self.router_id, dest)
                    ok = False
            self.report_probe(dest, ok)

        while not self._stopping:
            await asyncio.sleep(settings.period_s)
            await asyncio.gather(*(one(d, a) for d, a in self.probe_targets()))
