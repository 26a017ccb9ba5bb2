"""Item 11, the gRPC contract of the planner service, beyond tests/service:
deadlines honoured (unary and streaming), health transitions with Redis, retried
mutations idempotent across a deadline, and the auth matrix over every method.
Oversize requests (RESOURCE_EXHAUSTED) are in test_security.py."""

from __future__ import annotations

import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cacheroute.v1 import plan_pb2, planner_pb2, planner_pb2_grpc
from planner_svc.devstack.processes import restart_redis
from planner_svc.orchestration import failpoints
from planner_svc.server import SERVICE_NAME
from tests.faults import signals
from tests.reliability.harness import feed, planner_service
from tests.waiting import eventually

pytestmark = pytest.mark.integration
OPERATOR, READER = "op-secret", "read-secret"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def auth(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


@pytest.fixture()
def svc(redis_server, tmp_path):
    s = planner_service(
        redis_server.url, tmp_path / "planner", operator_token=OPERATOR, reader_token=READER
    )
    feed(s)
    assert eventually(lambda: s.planner.installed is not None, 5)
    yield s
    failpoints.configure("")
    s.stop(0)


@pytest.fixture()
def channel(svc):
    ch = grpc.insecure_channel(f"127.0.0.1:{svc.port}")
    yield ch
    ch.close()


def test_deadlines_are_honoured_and_a_retry_with_the_request_id_acts_once(svc, channel):
    stub = planner_pb2_grpc.PlannerStub(channel)
    before = svc.planner.installed.plan.version
    failpoints.configure("publish.before_redis=sleep:1.5")  # a slow publication
    req = planner_pb2.ReplanRequest(force=True, request_id="retry-1")
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as exc:
        stub.Replan(req, metadata=auth(OPERATOR), timeout=0.3)
    assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - t0 < 1.0  # the client is not held past its deadline
    failpoints.configure("")
    again = stub.Replan(req, metadata=auth(OPERATOR), timeout=5)  # the client retries
    after = svc.planner.installed.plan.version
    assert after.seq == before.seq + 1  # one install for two calls
    assert again.installed and again.decision.installed.seq == after.seq
    third = stub.Replan(req, metadata=auth(OPERATOR), timeout=5)
    assert third == again and svc.planner.installed.plan.version == after
    rb = planner_pb2.RollbackRequest(version=plan_pb2.PlanVersion(epoch=1, seq=1),
                                     request_id="rb-1")  # fmt: skip
    first_rb = stub.Rollback(rb, metadata=auth(OPERATOR), timeout=5)
    assert stub.Rollback(rb, metadata=auth(OPERATOR), timeout=5) == first_rb
    assert svc.planner.installed.plan.version.seq == after.seq + 1


def test_a_watch_ends_at_its_deadline_and_frees_its_thread(svc, channel):
    stub = planner_pb2_grpc.PlannerStub(channel)
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as exc:
        for _ in stub.WatchPlans(planner_pb2.WatchPlansRequest(), metadata=auth(READER),
                                 timeout=0.5):  # fmt: skip
            pass
    assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - t0 < 1.5
    assert eventually(lambda: svc.planner.events.watchers == 0, 2.0)


def test_health_follows_redis_and_shutdown(redis_server, svc, channel):
    health = health_pb2_grpc.HealthStub(channel)

    def status() -> int:
        return health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=2).status

    assert status() == SERVING
    signals.kill(redis_server.process.pid)
    t0 = time.monotonic()
    assert eventually(lambda: status() == NOT_SERVING, 5.0)
    down_s = time.monotonic() - t0
    restart_redis(redis_server)
    t1 = time.monotonic()
    assert eventually(lambda: status() == SERVING, 5.0)
    up_s = time.monotonic() - t1
    print(f"health: NOT_SERVING {down_s:.2f} s after the kill, SERVING {up_s:.2f} s after restart")
    assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status == SERVING
    svc.health.enter_graceful_shutdown()
    assert status() == NOT_SERVING


READS = {
    "GetStatus": planner_pb2.GetStatusRequest(),
    "GetCurrentVersion": planner_pb2.GetCurrentVersionRequest(),
    "ListPlanVersions": planner_pb2.ListPlanVersionsRequest(limit=2),
    "ListDecisions": planner_pb2.ListDecisionsRequest(limit=2),
    "ListRouters": planner_pb2.ListRoutersRequest(),
}
MUTATIONS = {
    "Replan": planner_pb2.ReplanRequest(dry_run=True),
    "Rollback": planner_pb2.RollbackRequest(release=True),
    "SetMode": planner_pb2.SetModeRequest(),
    "UpdateConfig": planner_pb2.UpdateConfigRequest(),
}


def test_auth_matrix_over_every_method(svc, channel):
    stub = planner_pb2_grpc.PlannerStub(channel)
    expected = {
        None: (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAUTHENTICATED),
        "wrong": (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAUTHENTICATED),
        READER: (grpc.StatusCode.OK, grpc.StatusCode.PERMISSION_DENIED),
        OPERATOR: (grpc.StatusCode.OK, grpc.StatusCode.OK),
    }
    for token, (read_code, write_code) in expected.items():
        md = auth(token) if token else None
        for calls, code in ((READS, read_code), (MUTATIONS, write_code)):
            for method, request in calls.items():
                try:
                    getattr(stub, method)(request, metadata=md, timeout=5)
                    got = grpc.StatusCode.OK
                except grpc.RpcError as exc:
                    got = exc.code()
                assert got == code, (token, method, got)
