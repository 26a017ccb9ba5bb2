"""A destination whose engine keeps queueing is planned at the capacity it showed: the next
plan moves load off it, `GetStatus` says why, and it is restored after it clears."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from cacheroute.v1 import planner_pb2, planner_pb2_grpc, signals_pb2
from planner_svc.control.traffic import capacities, expected_loads
from planner_svc.server import PlannerService
from tests.service.harness import DESTS, feed, serving

pytestmark = pytest.mark.integration


@pytest.fixture()
def service(redis_server, tmp_path) -> Iterator[PlannerService]:  # type: ignore[no-untyped-def]
    # q_cap 100 req/s per destination; the harness sends 300 req/s over six: 50 each (the
    # P2C tail, so the cold tail splits evenly and the arithmetic below is exact).
    with serving(redis_server.url, tmp_path, q_cap=100.0, hashed_tail=False) as svc:
        yield svc


def reports(svc: PlannerService, start_ms: int, seconds: range, **d0: int) -> None:
    for s in seconds:
        for d in DESTS:
            figures = d0 if d == "d0" else {"running": 6, "waiting": 0}
            svc.planner.on_engine_signals(signals_pb2.EngineSignals(
                destination=d, observed_at_ms=start_ms + s * 1000, metrics=True, **figures))


def d0_share(svc: PlannerService) -> float:
    svc.planner.replan(fresh=True, force=True, dry_run=False)
    plan = svc.planner.installed.plan  # type: ignore[union-attr]
    assert svc.planner.traffic is not None
    loads = expected_loads(plan, svc.planner.traffic)
    ids = [d.id for d in plan.destinations]
    return float(loads[ids.index("d0")] / loads.sum())


def test_a_saturated_engine_is_planned_at_its_measured_capacity_until_it_clears(service):
    stub = planner_pb2_grpc.PlannerStub(grpc.insecure_channel(f"127.0.0.1:{service.port}"))
    feed(service)
    service.planner.tick()
    before = d0_share(service)
    assert before == pytest.approx(1 / 6, abs=0.03)
    now_ms = int(time.time() * 1000) - 120_000
    reports(service, now_ms, range(0, 30, 5), running=8, waiting=12)  # 25 s queueing at 50/s
    status = stub.GetStatus(planner_pb2.GetStatusRequest(), timeout=10)
    [sat] = status.saturated
    assert sat.destination == "d0" and sat.derated and sat.reason == "waiting 12 beside 8 running"
    # 50 req/s arrived, the queue held steady: planned 10 % under that, so it drains
    assert sat.knee_per_s == pytest.approx(45.0, rel=0.02)
    assert sat.planned_weight == pytest.approx(0.45, rel=0.02) and sat.configured_weight == 1.0
    # The staleness account prices the overload the installed (even) plan now puts on it.
    fleet = list(service.planner.planning_config().destinations)
    installed = service.planner.installed.plan  # type: ignore[union-attr]
    over = expected_loads(installed, service.planner.traffic, fleet) - capacities(installed, fleet)
    assert over[[d.id for d in fleet].index("d0")] == pytest.approx(5.0, rel=0.05)
    after = d0_share(service)
    assert after < 0.7 * before  # the plan moved keys off it
    assert np.isclose(sum(1 for d in service.planner.installed.plan.destinations  # type: ignore[union-attr]
                          if d.capacity_weight < 1), 1)
    reports(service, now_ms, range(30, 95, 5), running=4, waiting=0)  # 65 s clear
    assert not stub.GetStatus(planner_pb2.GetStatusRequest(), timeout=10).saturated
    assert d0_share(service) == pytest.approx(before, abs=0.01)
