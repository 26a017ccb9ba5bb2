"""What one router's Redis login can do at worst (issue 55, defects 1-5, 15 and 17).

Every test renders the shipped ACL template as docs/security.md does (render-acl.sh),
starts a real redis-server with it, and attacks with redis-py holding exactly the
credential of one router, `edge-3`, while honest routers `edge-1` and `edge-2` report as
they do in production (RedisPlanSource.report) and the planner reads the fleet with its own
credential (PlanPublisher.router_statuses / fleet_view, which ListRouters and the control
loop call)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cacheroute.v1 import plan_pb2 as pb
from planner_svc.adapters.redis_publisher import PlanPublisher
from planner_svc.devstack.processes import start_redis
from planner_svc.orchestration.fleet_health import reported_down
from router_client import signing
from router_client.layout import Layout
from router_client.plan import Version
from router_client.redis_history import RedisHistoryExchange
from router_client.redis_source import RedisPlanSource
from router_client.routing import RouterCore
from router_client.testing import synthetic_plan
from tests.reliability.test_security import render_acl

pytestmark = pytest.mark.integration

ROUTERS = {"edge-1": "e1", "edge-2": "e2", "edge-3": "e3"}
LAY = Layout()


class Fleet:
    def __init__(self, url: str) -> None:
        self.url = url
        self.publisher = PlanPublisher(url, signing.generate_private_key(),
                                       username="cacheroute-planner", password="planner-pw")
        self.sources = {rid: RedisPlanSource(url, username=f"cacheroute-router-{rid}",
                                             password=pw) for rid, pw in ROUTERS.items()}
        self.attacker = redis.Redis.from_url(url, username="cacheroute-router-edge-3",
                                             password="e3")
        self.planner = redis.Redis.from_url(url, username="cacheroute-planner",
                                            password="planner-pw")

    def report(self, rid: str, unhealthy: tuple[str, ...] = ()) -> int | None:
        now = int(time.time() * 1000)
        return self.sources[rid].report(pb.RouterStatus(
            router_id=rid, reported_at_ms=now, applied=pb.PlanVersion(epoch=1, seq=1),
            unhealthy_destinations=list(unhealthy)))

    def ids(self) -> list[str]:
        return sorted(s.router_id for s in self.publisher.router_statuses())


@pytest.fixture()
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    acl = render_acl(tmp_path / "users.acl", "planner-pw", ROUTERS)
    server = start_redis(tmp_path, extra_args=["--aclfile", str(acl)])
    f = Fleet(f"redis://127.0.0.1:{server.port}/0")
    try:
        f.publisher.install(synthetic_plan(50, 4), None)
        yield f
    finally:
        for s in f.sources.values():
            s.close()
        server.process.stop()


def _denied(fn) -> bool:  # type: ignore[no-untyped-def]
    try:
        fn()
    except redis.exceptions.NoPermissionError:
        return True
    return False


def test_1_a_router_cannot_run_scripts_and_the_planner_can_kill_one(fleet: Fleet) -> None:
    """A CPU-loop script from a router answered BUSY to everyone else; now a router may not
    load or run a script at all, and the planner may SCRIPT KILL (NOTBUSY: none running)."""
    loop = "while true do end"
    assert _denied(lambda: fleet.attacker.script_load(loop))
    assert _denied(lambda: fleet.attacker.eval(loop, 0))
    assert _denied(lambda: fleet.attacker.evalsha("0" * 40, 1, LAY.versions))
    assert _denied(lambda: fleet.attacker.execute_command("FUNCTION", "LIST"))
    with pytest.raises(redis.ResponseError, match="NOTBUSY"):
        fleet.planner.script_kill()
    assert fleet.planner.ping()


def test_2_the_registry_cannot_be_broken_by_a_router(fleet: Fleet) -> None:
    """`SET routers junk` or a ZADD of invalid UTF-8 made ListRouters fail with INTERNAL.
    The registry is the planner's now: a router cannot write it, and a broken one (left by
    an older deployment) is rewritten on the planner's next read."""
    fleet.report("edge-1")
    assert _denied(lambda: fleet.attacker.set(LAY.routers, b"junk"))
    assert _denied(lambda: fleet.attacker.zadd(LAY.routers, {b"\xff\xfe": 1}))
    fleet.planner.set(LAY.routers, b"junk")  # what an older ACL let any router do
    assert fleet.ids() == ["edge-1"]
    assert [s.router_id for s in fleet.publisher.fleet_view()] == ["edge-1"]
    assert fleet.planner.type(LAY.routers) == b"zset"
    assert fleet.planner.zrange(LAY.routers, 0, -1) == [b"edge-1"]


def test_3_forged_statuses_neither_evict_honest_routers_nor_drain_an_engine(
    fleet: Fleet,
) -> None:
    """Forged statuses pushed honest routers out of the index, and a few forged "engine
    down" reports then drained engine-00. Now a router writes only its own key, a status
    counts only under the id its key names, and draining needs most routers' reports."""
    fleet.report("edge-1")
    fleet.report("edge-2")
    old = int(time.time() * 1000) - 3_600_000
    for rid in ("edge-1", "edge-2"):  # age the honest routers out of the index
        _denied(lambda rid=rid: fleet.attacker.zadd(LAY.routers, {rid: old}))
    for i in range(5):  # more "routers", all calling engine-00 down
        forged = pb.RouterStatus(router_id=f"edge-9{i}", reported_at_ms=int(time.time() * 1000),
                                 unhealthy_destinations=["d0000"])
        assert _denied(lambda f=forged: fleet.attacker.set(
            LAY.router_status(f.router_id), f.SerializeToString(), ex=15))
    # its own key, carrying another router's name: not counted as anybody
    impostor = pb.RouterStatus(router_id="edge-1", reported_at_ms=int(time.time() * 1000),
                               unhealthy_destinations=["d0000"])
    fleet.attacker.set(LAY.router_status("edge-3"), impostor.SerializeToString(), ex=15)
    statuses = fleet.publisher.router_statuses()
    assert sorted(s.router_id for s in statuses) == ["edge-1", "edge-2"]
    assert fleet.attacker.get(LAY.router_status("edge-3")) is None  # deleted
    # the attacker's honest-looking own report calling engine-00 down: one vote of three
    fleet.report("edge-3", unhealthy=("d0000",))
    statuses = fleet.publisher.router_statuses()
    assert len(statuses) == 3
    known = [d.id for d in synthetic_plan(50, 4).destinations]
    assert reported_down([s.unhealthy_destinations for s in statuses], known) == frozenset()
    fleet.report("edge-2", unhealthy=("d0000",))  # a second router agrees: a majority
    statuses = fleet.publisher.router_statuses()
    assert reported_down([s.unhealthy_destinations for s in statuses], known) == {"d0000"}


def test_4_a_status_with_an_impossible_version_is_refused(fleet: Fleet) -> None:
    """A status holding version 2^64-1 made the planner's first plan after a total loss
    start an epoch that does not fit in a version (ValueError on every step). It is not a
    status the planner reads now, so the next epoch stays above the honest routers'."""
    fleet.report("edge-1")
    lie = pb.RouterStatus(router_id="edge-3", reported_at_ms=int(time.time() * 1000),
                          applied=pb.PlanVersion(epoch=(1 << 64) - 1, seq=(1 << 64) - 1))
    fleet.sources["edge-3"].report(lie)  # as a router writes its status
    statuses = fleet.publisher.router_statuses()
    assert [s.router_id for s in statuses] == ["edge-1"]
    held = max(Version(s.applied.epoch, s.applied.seq) for s in statuses)
    assert held == Version(1, 1)


def test_5_a_router_cannot_hold_unbounded_memory(fleet: Fleet) -> None:
    """A router could SET its status at 10 MB with no TTL and ZADD 100,000 members into the
    index. The index is not its to write; an oversized, TTL-less or wrong-typed status key
    is deleted on the planner's next read (at most one control interval)."""
    assert _denied(lambda: fleet.attacker.zadd(LAY.routers, {f"r{i}": i for i in range(1000)}))
    key = LAY.router_status("edge-3")
    fleet.attacker.set(key, b"x" * (10 * 1024 * 1024))  # no TTL
    fleet.report("edge-1")
    assert fleet.ids() == ["edge-1"]
    assert fleet.planner.exists(key) == 0
    status = pb.RouterStatus(router_id="edge-3", reported_at_ms=int(time.time() * 1000))
    fleet.attacker.set(key, status.SerializeToString())  # well formed, but without a TTL
    assert fleet.ids() == ["edge-1"] and fleet.planner.exists(key) == 0
    fleet.attacker.set(key, status.SerializeToString(), ex=10**8)  # a TTL of three years
    assert fleet.ids() == ["edge-1"] and fleet.planner.exists(key) == 0
    fleet.report("edge-3")  # as a router writes it: counted
    assert fleet.ids() == ["edge-1", "edge-3"]
    assert fleet.publisher.junk_router_statuses == 3


def test_peers_are_counted_from_the_planners_registry(fleet: Fleet) -> None:
    """Routers count their peers (idle re-homing pauses while there are any) from the
    registry the planner writes, and never count themselves."""
    assert fleet.report("edge-1") == 0
    fleet.report("edge-2")
    fleet.publisher.router_statuses()  # the planner's read writes the registry
    assert fleet.report("edge-1") == 1
    assert fleet.report("edge-3") == 2  # not yet in the registry itself


def test_15_conversation_memory_is_shared_on_the_router_credentials(fleet: Fleet) -> None:
    """The documented router users could not publish on the history channel (moves_lost
    30 of 30). They may publish there, and still not on the planner's notify channel."""
    assert _denied(lambda: fleet.attacker.publish(LAY.channel, b"x"))

    async def main() -> None:
        cores = [RouterCore(["d0", "d1", "d2"], seed=i, history_slack=1.0) for i in range(2)]
        ex = [await RedisHistoryExchange(c, fleet.url, router_id=rid, period_s=0.02,
                                         username=f"cacheroute-router-{rid}",
                                         password=ROUTERS[rid]).start()
              for c, rid in zip(cores, ("edge-1", "edge-2"), strict=True)]
        try:
            await asyncio.sleep(0.3)
            for i in range(30):
                cores[0].route_index("tenant", f"conversation-{i}")
            for _ in range(100):
                if cores[1].history_learned >= 30:
                    break
                await asyncio.sleep(0.05)
            assert ex[0].moves_lost == 0
            assert cores[1].history_learned == 30
        finally:
            for e in ex:
                await e.stop()

    asyncio.run(main())


def test_17_the_template_loads_as_documented() -> None:
    """Redis 7.0 refused the rendered template ("should start with user keyword") because
    of its comment lines; the test used to strip them. It has none, and docs/security.md
    renders it with the script the tests use."""
    root = Path(__file__).resolve().parents[2]
    template = (root / "deploy/redis/users.acl.template").read_text().splitlines()
    assert template and all(line.startswith("user ") for line in template)
    assert "deploy/redis/render-acl.sh" in (root / "docs/security.md").read_text()


def test_a_group_user_renders_and_loads(tmp_path: Path) -> None:
    """`gateway-*`, as the Kubernetes manifests log in (every gateway pod one user)."""
    acl = render_acl(tmp_path / "users.acl", "planner-pw", {"gateway-*": "g"})
    server = start_redis(tmp_path, extra_args=["--aclfile", str(acl)])
    try:
        pod = redis.Redis(port=server.port, username="cacheroute-router-gateway-*",
                          password="g")
        assert pod.set(LAY.router_status("gateway-pod-1"), b"x", ex=5)
        assert _denied(lambda: pod.set(LAY.router_status("epp-1"), b"x", ex=5))
    finally:
        server.process.stop()


def test_a_bad_credentials_file_is_one_line(tmp_path: Path) -> None:
    import subprocess

    from tests.reliability.test_security import RENDER

    for text, expected in (("router edge-1 pw\n", "no 'planner"),
                           ("planner pw\nrouter a*b pw\n", "router id 'a*b'"),
                           ("planner pw\nrouter *\n", "router id '*'"),
                           ("planner pw\nrouter edge-1\n", "needs a password")):
        r = subprocess.run(["sh", str(RENDER)], input=text, text=True, capture_output=True)
        assert r.returncode == 2 and expected in r.stderr and r.stderr.count("\n") == 1
