"""The clients against the in-memory StaticPlanSource (no servers)."""

from __future__ import annotations

import asyncio
import time

from router_client import AsyncRouterClient, AsyncStaticPlanSource, RouterClient, StaticPlanSource
from router_client.follow import Ask, PlanFollower, sync_round
from router_client.layout import Pointer
from router_client.plan import Version
from router_client.routing import FALLBACK, PLANNED
from router_client.testing import perturb, synthetic_plan
from tests.waiting import eventually


def _client(source, **kw) -> RouterClient:
    kw.setdefault("recheck_s", 0.05)
    return RouterClient(source, router_id="r", public_keys=source.public_keys, **kw)


def test_sync_round_asks_pointer_then_delta_then_plan():
    src = StaticPlanSource()
    p1 = synthetic_plan(20, 3)
    ptr = src.publish(p1)
    f = PlanFollower(src.public_keys)
    rnd = sync_round(f)
    assert next(rnd).ask is Ask.CURRENT
    want = rnd.send(ptr)
    assert want.ask is Ask.PLAN and want.version == Version(1, 1)  # no base: no delta
    try:
        rnd.send(src.fetch_plan(want.version))
    except StopIteration as done:
        f.accept(done.value)
    # the same pointer again: nothing to fetch; an older one is ignored and counted
    rnd = sync_round(f)
    next(rnd)
    try:
        rnd.send(Pointer(Version(0, 5), b""))
    except StopIteration as done:
        assert done.value is None
    assert f.ignored_older == 1


def test_client_follows_versions_using_deltas_and_routes_by_the_plan():
    src = StaticPlanSource()
    plan = synthetic_plan(300, 8)
    src.publish(plan)
    with _client(src) as c:
        assert c.wait_for_version(Version(1, 1), 5)
        for seq in range(2, 6):
            plan = perturb(plan, 0.05, version=Version(1, seq), seed=seq)
            src.publish(plan)
            assert c.wait_for_version(Version(1, seq), 5)
        assert c.follower.applied_delta >= 1
        table = c.table
        assert table is not None and table.lookup == type(table).from_plan(plan).lookup
        assert c.route("k00000007") in {
            plan.destinations[i].id for i in table.members_of("k00000007")
        }
        assert c.mode == PLANNED
        with c.request("k00000001") as dest:
            assert c.core.inflight[c.core.slot_of(dest)] == 1
        assert c.core.inflight[c.core.slot_of(dest)] == 0


def test_corrupt_version_is_rejected_reported_and_the_last_good_kept():
    src = StaticPlanSource()
    src.publish(synthetic_plan(100, 4))
    rejections: list[str] = []
    with _client(src, on_rejection=rejections.append) as c:
        assert c.wait_for_version(Version(1, 1), 5)
        good = c.table
        src.put_raw(Version(1, 2), b"\x0a\x03abc", b"\x00" * 32)
        assert eventually(lambda: c.follower.rejections == 1)
        time.sleep(0.2)  # several more rounds: the bad version is not refetched
        assert c.follower.rejections == 1 and c.table is good and c.version == Version(1, 1)
        assert rejections and "1.2" in rejections[0]
        assert eventually(lambda: src.reports["r"].last_rejected.seq == 2)
        assert "1.2" in c.source.reports["r"].last_rejection


def test_saved_plan_serves_at_start_when_the_source_is_down(tmp_path):
    src = StaticPlanSource()
    plan = synthetic_plan(100, 4)
    src.publish(plan)
    src.publish(perturb(plan, 0.1, version=Version(1, 2)))
    with _client(src, cache_path=tmp_path / "plan.bin") as c:
        assert c.wait_for_version(Version(1, 2), 5)
        assert eventually(lambda: (tmp_path / "plan.bin").exists())
    src.available = False
    c2 = _client(src, cache_path=tmp_path / "plan.bin").start()
    try:
        assert c2.version == Version(1, 2) and c2.mode == PLANNED  # at once, no waiting
        assert c2.table is not None and c2.table.lookup == c.table.lookup
    finally:
        c2.stop()


def test_tampered_saved_plan_is_ignored(tmp_path):
    src = StaticPlanSource()
    src.publish(synthetic_plan(50, 4))
    with _client(src, cache_path=tmp_path / "plan.bin") as c:
        assert c.wait_for_version(Version(1, 1), 5)
        assert eventually(lambda: (tmp_path / "plan.bin").exists())
    data = bytearray((tmp_path / "plan.bin").read_bytes())
    data[-5] ^= 0xFF
    (tmp_path / "plan.bin").write_bytes(bytes(data))
    src.available = False
    c2 = _client(src, cache_path=tmp_path / "plan.bin", destination_ids=["d0000"]).start()
    try:
        assert c2.table is None and c2.mode == FALLBACK and c2.route("x") == "d0000"
    finally:
        c2.stop()


def test_plan_older_than_max_age_routes_by_fallback_until_confirmed_again():
    src = StaticPlanSource()
    src.publish(synthetic_plan(50, 4))
    with _client(src, max_plan_age_s=0.3) as c:
        assert c.wait_for_version(Version(1, 1), 5)
        src.available = False
        assert eventually(lambda: c.mode == FALLBACK)
        assert c.fallback_reason == "stale" and c.plan_age_s > 0.3
        c.route("k00000001")
        assert c.core.fallback >= 1
        src.available = True
        assert eventually(lambda: c.mode == PLANNED)


def test_metrics_are_attributes_and_prometheus_text():
    src = StaticPlanSource()
    src.publish(synthetic_plan(10, 2))
    with _client(src) as c:
        assert c.wait_for_version(Version(1, 1), 5)
        c.route("k00000001")
        c.route("nope")
        m = c.metrics()
        assert m["decisions_planned"] == 1 and m["decisions_unadmitted"] == 1
        text = c.metrics_text()
        assert 'cacheroute_router_decisions_total{path="planned",router="r"} 1.0' in text
        assert 'cacheroute_router_plan_seq{router="r"} 1.0' in text


def test_async_client_follows_the_same_way():
    async def scenario() -> None:
        src = StaticPlanSource()
        plan = synthetic_plan(100, 4)
        src.publish(plan)
        client = AsyncRouterClient(
            AsyncStaticPlanSource(src), router_id="a", public_keys=src.public_keys, recheck_s=0.05
        )
        async with client:
            assert await client.wait_for_version(Version(1, 1), 5)
            src.publish(perturb(plan, 0.1, version=Version(1, 2)))
            assert await client.wait_for_version(Version(1, 2), 5)
            assert client.follower.applied_delta == 1
            assert client.route("k00000003") in {d.id for d in plan.destinations}

    asyncio.run(scenario())


def test_public_names():
    import router_client

    assert set(router_client.__all__) == {
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
    }


def test_in_flight_counts_balance_across_request_threads_and_errors():
    import threading

    src = StaticPlanSource()
    src.publish(synthetic_plan(50, 3))
    with _client(src) as c:
        assert c.wait_for_version(Version(1, 1), 5)

        def work() -> None:
            for i in range(2000):
                try:
                    with c.request(f"k{i % 60:08d}"):
                        if i % 7 == 0:
                            raise RuntimeError("backend failed")
                except RuntimeError:
                    pass

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert c.core.inflight == [0] * len(c.core.inflight)


def _run_round(f: PlanFollower, src) -> object:
    """Drive one sync round against a blocking source, as RouterClient does."""
    rnd = sync_round(f)
    want = next(rnd)
    try:
        while True:
            if want.ask is Ask.CURRENT:
                answer = src.current()
            elif want.ask is Ask.DELTAS:
                answer = src.fetch_deltas(want.after, want.version, 8)
            else:
                answer = src.fetch_plan(want.version)
            want = rnd.send(answer)
    except StopIteration as done:
        if done.value is not None:
            f.accept(done.value)
        return done.value


def test_a_router_several_versions_behind_applies_the_chain_of_deltas():
    src = StaticPlanSource()
    plan = synthetic_plan(300, 6)
    src.publish(plan)
    f = PlanFollower(src.public_keys)
    assert _run_round(f, src).kind == "full"
    for seq in range(2, 6):
        plan = perturb(plan, 0.05, version=Version(1, seq), seed=seq)
        src.publish(plan)
    applied = _run_round(f, src)
    assert applied.kind == "delta" and f.version == Version(1, 5)
    assert f.table.lookup == type(f.table).from_plan(plan).lookup
    # a hole in the chain, or a chain longer than the limit: the full plan instead
    for seq in range(6, 8):
        plan = perturb(plan, 0.05, version=Version(1, seq), seed=seq)
        src.publish(plan)
    del src._deltas[Version(1, 6)]
    assert _run_round(f, src).kind == "full" and f.version == Version(1, 7)
    for seq in range(8, 18):
        plan = perturb(plan, 0.05, version=Version(1, seq), seed=seq)
        src.publish(plan)
    assert _run_round(f, src).kind == "full" and f.version == Version(1, 17)
    assert f.delta_fallbacks == 0  # those were never attempted, not failed


def test_an_unexpected_error_in_a_round_is_logged_and_following_goes_on():
    class Flaky(StaticPlanSource):
        fail = 2

        def current(self):
            if self.fail:
                self.fail -= 1
                raise RuntimeError("bug in a source")
            return super().current()

    src = Flaky()
    src.publish(synthetic_plan(20, 3))
    with _client(src) as c:
        assert c.wait_for_version(Version(1, 1), 5)
        assert c.failed_rounds == 2 and c.metrics()["failed_rounds"] == 2
