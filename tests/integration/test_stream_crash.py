"""Crash test: 20,000 events over 100 keys while the worker is SIGKILLed three
times and SIGTERMed once at random moments (and restarted each time).

Once the stream settles, per-key counts of the published window equal a
straight recount of the raw topic: zero differences. No complete,
non-recovering window ever shows a key above the truth (no double counting),
and after settling none shows a key below it.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter

import pytest
from test_stream_support import (
    SnapshotLog,
    make_topics,
    recount_requests,
    start_worker,
)

from planner_svc.adapters.events_export import read_topic
from streams.assembly import CompleteWindow
from streams.emitter import EventEmitter

pytestmark = pytest.mark.integration

KEYS = [f"tenant-{i:03d}" for i in range(100)]
EVENTS = 20_000
PRODUCE_S = 12.0


def produce(bootstrap: str, topic: str, seed: int, done: threading.Event) -> None:
    rng = random.Random(seed)
    with EventEmitter(bootstrap, topic, producer_id=f"crash-{seed}",
                      batch_max_events=200) as em:
        per_tick = EVENTS // int(PRODUCE_S * 20)
        sent = 0
        while sent < EVENTS:
            for _ in range(min(per_tick, EVENTS - sent)):
                key = rng.choice(KEYS)
                dest = f"dest-{rng.randrange(6)}"
                if sent % 5 == 4:
                    cached = rng.randrange(101)
                    em.emit_cache_hit(key, dest, prompt_tokens=100, cached_tokens=cached)
                else:
                    em.emit_request(key, dest, prompt_tokens=100)
                sent += 1
            time.sleep(0.05)
        assert em.dropped == 0
    done.set()


def counts_of(w: CompleteWindow) -> Counter[str]:
    return Counter({k: int(n) for k, n in zip(w.keys, w.requests, strict=True) if n})


def test_counts_survive_sigkill_and_sigterm(broker, tmp_path):
    topics = make_topics(broker.bootstrap, partitions=4)
    args = ("--window-s", "600", "--hop-s", "2", "--eviction-s", "30")
    worker = start_worker(broker.bootstrap, topics, tmp_path, *args)
    snaps = SnapshotLog(broker.bootstrap, topics.snapshots)
    done = threading.Event()
    producer = threading.Thread(target=produce, args=(broker.bootstrap, topics.events, 11, done))
    rng = random.Random(5)
    kills = [signal.SIGKILL, signal.SIGKILL, signal.SIGKILL, signal.SIGTERM]
    rng.shuffle(kills)
    try:
        time.sleep(2.0)
        producer.start()
        started = time.monotonic()
        for at, sig in zip(sorted(rng.uniform(1.0, 24.0) for _ in kills), kills, strict=True):
            while time.monotonic() - started < at:
                snaps.poll(0.2)
            worker.signal(sig)
            assert worker.proc is not None
            worker.proc.wait(30)
            worker.start()
        last_start_ms = int(time.time() * 1000)
        producer.join(60)
        assert done.is_set()
        truth = recount_requests(read_topic(broker.bootstrap, topics.events, deadline_s=60.0))
        assert sum(truth.values()) == EVENTS * 4 // 5

        def settled(w: CompleteWindow) -> bool:
            # published by the last incarnation, after its recovery
            fresh = w.published_at_ms > last_start_ms
            return fresh and not w.recovering and counts_of(w) == truth

        win = snaps.wait_for(settled, timeout_s=90)
        assert win is not None, worker.log_tail(40)
        for _ in range(20):  # a few more hops
            snaps.poll(1.0)
            later = [w for w in snaps.complete_windows() if w.window_end_ms >= win.window_end_ms]
            if len(later) >= 3:
                break
        assert len(later) >= 3
        for w in later:
            assert counts_of(w) == truth, w.window_end_ms
        for w in snaps.complete_windows():
            if not w.recovering:
                over = {k: n for k, n in counts_of(w).items() if n > truth[k]}
                assert not over, f"double counted in window {w.window_end_ms}: {over}"
    finally:
        snaps.close()
        worker.stop()
