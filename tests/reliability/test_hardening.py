"""Hostile or buggy writers of every topic, Redis key and RPC (the hardening issue, item
by item). Each test uses the real servers (broker, redis-server, the planner service with
gRPC on port 0) and writes what a third-party client could write."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from pathlib import Path

import grpc
import pytest
import redis
from confluent_kafka import Producer

from cacheroute.v1 import plan_pb2, planner_pb2, planner_pb2_grpc, snapshot_pb2
from planner_svc.adapters.snapshot_consumer import SnapshotConsumer
from planner_svc.devstack.processes import RedisServer
from planner_svc.devstack.stack import StackOptions, create_topics
from planner_svc.server import build_service
from router_client import RouterClient, signing
from router_client.layout import Layout
from router_client.plan import Version
from router_client.redis_source import RedisPlanSource
from streams.assembly import SnapshotLimits
from streams.columns import encode_keys
from tests.service.harness import DESTS, feed, planner_settings
from tests.waiting import eventually

pytestmark = pytest.mark.integration


def stub(svc) -> planner_pb2_grpc.PlannerStub:
    return planner_pb2_grpc.PlannerStub(grpc.insecure_channel(f"127.0.0.1:{svc.port}"))


@pytest.fixture()
def planner(redis_server: RedisServer, tmp_path: Path):
    svc = build_service(planner_settings(redis_server.url, tmp_path / "p"), consume=False)
    svc.start()
    feed(svc)
    svc.planner.tick()
    assert svc.planner.installed is not None
    yield svc
    svc.stop()


# 1. A forged snapshot does not steer the planner ------------------------------------------

def forged_snapshot(end_ms: int, partitions: int) -> bytes:
    s = snapshot_pb2.RateSnapshot(window_start_ms=end_ms - 10_000, window_end_ms=end_ms,
                                  source_partition=0, partition_count=partitions,
                                  part_index=0, part_count=1, worker_id="evil")
    keys = [f"forged-{i}" for i in range(5)]
    s.keys.keys = encode_keys(keys)
    s.keys.rate_per_s.extend([5000.0] * 5)
    for name in ("ewma_rate_per_s", "prompt_tokens", "cached_tokens", "reuse_fraction",
                 "interarrival_cv", "reusable_prefix_tokens"):
        getattr(s.keys, name).extend([0.0] * 5)
    s.keys.requests.extend([50_000] * 5)
    return s.SerializeToString()


def test_1_forged_snapshots_are_refused(broker, tmp_path):
    topic, events = f"snap-{os.getpid()}-{time.time_ns()}", f"ev-{time.time_ns()}"
    create_topics(broker.bootstrap, StackOptions(events_topic=events, snapshots_topic=topic,
                                                 deadletter_topic=f"dl-{time.time_ns()}",
                                                 event_partitions=4))
    windows: list = []
    consumer = SnapshotConsumer(broker.bootstrap, topic, windows.append, events_topic=events,
                                limits=SnapshotLimits(window_ms=10_000, hop_ms=2_000))
    consumer.start(from_beginning=True)
    try:
        p = Producer({"bootstrap.servers": broker.bootstrap})
        now = int(time.time() * 1000) // 2000 * 2000
        p.produce(topic, forged_snapshot(2**62, 4))  # the original attack: far future
        p.produce(topic, forged_snapshot(now, 1))  # a plausible time, one "partition"
        p.flush(10)
        assert eventually(lambda: consumer.refused == 2, 10.0)
        assert windows == []
    finally:
        consumer.stop()


# 4. One Redis write does not wedge the planner ---------------------------------------------

PAST_WHAT_IS_STORED = b"0000000000000001ffffffffffffffff " + b"00" * 32  # version 1.2^64-1


@pytest.mark.parametrize("junk", [b"hello world", PAST_WHAT_IS_STORED])
def test_4_a_junk_pointer_is_repaired_and_installs_go_on(planner, redis_server, junk):
    r = redis.Redis.from_url(redis_server.url)
    lay = Layout()
    r.set(lay.current, junk)
    assert planner.planner.republish_if_missing()
    assert planner.planner.pointer_repairs == 1
    current = planner.publisher.current()
    assert current is not None and current.version == planner.planner.installed.plan.version
    planner.planner.replan(fresh=False, force=True, dry_run=False)
    assert planner.publisher.current().version > current.version  # installs work again


# 5. Versions never go backwards, even after losing Redis and the history -------------------

def test_5_a_planner_that_lost_everything_starts_above_what_routers_hold(redis_server, tmp_path):
    settings = planner_settings(redis_server.url, tmp_path / "p1")
    first = build_service(settings, consume=False)
    first.start()
    key = signing.load_public_key(Path(settings.data_dir) / "planner-signing-key.pub.pem")
    router = RouterClient(RedisPlanSource(redis_server.url), router_id="r1",
                          public_keys=[key], status_interval_s=0.1).start()
    try:
        feed(first)
        first.planner.tick()
        for _ in range(3):
            first.planner.replan(fresh=False, force=True, dry_run=False)
        held = first.planner.installed.plan.version
        assert router.wait_for_version(held, 5)
        first.stop()
        redis.Redis.from_url(redis_server.url).flushall()  # Redis lost; no durable history
        # The same signing key (it is on disk), a fresh planner with nothing to resume from.
        second = build_service(settings, consume=False)
        second.start()
        try:
            assert eventually(lambda: any(
                s.router_id == "r1" for s in second.publisher.router_statuses()), 5.0)
            feed(second)
            second.planner.tick()
            new = second.planner.installed.plan.version
            assert new > held and new.epoch > held.epoch
            assert router.wait_for_version(new, 5)
        finally:
            second.stop()
    finally:
        router.stop()


def test_5_an_older_pointer_never_confirms_a_router(planner, redis_server):
    key = signing.load_public_key(
        Path(planner.settings.data_dir) / "planner-signing-key.pub.pem")
    router = RouterClient(RedisPlanSource(redis_server.url), router_id="r2", public_keys=[key],
                          max_plan_age_s=1.0, recheck_s=0.1).start()
    try:
        planner.planner.replan(fresh=False, force=True, dry_run=False)
        newest = planner.planner.installed.plan.version
        assert router.wait_for_version(newest, 5)
        planner.stop()  # the planner is gone (it would republish the newest plan)
        # Someone points Redis back at the first version (which is still stored).
        lay = Layout()
        r = redis.Redis.from_url(redis_server.url)
        first = Version(newest.epoch, 1)
        digest = r.get(lay.digest(first)).decode()
        r.set(lay.current, f"{first.epoch:016x}{first.seq:016x} {digest}")
        assert eventually(lambda: router.fallback_reason == "stale", 5.0)
        assert router.version == newest  # it never went back either
    finally:
        router.stop()


# 6. Watch streams cannot starve the gRPC server -------------------------------------------

def test_6_many_watch_streams_leave_unary_calls_and_health_serving(planner):
    from concurrent.futures import ThreadPoolExecutor

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    channels = [grpc.insecure_channel(f"127.0.0.1:{planner.port}") for _ in range(20)]
    streams = [planner_pb2_grpc.PlannerStub(ch).WatchPlans(planner_pb2.WatchPlansRequest(),
                                                           timeout=3)
               for ch in channels]

    def outcome(call) -> grpc.StatusCode | None:
        try:
            next(iter(call))
        except grpc.RpcError as exc:
            return exc.code()
        except StopIteration:
            return None
        return None

    with ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(outcome, call) for call in streams]
        time.sleep(0.5)
        # while the accepted streams are open: unary calls and health still answer
        assert stub(planner).GetStatus(planner_pb2.GetStatusRequest(), timeout=5)
        ch = grpc.insecure_channel(f"127.0.0.1:{planner.port}")
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        codes = [f.result() for f in futures]
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) >= 20 - 8


# 7. Auth cannot be half-configured open; cacheroute up passes tokens -----------------------

def test_7_a_reader_token_alone_locks_mutations(redis_server, tmp_path):
    svc = build_service(planner_settings(redis_server.url, tmp_path / "p", reader_token="r"),
                        consume=False)
    svc.start()
    try:
        s = stub(svc)
        meta = [("authorization", "Bearer r")]
        assert s.GetStatus(planner_pb2.GetStatusRequest(), metadata=meta, timeout=5)
        with pytest.raises(grpc.RpcError) as err:
            s.UpdateConfig(planner_pb2.UpdateConfigRequest(remove_destinations=[DESTS[0]]),
                           metadata=meta, timeout=5)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        svc.stop()


def test_7_the_stack_passes_tokens_instead_of_overriding_them():
    from planner_svc.devstack import stack as stack_mod
    src = Path(stack_mod.__file__).read_text()
    assert '"--operator-token",\n        o.operator_token' not in src
    assert "if token:" in src


# 8. Bounds ----------------------------------------------------------------------------------

def test_8_oversized_ids_and_values_are_refused(planner):
    s = stub(planner)
    with pytest.raises(grpc.RpcError) as err:
        s.Replan(planner_pb2.ReplanRequest(dry_run=True, request_id="x" * 4_000_000), timeout=10)
    assert err.value.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                                grpc.StatusCode.RESOURCE_EXHAUSTED)
    with pytest.raises(grpc.RpcError) as err:
        s.UpdateConfig(planner_pb2.UpdateConfigRequest(q_cap=1e-300), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    many = [plan_pb2.Destination(id=f"x{i}") for i in range(10_001)]
    with pytest.raises(grpc.RpcError) as err:
        s.UpdateConfig(planner_pb2.UpdateConfigRequest(add_destinations=many), timeout=30)
    assert err.value.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                                grpc.StatusCode.RESOURCE_EXHAUSTED)


# 9. Junk in Redis does not break fleet views ---------------------------------------------------

def test_9_junk_router_status_and_version_members_are_skipped(planner, redis_server):
    r = redis.Redis.from_url(redis_server.url)
    lay = Layout()
    r.zadd(lay.routers, {"junk-router": time.time() * 1000})
    r.set(lay.router_status("junk-router"), b"\xff\xfe not a status")
    r.zadd(lay.versions, {"not-a-version": 0})
    s = stub(planner)
    assert s.ListRouters(planner_pb2.ListRoutersRequest(), timeout=5) is not None
    listed = s.ListPlanVersions(planner_pb2.ListPlanVersionsRequest(), timeout=5)
    assert len(listed.versions) >= 1
    assert planner.publisher.junk_router_statuses >= 1


# 10. Recovery: Redis down is UNAVAILABLE; request ids per call kind --------------------------

def test_10_redis_down_is_unavailable_and_request_ids_are_per_kind(planner, redis_server):
    s = stub(planner)
    rid = "same-id"
    s.Replan(planner_pb2.ReplanRequest(dry_run=True, request_id=rid), timeout=10)
    mode = s.SetMode(planner_pb2.SetModeRequest(mode=planner_pb2.FALLBACK, reason="drill"),
                     timeout=5)
    assert mode.mode == planner_pb2.FALLBACK
    version = planner.planner.installed.plan.version
    back = s.Rollback(planner_pb2.RollbackRequest(
        version=plan_pb2.PlanVersion(epoch=version.epoch, seq=version.seq), request_id=rid),
        timeout=10)
    assert back.pinned  # not the Replan's cached answer
    redis_server.process.stop()
    with pytest.raises(grpc.RpcError) as err:
        s.ListRouters(planner_pb2.ListRoutersRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


# 11. The signing key is never world-readable ------------------------------------------------

def test_11_the_signing_key_is_created_0600(tmp_path):
    seen: list[int] = []
    path = tmp_path / "key.pem"
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            with contextlib.suppress(FileNotFoundError):
                seen.append(stat.S_IMODE(os.stat(path).st_mode))

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    signing.save_private_key(signing.generate_private_key(), path)
    time.sleep(0.05)
    stop.set()
    t.join(1)
    assert seen and set(seen) == {0o600}
    with pytest.raises(FileExistsError):
        signing.save_private_key(signing.generate_private_key(), path)


