"""PlanPublisher on a real redis-server: the atomic install script and its guarantees."""

from __future__ import annotations

import threading

import pytest
import redis

from planner_svc.adapters.redis_publisher import PlanPublisher, VersionConflict, VersionRegression
from router_client import signing
from router_client.layout import Layout, Pointer
from router_client.plan import Version
from router_client.testing import perturb, synthetic_plan

pytestmark = pytest.mark.integration


@pytest.fixture()
def key():
    return signing.generate_private_key()


def test_install_current_load_list_and_retention(redis_server, key):
    pub = PlanPublisher(redis_server.url, key, retain=3)
    assert pub.ping() and pub.current() is None
    plan = synthetic_plan(200, 6)
    first = pub.install(plan, None)
    plans = [plan]
    for seq in range(2, 7):
        nxt = perturb(plans[-1], 0.05, version=Version(1, seq), seed=seq)
        pub.install(nxt, plans[-1])
        plans.append(nxt)
    assert pub.current().version == Version(1, 6)
    assert pub.list_versions() == [Version(1, 4), Version(1, 5), Version(1, 6)]
    assert pub.load(Version(1, 6)).table.as_dict() == plans[-1].table.as_dict()
    with pytest.raises(KeyError):
        pub.load(first.version)
    r = redis.Redis.from_url(redis_server.url)
    lay = Layout()
    assert r.exists(lay.delta(Version(1, 6))) and not r.exists(lay.plan(Version(1, 1)))
    assert not r.exists(lay.delta(Version(1, 1)), lay.digest(Version(1, 2)))


def test_pointer_never_moves_back_and_versions_are_never_reused(redis_server, key):
    a = PlanPublisher(redis_server.url, key)
    b = PlanPublisher(redis_server.url, key)  # a second planner on the same Redis
    p10 = synthetic_plan(50, 4, version=Version(1, 10))
    a.install(p10, None)
    with pytest.raises(VersionRegression):
        b.install(synthetic_plan(50, 4, version=Version(1, 9)), None)
    with pytest.raises(VersionConflict):
        b.install(synthetic_plan(50, 4, version=Version(1, 10), seed=3), None)
    assert a.install(p10, None).version == Version(1, 10)  # same bytes again: no-op
    assert a.current().version == Version(1, 10)
    b.install(synthetic_plan(50, 4, version=Version(2, 0)), None)  # a new epoch is newer
    assert a.current().version == Version(2, 0)


def test_staged_installs_move_the_blobs_into_place_and_leave_nothing_behind(redis_server, key):
    pub = PlanPublisher(redis_server.url, key)
    r = redis.Redis.from_url(redis_server.url)
    lay = Layout()
    base = synthetic_plan(300, 6)
    pub.commit(pub.stage(pub.prepare(base, None)))
    nxt = perturb(base, 0.05, version=Version(1, 2), seed=2)
    prepared = pub.stage(pub.prepare(nxt, base))
    assert prepared.staged and pub.current().version == Version(1, 1)  # staged, not visible
    staged = r.keys(lay.prefix + "staged:*")
    assert len(staged) == 2 and all(0 < r.ttl(k) <= 600 for k in staged)
    pub.commit(prepared)
    assert pub.current() == PlanPublisher(redis_server.url, key).current()
    assert pub.current().version == Version(1, 2)
    assert r.get(lay.plan(Version(1, 2))) == prepared.plan_blob
    assert r.get(lay.delta(Version(1, 2))) == prepared.delta_blob
    assert r.ttl(lay.plan(Version(1, 2))) == -1 and r.ttl(lay.delta(Version(1, 2))) == -1
    assert r.keys(lay.prefix + "staged:*") == []
    # blobs gone before the commit (expired, evicted): committed inline instead
    third = perturb(nxt, 0.05, version=Version(1, 3), seed=3)
    lost = pub.stage(pub.prepare(third, nxt))
    r.delete(*r.keys(lay.prefix + "staged:*delta"))
    pub.commit(lost)
    assert r.get(lay.delta(Version(1, 3))) == lost.delta_blob
    assert pub.load(Version(1, 3)).table.as_dict() == third.table.as_dict()


def test_a_reader_never_sees_a_pointer_to_a_missing_plan(redis_server, key):
    pub = PlanPublisher(redis_server.url, key, retain=2)
    r = redis.Redis.from_url(redis_server.url)
    lay = Layout()
    # Read pointer and the blob it names in one atomic step, as often as possible.
    read_both = r.register_script(
        "local p = redis.call('GET', KEYS[1]) if not p then return {0} end "
        "return {p, redis.call('EXISTS', ARGV[1] .. string.sub(p, 1, 32) .. ':plan')}"
    )
    stop, bad, reads = threading.Event(), [], [0]

    def reader() -> None:
        while not stop.is_set():
            got = read_both(keys=[lay.current], args=[lay.version_prefix()])
            if got[0] != 0:
                reads[0] += 1
                if got[1] != 1:
                    bad.append(got[0])

    t = threading.Thread(target=reader)
    t.start()
    plan = synthetic_plan(100, 5)
    pub.install(plan, None)
    for seq in range(2, 120):
        nxt = perturb(plan, 0.1, version=Version(1, seq), seed=seq)
        pub.install(nxt, plan)
        plan = nxt
    stop.set()
    t.join()
    assert reads[0] > 0 and bad == []
    assert Pointer.decode(r.get(lay.current)).version == Version(1, 119)
