"""Known Poisson workload through the real broker and a real worker process.

Event time is synthetic (the past ~80 minutes, produced in seconds), so a
4000 s window reaches steady state without the test running for minutes.
Rates span three orders of magnitude (0.02 .. 20 req/s); keys above 1 req/s
must be within 5 % of their true rate. Counts, token sums (hit rates) and the
reuse statistic must equal a direct computation over the same events.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict

import numpy as np
import pytest
from test_stream_support import SnapshotLog, make_topics, start_worker

from streams.emitter import EventEmitter

pytestmark = pytest.mark.integration

WINDOW_S, HOP_S, EVICTION_S = 4000, 500, 20
SPAN_S = 5000
DESTS = [f"dest-{i}" for i in range(4)]


def workload(t0_ms: int, seed: int = 7) -> list[tuple]:
    """(ts_ms, key, dest, prompt, cached or -1) sorted by time; -1 = no hit event."""
    rng = np.random.default_rng(seed)
    rates = np.geomspace(0.02, 20.0, 12)
    rows = []
    for k, lam in enumerate(rates):
        n = rng.poisson(lam * SPAN_S)
        times = np.sort(rng.uniform(0, SPAN_S * 1000, n)).astype(np.int64) + t0_ms
        home = [DESTS[k % 4], DESTS[(k + 1) % 4]]
        for t in times.tolist():
            prompt = int(rng.integers(100, 2000))
            cached = int(rng.integers(0, prompt + 1)) if rng.random() < 0.25 else -1
            dest = home[int(rng.integers(0, 2))]
            rows.append((t, f"key-{k:02d}-{lam:.3f}", dest, prompt, cached))
    rows.sort()
    return rows


def expected(rows: list[tuple], start: int, end: int) -> dict[str, dict]:
    """Direct computation of the window [start, end) statistics per key."""
    out: dict[str, dict] = defaultdict(lambda: dict(n=0, prompt=0, cached=0, reused=0, gaps=[]))
    last_pair: dict[tuple[str, str], int] = {}
    last_key: dict[str, int] = {}
    for t, key, dest, prompt, cached in rows:
        prev_pair = last_pair.get((key, dest))
        prev_key = last_key.get(key)
        last_pair[(key, dest)] = t
        last_key[key] = t
        if not start <= t < end:
            continue
        o = out[key]
        o["n"] += 1
        o["reused"] += prev_pair is not None and t - prev_pair <= EVICTION_S * 1000
        if prev_key is not None and t - prev_key <= WINDOW_S * 1000:
            o["gaps"].append(t - prev_key)
        if cached >= 0:
            o["prompt"] += prompt
            o["cached"] += cached
    return out


def test_poisson_rates_hit_rates_and_reuse(broker, tmp_path):
    topics = make_topics(broker.bootstrap, partitions=4)
    snaps = SnapshotLog(broker.bootstrap, topics.snapshots)
    worker = None
    try:
        now = int(time.time() * 1000)
        t0 = (now - (SPAN_S + 600) * 1000) // (HOP_S * 1000) * (HOP_S * 1000)
        rows = workload(t0)
        with EventEmitter(broker.bootstrap, topics.events, producer_id="accuracy",
                          buffer_max_events=len(rows) * 2 + 10) as em:
            for t, key, dest, prompt, cached in rows:
                em.emit_request(key, dest, prompt_tokens=prompt, timestamp_ms=t)
                if cached >= 0:
                    em.emit_cache_hit(key, dest, prompt_tokens=prompt, cached_tokens=cached,
                                      timestamp_ms=t + 1)
            assert em.dropped == 0
        # The whole backlog is in the topic before the worker starts: the idle
        # clock (wall time) cannot close a synthetic-time window early.
        worker = start_worker(
            broker.bootstrap, topics, tmp_path, "--window-s", str(WINDOW_S),
            "--hop-s", str(HOP_S), "--eviction-s", str(EVICTION_S), "--max-past-s", "100000",
        )
        end = t0 + SPAN_S * 1000  # the window [end - 4000 s, end) is full of data
        win = snaps.wait_for(lambda w: w.window_end_ms == end, timeout_s=90)
        assert win is not None, f"no complete window ending {end}: {worker.log_tail(40)}"
        assert not win.recovering
        truth = expected([(t, k, d, p, c) for t, k, d, p, c in rows], end - WINDOW_S * 1000, end)
        # hit events are stamped 1 ms after their request: same window except at the edge
        hits = expected([(t + 1, k, d, p, c) for t, k, d, p, c in rows],
                        end - WINDOW_S * 1000, end)
        idx = win.key_index()
        assert set(idx) >= {k for k, o in truth.items() if o["n"]}
        checked = 0
        for key, o in truth.items():
            i = idx[key]
            true_rate = float(key.rsplit("-", 1)[1])
            assert int(win.requests[i]) == o["n"]
            assert win.rate_per_s[i] == pytest.approx(o["n"] / WINDOW_S)
            if true_rate > 1.0:
                assert abs(win.rate_per_s[i] / true_rate - 1) < 0.05, key
                checked += 1
            assert win.prompt_tokens[i] == hits[key]["prompt"]
            assert win.cached_tokens[i] == hits[key]["cached"]
            assert win.reuse_fraction[i] == pytest.approx(o["reused"] / o["n"])
            gaps = np.array(o["gaps"], dtype=float)
            if gaps.size >= 2:
                assert win.interarrival_cv[i] == pytest.approx(gaps.std() / gaps.mean(), rel=1e-6)
        assert checked >= 4
        n_window = sum(o["n"] for o in truth.values())
        dest_total = sum(d.arrival_rate_per_s for d in win.destinations.values()) * WINDOW_S
        assert dest_total == pytest.approx(n_window)
        for d in win.destinations.values():
            assert d.cached_tokens <= d.prompt_tokens
        assert win.active_keys == len([o for o in truth.values() if o["n"]])
        assert not math.isnan(win.ewma_rate_per_s[0])
    finally:
        snaps.close()
        if worker is not None:
            worker.stop()
