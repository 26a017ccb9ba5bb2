"""Issue 55, items 6 and 7: what a client that may produce to the Kafka topics can forge.

6. A plausible forged snapshot (the events topic's partition count, on the hop grid, ending
   26 s ahead, 20 made-up keys carrying all the rate) must not reach the planner, and the
   real windows after it must keep arriving. So must one ending now, unsigned or signed
   with a key of the forger's own: the planner takes only parts a worker key signed.
7. A forward sequence jump of +9,000,000 on a real producer's id must not make that
   producer's later events count as repeats.

Both run the real worker (`python -m streams worker`) on the session's broker."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import Producer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cacheroute.v1 import snapshot_pb2
from planner_svc.adapters.snapshot_consumer import SnapshotConsumer
from streams.assembly import CompleteWindow, SnapshotLimits
from streams.columns import encode_keys
from streams.emitter import EventEmitter
from streams.snapshot_signing import SnapshotSigner, load_or_create_private_key, public_key_path
from tests.faults.hostile import forged_request
from tests.integration.test_stream_support import SnapshotLog, make_topics, start_worker
from tests.waiting import eventually

pytestmark = pytest.mark.integration

FORGED = [f"forged-{i}" for i in range(20)]
REAL = [f"tenant-{i}" for i in range(20)]


def forged_part(end_ms: int, partition: int, partitions: int,
                window_ms: int = 10_000) -> snapshot_pb2.RateSnapshot:
    """One partition's part of a plausible window: 20 made-up keys, 500 req/s each."""
    s = snapshot_pb2.RateSnapshot(window_start_ms=end_ms - window_ms, window_end_ms=end_ms,
                                  source_partition=partition, partition_count=partitions,
                                  part_index=0, part_count=1, worker_id="worker-1",
                                  published_at_ms=end_ms)
    keys = FORGED[partition::partitions]
    s.keys.keys = encode_keys(keys)
    s.keys.rate_per_s.extend([500.0] * len(keys))
    s.keys.ewma_rate_per_s.extend([500.0] * len(keys))
    s.keys.prompt_tokens.extend([1e6] * len(keys))
    s.keys.cached_tokens.extend([9e5] * len(keys))
    for name in ("reuse_fraction", "interarrival_cv", "reusable_prefix_tokens"):
        getattr(s.keys, name).extend([0.0] * len(keys))
    s.keys.requests.extend([5_000] * len(keys))
    s.active_keys = len(keys)
    return s


@dataclass
class Traffic:
    """Real requests on `REAL` keys, about 40/s, until stopped."""

    emitter: EventEmitter
    stop: threading.Event

    @classmethod
    def start(cls, bootstrap: str, topic: str) -> Traffic:
        t = cls(EventEmitter(bootstrap, topic, producer_id="gateway"), threading.Event())
        threading.Thread(target=t._run, daemon=True).start()
        return t

    def _run(self) -> None:
        i = 0
        while not self.stop.wait(0.025):
            self.emitter.emit_request(REAL[i % len(REAL)], "engine-00", prompt_tokens=100)
            i += 1

    def close(self) -> None:
        self.stop.set()
        self.emitter.close()


@pytest.fixture()
def stream(broker, tmp_path) -> Iterator[tuple]:
    topics = make_topics(broker.bootstrap, partitions=2)
    load_or_create_private_key(tmp_path / "worker-key.pem")
    worker = start_worker(broker.bootstrap, topics, tmp_path, "--window-s", "10", "--hop-s", "2",
                          "--signing-key-path", str(tmp_path / "worker-key.pem"))
    traffic = Traffic.start(broker.bootstrap, topics.events)
    try:
        yield topics, worker, traffic
    finally:
        traffic.close()
        worker.stop()


def _keys(w: CompleteWindow) -> set[str]:
    return set(w.keys)


def test_6_a_plausible_forged_snapshot_never_reaches_the_planner(broker, stream, tmp_path):
    topics, worker, _ = stream
    windows: list[CompleteWindow] = []
    worker_key = str(public_key_path(tmp_path / "worker-key.pem"))
    consumer = SnapshotConsumer(broker.bootstrap, topics.snapshots, windows.append,
                                events_topic=topics.events, worker_key_paths=[worker_key],
                                limits=SnapshotLimits(window_ms=10_000, hop_ms=2_000))
    consumer.start()
    try:
        assert eventually(lambda: any(_keys(w) & set(REAL) for w in windows), 60.0), \
            worker.log_tail(20)
        forged_at_ms = int(time.time() * 1000)
        grid = forged_at_ms // 2000 * 2000
        rogue = SnapshotSigner(Ed25519PrivateKey.generate())
        p = Producer({"bootstrap.servers": broker.bootstrap})
        for part in range(2):
            ahead = forged_part(grid + 26_000, part, 2).SerializeToString()  # 24-28 s ahead
            now = forged_part(grid + 2_000, part, 2).SerializeToString()  # the next real end
            for value in (ahead, now, rogue.sign(ahead), rogue.sign(now)):
                p.produce(topics.snapshots, value)
        assert p.flush(10) == 0
        # The real windows closed after the forgery keep coming (they are not "older than
        # the last complete window"), and none of them, nor any other, holds a forged key.
        def real_after() -> int:
            return sum(w.window_end_ms > forged_at_ms and bool(_keys(w) & set(REAL))
                       for w in windows)

        assert eventually(lambda: real_after() >= 3, 15.0), [w.window_end_ms for w in windows]
        assert all(not _keys(w) & set(FORGED) for w in windows)
        assert eventually(lambda: consumer.refused >= 8, 10.0), consumer.refused
    finally:
        consumer.stop()


def test_7_a_forward_sequence_jump_does_not_freeze_a_real_producer(broker, tmp_path):
    topics = make_topics(broker.bootstrap, partitions=2)
    worker = start_worker(broker.bootstrap, topics, tmp_path, "--window-s", "600",
                          "--hop-s", "2")
    snaps = SnapshotLog(broker.bootstrap, topics.snapshots)
    try:
        with EventEmitter(broker.bootstrap, topics.events, producer_id="real") as em:
            for i in range(200):
                em.emit_request(REAL[i % len(REAL)], "engine-00", prompt_tokens=10)
            assert em.flush(10) == 0
            now = int(time.time() * 1000)
            p = Producer({"bootstrap.servers": broker.bootstrap})
            for part in range(2):  # the real producer's id, 9,000,000 ahead of its sequence
                p.produce(topics.events, partition=part,
                          value=forged_request(em.producer_id, 9_000_200, now))
            assert p.flush(10) == 0
            time.sleep(1.0)  # the forged events are counted before the real ones resume
            for i in range(200):
                em.emit_request(REAL[i % len(REAL)], "engine-00", prompt_tokens=10)

        def real_requests(w: CompleteWindow) -> int:
            index = w.key_index()
            return sum(int(w.requests[index[k]]) for k in REAL if k in index)

        found = snaps.wait_for(lambda w: not w.recovering and real_requests(w) == 400, 60)
        seen = [real_requests(w) for w in snaps.complete_windows()[-3:]]
        assert found is not None, (seen, worker.log_tail(20))
    finally:
        snaps.close()
        worker.stop()
