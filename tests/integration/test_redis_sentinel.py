"""Plans through a Sentinel-managed Redis: a primary, two replicas, three Sentinels (real
redis-server processes), the real planner service installing ~10 plans a second and five
routers following, all connected by `redis+sentinel://…/cacheroute`.

The primary is SIGKILLed. The Sentinels promote a replica; the planner and the routers
find it on their own; every router is on the newest version within 5 s of the failover,
versions only ever increase, and what the old primary acknowledged but never replicated
is put back: the planner re-checks the pointer against what it installed and republishes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner_svc.devstack.redis_topologies import SentinelProcs, start_redis_sentinel
from planner_svc.errors import PlannerError
from planner_svc.server import PlannerService, build_service
from router_client import signing
from router_client.client import RouterClient
from router_client.layout import Layout, Pointer
from router_client.plan import Version
from router_client.redis_source import RedisPlanSource, connect
from tests.faults.history import RouterHistory, check_history
from tests.service.harness import feed, planner_settings
from tests.waiting import eventually

pytestmark = pytest.mark.integration


@pytest.fixture()
def sentinel(server_workdir) -> Iterator[SentinelProcs]:  # type: ignore[no-untyped-def]
    s = start_redis_sentinel(server_workdir)
    yield s
    s.stop()


@pytest.fixture()
def planner(sentinel: SentinelProcs, tmp_path: Path) -> Iterator[PlannerService]:
    svc = build_service(planner_settings(sentinel.url, tmp_path), consume=False)
    svc.start()  # the timer: republish what Redis lost, control steps
    yield svc
    svc.stop(0)


class Installer:
    """An operator forcing an install every 0.1 s; Unavailable (failover) is retried."""

    def __init__(self, svc: PlannerService) -> None:
        self.svc = svc
        self.installed: list[tuple[float, Version]] = []
        self.digests: list[tuple[float, Version, bytes]] = []
        self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                r = self.svc.planner.replan(fresh=False, force=True, dry_run=False)
            except PlannerError:
                self.refused += 1
                continue
            if r.installed is not None:
                now, v = time.monotonic(), r.installed.plan.version
                self.installed.append((now, v))
                self.digests.append((now, v, r.installed.digest))

    def __enter__(self) -> Installer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_routers_follow_the_promoted_primary_within_5_s(sentinel, planner, tmp_path):
    feed(planner)
    planner.planner.tick()
    key = signing.load_public_key(tmp_path / "planner-signing-key.pub.pem")
    fleet = []
    for i in range(5):
        h = RouterHistory(f"r{i}")
        client = RouterClient(RedisPlanSource(sentinel.url), router_id=f"r{i}",
                              public_keys=[key], on_applied=h.on_applied, recheck_s=0.5)
        fleet.append((client.start(initial_wait_s=5), h))
    store = connect(sentinel.url, socket_timeout=2)
    first = planner.planner.installed
    assert first is not None
    old_port = sentinel.master_port()
    try:
        with Installer(planner) as installer:
            assert eventually(lambda: len(installer.installed) >= 10, 20)
            sentinel.primary.process.signal(9)
            killed = time.monotonic()
            assert eventually(lambda: sentinel.master_port() != old_port, 30)
            failed_over = time.monotonic()
            assert eventually(lambda: any(t > failed_over for t, _ in installer.installed), 15)
            newest = planner.planner.installed.plan.version  # type: ignore[union-attr]
            assert eventually(lambda: all(c.version >= newest for c, _ in fleet), 10)
            caught_up = time.monotonic()
        print(f"sentinel failover {failed_over - killed:.2f} s after SIGKILL; every router on "
              f"{newest} {caught_up - failed_over:.2f} s after it; {installer.refused} "
              f"installs refused meanwhile")
        assert caught_up - failed_over <= 5.0
        final = planner.planner.installed.plan.version  # type: ignore[union-attr]
        # Redis holds what the planner installed (republished if the failover lost it)
        assert eventually(lambda: Pointer.decode(store.get(Layout().current)).version == final,
                          10)
        versions = [v for _, v in installer.installed]
        assert versions == sorted(versions)
        published = {first.plan.version: first.digest,
                     **{v: d for _, v, d in installer.digests}}
        for client, history in fleet:
            assert client.wait_for_version(final, 10) and history.wait_for(final)
            assert check_history(history, published=published, final=final) == []
    finally:
        for client, _ in fleet:
            client.stop()
