"""Plans through a real Redis Cluster: three masters with a replica each (redis-server
--cluster-enabled, `redis-cli --cluster create`), the planner's publisher and routers
connected by seed nodes (`redis+cluster://…`).

- versions published in a stream reach 10 routers with no torn, mixed, repeated or
  out-of-order table (the install script, pointer, versions index and deltas share the
  `{plan}` slot; notifications are sharded pub/sub on that slot's node);
- the plan's slot migrates to another master mid-stream (SETSLOT / MIGRATE, as
  `redis-cli --cluster reshard` does it) and nothing breaks;
- the master holding the slot is killed, its replica is promoted, and every router is on
  the next version within 2 s of the promotion.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from planner_svc.adapters.redis_publisher import PlanPublisher
from planner_svc.devstack.redis_topologies import RedisClusterProcs, start_redis_cluster
from planner_svc.errors import Unavailable
from router_client import signing
from router_client.client import RouterClient
from router_client.layout import Layout
from router_client.plan import RoutingPlan, Version
from router_client.redis_source import RedisPlanSource
from router_client.testing import perturb, synthetic_plan
from tests.faults.history import RouterHistory, check_history
from tests.waiting import eventually

pytestmark = pytest.mark.integration
SLOT_KEY = Layout().current


@pytest.fixture()
def cluster(server_workdir) -> Iterator[RedisClusterProcs]:  # type: ignore[no-untyped-def]
    c = start_redis_cluster(server_workdir)
    yield c
    c.stop()


def node_client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)


def slot_owner(c: RedisClusterProcs) -> tuple[int, str]:
    """(port, node id) of the master serving the plan's slot, by CLUSTER SHARDS."""
    slot = node_client(c.nodes[0].port).cluster("keyslot", SLOT_KEY)
    for n in c.nodes:
        try:
            nodes = node_client(n.port).cluster("nodes")
        except redis.ConnectionError:
            continue
        for address, info in nodes.items():
            if "master" not in info["flags"] or "fail" in info["flags"]:
                continue
            for start_end in info["slots"]:
                lo, hi = int(start_end[0]), int(start_end[-1])
                if lo <= slot <= hi:
                    return int(address.split(":")[1].split("@")[0]), info["node_id"]
    raise AssertionError("no master serves the plan's slot")


@dataclass
class Stream:
    """Publishes versions one after another; an Unavailable install (a slot moving, a
    failover) is retried with the same version."""

    publisher: PlanPublisher
    base: RoutingPlan
    published: dict[Version, bytes] = field(default_factory=dict)
    retries: int = 0
    last: RoutingPlan | None = None
    seq: int = 0

    def one(self) -> Version:
        self.seq += 1
        plan = perturb(self.base, 0.02, version=Version(1, self.seq), seed=self.seq)
        while True:
            try:
                done = self.publisher.install(plan, self.last)
                break
            except Unavailable:
                self.retries += 1
                time.sleep(0.05)
        self.published[plan.version] = done.digest
        self.last = plan
        return plan.version


def routers(url: str, key: Any, n: int) -> list[tuple[RouterClient, RouterHistory]]:
    out = []
    for i in range(n):
        h = RouterHistory(f"r{i}")
        c = RouterClient(RedisPlanSource(url), router_id=f"r{i}", public_keys=[key],
                         on_applied=h.on_applied, recheck_s=0.5)
        out.append((c.start(initial_wait_s=0), h))
    return out


def run_stream(cluster: RedisClusterProcs, versions: int, routers_n: int = 10,
               during: Any = None, check: Any = None,
               ) -> tuple[Stream, list[tuple[RouterClient, RouterHistory]]]:
    key = signing.generate_private_key()
    publisher = PlanPublisher(cluster.url, key)
    stream = Stream(publisher, synthetic_plan(300, 8, seed=3))
    stream.one()
    fleet = routers(cluster.url, key.public_key(), routers_n)
    action = threading.Thread(target=during, args=(stream,)) if during else None
    try:
        for i in range(versions - 1):
            stream.one()
            if action is not None and i == versions // 4:
                action.start()
        if action is not None:
            action.join(60)
        final = max(stream.published)
        for client, history in fleet:
            assert client.wait_for_version(final, 15), (client.router_id, client.version)
            assert history.wait_for(final)
        for _, history in fleet:
            assert check_history(history, published=stream.published, final=final) == []
        if check is not None:
            check()
    finally:
        for client, _ in fleet:
            client.stop()
        publisher.close()
    return stream, fleet


def sharded_subscribers(cluster: RedisClusterProcs, channel: str = Layout().channel) -> int:
    """Routers subscribed to `channel` (the notify channel) with SSUBSCRIBE, on the slot's
    master."""
    owner, _ = slot_owner(cluster)
    return int(node_client(owner).execute_command("PUBSUB", "SHARDNUMSUB", channel)[1])


def test_a_stream_of_versions_reaches_every_router_whole(cluster):
    def sharded() -> None:  # notifications are sharded pub/sub, on the slot's node
        assert sharded_subscribers(cluster) == 10

    stream, fleet = run_stream(cluster, versions=200, check=sharded)
    applied = sum(len(h.applied) for _, h in fleet)
    print(f"cluster: 200 versions, 10 routers, {applied} applies, {stream.retries} retries")


@pytest.mark.slow
def test_1000_versions_reach_10_routers_whole(cluster):
    run_stream(cluster, versions=1000)


def migrate_plan_slot(cluster: RedisClusterProcs) -> None:
    """Move the plan's slot to another master, key by key, as a reshard does."""
    source_port, source_id = slot_owner(cluster)
    source = node_client(source_port)
    slot = source.cluster("keyslot", SLOT_KEY)
    masters = {int(a.split(":")[1].split("@")[0]): i["node_id"]
               for a, i in source.cluster("nodes").items() if "master" in i["flags"]}
    target_port = next(p for p in masters if p != source_port)
    target, target_id = node_client(target_port), masters[target_port]
    target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    while True:
        keys = source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 5)
        if not keys:
            break
        source.execute_command("MIGRATE", "127.0.0.1", target_port, "", 0, 5000,
                               "REPLACE", "KEYS", *keys)
        time.sleep(0.02)  # let installs interleave with the move
    for port in masters:
        node_client(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)


def test_the_plan_slot_migrates_mid_stream(cluster):
    before, _ = slot_owner(cluster)
    stream, _ = run_stream(cluster, versions=150, routers_n=5,
                           during=lambda s: migrate_plan_slot(cluster))
    after, _ = slot_owner(cluster)
    assert after != before
    print(f"slot moved {before} -> {after}; {stream.retries} installs retried")


def test_routers_converge_within_2_s_after_the_replica_is_promoted(cluster):
    key = signing.generate_private_key()
    publisher = PlanPublisher(cluster.url, key)
    stream = Stream(publisher, synthetic_plan(300, 8, seed=5))
    stream.one()
    fleet = routers(cluster.url, key.public_key(), 10)
    try:
        for _ in range(20):
            stream.one()
        for client, _ in fleet:
            assert client.wait_for_version(max(stream.published), 10)
        port, _ = slot_owner(cluster)
        cluster.node(port).process.signal(9)  # SIGKILL the slot's master
        killed = time.monotonic()
        assert eventually(lambda: slot_owner(cluster)[0] != port, 20)
        promoted = time.monotonic()
        version = stream.one()  # retried until the cluster takes writes again
        assert eventually(lambda: all(c.version >= version for c, _ in fleet), 10)
        converged = time.monotonic()
        print(f"master killed: promoted after {promoted - killed:.2f} s, every router on "
              f"{version} {converged - promoted:.2f} s after the promotion "
              f"({stream.retries} install retries)")
        assert converged - promoted <= 2.0
        for _, history in fleet:
            assert history.wait_for(version)
            assert check_history(history, published=stream.published, final=version) == []
    finally:
        for client, _ in fleet:
            client.stop()
        publisher.close()


def test_routers_share_conversations_by_sharded_pub_sub(cluster):
    """The routers' history exchange (router_client.redis_history) on a cluster: sharded
    pub/sub on the plan slot's node, the same as the plan notifications."""
    import asyncio

    from router_client.redis_history import RedisHistoryExchange
    from router_client.routing import RouterCore

    async def main() -> tuple[int, int]:
        cores = [RouterCore(["d0", "d1", "d2"], seed=i, history_slack=1.0) for i in range(2)]
        ex = [await RedisHistoryExchange(c, cluster.url, router_id=f"r{i}").start()
              for i, c in enumerate(cores)]
        try:
            for _ in range(100):  # both sharded subscriptions in place
                if sharded_subscribers(cluster, Layout().history_channel) >= 2:
                    break
                await asyncio.sleep(0.05)
            for n in range(20):
                cores[0].route_index("tenant", f"conv-{n}")
            for _ in range(100):
                if cores[1].history_learned >= 20:
                    break
                await asyncio.sleep(0.05)
            return cores[1].history_learned, ex[0].moves_sent
        finally:
            for e in ex:
                await e.stop()

    learned, sent = asyncio.run(main())
    assert learned == sent == 20
