"""Helpers for the stream integration tests: topics, a worker process, snapshot
and dead-letter collection, and a straight recount of the raw events topic."""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cacheroute.v1 import events_pb2, snapshot_pb2
from planner_svc.adapters.events_export import read_topic
from planner_svc.devstack.processes import ManagedProcess, free_port
from streams.assembly import CompleteWindow, merge_parts


@dataclass
class Topics:
    events: str
    snapshots: str
    deadletter: str
    app_id: str


def make_topics(bootstrap: str, partitions: int = 4) -> Topics:
    tag = uuid.uuid4().hex[:8]
    t = Topics(f"ev-{tag}", f"snap-{tag}", f"dl-{tag}", f"streams-{tag}")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = [NewTopic(t.events, num_partitions=partitions, replication_factor=1),
           NewTopic(t.snapshots, num_partitions=1, replication_factor=1),
           NewTopic(t.deadletter, num_partitions=1, replication_factor=1)]
    for f in admin.create_topics(new).values():
        f.result(10)
    return t


def start_worker(bootstrap: str, topics: Topics, workdir: Path, *extra: str) -> ManagedProcess:
    argv = [sys.executable, "-m", "streams", "worker", "--bootstrap", bootstrap,
            "--web-port", str(free_port()), "--events-topic", topics.events,
            "--snapshots-topic", topics.snapshots, "--deadletter-topic", topics.deadletter,
            "--app-id", topics.app_id, "--data-dir", str(workdir / "faust"), *extra]
    proc = ManagedProcess("streams", argv, workdir / "streams-worker.log")
    proc.start()
    return proc


def _consumer(bootstrap: str, topic: str) -> Consumer:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex[:8]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    c.assign([TopicPartition(topic, 0, 0)])
    return c


@dataclass
class SnapshotLog:
    """Every snapshot part published so far, grouped into windows."""

    bootstrap: str
    topic: str
    parts: dict[int, dict[tuple[int, int], snapshot_pb2.RateSnapshot]] = field(
        default_factory=dict)

    def __post_init__(self) -> None:
        self._c = _consumer(self.bootstrap, self.topic)

    def poll(self, seconds: float = 0.5) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            m = self._c.poll(0.1)
            if m is None or m.error():
                continue
            s = snapshot_pb2.RateSnapshot.FromString(m.value())
            window = self.parts.setdefault(s.window_end_ms, {})
            # a republished window's parts replace the earlier copy
            window[(s.source_partition, s.part_index)] = s

    def complete(self, end_ms: int) -> CompleteWindow | None:
        parts = self.parts.get(end_ms, {})
        if not parts:
            return None
        first = next(iter(parts.values()))
        need: dict[int, int] = {}  # partition -> its part count, once a part is seen
        for (p, _), s in parts.items():
            need[p] = s.part_count
        if len(need) != first.partition_count or len(parts) != sum(need.values()):
            return None
        return merge_parts(list(parts.values()))

    def complete_windows(self) -> list[CompleteWindow]:
        out = [self.complete(end) for end in sorted(self.parts)]
        return [w for w in out if w is not None]

    def wait_for(self, predicate: Callable[[CompleteWindow], bool],
                 timeout_s: float) -> CompleteWindow | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.poll(0.5)
            for w in reversed(self.complete_windows()):
                if predicate(w):
                    return w
        return None

    def close(self) -> None:
        self._c.close()


def recount_requests(values: list[bytes]) -> Counter[str]:
    """Requests per key in the raw topic, each (producer, sequence) once."""
    seen: set[tuple[str, int]] = set()
    counts: Counter[str] = Counter()
    for v in values:
        for e in events_pb2.EventBatch.FromString(v).events:
            if e.WhichOneof("body") == "request" and (e.producer_id, e.sequence) not in seen:
                seen.add((e.producer_id, e.sequence))
                counts[e.request.routing_key] += 1
    return counts


def dead_letters(bootstrap: str, topic: str, expected: int) -> list[events_pb2.DeadLetter]:
    """The dead letters, once at least `expected` of them were written (the worker writes
    them apart from the window that counts them)."""
    return [events_pb2.DeadLetter.FromString(v)
            for v in read_topic(bootstrap, topic, at_least=expected, deadline_s=60.0)]
