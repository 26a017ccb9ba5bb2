"""Every kind of bad event, interleaved with good ones in the same batches: every
good event is counted, every bad one is dead-lettered with its reason, the
worker keeps running, a re-sent batch is dropped as duplicates, and /metrics
shows the counters."""

from __future__ import annotations

import time
import urllib.request
from collections import Counter

import pytest
from confluent_kafka import Producer
from test_stream_support import (
    SnapshotLog,
    dead_letters,
    make_topics,
    start_worker,
)

from cacheroute.v1 import events_pb2
from planner_svc.devstack.stack import worker_web_port
from streams.partitioning import partition_for_key

pytestmark = pytest.mark.integration

PARTITIONS = 4
GOOD_KEYS = [f"good-{i}" for i in range(8)]


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire) + payload


def _bytes_field(number: int, data: bytes) -> bytes:
    return _field(number, 2, _varint(len(data)) + data)


class Batches:
    """Builds one EventBatch per partition; bad events ride with good ones."""

    def __init__(self, now_ms: int) -> None:
        self.now = now_ms
        self.seqs = {p: p << 40 for p in range(PARTITIONS)}  # numbered as the emitter does
        self.raw: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        self.expected_bad: Counter[str] = Counter()
        self.good_requests: Counter[str] = Counter()
        self.good_prompt: Counter[str] = Counter()

    def _next(self, key: str) -> int:
        """The producer's next sequence in `key`'s partition (consecutive there)."""
        p = partition_for_key(key, PARTITIONS)
        self.seqs[p] += 1
        return self.seqs[p]

    def _event(self, key: str, **fields) -> events_pb2.Event:
        # (an event with another producer id is not this producer's: it takes no number)
        mine = fields.get("producer_id", "validation") == "validation"
        base = dict(producer_id="validation", sequence=self._next(key) if mine else 1,
                    timestamp_ms=self.now)
        base.update(fields)
        return events_pb2.Event(**base)

    def _put(self, key: str, event: events_pb2.Event | bytes) -> None:
        raw = event if isinstance(event, bytes) else event.SerializeToString()
        self.raw[partition_for_key(key, PARTITIONS)].append(raw)

    def good(self, key: str, i: int) -> None:
        self._put(key, self._event(key, request=events_pb2.RequestEvent(
            routing_key=key, destination="d1", prompt_tokens=100 + i)))
        self._put(key, self._event(key, cache_hit=events_pb2.CacheHitEvent(
            routing_key=key, destination="d1", prompt_tokens=100 + i, cached_tokens=i,
            e2e_ms=50.0, queue_depth=3)))
        self.good_requests[key] += 1
        self.good_prompt[key] += 100 + i

    def bad(self, reason: str, key: str, event: events_pb2.Event | bytes) -> None:
        self._put(key, event)
        self.expected_bad[reason] += 1

    def add_every_bad_kind(self, key: str) -> None:
        req = events_pb2.RequestEvent
        hit = events_pb2.CacheHitEvent
        self.bad("unknown_type", key, self._event(key))  # no body at all
        future_body = (_bytes_field(1, b"validation") + _field(2, 0, _varint(self._next(key)))
                       + _field(3, 0, _varint(self.now)) + _bytes_field(13, b"\x0a\x01x"))
        self.bad("unknown_type", key, future_body)  # a body type from a newer schema
        self.bad("missing_field", key, self._event(key, request=req(destination="d1")))
        self.bad("missing_field", key, self._event(
            key, producer_id="", request=req(routing_key=key, destination="d1")))
        self.bad("missing_field", key, self._event(key, cache_hit=hit(
            routing_key=key, destination="d1")))
        self.bad("invalid_key", key, self._event(key, request=req(
            routing_key="k" * 600, destination="d1")))
        self.bad("invalid_key", key, self._event(key, request=req(
            routing_key="a\0b", destination="d1")))
        negative = _bytes_field(1, b"validation") + _field(2, 0, _varint(self._next(key))) + _field(
            3, 0, _varint(self.now)) + _bytes_field(10, _bytes_field(1, key.encode())
                                                    + _bytes_field(2, b"d1")
                                                    + _field(3, 0, _varint(-5)))
        self.bad("absurd_tokens", key, negative)  # prompt_tokens = -5 on the wire
        self.bad("absurd_tokens", key, self._event(key, cache_hit=hit(
            routing_key=key, destination="d1", prompt_tokens=2_000_000_000, cached_tokens=1)))
        self.bad("cached_exceeds_prompt", key, self._event(key, cache_hit=hit(
            routing_key=key, destination="d1", prompt_tokens=10, cached_tokens=20)))
        self.bad("invalid_latency", key, self._event(key, cache_hit=hit(
            routing_key=key, destination="d1", prompt_tokens=10, cached_tokens=2, e2e_ms=-5.0)))
        self.bad("timestamp_future", key, self._event(
            key, timestamp_ms=self.now + 86_400_000,
            request=req(routing_key=key, destination="d1")))
        self.bad("timestamp_past", key, self._event(
            key, timestamp_ms=self.now - 30 * 86_400_000,
            request=req(routing_key=key, destination="d1")))
        # valid, but older than every open window of a partition that has moved on
        self.bad("late", key, self._event(
            key, timestamp_ms=self.now - 1_000_000, request=req(routing_key=key, destination="d1")))

    def messages(self) -> list[tuple[int, bytes]]:
        """(partition, EventBatch bytes) with events in the order they were added."""
        out = []
        for p, events in self.raw.items():
            if events:
                out.append((p, b"".join(_bytes_field(1, e) for e in events)))
            self.raw[p] = []
        return out


def test_bad_events_are_dead_lettered_and_good_ones_counted(broker, tmp_path):
    topics = make_topics(broker.bootstrap, partitions=PARTITIONS)
    worker = start_worker(broker.bootstrap, topics, tmp_path, "--window-s", "60", "--hop-s", "2")
    snaps = SnapshotLog(broker.bootstrap, topics.snapshots)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    try:
        b = Batches(int(time.time() * 1000))
        for i, key in enumerate(GOOD_KEYS):  # first: every partition's clock starts
            b.good(key, i)
        sent = b.messages()
        for i, key in enumerate(GOOD_KEYS * 3):
            b.good(key, i)
            b.add_every_bad_kind(key)
            b.good(key, i + 1)
        sent += b.messages()
        sent.append((0, b"\xff\xfe garbage, not protobuf \x00\x01"))
        b.expected_bad["undecodable"] += 1
        sent.append(sent[1])  # a retried batch: duplicates, not dead letters
        dup_events = len(events_pb2.EventBatch.FromString(sent[1][1]).events)
        for p, value in sent:
            producer.produce(topics.events, value=value, partition=p)
        assert producer.flush(10) == 0

        win = snaps.wait_for(
            lambda w: Counter({k: int(n) for k, n in zip(w.keys, w.requests, strict=True)})
            == b.good_requests, timeout_s=60)
        assert win is not None, worker.log_tail(40)
        idx = win.key_index()
        for key in GOOD_KEYS:
            assert win.prompt_tokens[idx[key]] == b.good_prompt[key]
        assert win.duplicates_dropped == dup_events
        assert win.dead_letters == sum(b.expected_bad.values())

        letters = dead_letters(broker.bootstrap, topics.deadletter,
                               sum(b.expected_bad.values()))
        assert Counter(d.reason for d in letters) == b.expected_bad
        assert all(d.source_topic == topics.events and d.raw and d.rejected_at_ms for d in letters)

        port = worker_web_port(worker)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        for reason, n in b.expected_bad.items():
            assert f'cacheroute_streams_dead_letters_total{{reason="{reason}"}} {n}' in text
        assert f"cacheroute_streams_duplicates_total {dup_events}" in text
        assert worker.alive()
    finally:
        snaps.close()
        worker.stop()
