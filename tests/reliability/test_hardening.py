"""Hostile or buggy writers of every topic, Redis key and RPC (the hardening issue, item
by item). Each test uses the real servers (broker, redis-server, the planner service with
gRPC on port 0) and writes what a third-party client could write."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis
from confluent_kafka import Producer

from cacheroute.v1 import plan_pb2, planner_pb2, planner_pb2_grpc
from planner_svc.adapters.snapshot_consumer import SnapshotConsumer
from planner_svc.devstack.processes import RedisServer
from planner_svc.devstack.stack import StackOptions, create_topics
from planner_svc.server import build_service
from router_client import RouterClient, signing
from router_client.layout import Layout
from router_client.plan import Version
from router_client.redis_source import RedisPlanSource
from streams.assembly import SnapshotLimits
from streams.emitter import EventEmitter
from streams.processor import MAX_DEAD_LETTER_RAW
from tests.faults.hostile import (
    JUNK_POINTERS,
    accept_large_messages,
    forged_request,
    forged_snapshot,
    oversized_garbage,
)
from tests.integration.test_stream_support import (
    SnapshotLog,
    dead_letters,
    make_topics,
    start_worker,
)
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


# 2 and 3. Events cannot blind the telemetry; an oversized message loses nothing -------------

def _telemetry(broker, tmp_path):
    topics = make_topics(broker.bootstrap, partitions=2)
    worker = start_worker(broker.bootstrap, topics, tmp_path, "--window-s", "600", "--hop-s", "2")
    return topics, worker, SnapshotLog(broker.bootstrap, topics.snapshots)


def _real_events(em: EventEmitter, n: int) -> None:
    for i in range(n):
        em.emit_request(f"k-{i % 20}", "engine-00", prompt_tokens=10)
    assert em.flush(10) == 0


def _hostile(bootstrap: str, topic: str, messages: list[tuple[int, bytes]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 8 << 20})
    refused: list[str] = []
    for partition, value in messages:
        p.produce(topic, value=value, partition=partition,
                  on_delivery=lambda err, _m: refused.append(str(err)) if err else None)
    assert p.flush(15) == 0
    assert not refused, refused  # the broker took them: the worker is what is tested


def _all_counted(snaps, n: int) -> bool:
    return snaps.wait_for(lambda w: not w.recovering and int(w.requests.sum()) == n,
                          timeout_s=60) is not None


def test_2_future_events_and_forged_sequences_are_dead_lettered_real_ones_all_count(
        broker, tmp_path):
    topics, worker, snaps = _telemetry(broker, tmp_path)
    try:
        with EventEmitter(broker.bootstrap, topics.events, producer_id="real") as em:
            _real_events(em, 200)
            now = int(time.time() * 1000)
            _hostile(broker.bootstrap, topics.events,
                     [(p, forged_request("evil-clock", 1 + p, now + 290_000)) for p in (0, 1)]
                     + [(p, forged_request(em.producer_id, 2**64 - 1, now)) for p in (0, 1)])
            _real_events(em, 200)  # after the attack: none of these may be "late" or repeats
        assert _all_counted(snaps, 400), worker.log_tail(20)
        reasons = Counter(d.reason for d in dead_letters(broker.bootstrap, topics.deadletter, 4))
        assert reasons == {"timestamp_future": 2, "sequence_jump": 2}
    finally:
        snaps.close()
        worker.stop()


def test_3_an_oversized_message_is_dead_lettered_cut_to_size_and_nothing_is_lost(
        broker, tmp_path):
    topics, worker, snaps = _telemetry(broker, tmp_path)
    try:
        accept_large_messages(broker.bootstrap, topics.events)
        pid = worker.pid
        with EventEmitter(broker.bootstrap, topics.events, producer_id="real") as em:
            _real_events(em, 200)
            _hostile(broker.bootstrap, topics.events, [(0, oversized_garbage(3 << 20))])
            _real_events(em, 200)
        assert _all_counted(snaps, 400), worker.log_tail(20)
        assert worker.alive() and worker.pid == pid  # no crash, no restart
        (letter,) = dead_letters(broker.bootstrap, topics.deadletter, 1)
        assert letter.reason == "undecodable"
        assert len(letter.raw) == MAX_DEAD_LETTER_RAW
        assert f"raw truncated from {3 << 20} bytes" in letter.detail and "sha256=" in letter.detail
    finally:
        snaps.close()
        worker.stop()


# 4. One Redis write does not wedge the planner ---------------------------------------------

@pytest.mark.parametrize("junk", JUNK_POINTERS)
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


def test_6b_idle_reflection_streams_leave_unary_calls_and_health_serving(planner):
    """Server reflection streams sit outside the watch cap and hold a thread each while
    the client sends nothing: 24 of them took every thread (GetStatus and health timed
    out). At most REFLECTION_STREAMS are served at once; the rest are refused."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    from planner_svc.api.interceptors import REFLECTION_STREAMS

    channels = [grpc.insecure_channel(f"127.0.0.1:{planner.port}") for _ in range(24)]
    never = threading.Event()

    def silent() -> Iterator[reflection_pb2.ServerReflectionRequest]:
        never.wait(10)  # an open stream that sends nothing
        return
        yield

    calls = [reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(silent(),
                                                                              timeout=8)
             for ch in channels]
    try:
        time.sleep(1.0)
        assert stub(planner).GetStatus(planner_pb2.GetStatusRequest(), timeout=3)
        ch = grpc.insecure_channel(f"127.0.0.1:{planner.port}")
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=3)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        never.set()
    refused = 0
    for call in calls:
        try:
            list(call)
        except grpc.RpcError as exc:
            refused += exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused >= 24 - REFLECTION_STREAMS
    # and reflection itself still works for a well-behaved client (grpcurl, the CLI)
    ok = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
    names = [s.name for r in ok for s in r.list_services_response.service]
    assert "cacheroute.v1.Planner" in names


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


