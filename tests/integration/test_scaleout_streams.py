"""Scale-out: four stream workers of one app on one broker, joining and leaving mid-run.

20,000 events over 200 keys on an 8-partition topic while the membership changes:
two workers at the start, two more join, one leaves (SIGTERM), one dies (SIGKILL),
and the one that left comes back. Partitions move between the workers at every change.

Checked against a straight recount of the raw topic:
- no event is lost: once the stream settles, the per-key counts of complete windows
  (assembled by the planner's own `WindowAssembler`) equal the recount exactly;
- none is counted twice: no complete, non-recovering window ever shows a key above it;
- snapshots stay complete: each change is made only once a window completed (all eight
  partitions) that shows the previous one, and one window is assembled from parts
  published by four workers at once.
"""

from __future__ import annotations

import itertools
import random
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, TopicPartition
from test_stream_support import make_topics, recount_requests, start_worker

from cacheroute.v1 import snapshot_pb2
from planner_svc.adapters.events_export import read_topic
from planner_svc.devstack.processes import ManagedProcess
from streams.assembly import CompleteWindow, WindowAssembler
from streams.emitter import EventEmitter

pytestmark = pytest.mark.integration

PARTITIONS = 8
KEYS = [f"tenant-{i:03d}" for i in range(200)]
EVENTS = 20_000
PRODUCE_S = 30.0
WORKER_ARGS = ("--window-s", "600", "--hop-s", "2", "--eviction-s", "30")


def produce(bootstrap: str, topic: str, done: threading.Event) -> None:
    """EVENTS events (4 requests : 1 cache hit) spread evenly over PRODUCE_S seconds."""
    rng = random.Random(23)
    with EventEmitter(bootstrap, topic, producer_id="scaleout", batch_max_events=200) as em:
        per_tick = EVENTS // int(PRODUCE_S * 20)
        sent = 0
        while sent < EVENTS:
            for _ in range(min(per_tick, EVENTS - sent)):
                key, dest = rng.choice(KEYS), f"dest-{rng.randrange(8)}"
                if sent % 5 == 4:
                    em.emit_cache_hit(key, dest, prompt_tokens=100, cached_tokens=50)
                else:
                    em.emit_request(key, dest, prompt_tokens=100)
                sent += 1
            time.sleep(0.05)
        assert em.dropped == 0
    done.set()


class PlannerView:
    """The snapshots topic as the planner sees it: parts in arrival order -> WindowAssembler.

    `windows` holds each completed window with when it completed and which workers published
    its parts."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.assembler = WindowAssembler(max_pending=64)
        self.windows: list[tuple[float, CompleteWindow, set[str]]] = []
        self._workers: dict[int, dict[tuple[int, int], str]] = {}  # window -> part -> worker
        self._c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"v-{uuid.uuid4().hex}",
                            "enable.auto.commit": False})
        self._c.assign([TopicPartition(topic, 0, 0)])

    def poll(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            m = self._c.poll(0.1)
            if m is None or m.error():
                continue
            part = snapshot_pb2.RateSnapshot.FromString(m.value())
            by_part = self._workers.setdefault(part.window_end_ms, {})
            by_part[(part.source_partition, part.part_index)] = part.worker_id
            window = self.assembler.add(part)
            if window is not None:
                workers = set(self._workers.pop(window.window_end_ms).values())
                self.windows.append((time.monotonic(), window, workers))

    def wait_for(self, ok: Callable[[set[str]], bool], since: float, timeout_s: float) -> bool:
        """Until a window completed after `since` whose publishing workers satisfy `ok`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(at > since and ok(ws) for at, _, ws in self.windows):
                return True
            self.poll(0.5)
        return False

    def close(self) -> None:
        self._c.close()


def counts_of(w: CompleteWindow) -> Counter[str]:
    return Counter({k: int(n) for k, n in zip(w.keys, w.requests, strict=True) if n})


# (change, worker): each is made once the previous one showed in a complete window.
MEMBERSHIP = [("join", 2), ("join", 3), ("leave", 1), ("die", 3), ("rejoin", 1)]


def publishing(worker: str, expected: bool) -> Callable[[set[str]], bool]:
    """Whether a window's publishing workers include `worker` (or, with False, exclude it)."""
    return lambda workers: (worker in workers) == expected


def change_membership(workers: list[ManagedProcess], spawn: Callable[[int], ManagedProcess],
                      view: PlannerView) -> list[float]:
    """Join, leave, die, rejoin; returns when each change was made."""
    changed = []
    for what, i in MEMBERSHIP:
        name = f"w{i}"
        if what == "join":
            workers.append(spawn(i))
        elif what == "rejoin":
            workers[i].start()
        else:
            workers[i].signal(signal.SIGTERM if what == "leave" else signal.SIGKILL)
            proc = workers[i].proc
            assert proc is not None
            proc.wait(30)
        changed.append(time.monotonic())
        shown = view.wait_for(publishing(name, what in ("join", "rejoin")), changed[-1], 60)
        assert shown, f"{what} {name}: no complete window showed it"
    return changed


def test_four_workers_join_and_leave_without_loss_or_double_count(broker, tmp_path):
    topics = make_topics(broker.bootstrap, partitions=PARTITIONS)

    def spawn(i: int) -> ManagedProcess:
        workdir = tmp_path / f"w{i}"
        workdir.mkdir()
        return start_worker(broker.bootstrap, topics, workdir, *WORKER_ARGS, "--worker-id", f"w{i}")

    workers = [spawn(0), spawn(1)]
    view = PlannerView(broker.bootstrap, topics.snapshots)
    done = threading.Event()
    producer = threading.Thread(target=produce, args=(broker.bootstrap, topics.events, done))
    try:
        view.poll(3.0)
        producer.start()
        changes = change_membership(workers, spawn, view)
        producer.join(60)
        assert done.is_set()
        truth = recount_requests(read_topic(broker.bootstrap, topics.events, deadline_s=60.0))
        assert sum(truth.values()) == EVENTS * 4 // 5
        settled = wait_settled(view, truth, since=changes[-1])
        assert settled is not None, (describe_unsettled(view, truth, changes[-1]) + "\n"
                                     + "\n".join(w.log_tail(20) for w in workers))
        check_no_double_count(view, truth)
        four = [ws for _, _, ws in view.windows if len(ws) == 4]
        assert four, "no window was assembled from the parts of four workers"
        assert all(w.partition_count == PARTITIONS for _, w, _ in view.windows)
        print(f"membership changes at {[round(c - changes[0], 1) for c in changes]} s; "
              f"{len(view.windows)} complete windows, {len(four)} from 4 workers; "
              f"longest gap between complete windows {max_gap(view):.1f} s")
    finally:
        view.close()
        for w in workers:
            w.stop()


def wait_settled(view: PlannerView, truth: Counter[str], since: float) -> CompleteWindow | None:
    """The first non-recovering window completed after `since` whose counts equal the truth,
    followed by at least two more complete windows that equal it too."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        view.poll(1.0)
        later = [w for at, w, _ in view.windows if at > since and not w.recovering]
        exact = [i for i, w in enumerate(later) if counts_of(w) == truth]
        if exact and len(later) - exact[0] >= 3:
            for w in later[exact[0]:]:
                assert counts_of(w) == truth, f"window {w.window_end_ms} drifted from the truth"
            return later[exact[0]]
    return None


def describe_unsettled(view: PlannerView, truth: Counter[str], since: float) -> str:
    """What the windows after the last change showed, against the truth: the evidence a
    failure needs (lost events look different from a stream that never caught up)."""
    later = [(at - since, w, ws) for at, w, ws in view.windows if at > since]
    lines = [f"{len(later)} complete windows after the last change "
             f"(truth: {sum(truth.values())} requests)"]
    for dt, w, ws in later[-6:]:
        counts = counts_of(w)
        short = sum((truth - counts).values())
        over = sum((counts - truth).values())
        lines.append(f"  +{dt:.1f}s window {w.window_end_ms} recovering={w.recovering} "
                     f"workers={sorted(ws)} total={sum(counts.values())} "
                     f"short={short} over={over}")
    return "\n".join(lines)


def check_no_double_count(view: PlannerView, truth: Counter[str]) -> None:
    for _, w, _ in view.windows:
        if not w.recovering:
            over = {k: n for k, n in counts_of(w).items() if n > truth[k]}
            assert not over, f"double counted in window {w.window_end_ms}: {over}"


def max_gap(view: PlannerView) -> float:
    """Longest time between consecutive completed windows (a rebalance shows here)."""
    times = [at for at, _, _ in view.windows]
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)
