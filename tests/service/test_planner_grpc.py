"""The planner service in-process: real gRPC on an ephemeral port, real redis-server.

Windows are fed straight into the planner (the Kafka leg is covered end to end in
tests/integration); everything from the planner to Redis and the gRPC API is real.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from cacheroute.v1 import plan_pb2, planner_pb2, planner_pb2_grpc
from planner_svc.control.guard import DEFAULT_AFFINITY_GAIN_MIN
from planner_svc.server import PlannerService, build_service
from planner_svc.simulator.rates import paper_like_keys, paper_like_rates
from router_client import signing
from router_client.plan import Version, decode_plan
from tests.service.harness import DESTS, OPERATOR, READER, feed, planner_settings
from tests.service.windows import make_window

pytestmark = pytest.mark.integration


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def service(redis_server, tmp_path: Path) -> Iterator[PlannerService]:
    settings = planner_settings(
        redis_server.url, tmp_path, operator_token=OPERATOR, reader_token=READER
    )
    svc = build_service(settings, consume=False)
    svc.server.start()
    yield svc
    svc.stop(0)


def stub_for(svc: PlannerService) -> planner_pb2_grpc.PlannerStub:
    channel = grpc.insecure_channel(f"127.0.0.1:{svc.port}")
    return planner_pb2_grpc.PlannerStub(channel)


def auth(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def test_first_window_installs_a_plan_visible_over_grpc_and_in_redis(service):
    feed(service)
    decision = service.planner.tick()
    assert decision is not None and decision.action == "install"
    stub = stub_for(service)
    current = stub.GetCurrentVersion(planner_pb2.GetCurrentVersionRequest(), metadata=auth(READER))
    assert (current.version.epoch, current.version.seq) == (1, 1)
    published = service.publisher.current()
    assert published is not None and published.version.seq == 1
    assert published.digest == current.digest
    chunks = list(stub.GetPlan(planner_pb2.GetPlanRequest(), metadata=auth(READER)))
    blob = b"".join(c.payload for c in chunks)
    key = signing.load_private_key(Path(service.settings.data_dir) / "planner-signing-key.pem")
    _kind, payload, _digest = signing.verify_blob(blob, signing.pin([key.public_key()]))
    plan = decode_plan(payload)
    assert len(plan.table) == 6 * 8  # C = R·W slots, all k_b = 1 at these rates
    assert plan.destination_ids == list(DESTS)


def test_replan_rollback_and_mode_work_end_to_end(service):
    feed(service)
    service.planner.tick()
    stub = stub_for(service)
    op = auth(OPERATOR)
    dry = stub.Replan(planner_pb2.ReplanRequest(dry_run=True), metadata=op)
    assert not dry.installed
    forced = stub.Replan(
        planner_pb2.ReplanRequest(force=True, fresh=True, request_id="r1"), metadata=op
    )
    assert forced.installed and forced.candidate.version.seq == 2
    again = stub.Replan(
        planner_pb2.ReplanRequest(force=True, fresh=True, request_id="r1"), metadata=op
    )
    assert again.candidate.version.seq == 2  # the retried request acted once
    rolled = stub.Rollback(
        planner_pb2.RollbackRequest(version=plan_pb2.PlanVersion(epoch=1, seq=1), request_id="b1"),
        metadata=op,
    )
    assert rolled.pinned and rolled.installed.version.seq == 3
    assert rolled.installed.built_by == "rollback:1.1"
    status = stub.GetStatus(planner_pb2.GetStatusRequest(), metadata=op)
    assert status.pinned and status.installed.seq == 3
    mode = stub.SetMode(
        planner_pb2.SetModeRequest(mode=planner_pb2.FALLBACK, reason="drill"), metadata=op
    )
    assert mode.mode == planner_pb2.FALLBACK
    fallback_plan = service.publisher.load(service.publisher.current().version)
    assert len(fallback_plan.table) == 0 and fallback_plan.config.built_by == "fallback"
    assert fallback_plan.config.fallback  # the field routers act on
    back = stub.SetMode(planner_pb2.SetModeRequest(mode=planner_pb2.PLANNED), metadata=op)
    assert back.mode == planner_pb2.PLANNED
    resumed = service.publisher.load(service.publisher.current().version)
    assert len(resumed.table) > 0
    versions = stub.ListPlanVersions(planner_pb2.ListPlanVersionsRequest(), metadata=op)
    seqs = [v.version.seq for v in versions.versions]
    assert seqs == sorted(seqs, reverse=True) and seqs[0] == service.publisher.current().version.seq
    decisions = stub.ListDecisions(planner_pb2.ListDecisionsRequest(limit=50), metadata=op)
    actions = [d.action for d in decisions.decisions]
    assert "install" in actions and "fallback" in actions and "resume" in actions


def test_auth_matrix(service):
    feed(service)
    service.planner.tick()
    stub = stub_for(service)
    with pytest.raises(grpc.RpcError) as none:
        stub.Replan(planner_pb2.ReplanRequest(dry_run=True))
    assert none.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as reader:
        stub.Replan(planner_pb2.ReplanRequest(dry_run=True), metadata=auth(READER))
    assert reader.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as wrong:
        stub.GetStatus(planner_pb2.GetStatusRequest(), metadata=auth("nope"))
    assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert stub.GetStatus(planner_pb2.GetStatusRequest(), metadata=auth(READER)).installed.seq == 1


@pytest.mark.parametrize(
    ("call", "request_"),
    [
        ("UpdateConfig", planner_pb2.UpdateConfigRequest(q_cap=-1.0)),
        ("UpdateConfig", planner_pb2.UpdateConfigRequest(drain_destinations=["nope"])),
        ("UpdateConfig", planner_pb2.UpdateConfigRequest(warm_slots_per_destination=0)),
        ("DiffPlans", planner_pb2.DiffPlansRequest()),
        ("ListDecisions", planner_pb2.ListDecisionsRequest(limit=10**6)),
        ("Rollback", planner_pb2.RollbackRequest()),
    ],
)
def test_invalid_requests_get_invalid_argument(service, call, request_):
    feed(service)
    service.planner.tick()
    with pytest.raises(grpc.RpcError) as err:
        getattr(stub_for(service), call)(request_, metadata=auth(OPERATOR))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details()


def test_unknown_version_is_not_found(service):
    feed(service)
    service.planner.tick()
    with pytest.raises(grpc.RpcError) as err:
        list(
            stub_for(service).GetPlan(
                planner_pb2.GetPlanRequest(version=plan_pb2.PlanVersion(epoch=1, seq=99)),
                metadata=auth(READER),
            )
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_drain_moves_keys_off_the_destination(service):
    feed(service)
    service.planner.tick()
    stub = stub_for(service)
    stub.UpdateConfig(
        planner_pb2.UpdateConfigRequest(drain_destinations=["d0"]), metadata=auth(OPERATOR)
    )
    result = stub.Replan(planner_pb2.ReplanRequest(force=True), metadata=auth(OPERATOR))
    assert result.installed
    plan = service.publisher.load(service.publisher.current().version)
    d0 = plan.destination_ids.index("d0")
    assert d0 not in set(plan.table.members.tolist())


def test_restart_resumes_at_the_installed_version(service, redis_server, tmp_path):
    feed(service)
    service.planner.tick()
    installed = service.planner.installed
    again = build_service(service.settings, consume=False)
    try:
        assert again.planner.installed is not None
        assert again.planner.installed.plan.version == installed.plan.version
        assert again.planner.installed.digest == installed.digest
    finally:
        again.publisher.close()


def test_first_plan_waits_for_a_full_window_of_rates(service):
    keys = paper_like_keys(50)
    rates = paper_like_rates(50, 100.0, seed=3)
    end = int(time.time() * 1000)
    service.planner.on_window(
        make_window(keys, rates, window_end_ms=end - 5_000, destinations=list(DESTS))
    )
    assert service.planner.tick() is None and service.planner.installed is None
    service.planner.on_window(
        make_window(keys, rates, window_end_ms=end + 5_000, destinations=list(DESTS))
    )
    decision = service.planner.tick()
    assert decision is not None and decision.action == "install"


def test_windows_without_traffic_plan_nothing_until_a_window_of_traffic_is_in(service):
    # All-zero rates (an idle fleet, a silent stream partition) neither crash nor yield a
    # plan: the first plan waits for a full window after the first one with traffic.
    keys = paper_like_keys(10)
    end = int(time.time() * 1000)
    for window_end in (end - 30_000, end - 20_000):
        service.planner.on_window(
            make_window(keys, np.zeros(10), window_end_ms=window_end, destinations=list(DESTS))
        )
    assert service.planner.tick() is None and service.planner.installed is None
    rates = np.full(10, 5.0)
    service.planner.on_window(
        make_window(keys, rates, window_end_ms=end - 10_000, destinations=list(DESTS)))
    assert service.planner.tick() is None  # one window of traffic is not yet a full one
    service.planner.on_window(make_window(keys, rates, window_end_ms=end,
                                          destinations=list(DESTS)))
    decision = service.planner.tick()
    assert decision is not None and decision.action == "install"
    assert len(service.planner.installed.plan.table) == 10


def test_history_outlives_redis_and_restart_republishes(broker, redis_server, tmp_path):
    import uuid

    from planner_svc.devstack.processes import restart_redis

    settings = planner_settings(
        redis_server.url, tmp_path, bootstrap=broker.bootstrap,
        state_topic=f"planner-state-{uuid.uuid4().hex[:8]}",
    )
    first = build_service(settings, consume=False, durable=True)
    feed(first)
    first.planner.tick()
    first.planner.replan(fresh=False, force=True, dry_run=False)
    installed = first.planner.installed
    assert installed is not None and installed.plan.version.seq == 2
    first.publisher.close()
    restart_redis(redis_server)  # no persistence: Redis comes back empty
    second = build_service(settings, consume=False, durable=True)
    try:
        assert second.planner.installed is not None
        assert second.planner.installed.plan.version == installed.plan.version
        current = second.publisher.current()
        assert current is not None and current.version == installed.plan.version
        assert current.digest == installed.digest
        assert [d.action for d in second.planner.decisions][-2:] == ["install", "install"]
    finally:
        second.publisher.close()


def test_every_rpc_is_reachable_through_reflection(service):
    """A generic client (no generated stubs) discovers the service and calls every RPC."""
    from google.protobuf import descriptor_pool, message_factory
    from google.protobuf.descriptor_pb2 import FileDescriptorProto
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    feed(service)
    service.planner.tick()
    channel = grpc.insecure_channel(f"127.0.0.1:{service.port}")
    reflect = reflection_pb2_grpc.ServerReflectionStub(channel)

    def ask(**kw):
        return next(
            iter(
                reflect.ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(**kw)]), metadata=auth(OPERATOR)
                )
            )
        )

    services = {s.name for s in ask(list_services="").list_services_response.service}
    assert "cacheroute.v1.Planner" in services and "grpc.health.v1.Health" in services
    pool = descriptor_pool.DescriptorPool()
    protos = ask(file_containing_symbol="cacheroute.v1.Planner").file_descriptor_response
    pending = [FileDescriptorProto.FromString(raw) for raw in protos.file_descriptor_proto]
    while pending:  # add files once their dependencies are in
        fd = pending.pop(0)
        try:
            pool.Add(fd)
        except TypeError:
            pending.append(fd)
    svc = pool.FindServiceByName("cacheroute.v1.Planner")
    read_only = {
        "GetStatus",
        "GetCurrentVersion",
        "GetPlan",
        "ListPlanVersions",
        "ListDecisions",
        "ListRouters",
    }
    called = set()
    for method in svc.methods:
        if method.name not in read_only:
            continue
        request_cls = message_factory.GetMessageClass(method.input_type)
        response_cls = message_factory.GetMessageClass(method.output_type)
        path = f"/cacheroute.v1.Planner/{method.name}"
        kwargs = dict(
            request_serializer=request_cls.SerializeToString,
            response_deserializer=response_cls.FromString,
        )
        if method.server_streaming:
            replies = list(
                channel.unary_stream(path, **kwargs)(request_cls(), metadata=auth(OPERATOR))
            )
            assert replies
        else:
            channel.unary_unary(path, **kwargs)(request_cls(), metadata=auth(OPERATOR))
        called.add(method.name)
    assert called == read_only
    assert {m.name for m in svc.methods} >= read_only | {
        "Replan",
        "Rollback",
        "SetMode",
        "UpdateConfig",
        "DiffPlans",
        "WatchPlans",
    }


def test_watch_streams_installs_and_decisions(service):
    import threading

    feed(service)
    service.planner.tick()
    channel = grpc.insecure_channel(f"127.0.0.1:{service.port}")
    stub = planner_pb2_grpc.PlannerStub(channel)
    stream = stub.WatchPlans(planner_pb2.WatchPlansRequest(), metadata=auth(READER))
    events: list = []

    def consume():
        for ev in stream:
            events.append(ev)
            if len(events) >= 2:
                return

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.5)
    stub.Replan(planner_pb2.ReplanRequest(force=True), metadata=auth(OPERATOR))
    t.join(10)
    stream.cancel()
    kinds = {ev.WhichOneof("event") for ev in events}
    assert kinds == {"installed", "decision"}
    installed = next(ev.installed for ev in events if ev.WhichOneof("event") == "installed")
    assert installed.version.seq == 2 and installed.current


def test_routers_report_their_sync_state(service, redis_server):
    from router_client import RouterClient
    from router_client.plan import Version
    from router_client.redis_source import RedisPlanSource

    feed(service)
    service.planner.tick()
    key = signing.load_private_key(Path(service.settings.data_dir) / "planner-signing-key.pem")
    router = RouterClient(
        RedisPlanSource(redis_server.url),
        router_id="edge-7",
        public_keys=signing.pin([key.public_key()]),
        destination_ids=DESTS,
        status_interval_s=0.2,
    ).start()
    try:
        assert router.wait_for_version(Version(1, 1), 10)
        deadline = time.monotonic() + 5
        routers = []
        while time.monotonic() < deadline and not routers:
            routers = (
                stub_for(service)
                .ListRouters(planner_pb2.ListRoutersRequest(), metadata=auth(READER))
                .routers
            )
            time.sleep(0.2)
        assert [(r.status.router_id, r.state) for r in routers] == [("edge-7", "in_sync")]
    finally:
        router.stop()


def test_decisions_name_what_they_installed_and_retried_config_acts_once(service):
    feed(service)
    service.planner.tick()
    stub = stub_for(service)
    op = auth(OPERATOR)
    stub.Replan(planner_pb2.ReplanRequest(force=True, request_id="rq-9"), metadata=op)
    latest = stub.ListDecisions(planner_pb2.ListDecisionsRequest(limit=1), metadata=op).decisions[0]
    assert latest.action == "install" and latest.installed.seq == 2 and latest.request_id == "rq-9"
    ids = [
        d.id for d in stub.ListDecisions(planner_pb2.ListDecisionsRequest(), metadata=op).decisions
    ]
    assert len(ids) == len(set(ids))
    add = planner_pb2.UpdateConfigRequest(
        add_destinations=[plan_pb2.Destination(id="d9")], request_id="cfg-1"
    )
    first = stub.UpdateConfig(add, metadata=op)
    again = stub.UpdateConfig(add, metadata=op)  # a retry after a lost reply: same answer
    assert [d.id for d in first.config.destinations] == [d.id for d in again.config.destinations]
    assert "d9" in [d.id for d in again.config.destinations]
    with pytest.raises(grpc.RpcError) as err:  # a new request adding it again is a conflict
        stub.UpdateConfig(
            planner_pb2.UpdateConfigRequest(
                add_destinations=[plan_pb2.Destination(id="d9")], request_id="cfg-2"
            ),
            metadata=op,
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError):  # a refused edit changes nothing
        stub.UpdateConfig(
            planner_pb2.UpdateConfigRequest(q_cap=5.0, remove_destinations=["zz"]), metadata=op
        )
    assert service.planner.tunables.q_cap == 20.0


def test_drift_installs_only_when_staleness_exceeds_rewarm(service):
    """σ = 0.3 lognormal random walk, one step per interval, through the real loop."""
    from planner_svc.simulator.rates import lognormal_walk

    keys = paper_like_keys(400)
    rates = paper_like_rates(400, 300.0, seed=5)
    rng = np.random.default_rng(11)
    start = int(time.time() * 1000)
    interval_ms = 10_000
    service.planner.update_config(tunables={"interval_s": 10.0}, add=[], drain=[], remove=[])
    for step in range(30):
        end = start + step * interval_ms
        if step >= 2:
            rates = lognormal_walk(rates, 0.3, rng)
        # Warm keys (the plan's) hit 80 %, the fallback's 20 %: the warm advantage is real.
        installed = service.planner.installed
        admitted = set(installed.plan.table.keys) if installed else set()
        hits = np.array([0.8 if k in admitted else 0.2 for k in keys])
        service.planner.on_window(
            make_window(keys, rates, window_end_ms=end, hit_rate=hits, destinations=list(DESTS))
        )
        service.planner.tick(now_s=end / 1000.0 + 0.5)
    decisions = (
        stub_for(service)
        .ListDecisions(planner_pb2.ListDecisionsRequest(limit=100), metadata=auth(READER))
        .decisions
    )
    loop_decisions = [d for d in decisions if d.action in ("install", "keep")][::-1][1:]
    assert loop_decisions, "the loop made no decision"
    hysteresis = service.planner.decision_settings.hysteresis
    for d in loop_decisions:
        p = d.penalties
        price = p.rewarm_cost * (1 + hysteresis)
        if d.action == "install":
            assert d.installed.seq >= 2 and d.moved_traffic_share > 0
            assert p.rewarm_cost > 0 and p.staleness_accumulated >= price, d.reason
        else:
            assert p.staleness_accumulated < price, d.reason
    installs = [d for d in loop_decisions if d.action == "install"]
    keeps = [d for d in loop_decisions if d.action == "keep"]
    assert installs and keeps, [d.action for d in loop_decisions]
    for d in installs:  # the figures before the reset: the reason quotes them
        assert "reached the candidate's rewarm cost" in d.reason


def test_guard_falls_back_outside_the_validated_range_and_resumes(redis_server, tmp_path):
    settings = planner_settings(
        redis_server.url, tmp_path, interval_s=5.0, validated_hit_rate_min=0.5
    )
    svc = build_service(settings, consume=False)
    try:
        keys = paper_like_keys(400)
        rates = paper_like_rates(400, 300.0, seed=1)
        start = int(time.time() * 1000)

        def window_at(step: int, hit: float) -> float:
            end = start + step * 5_000
            svc.planner.on_window(
                make_window(
                    keys,
                    rates,
                    window_end_ms=end,
                    window_s=5.0,
                    hit_rate=hit,
                    destinations=list(DESTS),
                )
            )
            svc.planner.tick(now_s=end / 1000.0 + 0.1)
            return end

        for step in range(3):
            window_at(step, 0.8)
        assert svc.planner.mode == "planned"
        for step in range(3, 6):
            window_at(step, 0.2)  # the served hit rate left the validated range
        assert svc.planner.mode == "fallback"
        live = svc.publisher.load(svc.publisher.current().version)
        assert live.config.built_by == "fallback" and len(live.table) == 0
        for step in range(6, 30):
            window_at(step, 0.8)  # back inside: resume after the guard's dwell
        assert svc.planner.mode == "planned"
        live = svc.publisher.load(svc.publisher.current().version)
        assert len(live.table) > 0
        actions = [d.action for d in svc.planner.decisions]
        assert "fallback" in actions and "resume" in actions
    finally:
        svc.stop(0)


def gain_floor_planner(redis_url: str, tmp_path: Path,
                       **overrides: Any) -> tuple[PlannerService, Any]:
    """A planner with the default floor on the predicted gain, and `window_at(step, prefix,
    hit)`: feed the 5-s window ending at `step` (400 paper-like keys whose prompts share
    `prefix` of 1000 tokens, `hit` served from cache) and run the control step after it."""
    settings = planner_settings(redis_url, tmp_path, interval_s=5.0,
                                validated_affinity_gain_min=DEFAULT_AFFINITY_GAIN_MIN,
                                warm_slots_per_destination=60, **overrides)
    svc = build_service(settings, consume=False)
    keys = paper_like_keys(400)
    rates = paper_like_rates(400, 300.0, seed=1)
    start = int(time.time() * 1000)

    def window_at(step: int, prefix: float, hit: float) -> Any:
        end = start + step * 5_000
        svc.planner.on_window(make_window(
            keys, rates, window_end_ms=end, window_s=5.0, hit_rate=hit,
            destinations=list(DESTS), prefix_tokens=prefix))
        return svc.planner.tick(now_s=end / 1000.0 + 0.1)

    return svc, window_at


def test_guard_gain_floor_serves_flat_lb_where_affinity_cannot_win_and_resumes(
        redis_server, tmp_path):
    """The default floor on affinity's predicted gain, in the planner: windows whose keys
    share 30 of 1000 prompt tokens send the fleet to Flat-LB (a fallback plan published),
    windows of 900-token prefixes on caches that hold the hot keys bring the plan back."""
    svc, window_at = gain_floor_planner(redis_server.url, tmp_path, guard_resume_dwell_s=10.0)
    try:

        for step in range(3):
            window_at(step, 900.0, 0.8)
        assert svc.planner.mode == "planned"
        for step in range(3, 6):
            window_at(step, 30.0, 0.02)  # little to reuse: pinning buys nothing
        assert svc.planner.mode == "fallback"
        live = svc.publisher.load(svc.publisher.current().version)
        assert live.config.is_fallback
        reasons = [d.reason for d in svc.planner.decisions if d.action == "fallback"]
        assert reasons and "predicted affinity gain" in reasons[-1]
        for step in range(6, 20):
            window_at(step, 900.0, 0.3)  # measured under Flat-LB; the gain is back
        assert svc.planner.mode == "planned"
        assert len(svc.publisher.load(svc.publisher.current().version).table) > 0
    finally:
        svc.stop(0)


def test_traffic_with_too_little_to_reuse_never_gets_a_plan_before_the_guards_verdict(
        redis_server, tmp_path):
    """The guard judges the predicted gain before the first plan: while a run of low
    gains is under way nothing is installed (routers keep their cold tail), the run's
    verdict installs Flat-LB as the first table, and a gain that comes back later gets a
    plan built fresh (there is no planned table to repack)."""
    svc, window_at = gain_floor_planner(redis_server.url, tmp_path, guard_resume_dwell_s=10.0)
    try:

        assert window_at(0, 30.0, 0.02) is None  # rates do not cover a window yet
        assert window_at(1, 30.0, 0.02) is None  # they do: the guard's first low window
        assert window_at(2, 30.0, 0.02) is None
        assert svc.planner.installed is None and svc.publisher.current() is None
        decision = window_at(3, 30.0, 0.02)  # the third low window: the verdict
        assert decision is not None and decision.action == "fallback"
        assert "predicted affinity gain" in decision.reason
        live = svc.publisher.load(svc.publisher.current().version)
        assert live.config.is_fallback and len(live.table) == 0
        for step in range(4, 13):
            window_at(step, 900.0, 0.3)  # the gain is back: resume after the dwell
        assert svc.planner.mode == "planned"
        live = svc.publisher.load(svc.publisher.current().version)
        assert not live.config.is_fallback and len(live.table) > 0
    finally:
        svc.stop(0)


def test_a_low_gain_that_never_settles_delays_the_first_plan_by_at_most_its_run(
        redis_server, tmp_path):
    """One low window, then windows whose gain is unknown: the run neither grows nor ends,
    so the first plan waits no longer than the run's length in windows (plus one) and
    then plans as before."""
    svc, window_at = gain_floor_planner(redis_server.url, tmp_path)
    try:
        decisions = []
        for step in range(8):
            # No prefix reported and nothing served from cache: the gain is unknown.
            prefix, hit = (30.0, 0.02) if step == 1 else (0.0, 0.0)
            decisions.append(window_at(step, prefix, hit))
        installs = [i for i, d in enumerate(decisions) if d is not None]
        assert installs and installs[0] == 5  # ready at step 1, then (3 + 1) windows of 5 s
        assert decisions[5].action == "install"
        assert len(svc.publisher.load(svc.publisher.current().version).table) > 0
    finally:
        svc.stop(0)


def test_the_guard_acts_while_a_rollback_pins_the_plan(redis_server, tmp_path):
    """The pin holds the plan, not the safety net: out of range, the pinned fleet falls
    back; back in range, it resumes to the pinned plan (not a new candidate)."""
    settings = planner_settings(
        redis_server.url, tmp_path, interval_s=5.0, validated_hit_rate_min=0.5,
        guard_resume_dwell_s=20.0,
    )
    svc = build_service(settings, consume=False)
    try:
        keys = paper_like_keys(400)
        start = int(time.time() * 1000)

        def window_at(step: int, hit: float, seed: int = 1) -> None:
            end = start + step * 5_000
            svc.planner.on_window(make_window(
                keys, paper_like_rates(400, 300.0, seed=seed), window_end_ms=end, window_s=5.0,
                hit_rate=hit, destinations=list(DESTS)))
            svc.planner.tick(now_s=end / 1000.0 + 0.1)

        for step in range(3):
            window_at(step, 0.8)
        pinned_from = svc.planner.installed.plan.version
        svc.planner.rollback(pinned_from)
        pinned = svc.publisher.load(svc.publisher.current().version)
        assert svc.planner.pinned
        # Out of range, and rates that would replan. The rollback is an install still
        # rewarming, so the guard waits `rewarm_enter_after_s` (30 s) before falling back.
        for step in range(3, 6):
            window_at(step, 0.2, seed=7)
        assert svc.planner.mode == "planned"
        for step in range(6, 11):
            window_at(step, 0.2, seed=7)
        assert svc.planner.mode == "fallback"
        assert svc.publisher.load(svc.publisher.current().version).config.built_by == "fallback"
        for step in range(11, 19):
            window_at(step, 0.8, seed=7)
        assert svc.planner.mode == "planned" and svc.planner.pinned
        resumed = svc.publisher.load(svc.publisher.current().version)
        assert resumed.version > pinned.version
        assert resumed.table.keys == pinned.table.keys  # the pinned table, not a replan
        actions = [d.action for d in svc.planner.decisions]
        assert actions.count("fallback") == 1 and actions.count("resume") == 1
    finally:
        svc.stop(0)


def test_guard_options_and_weights_set_at_run_time_survive_a_restart(
        broker, redis_server, tmp_path):
    import uuid

    settings = planner_settings(
        redis_server.url, tmp_path, bootstrap=broker.bootstrap,
        state_topic=f"planner-state-{uuid.uuid4().hex[:8]}", validated_p99_ms_max=9000.0,
    )
    first = build_service(settings, consume=False, durable=True)
    first.start()
    try:
        feed(first)
        first.planner.tick()
        s = stub_for(first)
        status = s.GetStatus(planner_pb2.GetStatusRequest(), timeout=5)
        assert status.config.guard.p99_ms_max == 9000
        guard = planner_pb2.GuardConfig(p99_ms_max=3500, hit_rate_min=0.5, enter_after_s=30,
                                        resume_dwell_s=120, p99_resume_margin=0.2)
        reply = s.UpdateConfig(planner_pb2.UpdateConfigRequest(
            guard=guard, byte_aware=True, balance_effort=0.25, set_weights={DESTS[1]: 3.0},
            hysteresis=0.4, min_dwell_s=30), timeout=10)
        assert reply.config.guard == guard and reply.config.byte_aware
        assert (reply.config.hysteresis, reply.config.min_dwell_s) == (0.4, 30)
        for bad in (planner_pb2.GuardConfig(p99_resume_margin=1.5),
                    planner_pb2.GuardConfig(hit_rate_min=2.0),
                    planner_pb2.GuardConfig(resume_dwell_s=float("nan"))):
            with pytest.raises(grpc.RpcError) as err:
                s.UpdateConfig(planner_pb2.UpdateConfigRequest(guard=bad), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert first.planner.guard.settings.resume_dwell_s == 120  # refused edits change nothing
    finally:
        first.stop(0)
    second = build_service(settings, consume=False, durable=True)
    try:
        g = second.planner.guard
        assert g.validated.p99_ms_max == 3500 and g.validated.hit_rate_min == 0.5
        t = second.planner.tunables
        assert t.byte_aware and t.balance_effort == 0.25
        assert {d.id: d.capacity_weight for d in second.planner.destinations}[DESTS[1]] == 3.0
        assert (g.settings.enter_after_s, g.settings.resume_dwell_s,
                g.settings.p99_resume_margin) == (30, 120, 0.2)
        d = second.planner.decision_settings
        assert (d.hysteresis, d.min_dwell_s) == (0.4, 30)
    finally:
        second.stop(0)


def test_a_config_persisted_before_the_loop_owned_the_install_rule_is_migrated(
        broker, redis_server, tmp_path):
    """Older planners kept hysteresis and min_dwell_s among the tunables; a planner that
    restores such a config applies them to its control loop and persists the new shape."""
    import dataclasses
    import uuid

    from planner_svc.adapters.kafka_history import KafkaHistory

    settings = planner_settings(redis_server.url, tmp_path, bootstrap=broker.bootstrap,
                                state_topic=f"planner-state-{uuid.uuid4().hex[:8]}")
    first = build_service(settings, consume=False, durable=True)
    old = {**dataclasses.asdict(first.planner.tunables), "hysteresis": 0.7, "min_dwell_s": 45.0}
    destinations = [dataclasses.asdict(d) for d in first.planner.destinations]
    first.stop(0)
    history = KafkaHistory(broker.bootstrap, settings.state_topic)
    history.record_config({"tunables": old, "guard": first.planner.guard.to_dict(),
                           "destinations": destinations})
    history.flush()
    second = build_service(settings, consume=False, durable=True)
    second.server.start()
    try:
        d = second.planner.decision_settings
        assert (d.hysteresis, d.min_dwell_s) == (0.7, 45.0)
        config = stub_for(second).GetStatus(planner_pb2.GetStatusRequest(), timeout=5).config
        assert (config.hysteresis, config.min_dwell_s) == (0.7, 45.0)
    finally:
        second.stop(0)


@contextlib.contextmanager
def five_second_planner(redis_url: str, tmp_path: Path) -> Iterator[PlannerService]:
    """A served planner with a 5-s control interval, its ticks driven by the test."""
    svc = build_service(planner_settings(redis_url, tmp_path, interval_s=5.0), consume=False)
    svc.server.start()
    try:
        yield svc
    finally:
        svc.stop(0)


def install_a_plan_predicting(planner: Any, hit: float) -> tuple[Any, Any, int]:
    """Three windows at `hit`, the first plan, one more window (what the second plan
    predicts from), then a forced second plan (1.2) installed "now" on the planner's clock.
    Returns (keys, rates, the wall-clock ms after which windows count for it)."""
    keys = paper_like_keys(400)
    rates = paper_like_rates(400, 300.0, seed=1)
    start = int(time.time() * 1000) - 600_000

    def window_at(step: int) -> None:
        planner.on_window(make_window(keys, rates, window_end_ms=start + step * 5_000,
                                      window_s=5.0, hit_rate=hit, destinations=list(DESTS)))

    for step in range(3):
        window_at(step)
    planner.tick(now_s=(start + 2 * 5_000) / 1000.0 + 0.1)  # the first plan
    window_at(4)  # measured hit of the admitted keys
    planner.replan(fresh=False, force=True, dry_run=False)
    return keys, rates, int(time.time() * 1000)


def serving_window(planner: Any, keys: Any, rates: Any, after_ms: int, i: int,
                   hit: float) -> float:
    """The i-th window after the install, served at `hit`; returns its end in seconds."""
    end = after_ms + i * 5_000 + 5_000
    planner.on_window(make_window(keys, rates, window_end_ms=end, window_s=5.0, hit_rate=hit,
                                  destinations=list(DESTS)))
    return end / 1000.0


def test_plan_report_joins_the_prediction_with_what_the_stream_measured(redis_server, tmp_path):
    from prometheus_client import generate_latest

    from planner_svc.api.metrics import planner_registry

    with five_second_planner(redis_server.url, tmp_path) as svc:
        keys, rates, after = install_a_plan_predicting(svc.planner, 0.8)
        for i in range(1, 12):  # the plan serves at 0.5, not the 0.8 it predicts
            end_s = serving_window(svc.planner, keys, rates, after, i, 0.5)
            svc.planner.tick(now_s=end_s + 0.1)  # the loop follows (and ends) the dip
        s = stub_for(svc)
        # the loop may replan on the lower hit rate: ask for plan 1.2 itself
        r = s.GetPlanReport(planner_pb2.GetPlanReportRequest(
            version=plan_pb2.PlanVersion(epoch=1, seq=2)), timeout=5)
        assert r.windows >= 1, r
        assert r.predicted_hit_rate == pytest.approx(0.8, abs=0.01)
        assert r.hit_rate == pytest.approx(0.5, abs=0.01)
        assert r.hit_gap == pytest.approx(-0.3, abs=0.02)
        assert len(r.destinations) == len(DESTS) == len(r.loads_per_s)
        first = s.GetPlanReport(planner_pb2.GetPlanReportRequest(
            version=plan_pb2.PlanVersion(epoch=r.version.epoch, seq=1)), timeout=5)
        assert not first.HasField("predicted_hit_rate")  # nothing measured before plan 1
        text = generate_latest(planner_registry(svc.planner)).decode()
        gap = [line for line in text.splitlines()
               if line.startswith("cacheroute_planner_plan_hit_gap_ratio ")]
        current = svc.planner.delivery()  # the metric follows the installed plan
        assert gap and float(gap[0].split()[1]) == pytest.approx(current.hit_gap, abs=1e-9)


def test_a_plan_that_misses_its_prediction_sends_the_fleet_to_fallback(redis_server, tmp_path):
    """The prediction gap is one of the guard's conditions (set at run time): a plan that
    serves 0.5 against the 0.8 it predicted falls back once the gap has lasted
    GAP_MIN_WINDOWS windows after the dip, with the figures in the decision."""
    from planner_svc.control.guard import GAP_MIN_WINDOWS

    with five_second_planner(redis_server.url, tmp_path) as svc:
        s = stub_for(svc)
        # (a long dwell: no replan re-predicts from the lower hit rate meanwhile)
        s.UpdateConfig(planner_pb2.UpdateConfigRequest(
            guard=planner_pb2.GuardConfig(hit_gap_max=0.1, resume_dwell_s=600),
            min_dwell_s=3600), timeout=10)
        keys, rates, after = install_a_plan_predicting(svc.planner, 0.8)
        fell = None
        for i in range(1, 20):
            end_s = serving_window(svc.planner, keys, rates, after, i, 0.5)
            serving = svc.planner.current()
            assert serving is not None
            d = svc.planner.tick(now_s=end_s + 0.1)
            if d is not None and d.action.value == "fallback":
                fell = (i, d, svc.planner.delivery(serving.plan.version))
                break
        assert fell is not None, "\n".join(str(x.reason) for x in svc.planner.decisions)
        _, decision, report = fell
        assert report.windows >= GAP_MIN_WINDOWS
        assert "below its predicted 80.0%" in decision.reason
        assert "tolerated 10.0%" in decision.reason
        status = s.GetStatus(planner_pb2.GetStatusRequest(), timeout=5)
        assert status.mode == planner_pb2.FALLBACK
        assert status.config.guard.hit_gap_max == pytest.approx(0.1)


def test_plan_report_checks_q_cap_against_the_latency_measured_at_the_measured_loads(
        redis_server, tmp_path):
    """300 req/s over six destinations is 2.5x the q_cap of 20: served with a p99 of 150 ms
    against a 3.5-s target, q_cap is reported understated (report, RPC and metric). With q_cap
    set to 200 the next plan runs each destination at a quarter of it, and one destination's
    9-s p99 makes it overstated."""
    from prometheus_client import generate_latest

    from planner_svc.api.metrics import planner_registry

    with five_second_planner(redis_server.url, tmp_path) as svc:
        s = stub_for(svc)
        s.UpdateConfig(planner_pb2.UpdateConfigRequest(
            guard=planner_pb2.GuardConfig(p99_ms_max=3500.0), min_dwell_s=3600), timeout=10)
        keys, rates, after = install_a_plan_predicting(svc.planner, 0.8)

        def serve(i: int, at: int, p99: dict[str, float]) -> None:
            svc.planner.on_window(make_window(
                keys, rates, window_end_ms=at + i * 5_000 + 5_000, window_s=5.0,
                hit_rate=0.8, destinations=list(DESTS), p99_ms=p99))

        for i in range(1, 8):
            serve(i, after, dict.fromkeys(DESTS, 150.0))
        r = s.GetPlanReport(planner_pb2.GetPlanReportRequest(
            version=plan_pb2.PlanVersion(epoch=1, seq=2)), timeout=5)
        assert r.windows >= 1, r
        assert r.q_cap == 20.0 and r.p99_target_ms == 3500.0
        assert list(r.utilisation) == pytest.approx([300.0 / 6 / 20.0] * len(DESTS), rel=0.02)
        assert list(r.p99_ms) == pytest.approx([150.0] * len(DESTS))
        assert r.capacity_verdict == "q_cap_understated", r.capacity_reason
        text = generate_latest(planner_registry(svc.planner)).decode()
        assert ('cacheroute_planner_plan_capacity_verdict{verdict="q_cap_understated"} 1.0'
                in text), text

        s.UpdateConfig(planner_pb2.UpdateConfigRequest(q_cap=200.0), timeout=10)
        svc.planner.replan(fresh=False, force=True, dry_run=False)
        version = svc.planner.current().plan.version
        later = int(time.time() * 1000) + 120_000
        for i in range(1, 8):
            serve(i, later, {**dict.fromkeys(DESTS, 150.0), DESTS[0]: 9000.0})
        r = s.GetPlanReport(planner_pb2.GetPlanReportRequest(
            version=plan_pb2.PlanVersion(epoch=version.epoch, seq=version.seq)), timeout=5)
        assert r.windows >= 1 and r.q_cap == 200.0, r
        assert r.capacity_verdict == "q_cap_overstated", r.capacity_reason
        assert r.capacity_reason.startswith(f"{DESTS[0]} ran at 25% of q_cap 200")
        assert max(r.predicted_utilisation) <= 1.0


def test_plan_reports_survive_a_planner_restart(broker, redis_server, tmp_path):
    """What each plan predicted and what was measured under it are in the history: a
    restarted planner answers `plan report` for earlier versions with the same figures."""
    import uuid

    settings = planner_settings(redis_server.url, tmp_path, bootstrap=broker.bootstrap,
                                state_topic=f"planner-state-{uuid.uuid4().hex[:8]}",
                                interval_s=5.0)
    first = build_service(settings, consume=False, durable=True)
    try:
        keys, rates, after = install_a_plan_predicting(first.planner, 0.8)
        for i in range(1, 12):
            serving_window(first.planner, keys, rates, after, i, 0.5)
        before = first.planner.delivery(Version(1, 2)).to_dict()
        assert before["windows"] >= 1 and before["predicted_hit_rate"] is not None
        first.planner._history.flush()  # type: ignore[union-attr]
    finally:
        first.stop(0)
    second = build_service(settings, consume=False, durable=True)
    try:
        assert second.planner.delivery(Version(1, 2)).to_dict() == before
        assert second.planner.delivery(Version(1, 1)).predicted.hit_rate is None
    finally:
        second.stop(0)


def test_rate_noise_z_holds_a_stationary_windows_counting_noise_to_the_plans_rates(
        redis_server, tmp_path):
    """Set at run time: after the first plan, a window whose counts are Poisson draws of the
    same rates is planned on the plan's rates for (almost) every key; with 0, as measured."""
    with five_second_planner(redis_server.url, tmp_path) as svc:
        s = stub_for(svc)
        config = s.UpdateConfig(planner_pb2.UpdateConfigRequest(rate_noise_z=2.0),
                                timeout=10).config
        assert config.rate_noise_z == 2.0
        with pytest.raises(grpc.RpcError) as bad:
            s.UpdateConfig(planner_pb2.UpdateConfigRequest(rate_noise_z=-1.0), timeout=10)
        assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        keys = paper_like_keys(200)
        rates = paper_like_rates(200, 300.0, seed=1)
        start = int(time.time() * 1000) - 600_000
        for step in range(3):
            svc.planner.on_window(make_window(keys, rates, window_end_ms=start + step * 5_000,
                                              window_s=5.0, destinations=list(DESTS)))
        svc.planner.tick(now_s=(start + 2 * 5_000) / 1000.0 + 0.1)
        assert svc.planner.installed is not None
        rng = np.random.default_rng(3)

        def noisy_window(step: int) -> dict[str, float]:
            counts = rng.poisson(rates * 5.0)
            svc.planner.on_window(make_window(keys, counts / 5.0, window_end_ms=start + step
                                              * 5_000, window_s=5.0, destinations=list(DESTS)))
            t = svc.planner.traffic
            return dict(zip(t.keys, t.rates.tolist(), strict=True))

        held = noisy_window(3)
        same = sum(held[k] == pytest.approx(r) for k, r in zip(keys, rates, strict=True))
        assert same >= 0.9 * len(keys), same
        s.UpdateConfig(planner_pb2.UpdateConfigRequest(rate_noise_z=0.0), timeout=10)
        raw = noisy_window(4)
        same = sum(raw[k] == pytest.approx(r) for k, r in zip(keys, rates, strict=True))
        assert same <= 0.3 * len(keys), same
