"""Hopping-window math on event time (streams.windows), no servers.

Timeline used below (hop 1 s, window 3 s, grace 1 s):

    t(s)     0     1     2     3     4     5     6
    bucket   | b0  | b1  | b2  | b3  | b4  | b5  |
    window ending 3 s = b0+b1+b2, published once the clock reaches 3 s + grace
    window ending 4 s = b1+b2+b3, ...
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.categorical import Categorical
from streams.config import StreamConfig
from streams.decoding import KIND_CACHE_HIT, KIND_REQUEST, EventColumns
from streams.windows import PartitionWindows, WindowResult

S = 1000
CFG = StreamConfig(window_ms=3 * S, hop_ms=S, grace_ms=S, eviction_ms=2 * S, idle_ms=S)


def cols(rows: list[tuple]) -> EventColumns:
    """rows: (ts_ms, key, dest, kind, prompt, cached)."""
    n = len(rows)
    return EventColumns(
        kind=np.array([r[3] for r in rows], dtype=np.int8),
        producer=Categorical.of(["p"] * n),
        sequence=np.arange(1, n + 1, dtype=np.uint64),
        timestamp_ms=np.array([r[0] for r in rows], dtype=np.int64),
        key=Categorical.of([r[1] for r in rows]),
        destination=Categorical.of([r[2] for r in rows]),
        prompt_tokens=np.array([r[4] for r in rows], dtype=np.int64),
        cached_tokens=np.array([r[5] for r in rows], dtype=np.int64),
        prefix_tokens=np.zeros(n, dtype=np.int64),
        depth=np.full(n, -1, dtype=np.int64),
        ttft_ms=np.zeros(n),
        e2e_ms=np.zeros(n),
        offset=np.zeros(n, dtype=np.int64),
        raw=b"",
        raw_start=np.zeros(n, dtype=np.int64),
        raw_end=np.zeros(n, dtype=np.int64),
    )


def req(ts: int, key: str = "a", dest: str = "d") -> tuple:
    return (ts, key, dest, KIND_REQUEST, 0, 0)


def hit(ts: int, key: str, prompt: int, cached: int, dest: str = "d") -> tuple:
    return (ts, key, dest, KIND_CACHE_HIT, prompt, cached)


def by_key(w: WindowResult, name: str = "requests") -> dict[str, float]:
    return dict(zip(w.keys, getattr(w, name).tolist(), strict=True))


def test_window_is_published_after_grace_and_sums_its_buckets():
    pw = PartitionWindows(CFG)
    late, closed = pw.ingest(cols([req(100), req(1100), req(2100), req(2200, "b")]))
    assert not late.any()
    assert [w.window_end_ms for w in closed] == [1 * S]  # clock 2.2 s >= 1 s + grace
    _, closed = pw.ingest(cols([req(3500)]))  # clock 3.5 s: window 2 s, not yet 3 s
    assert [w.window_end_ms for w in closed] == [2 * S]
    _, closed = pw.ingest(cols([req(4000)]))
    assert [w.window_end_ms for w in closed] == [3 * S]
    w = closed[0]
    assert w.window_start_ms == 0
    assert by_key(w) == {"a": 3, "b": 1}
    assert by_key(w, "rate_per_s") == {"a": 1.0, "b": pytest.approx(1 / 3)}


def test_ramp_up_divides_by_time_covered_not_the_full_window():
    pw = PartitionWindows(CFG)
    _, closed = pw.ingest(cols([req(0), req(500), req(2500)]))
    assert [w.window_end_ms for w in closed] == [S]
    assert by_key(closed[0], "rate_per_s") == {"a": 2.0}  # 2 requests over 1 s of data


def test_event_within_grace_lands_in_its_own_window():
    pw = PartitionWindows(CFG)
    pw.ingest(cols([req(100), req(3900)]))  # clock 3.9 s; window ending 3 s still open
    late, closed = pw.ingest(cols([req(2500, "late-but-in-grace")]))
    assert not late.any()
    _, closed = pw.ingest(cols([req(4100)]))
    w = next(w for w in closed if w.window_end_ms == 3 * S)
    assert by_key(w)["late-but-in-grace"] == 1


def test_event_after_its_window_was_published_counts_in_later_windows():
    pw = PartitionWindows(CFG)
    _, closed = pw.ingest(cols([req(100), req(4500)]))  # window 3 s published
    assert closed[-1].window_end_ms == 3 * S
    late, _ = pw.ingest(cols([req(2500, "x")]))  # bucket b2 is still in windows 4 s, 5 s
    assert not late.any()
    _, closed = pw.ingest(cols([req(6100)]))
    assert {w.window_end_ms: by_key(w).get("x", 0) for w in closed} == {4 * S: 1, 5 * S: 1}


def test_event_older_than_every_open_window_is_late():
    pw = PartitionWindows(CFG)
    pw.ingest(cols([req(100), req(9500)]))
    late, _ = pw.ingest(cols([req(5000), req(9000)]))
    assert late.tolist() == [True, False]


def test_jump_far_ahead_publishes_and_does_not_corrupt_the_ring():
    pw = PartitionWindows(CFG)
    # one batch spanning more hops than the ring holds
    late, closed = pw.ingest(cols([req(100), req(1100), req(60_000), req(60_100)]))
    assert not late.any()
    ends = [w.window_end_ms for w in closed]
    assert ends == sorted(ends) and ends[-1] <= 59 * S
    assert by_key(closed[0]) == {"a": 1}
    _, closed = pw.ingest(cols([req(70_000)]))
    w = next(w for w in closed if w.window_end_ms == 61 * S)
    assert by_key(w) == {"a": 2}


def test_idle_partition_closes_windows_by_wall_clock():
    pw = PartitionWindows(CFG)
    pw.ingest(cols([req(100)]))
    closed = pw.advance_idle(now_ms=5_000)  # clock = 5 s - idle 1 s = 4 s
    assert [w.window_end_ms for w in closed] == [1 * S, 2 * S, 3 * S]


def test_token_weighted_hit_rate_per_key_and_destination():
    pw = PartitionWindows(CFG)
    pw.ingest(cols([hit(100, "a", 100, 50, "d1"), hit(200, "a", 300, 0, "d2"),
                    hit(300, "b", 10, 10, "d1"), req(400, "a", "d1")]))
    _, closed = pw.ingest(cols([req(5000, "z")]))
    w = next(w for w in closed if w.window_end_ms == 3 * S)
    assert by_key(w, "prompt_tokens") == {"a": 400, "b": 10}
    assert by_key(w, "cached_tokens") == {"a": 50, "b": 10}
    d = {s.destination: s for s in w.destinations}
    assert (d["d1"].prompt_tokens, d["d1"].cached_tokens) == (110, 60)
    assert d["d1"].arrival_rate_per_s == pytest.approx(1 / 3)
    assert d["d2"].hit_rate == 0.0


def test_ewma_smooths_across_hops():
    cfg = StreamConfig(window_ms=S, hop_ms=S, grace_ms=0, ewma_alpha=0.5)
    pw = PartitionWindows(cfg)
    rows = [req(t) for t in range(0, 1000, 250)]  # 4/s in hop 0
    rows += [req(1500)]  # 1/s in hop 1
    _, closed = pw.ingest(cols([*rows, req(2000, "z")]))
    assert [by_key(w, "rate_per_s")["a"] for w in closed] == [4.0, 1.0]
    assert [by_key(w, "ewma_rate_per_s")["a"] for w in closed] == [4.0, 2.5]


def test_tracked_key_cap_folds_excess_into_overflow_and_keeps_admitted_keys():
    cfg = StreamConfig(window_ms=3 * S, hop_ms=S, grace_ms=0, max_tracked_keys=2)
    pw = PartitionWindows(cfg)
    rows = [req(100, "real-1"), req(200, "real-2")]
    rows += [req(300 + i, f"junk-{i}") for i in range(50)]
    rows += [req(900, "real-1")]
    _, closed = pw.ingest(cols([*rows, req(3000, "real-2")]))
    w = next(w for w in closed if w.window_end_ms == 3 * S)
    assert by_key(w) == {"real-1": 2, "real-2": 1}
    assert w.overflow_keys == 50
    assert w.overflow_rate_per_s == pytest.approx(50 / 3)
    assert w.active_keys == 52


def test_quiet_keys_release_their_slots():
    cfg = StreamConfig(window_ms=2 * S, hop_ms=S, grace_ms=0, eviction_ms=S,
                       max_tracked_keys=1)
    pw = PartitionWindows(cfg)
    pw.ingest(cols([req(100, "old")]))
    _, _closed = pw.ingest(cols([req(9000, "old"), req(9100, "new")]))
    # 9 s of silence released "old"'s only slot; it took a slot again on its return
    # (first in the batch), so "new" overflowed.
    assert pw.released_keys >= 1
    assert pw.keys.lookup(["old"]).tolist() == [0]


def direct_reuse_and_cv(times: list[tuple[int, str, str]], eviction: int, start: int, end: int,
                        window: int):
    last_pair: dict = {}
    last_key: dict = {}
    n = reused = 0
    gaps = []
    for t, k, d in times:
        pp, pk = last_pair.get((k, d)), last_key.get(k)
        last_pair[(k, d)] = t
        last_key[k] = t
        if start <= t < end:
            n += 1
            reused += pp is not None and t - pp <= eviction
            if pk is not None and t - pk <= window:
                gaps.append(t - pk)
    g = np.array(gaps, dtype=float)
    cv = g.std() / g.mean() if g.size >= 2 and g.mean() > 0 else math.nan
    return n, reused, cv


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 9_999), st.sampled_from(["d1", "d2", "d3"])),
                min_size=1, max_size=200))
def test_reuse_fraction_and_cv_match_a_direct_computation(draws):
    cfg = StreamConfig(window_ms=4 * S, hop_ms=S, grace_ms=0, eviction_ms=1500)
    events = sorted((t, "k", d) for t, d in draws)
    pw = PartitionWindows(cfg)
    closed = []
    for i in range(0, len(events), 7):  # several batches
        _, c = pw.ingest(cols([req(t, k, d) for t, k, d in events[i : i + 7]]))
        closed += c
    _, c = pw.ingest(cols([req(30_000, "zz")]))
    closed += c
    for w in closed:
        if "k" not in w.keys:
            continue
        n, reused, cv = direct_reuse_and_cv(events, 1500, w.window_start_ms, w.window_end_ms,
                                            cfg.window_ms)
        i = w.keys.index("k")
        assert int(w.requests[i]) == n
        assert w.reuse_fraction[i] == pytest.approx(reused / n if n else 0.0)
        if math.isnan(cv):
            assert math.isnan(w.interarrival_cv[i])
        else:
            assert w.interarrival_cv[i] == pytest.approx(cv, rel=1e-9, abs=1e-12)


def test_overflow_distinct_count_is_exact_when_few_and_close_when_many():
    from streams.ring import OverflowRing

    ring = OverflowRing(4)
    names = [f"junk-{i}" for i in range(50)]
    ring.add(np.array([0] * 25 + [1] * 25), names)
    ring.add(np.array([1] * 10), names[:10])  # repeats across buckets count once
    assert ring.distinct([0, 1]) == 50
    many = [f"k{i}" for i in range(20_000)]
    ring.add(np.array([2] * len(many)), many)  # past the exact limit: the bitmap estimates
    assert abs(ring.distinct([0, 1, 2]) - 20_050) < 0.03 * 20_050
    ring.clear(2)
    assert ring.distinct([0, 1, 2]) == 50


def last_destinations(w: WindowResult) -> dict[str, str | None]:
    names = w.last_destination_names
    return {k: (names[i] if i >= 0 else None)
            for k, i in zip(w.keys, w.last_destination.tolist(), strict=True)}


def test_each_key_reports_where_its_newest_request_went_even_out_of_order() -> None:
    pw = PartitionWindows(CFG)
    # b's events arrive out of order: its newest (1900 ms, d2) comes first in the batch;
    # c only has a cache-hit report (no request): no destination known.
    pw.ingest(cols([req(100, "a", "d1"), req(1900, "b", "d2"), req(500, "b", "d1"),
                    req(1200, "a", "d3"), hit(1300, "c", 10, 5, "d1")]))
    _, closed = pw.ingest(cols([req(1000, "b", "d3")]))  # older than b's newest: ignored
    _, closed = pw.ingest(cols([req(4100, "z", "d1")]))
    w = closed[-1]
    assert last_destinations(w) == {"a": "d3", "b": "d2", "c": None}
    assert sorted(w.last_destination_names) == ["d2", "d3"]  # only the names used


def test_a_quiet_key_forgets_its_last_destination_with_its_slot() -> None:
    pw = PartitionWindows(CFG)
    pw.ingest(cols([req(100, "a", "d1")]))
    for t in range(2000, 20_000, 1000):  # a goes quiet; its slot is released and reused
        pw.ingest(cols([req(t, f"k{t}", "d2")]))
    # a comes back with a cache-hit report only: nothing says where it went this time
    _, closed = pw.ingest(cols([hit(20_100, "a", 10, 5, "d9"), req(20_200, "b", "d2")]))
    _, closed = pw.ingest(cols([req(24_000, "z", "d2")]))
    assert pw.released_keys > 0
    assert last_destinations(closed[-1])["a"] is None  # not d1, from before it went quiet
