"""Item 6, bad plans on a real Redis: every kind rejected, none applied, the
previous plan keeps answering, each rejection in the planner's fleet view within 1 s."""

from __future__ import annotations

import time

import pytest
import redis

from planner_svc.adapters.redis_publisher import REJECTED, PlanPublisher
from router_client import RouterClient, signing
from router_client.layout import Layout
from router_client.plan import Version
from router_client.redis_source import RedisPlanSource
from router_client.routing import RoutingTable
from router_client.testing import perturb, synthetic_plan
from tests.faults.bad_plans import EXPECTED_REASON, bad_blobs, install_raw
from tests.faults.history import RouterHistory, check_history
from tests.waiting import eventually

pytestmark = pytest.mark.integration
MAX_BYTES = 256 * 1024


def _states(pub: PlanPublisher) -> list[str]:
    return [v.state for v in pub.fleet_view()]


def test_every_kind_of_bad_plan_is_refused_and_reported(redis_server):
    key = signing.generate_private_key()
    pub = PlanPublisher(redis_server.url, key)
    plan = synthetic_plan(200, 5)
    good = pub.install(plan, None)
    table = RoutingTable.from_plan(plan)
    history = RouterHistory("r")
    client = RouterClient(
        RedisPlanSource(redis_server.url),
        router_id="r",
        public_keys=[key.public_key()],
        recheck_s=0.2,
        max_plan_bytes=MAX_BYTES,
        on_applied=history.on_applied,
    ).start(initial_wait_s=5)
    r = redis.Redis.from_url(redis_server.url)
    seen: dict[str, str] = {}
    try:
        seq = 2
        for kind, blob in bad_blobs(plan, key, oversize_bytes=MAX_BYTES + 1).items():
            before = client.follower.rejections
            t0 = time.monotonic()
            install_raw(r, Layout(), Version(1, seq), blob)
            assert eventually(lambda b=before: client.follower.rejections == b + 1, 2), kind
            assert eventually(lambda: _states(pub) == [REJECTED], 1.0), (kind, _states(pub))
            seen[kind] = client.follower.last_rejection
            assert time.monotonic() - t0 <= 1.5, kind
            assert client.version == Version(1, 1) and client.mode == "planned"
            for k in plan.table.keys[:20]:  # the previous plan keeps answering
                assert client.route(k) in {plan.destination_ids[m] for m in table.members_of(k)}
            seq += 1
        nxt = perturb(plan, 0.1, version=Version(1, seq))
        last = pub.install(nxt, None)  # the real planner moves on past the junk
        assert client.wait_for_version(last.version, 3) and history.wait_for(last.version)
    finally:
        client.stop()
    for kind, reason in EXPECTED_REASON.items():
        assert seen[kind].split(": ")[1] == reason, (kind, seen[kind])
    published = {good.version: good.digest, last.version: last.digest}
    assert check_history(history, published=published, final=last.version) == []


def test_a_junk_plan_under_the_next_version_does_not_wedge_the_planner(redis_server, tmp_path):
    from tests.reliability.harness import feed, planner_service

    svc = planner_service(redis_server.url, tmp_path / "planner", interval_s=3600.0)
    try:
        feed(svc)
        assert eventually(lambda: svc.planner.installed is not None, 5)
        v = svc.planner.installed.plan.version
        junk = bad_blobs(svc.planner.installed.plan, signing.generate_private_key(), 1 << 20)
        install_raw(redis.Redis.from_url(redis_server.url), Layout(), Version(v.epoch, v.seq + 1),
                    junk["unknown_key"])  # fmt: skip
        svc.planner.replan(fresh=False, force=True, dry_run=False)
        current = svc.publisher.current()
        assert current is not None and current.version > Version(v.epoch, v.seq + 1)
    finally:
        svc.stop(0)
