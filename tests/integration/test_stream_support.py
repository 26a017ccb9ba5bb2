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


def web_port_of(proc: ManagedProcess) -> int:
    return int(proc.argv[proc.argv.index("--web-port") + 1])


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
        need = {p: None for p in range(first.partition_count)}
        for (p, _), s in parts.items():
            need[p] = s.part_count
        if None in need.values():
            return None
        if len(parts) != sum(v for v in need.values() if v is not None):
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


def read_all(bootstrap: str, topic: str, partitions: int, *, at_least: int = 0,
             deadline_s: float = 60.0) -> list[bytes]:
    """Every message value of `topic` (all partitions) from the beginning: at least up to
    the high watermarks and `at_least` messages in all (for writes that land
    asynchronously, such as dead letters), or fail at the deadline. Reading to a known
    end, not until the topic goes quiet, keeps this correct on a loaded machine, where the
    first fetch can take longer than any idle cut-off.

    Tansu reports a partition's high watermark as its last record batch's *base* offset
    + 1, so reaching it means that batch was fetched; the rest of the batch is already in
    the consumer's queue, drained after (`drain_s` with nothing new)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:8]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    give_up = time.monotonic() + deadline_s
    drain_s = 1.0
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=deadline_s)[1]
                for p in range(partitions)}
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        read = dict.fromkeys(ends, 0)
        values: list[bytes] = []
        last = time.monotonic()
        while (any(read[p] < ends[p] for p in ends) or len(values) < at_least
               or time.monotonic() - last < drain_s):
            if time.monotonic() > give_up:
                raise AssertionError(f"{topic}: read {len(values)} messages (offsets {read}, "
                                     f"watermarks {ends}, wanted >= {at_least}) "
                                     f"within {deadline_s} s")
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            read[m.partition()] = m.offset() + 1
            values.append(m.value())
            last = time.monotonic()
        return values
    finally:
        c.close()


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
            for v in read_all(bootstrap, topic, 1, at_least=expected)]
