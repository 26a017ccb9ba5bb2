"""The whole pipeline on real servers: Kafka client -> Faust worker -> planner -> Redis -> router.

The stack is started exactly as `cacheroute up` starts it (planner_svc.devstack.stack).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from cacheroute.v1 import events_pb2, planner_pb2, planner_pb2_grpc
from planner_svc.devstack.stack import LocalStack, StackOptions, start_stack
from router_client import RouterClient, signing
from router_client.plan import Version
from router_client.redis_source import RedisPlanSource
from streams.emitter import EventEmitter

pytestmark = pytest.mark.integration

HOT, COLD = 12, 300
HOT_RATE = 10.0  # req/s per hot key: k_b = ceil(10 / q_cap 4) = 3


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    options = StackOptions(
        destinations=6,
        event_partitions=2,
        window_s=4.0,
        hop_s=1.0,
        interval_s=2.0,
        q_cap=4.0,  # the hottest keys need k_b = 2 replicas
        warm_slots_per_destination=8,  # C = 48 slots: every hot key fits with k_b = 3
        workdir=str(tmp_path_factory.mktemp("stack")),
    )
    s = start_stack(options)
    yield s
    s.stop()
    assert not any(p.alive() for p in s.processes())


class Traffic:
    """HOT keys at HOT_RATE req/s each (replicated at q_cap 4), COLD keys at ~0.05 req/s."""

    def __init__(self, stack: LocalStack) -> None:
        self.stack = stack
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        stack = self.stack
        emitter = EventEmitter(stack.bootstrap, stack.options.events_topic, producer_id="e2e-test")
        rng = np.random.default_rng(3)
        dests = stack.options.destination_ids
        while not self.stop.is_set():
            tick = time.monotonic()
            for i in range(HOT):
                for _ in range(rng.poisson(HOT_RATE * 0.1)):
                    d = dests[rng.integers(len(dests))]
                    emitter.emit_request(
                        f"hot-{i}", d, prompt_tokens=1200, reusable_prefix_tokens=1000
                    )
                    emitter.emit_cache_hit(f"hot-{i}", d, prompt_tokens=1200, cached_tokens=600)
            for j in rng.choice(COLD, size=rng.poisson(COLD * 0.05 * 0.1)):
                emitter.emit_request(f"cold-{j}", dests[0], prompt_tokens=300)
            time.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))
        emitter.close()


@pytest.fixture(scope="module")
def traffic(stack: LocalStack) -> Iterator[Traffic]:
    t = Traffic(stack)
    t.thread.start()
    yield t
    t.stop.set()
    t.thread.join(10)


def wait_for(predicate, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def test_events_become_a_plan_that_routers_follow(stack: LocalStack, traffic: Traffic) -> None:
    keys = signing.pin([signing.load_public_key(stack.public_key_path)])
    router = RouterClient(
        RedisPlanSource(stack.redis_url),
        router_id="e2e",
        public_keys=keys,
        destination_ids=stack.options.destination_ids,
    ).start()
    try:
        assert router.wait_for_version(Version(0, 1), 40.0), "no plan reached the router"
        with grpc.insecure_channel(stack.grpc_target) as channel:
            stub = planner_pb2_grpc.PlannerStub(channel)
            current = stub.GetCurrentVersion(planner_pb2.GetCurrentVersionRequest(), timeout=5)
            assert router.wait_for_version(Version(current.version.epoch, current.version.seq), 10)
            # The first window may have started mid-traffic; once rates are steady, a fresh
            # plan replicates every hot key.
            time.sleep(2 * stack.options.window_s)
            stub.Replan(planner_pb2.ReplanRequest(force=True, fresh=True), timeout=10)
            current = stub.GetCurrentVersion(planner_pb2.GetCurrentVersionRequest(), timeout=5)
        assert router.wait_for_version(Version(current.version.epoch, current.version.seq), 10)
        table = router.table
        assert table is not None
        for i in range(HOT):
            planned = {table.destination_ids[m] for m in table.members_of(f"hot-{i}")}
            assert len(planned) >= 2, f"hot-{i} should be replicated (k_b > 1), got {planned}"
            seen = {router.route(f"hot-{i}") for _ in range(50)}
            assert seen <= planned
        cold_dests = Counter(router.route(f"never-seen-{n}") for n in range(600))
        assert set(cold_dests) == set(stack.options.destination_ids)
        url = f"http://127.0.0.1:{stack.metrics_port}/metrics"
        scraped = urllib.request.urlopen(url, timeout=5).read().decode()
        seq_lines = [
            ln for ln in scraped.splitlines() if ln.startswith("cacheroute_planner_plan_seq ")
        ]
        assert seq_lines and float(seq_lines[0].split()[1]) >= current.version.seq
    finally:
        router.stop()


def test_garbage_on_the_topic_is_counted_skipped_and_dead_lettered(stack: LocalStack) -> None:
    producer = Producer({"bootstrap.servers": stack.bootstrap})
    producer.produce(stack.options.events_topic, key=b"hot-0", value=b"\xff\x00garbage\x17")
    good = events_pb2.EventBatch(
        events=[
            events_pb2.Event(
                producer_id="e2e-garbage",
                sequence=1,
                timestamp_ms=int(time.time() * 1000),
                request=events_pb2.RequestEvent(
                    routing_key="hot-0", destination="engine-00", prompt_tokens=10
                ),
            )
        ]
    )
    producer.produce(stack.options.events_topic, key=b"hot-0", value=good.SerializeToString())
    assert producer.flush(10) == 0
    consumer = Consumer(
        {"bootstrap.servers": stack.bootstrap, "group.id": "e2e-dlq", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(stack.options.deadletter_topic, 0, 0)])
    letters: list[events_pb2.DeadLetter] = []
    deadline = time.monotonic() + 20
    while not letters and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            dl = events_pb2.DeadLetter()
            dl.ParseFromString(msg.value() or b"")
            letters.append(dl)
    consumer.close()
    assert letters and letters[0].raw == b"\xff\x00garbage\x17" and letters[0].reason
    assert all(w.alive() for w in stack.workers), "a worker died on garbage input"
