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
