"""The planner plans with W measured from the engines' KV events when asked to
(`learn_warm_slots`, live through UpdateConfig), within [W/2, 2W] of the operator's W."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from cacheroute.v1 import planner_pb2, planner_pb2_grpc, signals_pb2
from planner_svc.server import PlannerService
from tests.service.harness import DESTS, feed, serving

pytestmark = pytest.mark.integration


@pytest.fixture()
def service(redis_server, tmp_path) -> Iterator[PlannerService]:  # type: ignore[no-untyped-def]
    with serving(redis_server.url, tmp_path) as svc:
        yield svc


def report(svc: PlannerService, blocks: int) -> None:
    now_ms = int(time.time() * 1000)
    for d in DESTS:
        svc.planner.on_engine_signals(signals_pb2.EngineSignals(
            destination=d, observed_at_ms=now_ms, kv_events=True, blocks_resident=blocks,
            block_size=16, kv_usage=0.97))


def test_w_follows_the_engines_when_learning_is_on(service):
    stub = planner_pb2_grpc.PlannerStub(grpc.insecure_channel(f"127.0.0.1:{service.port}"))
    feed(service)  # reusable prefixes of 800 tokens; the configured W is 8
    service.planner.tick()

    def planned_w() -> int:
        service.planner.replan(fresh=True, force=True, dry_run=False)
        return service.planner.installed.plan.config.warm_slots_per_destination  # type: ignore[union-attr]

    report(service, blocks=600)  # 600 x 16 / 800 = 12 prefixes per destination
    assert planned_w() == 8  # measured, shown, not used: learning is off
    status = stub.GetStatus(planner_pb2.GetStatusRequest(), timeout=10)
    assert status.measured_warm_slots == 12.0 and status.measured_warm_slots_destinations == 6
    config = stub.UpdateConfig(planner_pb2.UpdateConfigRequest(learn_warm_slots=True),
                               timeout=10).config
    assert config.learn_warm_slots
    assert planned_w() == 12
    report(service, blocks=5000)  # 100 prefixes: bounded to twice the operator's 8
    assert planned_w() == 16
    report(service, blocks=50)  # 1 prefix: bounded to half
    assert planned_w() == 4
    stub.UpdateConfig(planner_pb2.UpdateConfigRequest(learn_warm_slots=False), timeout=10)
    assert planned_w() == 8
