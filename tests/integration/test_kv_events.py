"""vLLM-protocol KV events through the bridge: a publisher on real ZMQ sockets (PUB and the
replay ROUTER, as vLLM's ZmqEventPublisher) and `streams.engines.kv_bridge`."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from planner_svc.devstack.kv_publisher import KvEventPublisher, cleared, removed, stored
from streams.engines.kv_bridge import KvEventSubscriber

pytestmark = pytest.mark.integration


def drain(sub: KvEventSubscriber, until_seq: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (sub.last_seq or -1) < until_seq and time.monotonic() < deadline:
        sub.poll(50)
    assert sub.last_seq == until_seq, (sub.last_seq, until_seq)


def connected(pub: KvEventPublisher) -> KvEventSubscriber:
    """A subscriber that has seen the publisher's first batch (ZMQ's slow joiner)."""
    sub = KvEventSubscriber("e0", pub.endpoint, pub.replay_endpoint)
    deadline = time.monotonic() + 5
    while sub.last_seq is None and time.monotonic() < deadline:
        pub.publish([])  # an empty batch every 10 ms until one arrives
        sub.poll(10)
    assert sub.last_seq is not None
    return sub


@pytest.fixture(params=["tagged_map", "array"])
def publisher(request) -> Iterator[KvEventPublisher]:  # type: ignore[no-untyped-def]
    pub = KvEventPublisher(layout=request.param)
    yield pub
    pub.close()


def test_blocks_stored_and_removed_give_residency_and_rates(publisher):
    sub = connected(publisher)
    try:
        publisher.publish([stored([1, 2, 3, 4], None, 16)])
        last = publisher.publish([removed([1, 2])])
        drain(sub, last)
        signals = sub.state.signals(time.monotonic())
        assert signals.blocks_resident == 2 and signals.block_size == 16
        assert signals.residency_s is not None and signals.residency_s < 1.0
        assert sub.counters.gaps == 0 and not sub.counters.garbage
    finally:
        sub.close()


def test_a_gap_is_detected_and_replayed_within_a_second(publisher):
    sub = connected(publisher)
    try:
        publisher.publish([stored([10, 11], None, 16)])
        publisher.drop_next(5)  # the PUB socket drops these; the replay buffer has them
        for i in range(5):
            publisher.publish([stored([100 + i], 11, 16)])
        detected_at = time.monotonic()
        last = publisher.publish([removed([10])])
        drain(sub, last)
        filled = time.monotonic() - detected_at
        assert sub.counters.gaps == 1 and sub.counters.replayed == 5
        assert sub.counters.resyncs == 0
        assert sub.state.signals(time.monotonic()).blocks_resident == 6  # 11 + 100..104
        assert filled < 1.0 and sub.counters.last_gap_filled_s < 1.0
        print(f"gap of 5 batches filled {sub.counters.last_gap_filled_s * 1000:.1f} ms "
              "after it was seen")
    finally:
        sub.close()


def test_a_hole_the_replay_cannot_fill_rebuilds_the_state(publisher):
    pub = KvEventPublisher(buffer_steps=3, layout=publisher.layout)
    sub = connected(pub)
    try:
        pub.publish([stored([1, 2], None, 16)])
        pub.drop_next(10)  # more than the replay buffer keeps
        for i in range(10):
            pub.publish([stored([200 + i], None, 16)])
        last = pub.publish([stored([300], None, 16)])
        drain(sub, last)
        assert sub.counters.gaps == 1 and sub.counters.resyncs == 1
        assert sub.state.resyncs == 1
        # what was resident before the hole is not trusted; what came after is
        assert sub.state.signals(time.monotonic()).blocks_resident == 1
    finally:
        sub.close()
        pub.close()


def test_a_restarted_publisher_and_garbage_are_survived(publisher):
    sub = connected(publisher)
    try:
        publisher.publish([stored([1, 2, 3], None, 16)])
        publisher.send_frames([b"only one frame"])
        publisher.send_frames([b"", b"short", b"x"])
        seq = publisher.publish_raw(b"\xc1 not msgpack")
        publisher.publish_raw(b"\x92\xa3abc\x90")  # msgpack, but no timestamp
        last = publisher.publish([stored([4], 3, 16)])
        drain(sub, last)
        assert seq == last - 2
        assert dict(sub.counters.garbage) == {"frames": 1, "sequence": 1, "payload": 2}
        assert sub.state.signals(time.monotonic()).blocks_resident == 4
        # the engine restarts: a new publisher on the same ports counts from 0 again
        host_port, replay_port = publisher.port, publisher.replay_port
        publisher.close()
        restarted = KvEventPublisher(layout=publisher.layout, port=host_port,
                                     replay_port=replay_port)
        try:
            deadline = time.monotonic() + 5
            while sub.counters.resyncs == 0 and time.monotonic() < deadline:
                restarted.publish([cleared(), stored([7], None, 16)])
                sub.poll(10)
            assert sub.counters.resyncs == 1
            assert sub.state.signals(time.monotonic()).blocks_resident == 1
        finally:
            restarted.close()
    finally:
        sub.close()


def test_the_emulated_engines_publish_their_block_pool_as_vllm_does(tmp_path):
    """The shared engine model's block pool, published by the emulated engines in vLLM's
    format: what the bridge reconstructs is what the engine holds, evictions included;
    and the engines' /metrics parse as a vLLM page."""
    import json
    import urllib.request

    from cacheroute.engine_metrics import load_between, parse_engine_metrics
    from planner_svc.devstack.engines import start_engines

    fleet = start_engines(tmp_path, 1, extra=["--time-scale", "0", "--kv-events",
                                              "--kv-tokens", "4096", "--faults"])
    try:
        endpoint, replay = fleet.kv_events["e0"]
        sub = KvEventSubscriber("e0", endpoint, replay)
        url = fleet.urls["e0"]

        def metrics() -> str:
            with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
                return r.read().decode()

        before = parse_engine_metrics(metrics())
        time.sleep(0.3)  # the subscription is up before the first batch
        for i in range(40):  # 40 distinct ~900-token prompts through a 4,096-token cache
            body = json.dumps({"model": "emulated-model", "max_tokens": 4, "messages": [
                {"role": "user", "content": f"document {i}: " + "lorem ipsum " * 300}]})
            req = urllib.request.Request(f"{url}/v1/chat/completions", body.encode(),
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                r.read()
            sub.poll(5)
        deadline = time.monotonic() + 5
        held = fleet.control("e0", "stats")["kv_cached_blocks"]
        while time.monotonic() < deadline:
            sub.poll(50)
            if sub.state.signals(time.monotonic()).blocks_resident == held:
                break
        signals = sub.state.signals(time.monotonic())
        stats = fleet.control("e0", "stats")
        assert signals.blocks_resident == stats["kv_cached_blocks"] > 0
        assert stats["kv_evicted_blocks"] > 0 and signals.removed_per_s > 0
        assert signals.residency_s is not None
        assert sub.counters.gaps == 0 and not sub.counters.garbage
        load = load_between(before, parse_engine_metrics(metrics()), 1.0)
        assert load.running == 0 and load.kv_usage is not None and load.kv_usage > 0
        sub.close()
    finally:
        fleet.stop()
