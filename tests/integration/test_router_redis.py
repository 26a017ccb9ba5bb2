"""Router clients following a real redis-server: streams of versions, outages, bad plans."""

from __future__ import annotations

import asyncio
import functools
import multiprocessing as mp
import signal
import threading
import time

import pytest
import redis

from planner_svc.adapters.redis_publisher import PlanPublisher
from planner_svc.devstack.processes import restart_redis
from planner_svc.errors import Unavailable
from router_client import AsyncRouterClient, RouterClient, signing
from router_client.layout import ROUTER_STATUS_TTL_S, Layout
from router_client.plan import DestinationSpec, KeyTable, PlanConfig, RoutingPlan, Version
from router_client.redis_source import AsyncRedisPlanSource, RedisPlanSource
from router_client.routing import RoutingTable
from router_client.testing import perturb, synthetic_plan
from tests.timing import bound
from tests.waiting import eventually, stop_routers

pytestmark = pytest.mark.integration

GROUPS = 7  # version s names destinations "g{s % GROUPS}-{j}": ids tell tables apart
R = 5
N_KEYS = 40


def grouped_plan(seq: int) -> RoutingPlan:
    """Keys k0..k39; k_b = 2 for every 5th key; sets move with the version."""
    ids = [f"g{seq % GROUPS}-{j}" for j in range(R)]
    sets = [
        ((i + seq) % R,) if i % 5 else ((i + seq) % R, (i + seq + 1) % R) for i in range(N_KEYS)
    ]
    return RoutingPlan(
        config=PlanConfig(10.0, 8, 40),
        destinations=tuple(DestinationSpec(d) for d in ids),
        table=KeyTable.from_sets([f"k{i}" for i in range(N_KEYS)], sets, [1.0] * N_KEYS),
        version=Version(1, seq),
    )


def allowed(seq: int, key: str) -> set[str]:
    return _allowed(seq % (GROUPS * R), key)  # plans repeat with this period


@functools.cache
def _allowed(seq: int, key: str) -> set[str]:
    plan = grouped_plan(seq)
    members = RoutingTable.from_plan(plan).members_of(key)
    ids = plan.destination_ids
    return {ids[m] for m in members} if members else set(ids)


def key_pem(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _publish_stream(url: str, pem: bytes, first: int, end: int) -> None:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    pub = PlanPublisher(url, load_pem_private_key(pem, None), retain=20)  # type: ignore[arg-type]
    prev = grouped_plan(first - 1)
    for seq in range(first, end):
        plan = grouped_plan(seq)
        pub.install(plan, prev)
        prev = plan
        time.sleep(0.001)  # paced, so subscribers apply many versions, not only the last


@pytest.fixture()
def key():
    return signing.generate_private_key()


def _client(url: str, key, rid: str, **kw) -> RouterClient:
    kw.setdefault("recheck_s", 1.0)
    return RouterClient(
        RedisPlanSource(url), router_id=rid, public_keys=signing.pin([key.public_key()]), **kw
    )


class Routers:
    """Threads that call route() continuously and check each answer."""

    def __init__(self, clients: list[RouterClient]) -> None:
        self.clients = clients
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.calls = [0] * len(clients)
        self.longest_gap_s = [0.0] * len(clients)
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(len(clients))
        ]

    def __enter__(self) -> Routers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)

    def _run(self, i: int) -> None:
        c, n, last = self.clients[i], 0, time.monotonic()
        while not self.stop.is_set():
            k = f"k{n % (N_KEYS + 3)}"  # k40..k42 are unadmitted
            before = c.core.table
            dest = c.route(k)
            after = c.core.table
            now = time.monotonic()
            self.longest_gap_s[i] = max(self.longest_gap_s[i], now - last)
            last = now
            self._check(k, dest, before, after)
            n += 1
            self.calls[i] = n
            if n % 10 == 0:
                time.sleep(0.001)  # let the follower and publisher threads in

    def _check(self, k, dest, before, after) -> None:
        if before is None or after is None:
            return
        seqs = range(before.version.seq, after.version.seq + 1)
        if not any(dest in allowed(s, k) for s in seqs if s % GROUPS == int(dest[1])):
            self.errors.append(f"{k} -> {dest} outside tables {before.version}..{after.version}")


def test_1000_versions_while_20_subscribers_route(redis_server, key):
    pub = PlanPublisher(redis_server.url, key, retain=20)
    pub.install(grouped_plan(1), None)
    clients = [_client(redis_server.url, key, f"r{i}").start() for i in range(20)]
    try:
        assert all(c.wait_for_version(Version(1, 1), 10) for c in clients)
        with Routers(clients) as routers:
            # The planner is another process, as in production: it publishes at full
            # speed while this process routes and follows.
            proc = mp.get_context("fork").Process(
                target=_publish_stream, args=(redis_server.url, key_pem(key), 2, 1002)
            )
            proc.start()
            proc.join(60)
            assert proc.exitcode == 0
            assert all(c.wait_for_version(Version(1, 1001), 20) for c in clients)
        assert routers.errors == []
        assert min(routers.calls) > 100
        assert {c.version for c in clients} == {Version(1, 1001)}
        applied = [c.follower.applied_delta + c.follower.applied_full for c in clients]
        print(f"versions applied per subscriber: {applied}, route calls: {routers.calls}")
        assert sum(c.follower.applied_delta for c in clients) > 0
        assert min(applied) >= 10  # they followed the stream, not just its end
        statuses = {s.router_id: s for s in pub.router_statuses()}
        assert eventually(lambda: len(pub.router_statuses()) == 20, 5)
        assert eventually(lambda: {v.state for v in pub.fleet_view()} == {"in_sync"}, 5)
        assert all(s.applied.seq >= 1 for s in statuses.values())
    finally:
        stop_routers(clients)


def test_convergence_without_pubsub_within_the_recheck_period(redis_server, key):
    pub = PlanPublisher(redis_server.url, key)
    plan = synthetic_plan(100, 4)
    pub.install(plan, None)
    c = _client(redis_server.url, key, "deaf", recheck_s=1.0).start()
    try:
        assert c.wait_for_version(Version(1, 1), 5)
        admin = redis.Redis.from_url(redis_server.url)
        for seq in range(2, 5):
            # Drop the subscriber's pub/sub connection, then publish: the hint is lost.
            admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            nxt = perturb(plan, 0.1, version=Version(1, seq), seed=seq)
            t0 = time.monotonic()
            pub.install(nxt, plan)
            plan = nxt
            assert c.wait_for_version(Version(1, seq), 3)
            assert time.monotonic() - t0 <= 2.0  # the 1 s re-check plus its own round
    finally:
        c.stop()


def test_redis_killed_and_restarted_mid_stream(redis_server, key):
    pub = PlanPublisher(redis_server.url, key, socket_timeout=0.5)
    pub.install(grouped_plan(1), None)
    clients = [_client(redis_server.url, key, f"r{i}").start() for i in range(4)]
    published = [1]
    stop = threading.Event()

    def publisher() -> None:
        prev, seq = grouped_plan(1), 2
        while not stop.is_set():
            plan = grouped_plan(seq)
            try:
                pub.install(plan, prev)
                prev, published[0] = plan, seq
                seq += 1
            except (redis.ConnectionError, redis.TimeoutError, OSError, Unavailable):
                time.sleep(0.05)
            time.sleep(0.01)

    try:
        assert all(c.wait_for_version(Version(1, 1), 10) for c in clients)
        with Routers(clients) as routers:
            t = threading.Thread(target=publisher, daemon=True)
            t.start()
            time.sleep(0.5)
            failed_before = [c.unavailable_rounds for c in clients]
            redis_server.process.signal(signal.SIGKILL)
            time.sleep(1.5)
            held = [c.version for c in clients]
            # Retries keep coming (jittered backoff capped at 250 ms), not one per second.
            retries = [
                c.unavailable_rounds - b for c, b in zip(clients, failed_before, strict=True)
            ]
            assert min(retries) >= 4, retries
            restart_redis(redis_server)  # comes back empty (no persistence)
            time.sleep(1.0)
            stop.set()
            t.join(5)
            last = Version(1, published[0])
            assert all(c.wait_for_version(last, 10) for c in clients)
        assert routers.errors == []
        bound(max(routers.longest_gap_s), 0.5, "longest routing gap, s")  # never stopped
        assert all(v >= Version(1, 2) for v in held)
        assert sum(c.source.reconnects for c in clients) >= 4
    finally:
        stop.set()
        stop_routers(clients)


def test_hung_redis_is_detected_within_3_s_and_the_client_resyncs(redis_server, key):
    pub = PlanPublisher(redis_server.url, key)
    plan = synthetic_plan(100, 4)
    pub.install(plan, None)
    c = _client(redis_server.url, key, "r").start()
    try:
        assert c.wait_for_version(Version(1, 1), 5)
        redis_server.process.signal(signal.SIGSTOP)  # sockets stay open, nothing answers
        t0 = time.monotonic()
        try:
            assert eventually(lambda: c.unavailable_rounds > 0, 3.0)
            detected_s = time.monotonic() - t0
            assert c.route("k00000001") == "d" + c.route("k00000001")[1:]  # still routing
        finally:
            redis_server.process.signal(signal.SIGCONT)
        bound(detected_s, 3.0, "outage detected after, s")
        nxt = perturb(plan, 0.1, version=Version(1, 2))
        pub.install(nxt, plan)
        assert c.wait_for_version(Version(1, 2), 5)
    finally:
        c.stop()


def test_corrupt_and_forged_plans_are_rejected_and_the_last_good_kept(redis_server, key):
    pub = PlanPublisher(redis_server.url, key)
    plan = synthetic_plan(100, 4)
    pub.install(plan, None)
    c = _client(redis_server.url, key, "r", recheck_s=0.2).start()
    try:
        assert c.wait_for_version(Version(1, 1), 5)
        good = c.table
        r = redis.Redis.from_url(redis_server.url)
        lay = Layout()
        nxt = perturb(plan, 0.1, version=Version(1, 2))
        pub.install(nxt, plan)  # then corrupt the stored version 1.2 and hide its delta
        c.stop()
        blob = bytearray(r.get(lay.plan(Version(1, 2))))
        blob[len(blob) // 2] ^= 0xFF
        r.set(lay.plan(Version(1, 2)), bytes(blob))
        r.delete(lay.delta(Version(1, 2)))
        c = _client(redis_server.url, key, "r", recheck_s=0.2)
        c.follower.table, c.follower.applied_full = good, 1
        c.core.install(good)
        c.start()
        assert eventually(lambda: c.follower.rejections == 1, 5)
        assert c.version == Version(1, 1) and c.table is good
        assert eventually(lambda: any(s.last_rejected.seq == 2 for s in pub.router_statuses()), 5)
        # A plan signed by a key the router does not pin is refused as well.
        forger = PlanPublisher(redis_server.url, signing.generate_private_key())
        forger.install(perturb(plan, 0.2, version=Version(1, 3)), None)
        assert eventually(lambda: c.follower.rejections == 2, 5)
        assert "unknown_key" in c.follower.last_rejection and c.version == Version(1, 1)
        assert eventually(lambda: [v.state for v in forger.fleet_view()] == ["rejected"], 5)
        time.sleep(0.5)
        assert c.follower.rejections == 2  # a refused version is not fetched again
    finally:
        c.stop()


def test_saved_plan_serves_at_once_when_redis_is_down_at_start(redis_server, key, tmp_path):
    pub = PlanPublisher(redis_server.url, key)
    plan = synthetic_plan(300, 6)
    pub.install(plan, None)
    with _client(redis_server.url, key, "r", cache_path=tmp_path / "plan.bin") as c:
        assert c.wait_for_version(Version(1, 1), 5)
        assert eventually(lambda: (tmp_path / "plan.bin").exists(), 5)
    redis_server.process.stop()
    c2 = _client(redis_server.url, key, "r", cache_path=tmp_path / "plan.bin").start()
    try:
        assert c2.version == Version(1, 1) and c2.mode == "planned"
        dest = c2.route("k00000010")
        assert dest in {
            plan.destinations[i].id for i in RoutingTable.from_plan(plan).members_of("k00000010")
        }
    finally:
        c2.stop()


def test_async_client_follows_redis(redis_server, key):
    pub = PlanPublisher(redis_server.url, key)
    plan = synthetic_plan(200, 5)
    pub.install(plan, None)

    async def scenario() -> None:
        client = AsyncRouterClient(
            AsyncRedisPlanSource(redis_server.url),
            router_id="aio",
            public_keys=signing.pin([key.public_key()]),
        )
        async with client:
            assert await client.wait_for_version(Version(1, 1), 5)
            nxt = perturb(plan, 0.05, version=Version(1, 2))
            await asyncio.to_thread(pub.install, nxt, plan)
            assert await client.wait_for_version(Version(1, 2), 5)
            assert client.follower.applied_delta == 1
            assert client.table.lookup == RoutingTable.from_plan(nxt).lookup

    asyncio.run(scenario())


def test_deltas_of_a_lagging_router_come_as_one_chain_from_redis(redis_server, key):
    pub = PlanPublisher(redis_server.url, key, retain=10)
    plan = synthetic_plan(300, 6)
    plans = [plan]
    pub.install(plan, None)
    for seq in range(2, 6):
        plan = perturb(plan, 0.05, version=Version(1, seq), seed=seq)
        pub.install(plan, plans[-1])
        plans.append(plan)
    src = RedisPlanSource(redis_server.url)
    try:
        chain = src.fetch_deltas(Version(1, 2), Version(1, 5), 8)
        assert chain is not None and len(chain) == 3
        assert src.fetch_deltas(Version(1, 1), Version(1, 5), 3) is None  # longer than limit
        assert src.fetch_deltas(Version(1, 5), Version(1, 5), 8) is None
        redis.Redis.from_url(redis_server.url).delete(Layout().delta(Version(1, 4)))
        assert src.fetch_deltas(Version(1, 2), Version(1, 5), 8) is None  # a hole
        c = _client(redis_server.url, key, "lag")
        c.follower.table = RoutingTable.from_plan(plans[0], pub._stored_digest(Version(1, 1)))
        c.core.install(c.follower.table)
        c.start()
        # 1.1 -> 1.5 needs the deleted delta 1.4: the client falls back to the full plan
        assert c.wait_for_version(Version(1, 5), 5)
        assert c.follower.applied_full == 1 and c.follower.applied_delta == 0
        plan6 = perturb(plan, 0.05, version=Version(1, 6), seed=6)
        plan7 = perturb(plan6, 0.05, version=Version(1, 7), seed=7)
        c._stop.set()
        c.stop()
        pub.install(plan6, plan)
        pub.install(plan7, plan6)
        c2 = _client(redis_server.url, key, "lag2")
        c2.follower.table = c.follower.table
        c2.core.install(c2.follower.table)
        c2.start()
        assert c2.wait_for_version(Version(1, 7), 5)
        assert c2.follower.applied_delta == 1 and c2.follower.applied_full == 0  # 2-step chain
        assert c2.table.lookup == RoutingTable.from_plan(plan7).lookup
        c2.stop()
    finally:
        src.close()


def test_junk_in_redis_neither_stops_following_nor_blocks_the_planner(redis_server, key):
    pub = PlanPublisher(redis_server.url, key)
    plan = synthetic_plan(100, 4)
    pub.install(plan, None)
    c = _client(redis_server.url, key, "r", recheck_s=0.2).start()
    try:
        assert c.wait_for_version(Version(1, 1), 5)
        r = redis.Redis.from_url(redis_server.url)
        lay = Layout()
        r.publish(lay.channel, b"\xff\xfe not a notification")
        r.set(lay.current, b"junk pointer")
        time.sleep(0.6)  # a few rounds on the junk
        assert c.version == Version(1, 1) and c.mode == "planned"
        assert c.route("k00000001")
        nxt = perturb(plan, 0.1, version=Version(1, 2))
        pub.install(nxt, plan)  # the planner overwrites the junk pointer
        assert c.wait_for_version(Version(1, 2), 5)
        assert c.failed_rounds == 0
    finally:
        c.stop()


def test_a_status_report_counts_the_other_routers_on_the_plan(redis_server):
    """Idle re-homing pauses while other routers share the plan (`_note_peers`): the
    report's answer is how many others the planner's registry holds within the status TTL
    (the planner writes it from the status keys on each read of the fleet)."""
    from cacheroute.v1 import plan_pb2 as pb

    srcs = [RedisPlanSource(redis_server.url, namespace="peers") for _ in range(3)]
    planner = PlanPublisher(redis_server.url, signing.generate_private_key(), namespace="peers")
    now_ms = int(time.time() * 1000)
    assert srcs[0].report(pb.RouterStatus(router_id="r0", reported_at_ms=now_ms)) == 0
    assert srcs[1].report(pb.RouterStatus(router_id="r1", reported_at_ms=now_ms)) == 0
    assert sorted(s.router_id for s in planner.router_statuses()) == ["r0", "r1"]
    assert srcs[1].report(pb.RouterStatus(router_id="r1", reported_at_ms=now_ms + 5)) == 1
    assert srcs[0].report(pb.RouterStatus(router_id="r0", reported_at_ms=now_ms + 10)) == 1
    # Routers that last reported longer ago than the TTL are gone.
    stale = now_ms + (ROUTER_STATUS_TTL_S + 1) * 1000
    assert srcs[2].report(pb.RouterStatus(router_id="r2", reported_at_ms=stale)) == 0
    for s in srcs:
        s.close()


def test_async_report_counts_peers_and_a_gateway_pauses_re_homing_beside_them(
        redis_server, tmp_path):
    """A gateway on a plan in Redis starts with re-homing paused, runs it once its first
    report finds no other router, and pauses again when another reports."""
    import argparse

    from cacheroute.v1 import plan_pb2 as pb
    from planner_svc.cli.edge_args import ROUTING_FLAGS, add_flags, build_client

    signing.save_public_key(signing.generate_private_key().public_key(), tmp_path / "pub.pem")

    async def run() -> tuple[bool, bool, bool]:
        parser = argparse.ArgumentParser()
        add_flags(parser, ROUTING_FLAGS, "CACHEROUTE_TEST_")
        args = parser.parse_args(["--destinations", "a,b", "--redis-url", redis_server.url,
                                  "--redis-namespace", "peers-aio",
                                  "--public-key", str(tmp_path / "pub.pem")])
        client = build_client(args, "gw-0", "gateway")
        paused_at_start = client.core.rehome_paused
        other = AsyncRedisPlanSource(redis_server.url, namespace="peers-aio")
        now_ms = int(time.time() * 1000)
        client._note_peers(await client.source.report(
            pb.RouterStatus(router_id="gw-0", reported_at_ms=now_ms)))
        alone = client.core.rehome_paused
        await other.report(pb.RouterStatus(router_id="gw-1", reported_at_ms=now_ms))
        PlanPublisher(redis_server.url, signing.generate_private_key(),
                      namespace="peers-aio").router_statuses()  # the planner's read
        client._note_peers(await client.source.report(
            pb.RouterStatus(router_id="gw-0", reported_at_ms=now_ms + 5)))
        beside = client.core.rehome_paused
        await other.close()
        await client.source.close()
        return paused_at_start, alone, beside

    assert asyncio.run(run()) == (True, False, True)
