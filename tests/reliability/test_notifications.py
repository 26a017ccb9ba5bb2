"""Item 4, notifications dropped (30 %), duplicated (10 %), delayed, and forged old
ones, through the fault proxy: convergence within the re-check period, 0 regressions."""

from __future__ import annotations

import time

import pytest
import redis

from cacheroute.v1 import plan_pb2
from planner_svc.adapters.redis_publisher import PlanPublisher
from router_client import RouterClient, signing
from router_client.layout import Layout
from router_client.plan import Version
from router_client.redis_source import RedisPlanSource
from router_client.testing import perturb, synthetic_plan
from tests.faults.history import RouterHistory, check_histories, propagation_delays_ms
from tests.faults.proxy import FaultProxy

pytestmark = pytest.mark.integration
RECHECK_S = 1.0
ROUND_S = 0.5  # one sync round after the re-check fires, with margin for a busy machine


def _note(seq: int) -> bytes:
    return plan_pb2.PlanNotification(
        version=plan_pb2.PlanVersion(epoch=1, seq=seq), digest=b"\x00" * 32
    ).SerializeToString()


def test_lossy_duplicated_delayed_and_forged_hints_still_converge(redis_server):
    key = signing.generate_private_key()
    pub = PlanPublisher(redis_server.url, key)
    plan = synthetic_plan(300, 6)
    first = pub.install(plan, None)
    published = {first.version: first.digest}
    published_at: dict[Version, float] = {}
    proxy = FaultProxy(redis_server.port, seed=7).start()
    proxy.drop_messages, proxy.duplicate_messages = 0.30, 0.10
    proxy.delay_messages, proxy.delay_s = 0.10, 0.3
    histories = [RouterHistory(f"r{i}") for i in range(4)]
    clients = [
        RouterClient(
            RedisPlanSource(proxy.redis_url), router_id=h.router_id,
            public_keys=[key.public_key()], recheck_s=RECHECK_S, on_applied=h.on_applied,
        ).start(initial_wait_s=5)
        for h in histories
    ]  # fmt: skip
    forger = redis.Redis.from_url(redis_server.url)
    try:
        for seq in range(2, 62):
            nxt = perturb(plan, 0.05, version=Version(1, seq), seed=seq)
            published_at[nxt.version] = time.time() * 1000
            p = pub.install(nxt, plan)
            published[p.version], plan = p.digest, nxt
            forger.publish(Layout().channel, _note(max(1, seq - 5)))  # an old version
            forger.publish(Layout().channel, b"\x08\x01 junk")
            time.sleep(0.1)
        final = max(published)
        t_last = time.monotonic()
        for c in clients:
            assert c.wait_for_version(final, RECHECK_S + ROUND_S + 1.0)
        converged_s = time.monotonic() - t_last
        ids = set(plan.destination_ids)
        assert all(c.route(k) in ids for c in clients for k in plan.table.keys[:50])
    finally:
        for c in clients:
            c.stop()
        proxy.stop()
    print(f"proxy: {proxy.stats}; converged {converged_s:.2f} s after the last publication")
    assert proxy.stats.dropped > 20 and proxy.stats.duplicated > 5 and proxy.stats.delayed > 5
    assert check_histories(histories, published=published, final=final) == []
    worst = max(d for h in histories for d in propagation_delays_ms(h, published_at))
    assert worst <= (RECHECK_S + ROUND_S) * 1000, worst
    assert converged_s <= RECHECK_S + ROUND_S
    assert sum(c.follower.ignored_older for c in clients) > 0  # forged old hints were seen
