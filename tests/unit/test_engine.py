"""The shared engine model: LRU prefix cache in tokens, batching, prefill/decode costs, fit."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from planner_svc.simulator.engine import Engine, EngineModel, PrefixCache


def test_cache_hit_is_limited_by_reusable_prefix_and_grows_per_turn() -> None:
    cache = PrefixCache(10_000)
    assert cache.lookup_and_insert("a", 0, 1_000) == 0
    assert cache.lookup_and_insert("a", 1_000, 1_500) == 1_000  # turn 2 reuses turn 1
    assert cache.lookup_and_insert("a", 1_200, 2_000) == 1_200  # only the shared prefix counts
    assert cache.peek("a") == 2_000


def test_cache_evicts_least_recently_used_keys_until_it_fits() -> None:
    cache = PrefixCache(3_000)
    for key in ("a", "b", "c"):
        cache.lookup_and_insert(key, 0, 1_000)
    cache.lookup_and_insert("a", 1_000, 1_000)  # refresh a: b is now the LRU key
    cache.lookup_and_insert("d", 0, 1_500)  # 4,500 tokens: evict b, then c
    assert cache.keys_lru_first() == ["a", "d"]
    assert cache.used_tokens == 2_500
    assert "b" not in cache
    assert cache.lookup_and_insert("b", 1_000, 1_000) == 0


def test_cache_never_exceeds_capacity_and_truncates_oversized_prompts() -> None:
    cache = PrefixCache(1_000)
    rng = np.random.default_rng(1)
    for _ in range(500):
        cache.lookup_and_insert(int(rng.integers(50)), 100, int(rng.integers(1, 3_000)))
        assert cache.used_tokens <= 1_000
        assert cache.used_tokens == sum(cache.peek(k) for k in cache.keys_lru_first())


def test_unloaded_latency_is_prefill_of_uncached_tokens_plus_decode() -> None:
    m = EngineModel(prefill_overhead_s=0.01, prefill_s_per_token=1e-4, decode_s_per_token=0.02)
    eng = Engine(m)
    cached, finish = eng.submit("k", 2_000, 0, 10, now=5.0)
    assert cached == 0
    assert finish == pytest.approx(5.0 + 0.01 + 0.2 + 10 * 0.02)
    cached, finish = eng.submit("k", 2_500, 2_000, 10, now=100.0)
    assert cached == 2_000
    assert finish == pytest.approx(100.0 + 0.01 + 0.05 + 10 * 0.02)


def test_prefill_is_serialised_so_a_burst_queues() -> None:
    m = EngineModel(prefill_overhead_s=0.0, prefill_s_per_token=1e-3, decode_s_per_token=0.0)
    eng = Engine(m)
    finishes = [eng.submit(i, 1_000, 0, 0, now=0.0)[1] for i in range(3)]
    assert finishes == pytest.approx([1.0, 2.0, 3.0])
    assert eng.in_flight(0.5) == 3
    assert eng.in_flight(2.5) == 1


def test_full_batch_waits_for_the_earliest_slot() -> None:
    m = EngineModel(
        prefill_overhead_s=0.0,
        prefill_s_per_token=0.0,
        decode_s_per_token=1.0,
        decode_slowdown_per_running=0.0,
        batch_limit=2,
    )
    eng = Engine(m)
    assert eng.admit("a", 10, 0, 5, 0.0).finish_time == pytest.approx(5.0)
    assert eng.admit("b", 10, 0, 3, 0.0).finish_time == pytest.approx(3.0)
    third = eng.admit("c", 10, 0, 1, 1.0)
    assert third.start_time == pytest.approx(3.0)
    assert third.finish_time == pytest.approx(4.0)


def test_decode_slows_with_the_batch() -> None:
    m = EngineModel(
        prefill_overhead_s=0.0,
        prefill_s_per_token=0.0,
        decode_s_per_token=0.1,
        decode_slowdown_per_running=0.5,
    )
    eng = Engine(m)
    assert eng.admit("a", 1, 0, 10, 0.0).finish_time == pytest.approx(1.0)
    assert eng.admit("b", 1, 0, 10, 0.0).finish_time == pytest.approx(1.5)


def test_time_never_runs_backwards() -> None:
    eng = Engine(
        EngineModel(decode_s_per_token=0.0, prefill_overhead_s=0.0, prefill_s_per_token=0.0)
    )
    eng.submit("a", 1, 0, 0, now=10.0)
    assert eng.admit("b", 1, 0, 0, now=3.0).start_time == 10.0


def test_fit_recovers_the_constants() -> None:
    truth = EngineModel(
        prefill_overhead_s=0.03,
        prefill_s_per_token=2e-4,
        decode_s_per_token=0.025,
        decode_slowdown_per_running=0.02,
    )
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(200):
        u, out, b = int(rng.integers(0, 8_000)), int(rng.integers(1, 200)), int(rng.integers(1, 32))
        rows.append((u, out, b, truth.service_seconds(u, out, b)))
    got = EngineModel.fit(rows)
    assert got.prefill_overhead_s == pytest.approx(0.03, rel=1e-6)
    assert got.prefill_s_per_token == pytest.approx(2e-4, rel=1e-6)
    assert got.decode_s_per_token == pytest.approx(0.025, rel=1e-6)
    assert got.decode_slowdown_per_running == pytest.approx(0.02, rel=1e-6)
    with pytest.raises(ValueError):
        EngineModel.fit([(1, 1, 1, 1.0)])


def test_running_requests_pin_kv_and_shrink_the_prefix_cache() -> None:
    m = EngineModel(
        cache_capacity_tokens=3_000,
        prefill_overhead_s=0.0,
        prefill_s_per_token=0.0,
        decode_s_per_token=1.0,
        decode_slowdown_per_running=0.0,
    )
    eng = Engine(m)
    eng.submit("a", 1_000, 0, 10, now=0.0)  # runs until t=10, pins 1,010 tokens
    eng.submit("b", 1_000, 0, 1, now=0.5)  # runs until 1.5
    eng.submit("c", 1_000, 0, 1, now=0.6)  # room left beside a and b: LRU key a is evicted
    assert "a" not in eng.cache
    assert eng.in_flight(0.7) == 3 and eng.in_flight(11.0) == 0
    unpinned = Engine(replace(m, running_requests_pin_kv=False))
    for key, t in (("a", 0.0), ("b", 0.5), ("c", 0.6)):
        unpinned.submit(key, 1_000, 0, 10, now=t)
    assert "a" in unpinned.cache
