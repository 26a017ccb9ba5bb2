"""Item 5, half-open connections: the path to Redis of some routers is blackholed
for 20 s (connections stay up, nothing moves). Detected <= 3 s, converged <= 1 s
after it heals, the other routers unaffected, no leaked file descriptors."""

from __future__ import annotations

import time

import pytest

from planner_svc.adapters.redis_publisher import PlanPublisher
from router_client import RouterClient, signing
from router_client.plan import Version
from router_client.redis_source import RedisPlanSource
from router_client.testing import perturb, synthetic_plan
from tests.faults.history import RouterHistory, check_histories, propagation_delays_ms
from tests.faults.proxy import FaultProxy
from tests.faults.resources import open_fds
from tests.timing import bound
from tests.waiting import eventually

pytestmark = pytest.mark.integration
BLACKHOLE_S = 20.0


def _client(url: str, key, h: RouterHistory) -> RouterClient:  # type: ignore[no-untyped-def]
    return RouterClient(
        RedisPlanSource(url), router_id=h.router_id, public_keys=[key.public_key()],
        on_applied=h.on_applied,
    ).start(initial_wait_s=5)  # fmt: skip


def test_blackholed_routers_detect_and_recover_the_rest_never_notice(redis_server):
    key = signing.generate_private_key()
    pub = PlanPublisher(redis_server.url, key)
    plan = synthetic_plan(300, 6)
    first = pub.install(plan, None)
    published, published_at = {first.version: first.digest}, {}
    fds_before = open_fds()
    proxy = FaultProxy(redis_server.port).start()
    cut = [RouterHistory(f"cut{i}") for i in range(3)]
    fine = [RouterHistory(f"fine{i}") for i in range(3)]
    cut_clients = [_client(proxy.redis_url, key, h) for h in cut]
    fine_clients = [_client(redis_server.url, key, h) for h in fine]
    try:
        time.sleep(1.5)  # a status report and a ping on every connection
        unavailable = [c.unavailable_rounds for c in cut_clients]
        proxy.blackhole = True
        t0 = time.monotonic()
        detected = eventually(
            lambda: all(
                c.unavailable_rounds > u for c, u in zip(cut_clients, unavailable, strict=True)
            ),
            3.0,
        )
        detected_s = time.monotonic() - t0
        seq = 2
        while time.monotonic() - t0 < BLACKHOLE_S:
            nxt = perturb(plan, 0.05, version=Version(1, seq), seed=seq)
            published_at[nxt.version] = time.time() * 1000
            p = pub.install(nxt, plan)
            published[p.version], plan = p.digest, nxt
            for c in cut_clients:  # routing goes on, on the last good plan
                assert c.route("k00000003") in plan.destination_ids
            seq += 1
            time.sleep(0.5)
        final = max(published)
        held = [c.version for c in cut_clients]
        proxy.blackhole = False
        t_heal = time.monotonic()
        assert all(c.wait_for_version(final, 5) for c in cut_clients)
        healed_s = time.monotonic() - t_heal
        assert all(c.wait_for_version(final, 1) for c in fine_clients)
    finally:
        for c in cut_clients + fine_clients:
            c.stop()
        proxy.stop()
    print(f"detected in {detected_s:.2f} s, converged {healed_s:.2f} s after healing")
    assert detected
    bound(detected_s, 3.0, "half-open connection detected after, s")
    bound(healed_s, 1.0, "healed after, s")
    assert all(v < final for v in held)  # they really were cut off
    assert check_histories(cut + fine, published=published, final=final) == []
    fine_delays = [d for h in fine for d in propagation_delays_ms(h, published_at)]
    bound(max(fine_delays), 200.0, "worst propagation delay to the routers not cut off, ms")
    time.sleep(0.5)
    assert open_fds() <= fds_before + 2, (fds_before, open_fds())
