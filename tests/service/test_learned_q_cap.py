"""The planner learns q_cap from the engines when asked (`learn_q_cap`, live through
UpdateConfig): loads carried without queueing can only raise it, destinations that stay
saturated measure it, and the operator's q_cap bounds it to [q/2, 2q]."""

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
    # q_cap 60 req/s; the harness sends 300 req/s over six destinations: 50 each.
    with serving(redis_server.url, tmp_path, q_cap=60.0) as svc:
        yield svc


def report(svc: PlannerService, at_ms: int, *, waiting: int) -> None:
    for d in DESTS:
        svc.planner.on_engine_signals(signals_pb2.EngineSignals(
            destination=d, observed_at_ms=at_ms, metrics=True, running=8, waiting=waiting))


def report_engine_ttft(svc: PlannerService, at_ms: int, p99_s: float) -> None:
    """Every destination's engine reports a TTFT p99 at `at_ms`, then a window ends there."""
    for d in DESTS:
        svc.planner.on_engine_signals(signals_pb2.EngineSignals(
            destination=d, observed_at_ms=at_ms, metrics=True, running=8, waiting=0,
            ttft_p99_s=p99_s))
    feed(svc, end_ms=at_ms)


def planned_q_cap(svc: PlannerService) -> float:
    svc.planner.replan(fresh=True, force=True, dry_run=False)
    return svc.planner.installed.plan.config.q_cap  # type: ignore[union-attr]


def test_q_cap_follows_the_engines_when_learning_is_on(service):
    stub = planner_pb2_grpc.PlannerStub(grpc.insecure_channel(f"127.0.0.1:{service.port}"))
    now_ms = int(time.time() * 1000)
    report(service, now_ms, waiting=0)  # every engine copes...
    feed(service, end_ms=now_ms)  # ...with 50 req/s each
    service.planner.tick()
    status = stub.GetStatus(planner_pb2.GetStatusRequest(), timeout=10)
    assert status.measured_q_cap_source == "served"
    assert status.measured_q_cap == pytest.approx(50.0)
    assert status.measured_q_cap_destinations == 6 and status.q_cap_in_use == 60.0
    config = stub.UpdateConfig(planner_pb2.UpdateConfigRequest(learn_q_cap=True),
                               timeout=10).config
    assert config.learn_q_cap
    assert planned_q_cap(service) == 60.0  # coping at 50 says only "q_cap >= 50"

    for s in range(0, 15, 5):  # a 10-s burst of queueing is no knee (yet: not derated)
        report(service, now_ms + 1000 + s * 1000, waiting=12)
    burst = stub.GetStatus(planner_pb2.GetStatusRequest(), timeout=10)
    assert burst.measured_q_cap_source == "served" and burst.q_cap_in_use == 60.0
    report(service, now_ms + 16_000, waiting=0)
    for s in range(0, 30, 5):  # then all six queue for 25 s at 50 req/s
        report(service, now_ms + 20_000 + s * 1000, waiting=12)
    status = stub.GetStatus(planner_pb2.GetStatusRequest(), timeout=10)
    assert status.measured_q_cap_source == "knee"
    assert status.measured_q_cap == pytest.approx(45.0, rel=0.02)  # 50 less the drain margin
    assert planned_q_cap(service) == pytest.approx(45.0, rel=0.02)
    plan = service.planner.installed.plan  # type: ignore[union-attr]
    # planned at the learned q_cap, the knees are the fleet's own: nobody is derated
    assert all(d.capacity_weight == pytest.approx(1.0) for d in plan.destinations)

    stub.UpdateConfig(planner_pb2.UpdateConfigRequest(learn_q_cap=False), timeout=10)
    assert planned_q_cap(service) == 60.0  # the operator's again; each destination derated
    plan = service.planner.installed.plan  # type: ignore[union-attr]
    assert all(d.capacity_weight == pytest.approx(0.75, rel=0.02) for d in plan.destinations)


def test_loads_that_keep_breaking_the_ttft_target_bound_q_cap_from_above(redis_server, tmp_path):
    """With a TTFT target, a load whose engines' TTFT p99 stays over it (two reports in a
    row) is no served load but an upper bound: q_cap typed in at 60 is planned at the 50
    req/s each destination broke the target at; one report over it is not yet a break."""
    with serving(redis_server.url, tmp_path, q_cap=60.0, learn_q_cap=True,
                 q_cap_ttft_slo_s=2.0) as svc:
        stub = planner_pb2_grpc.PlannerStub(grpc.insecure_channel(f"127.0.0.1:{svc.port}"))
        now_ms = int(time.time() * 1000)

        def report_ttft(at_ms: int, p99_s: float) -> None:
            report_engine_ttft(svc, at_ms, p99_s)

        report_ttft(now_ms, 3.5)
        status = stub.GetStatus(planner_pb2.GetStatusRequest(), timeout=10)
        assert not status.HasField("measured_q_cap") and status.q_cap_in_use == 60.0
        report_ttft(now_ms + 5_000, 3.5)  # the second report over the target in a row
        status = stub.GetStatus(planner_pb2.GetStatusRequest(), timeout=10)
        assert status.measured_q_cap_source == "slo"
        assert status.measured_q_cap_slo_bound == pytest.approx(50.0)
        assert status.q_cap_in_use == pytest.approx(50.0)
        assert planned_q_cap(svc) == pytest.approx(50.0)
        report_ttft(now_ms + 10_000, 1.2)  # within the target: a served load, still bounded
        status = stub.GetStatus(planner_pb2.GetStatusRequest(), timeout=10)
        assert status.measured_q_cap_source == "served"
        assert status.q_cap_in_use == pytest.approx(50.0)


def test_breaks_that_persist_under_the_bound_step_q_cap_down_to_half(redis_server, tmp_path):
    """A destination can keep breaking the target below the load it first broke it at (the
    plan still stacks hot keys on it): every dwell while that lasts, q_cap steps to 0.85 x
    the value in use, never below half the operator's; reports within the target stop it."""
    from planner_svc.control.capacity import SLO_STEP, SLO_STEP_DWELL_S

    with serving(redis_server.url, tmp_path, q_cap=60.0, learn_q_cap=True,
                 q_cap_ttft_slo_s=2.0) as svc:
        stub = planner_pb2_grpc.PlannerStub(grpc.insecure_channel(f"127.0.0.1:{svc.port}"))
        start_ms = int(time.time() * 1000) - 400_000  # windows in the recent past
        dwell_ms = int(SLO_STEP_DWELL_S * 1000)

        def report_ttft(at_ms: int, p99_s: float) -> float:
            report_engine_ttft(svc, at_ms, p99_s)
            return stub.GetStatus(planner_pb2.GetStatusRequest(), timeout=10).q_cap_in_use

        report_ttft(start_ms, 3.5)
        assert report_ttft(start_ms + 5_000, 3.5) == pytest.approx(50.0)  # the breaking load
        in_use = [report_ttft(start_ms + 5_000 + k * dwell_ms, 3.5) for k in range(1, 6)]
        assert in_use[:3] == pytest.approx([SLO_STEP ** k * 50.0 for k in (1, 2, 3)])
        assert in_use[3:] == pytest.approx([30.0, 30.0])  # 0.85^4 x 50 = 26.1: the floor q/2
        later = start_ms + 5_000 + 6 * dwell_ms
        assert report_ttft(later, 1.0) == pytest.approx(30.0)  # within target: it stays
        assert report_ttft(later + dwell_ms, 1.0) == pytest.approx(30.0)
