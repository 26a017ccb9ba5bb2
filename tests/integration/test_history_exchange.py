"""The routers' shared conversation memory (router_client.redis_history) through a Redis
outage: placements made while Redis is down are counted as lost (they are hints), neither
loop ends, and sharing resumes once Redis is back on its address."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from planner_svc.devstack.processes import RedisServer, start_redis
from router_client.redis_history import RedisHistoryExchange
from router_client.routing import RouterCore

pytestmark = pytest.mark.integration


async def _until(check, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout_s / 0.05)):
        if check():
            return True
        await asyncio.sleep(0.05)
    return bool(check())


def test_sharing_survives_a_redis_restart(redis_server: RedisServer, server_workdir: Path) -> None:
    async def main() -> None:
        cores = [RouterCore(["d0", "d1", "d2"], seed=i, history_slack=1.0) for i in range(2)]
        ex = [await RedisHistoryExchange(c, redis_server.url, router_id=f"r{i}",
                                         period_s=0.02).start() for i, c in enumerate(cores)]
        try:
            await asyncio.sleep(0.3)  # subscribed
            cores[0].route_index("tenant", "before")
            assert await _until(lambda: cores[1].history_learned == 1, 3.0)
            redis_server.process.stop()
            cores[0].route_index("tenant", "during")
            assert await _until(lambda: ex[0].moves_lost >= 1, 3.0)
            restarted = start_redis(server_workdir, port=redis_server.port)
            try:
                # the listener resubscribes (backoff <= 5 s), then a new placement arrives
                for attempt in range(40):
                    cores[0].route_index("tenant", f"after-{attempt}")
                    if await _until(lambda: cores[1].history_learned >= 2, 0.5):
                        break
                assert cores[1].history_learned >= 2
                assert ex[0].errors + ex[1].errors >= 1
                assert all(t.done() is False for e in ex for t in e._tasks)
            finally:
                restarted.process.stop()
        finally:
            for e in ex:
                await e.stop()

    asyncio.run(main())


def test_an_idle_exchange_rejects_nothing(redis_server: RedisServer) -> None:
    """The listener pings its socket every PING_EVERY_S; the pongs come back on the same
    socket and are not history messages (they once counted as rejected ones)."""
    from router_client.redis_source import PING_EVERY_S

    async def main() -> None:
        ex = await RedisHistoryExchange(RouterCore(["d0", "d1"], seed=0), redis_server.url,
                                        router_id="idle", period_s=0.02).start()
        try:
            await asyncio.sleep(3 * PING_EVERY_S + 0.5)
            assert ex.messages_rejected == 0 and ex.errors == 0
        finally:
            await ex.stop()

    asyncio.run(main())
