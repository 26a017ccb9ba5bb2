"""What a hostile or buggy third-party client writes (the hardening issue's attacks),
shared by the item-by-item tests and the chaos run."""

from __future__ import annotations

import os

from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from cacheroute.v1 import events_pb2, snapshot_pb2
from streams.columns import encode_keys

FORGED_PREFIX = "forged-"
# A current pointer naming version 1.(2^64 - 1): past anything the planner stored.
PAST_WHAT_IS_STORED = b"0000000000000001ffffffffffffffff " + b"00" * 32
JUNK_POINTERS = (b"hello world", PAST_WHAT_IS_STORED)


def forged_snapshot(end_ms: int, partitions: int, window_ms: int = 10_000) -> bytes:
    """A RateSnapshot of five made-up keys at 5,000 req/s from worker "evil"."""
    s = snapshot_pb2.RateSnapshot(window_start_ms=end_ms - window_ms, window_end_ms=end_ms,
                                  source_partition=0, partition_count=partitions,
                                  part_index=0, part_count=1, worker_id="evil")
    keys = [f"{FORGED_PREFIX}{i}" for i in range(5)]
    s.keys.keys = encode_keys(keys)
    s.keys.rate_per_s.extend([5000.0] * 5)
    for name in ("ewma_rate_per_s", "prompt_tokens", "cached_tokens", "reuse_fraction",
                 "interarrival_cv", "reusable_prefix_tokens"):
        getattr(s.keys, name).extend([0.0] * 5)
    s.keys.requests.extend([50_000] * 5)
    return s.SerializeToString()


def forged_request(producer_id: str, sequence: int, timestamp_ms: int,
                   key: str = f"{FORGED_PREFIX}event") -> bytes:
    """One EventBatch of one valid-looking request event."""
    e = events_pb2.Event(producer_id=producer_id, sequence=sequence, timestamp_ms=timestamp_ms,
                         request=events_pb2.RequestEvent(routing_key=key, destination="engine-00",
                                                         prompt_tokens=100))
    return events_pb2.EventBatch(events=[e]).SerializeToString()


def oversized_garbage(n_bytes: int = 3 << 20) -> bytes:
    return os.urandom(n_bytes)


def accept_large_messages(bootstrap: str, topic: str, max_bytes: int = 8 << 20) -> None:
    """Let `topic` take batches up to `max_bytes`. Apache Kafka refuses a batch above the
    topic's max.message.bytes (1 MiB by default) at produce time; a broker set to accept
    more hands an oversized message to the stream worker, whose defence is what is tested."""
    resource = ConfigResource("topic", topic, incremental_configs=[ConfigEntry(
        "max.message.bytes", str(max_bytes), incremental_operation=AlterConfigOpType.SET)])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.incremental_alter_configs([resource])[resource].result(10)


def plausible_forged_part(end_ms: int, partition: int, partitions: int,
                          window_ms: int) -> bytes:
    """Issue 55 item 6: one partition's part of a window that looks real (the events
    topic's partition count, on the hop grid, a real worker's name) but whose 20 made-up
    keys carry all the rate; unsigned."""
    s = snapshot_pb2.RateSnapshot(window_start_ms=end_ms - window_ms, window_end_ms=end_ms,
                                  source_partition=partition, partition_count=partitions,
                                  part_index=0, part_count=1, worker_id="worker-0",
                                  published_at_ms=end_ms)
    keys = [f"{FORGED_PREFIX}plausible-{i}" for i in range(20)][partition::partitions]
    s.keys.keys = encode_keys(keys)
    for name, value in (("rate_per_s", 500.0), ("ewma_rate_per_s", 500.0),
                        ("prompt_tokens", 1e6), ("cached_tokens", 9e5), ("reuse_fraction", 0.0),
                        ("interarrival_cv", 0.0), ("reusable_prefix_tokens", 0.0)):
        getattr(s.keys, name).extend([value] * len(keys))
    s.keys.requests.extend([5_000] * len(keys))
    s.active_keys = len(keys)
    return s.SerializeToString()


def rogue_signed(payload: bytes) -> bytes:
    """`payload` signed the way a worker signs, with a key of the forger's own."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from streams.snapshot_signing import SnapshotSigner

    return SnapshotSigner(Ed25519PrivateKey.generate()).sign(payload)
