"""`cacheroute pool-sync` against a real planner (gRPC, Redis): an InferencePool's pods come,
stop being ready and go, and the planner's destinations and its next plans follow.

The Kubernetes API server is the one part that cannot run here: the pool and its pods are
the API's JSON, held by the test and changed as a cluster would change them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from planner_svc.adapters.discovery_sources import InferencePoolSource
from planner_svc.cli.discover_cmd import DestinationSync
from planner_svc.cli.ops_client import PlannerConnection
from planner_svc.server import PlannerService
from tests.service.harness import OPERATOR, feed, serving
from tests.unit.test_reconcile import POOL, pod

pytestmark = pytest.mark.integration
PODS = ("vllm-0", "vllm-1", "vllm-2", "vllm-3", "vllm-4", "vllm-5")


class Cluster:
    """What the API server would answer for the pool and its pods."""

    def __init__(self) -> None:
        self.pods = {name: pod(name, f"10.1.0.{i + 10}") for i, name in enumerate(PODS)}

    def read_pool(self) -> dict[str, Any]:
        return POOL

    def list_pods(self, label_selector: str) -> list[dict[str, Any]]:
        assert label_selector == "app=vllm,tier=a"
        return list(self.pods.values())


@pytest.fixture()
def planner(redis_server, tmp_path) -> Iterator[PlannerService]:  # type: ignore[no-untyped-def]
    # The planner starts with the pool's six pods by name (addresses from the first sync).
    with serving(redis_server.url, tmp_path, operator_token=OPERATOR,
                 destinations=PODS) as svc:
        yield svc


def plan_destinations(svc: PlannerService) -> dict[str, tuple[str, bool]]:
    svc.planner.replan(fresh=False, force=True, dry_run=False)
    plan = svc.planner.installed.plan  # type: ignore[union-attr]
    return {d.id: (d.address, d.draining) for d in plan.destinations}


def test_the_planner_follows_the_pools_pods(planner):
    cluster = Cluster()
    clock = [0.0]
    conn = PlannerConnection(f"127.0.0.1:{planner.port}", OPERATOR)
    sync = DestinationSync(InferencePoolSource(cluster), conn, remove_after_s=30.0,
                           clock=lambda: clock[0])
    try:
        feed(planner)
        planner.planner.tick()
        first = sync.once()  # the same names; their addresses come from the pool
        assert sorted(d.id for d in first.add) == list(PODS) and not first.drain
        assert not sync.once()  # in step
        dests = plan_destinations(planner)
        assert dests["vllm-3"] == ("http://10.1.0.13:8000", False)
        # scale up: a seventh pod becomes ready
        cluster.pods["vllm-6"] = pod("vllm-6", "10.1.0.16")
        edit = sync.once()
        assert [d.id for d in edit.add] == ["vllm-6"]
        assert plan_destinations(planner)["vllm-6"] == ("http://10.1.0.16:8000", False)
        # a pod stops being ready: drained (routers stop sending), not yet removed
        cluster.pods["vllm-1"] = pod("vllm-1", "10.1.0.11", ready=False)
        assert sync.once().drain == ["vllm-1"]
        dests = plan_destinations(planner)
        assert dests["vllm-1"][1] is True
        plan = planner.planner.installed.plan
        drained = next(i for i, x in enumerate(plan.destinations) if x.id == "vllm-1")
        assert drained not in set(plan.table.members.tolist())  # no key is planned there
        clock[0] = 10.0
        assert not sync.once()  # still draining
        clock[0] = 45.0
        assert sync.once().remove == ["vllm-1"]
        assert "vllm-1" not in plan_destinations(planner)
        # a pool that momentarily selects nothing changes nothing
        saved, cluster.pods = cluster.pods, {}
        assert not sync.once()
        cluster.pods = saved
        assert (sync.rounds, sync.edits) == (7, 4)
    finally:
        conn.close()
