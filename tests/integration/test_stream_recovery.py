"""Recovery replays only the history the state needs.

Messages written two hours ago (by message timestamp) precede recent ones. A worker
taking the partitions over finds the first recent offset by binary search (the local
broker answers offsets-for-times with the log start), counts only the recent events,
and its windows are complete (not `recovering`) once they start after the replayed
history.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections import Counter

import pytest
from confluent_kafka import Producer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from test_stream_support import SnapshotLog, make_topics, start_worker

from cacheroute.v1 import events_pb2
from planner_svc.devstack.stack import worker_web_port
from streams.partitioning import partition_for_key

pytestmark = pytest.mark.integration
PARTITIONS = 2


def batch(key: str, seq0: int, n: int, ts: int) -> bytes:
    b = events_pb2.EventBatch()
    for i in range(n):
        b.events.add(producer_id=f"rec-{key}", sequence=seq0 + i, timestamp_ms=ts).request.CopyFrom(
            events_pb2.RequestEvent(routing_key=key, destination="d", prompt_tokens=1))
    return b.SerializeToString()


def test_replay_starts_at_the_needed_history(broker, tmp_path):
    topics = make_topics(broker.bootstrap, partitions=PARTITIONS)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    now = int(time.time() * 1000)
    old_ms = now - 2 * 3600 * 1000
    keys = [f"key-{i}" for i in range(6)]
    for round_ in range(20):  # old history: 20 messages per key, two hours ago
        for k in keys:
            producer.produce(topics.events, value=batch(k, 1 + round_ * 10, 10, old_ms),
                             partition=partition_for_key(k, PARTITIONS), timestamp=old_ms)
    recent: Counter[str] = Counter()
    for k in keys:  # recent traffic
        producer.produce(topics.events, value=batch(k, 1000, 7, now),
                         partition=partition_for_key(k, PARTITIONS))
        recent[k] += 7
    assert producer.flush(10) == 0

    worker = start_worker(broker.bootstrap, topics, tmp_path, "--window-s", "20", "--hop-s", "2",
                          "--replay-margin-s", "5")
    snaps = SnapshotLog(broker.bootstrap, topics.snapshots)
    try:
        win = snaps.wait_for(
            lambda w: not w.recovering
            and Counter({k: int(n) for k, n in zip(w.keys, w.requests, strict=True)}) == recent,
            timeout_s=60)
        assert win is not None, worker.log_tail(30)
        port = worker_web_port(worker)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        # the two-hour-old events were never read into the state
        assert f'cacheroute_streams_events_total{{type="request"}} {sum(recent.values())}.0\n' \
            in text.decode()
    finally:
        snaps.close()
        worker.stop()


class _Delivered:
    """What Faust hands the agent for one message: only `.message` is read."""

    def __init__(self, partition: int, offset: int, value: bytes) -> None:
        self.message = type("M", (), {"partition": partition, "offset": offset, "value": value})


def test_a_consumer_that_resumes_past_the_state_has_the_gap_replayed(broker, tmp_path):
    """The consumer hands the agent offsets 7.. while the state ends at 3 (the committed
    offset ran ahead of the replay): offsets 3-6 are read from the log, not lost."""
    from streams.app import create_app
    from streams.processor import PartitionProcessor
    from streams.settings import Settings
    from streams.snapshot_signing import SnapshotSigner

    topics = make_topics(broker.bootstrap, partitions=1)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    values = [batch("gap-key", 100 * i, i + 1, int(time.time() * 1000)) for i in range(10)]
    for v in values:  # message i carries i + 1 request events
        producer.produce(topics.events, value=v, partition=0)
    assert producer.flush(10) == 0

    settings = Settings(bootstrap=broker.bootstrap, events_topic=topics.events,
                        snapshots_topic=topics.snapshots, deadletter_topic=topics.deadletter,
                        window_s=600, hop_s=2, data_dir=tmp_path)
    _, worker = create_app(settings, SnapshotSigner(Ed25519PrivateKey.generate()))
    proc = PartitionProcessor(0, worker.config, worker.counters)
    proc.next_offset = 3
    worker.processors[0] = proc

    async def deliver() -> None:
        await worker.handle([_Delivered(0, o, values[o]) for o in range(7, 10)])
        await worker.handle([_Delivered(0, 9, values[9])])  # a redelivery: no gap, no count

    asyncio.run(deliver())
    assert proc.next_offset == 10
    assert worker.counters.gaps_filled == 1 and worker.counters.gap_messages == 4
    assert worker.counters.events_by_type["request"] == sum(range(4, 11))  # offsets 3..9
