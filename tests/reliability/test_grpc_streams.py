"""Streaming RPCs cannot starve the planner's gRPC server (issue 55, defect 8).

24 GetPlan streams whose client stops reading used to take every server thread: GetStatus,
health and GetCurrentVersion timed out, and 80 gave RESOURCE_EXHAUSTED. Plan downloads are
now bounded like WatchPlans (MAX_PLAN_STREAMS at once) and in time (a download that is not
read ends at the deadline and frees its thread)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cacheroute.v1 import planner_pb2, planner_pb2_grpc
from planner_svc import server as server_mod
from planner_svc.devstack.processes import RedisServer
from planner_svc.server import PlannerService, build_service
from planner_svc.simulator.rates import paper_like_keys, paper_like_rates
from tests.service.harness import DESTS, planner_settings
from tests.service.windows import make_window

pytestmark = pytest.mark.integration
DEADLINE_S = 3.0


@pytest.fixture()
def big_plan_planner(redis_server: RedisServer, tmp_path: Path,
                     monkeypatch: pytest.MonkeyPatch) -> Iterator[PlannerService]:
    monkeypatch.setattr(server_mod, "PLAN_STREAM_DEADLINE_S", DEADLINE_S)
    svc = build_service(planner_settings(redis_server.url, tmp_path / "p",
                                         warm_slots_per_destination=50_000), consume=False)
    svc.start()
    # A plan of several chunks, so a client that stops reading blocks the server's writes.
    keys = paper_like_keys(250_000)
    rates = paper_like_rates(250_000, 3000.0, seed=3)
    end = int(time.time() * 1000)
    for window_end in (end - 10_000, end):
        svc.planner.on_window(make_window(keys, rates, window_end_ms=window_end,
                                          destinations=list(DESTS)))
    svc.planner.tick()
    assert svc.planner.installed is not None
    try:
        yield svc
    finally:
        svc.stop()


def test_8_unread_plan_downloads_leave_unary_calls_and_health_serving(
    big_plan_planner: PlannerService,
) -> None:
    target = f"127.0.0.1:{big_plan_planner.port}"
    # A reader that never reads: no BDP probe, so each stream's window stays at 64 KiB and
    # the server's write blocks; a connection of its own per channel.
    slow = [("grpc.http2.bdp_probe", 0), ("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.insecure_channel(target, options=slow) for _ in range(24)]
    calls = []
    for ch in channels:
        call = planner_pb2_grpc.PlannerStub(ch).GetPlan(planner_pb2.GetPlanRequest(),
                                                        timeout=30)
        calls.append(call)
    time.sleep(1.0)  # every download started; none is read
    probe = grpc.insecure_channel(target)
    stub = planner_pb2_grpc.PlannerStub(probe)
    try:
        assert stub.GetStatus(planner_pb2.GetStatusRequest(), timeout=3)
        assert stub.GetCurrentVersion(planner_pb2.GetCurrentVersionRequest(), timeout=3)
        health = health_pb2_grpc.HealthStub(probe).Check(health_pb2.HealthCheckRequest(),
                                                         timeout=3)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        # The held downloads end at the deadline (never read, so never finished); the
        # others were refused.
        codes = []
        for call in calls:
            try:
                for _ in call:
                    time.sleep(DEADLINE_S)  # a reader far too slow for the deadline
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
        assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) >= 24 - server_mod.MAX_PLAN_STREAMS
        assert grpc.StatusCode.OK not in codes
        # ... and a reader that reads gets the whole plan on a freed slot.
        chunks = list(stub.GetPlan(planner_pb2.GetPlanRequest(), timeout=30))
        assert len(chunks) == chunks[0].count
    finally:
        probe.close()
        for ch in channels:
            ch.close()
