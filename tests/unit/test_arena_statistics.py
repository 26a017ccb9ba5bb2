"""The arena's capacity statistics (bench/arena.py): the p99 interval and the median of
sweeps over seeds."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from tests.bench_module import load_bench

arena = load_bench("arena")


def samples(n: int, per_conversation: int, seed: int = 1) -> list[tuple[int, float]]:
    """Turns of a conversation share its slowness (one cache, one destination)."""
    r = random.Random(seed)
    out = []
    for sid in range(n // per_conversation):
        slow = r.expovariate(1.0)
        out += [(sid, slow + 0.1 * r.random()) for _ in range(per_conversation)]
    return out


def test_the_p99_interval_holds_the_sample_p99_and_narrows_with_more_requests() -> None:
    few, many = samples(500, 1), samples(20_000, 1)
    for s in (few, many):
        lo, hi = arena.p99_interval(s)
        assert lo <= np.percentile([v for _, v in s], 99) <= hi
    assert np.subtract(*arena.p99_interval(many)[::-1]) < np.subtract(
        *arena.p99_interval(few)[::-1])


def test_too_few_samples_give_no_interval() -> None:
    assert all(np.isnan(arena.p99_interval([(1, 0.5)])))


def sweep(first_load: float) -> list[dict]:
    return [{"sessions_per_s": first_load}]


@pytest.mark.parametrize(("values", "middle"), [
    ([2.5, 3.0, 2.8], 2),          # plain values: the middle one
    ([0.0, 3.0, 2.8], 2),          # a sweep that missed at its first point ranks lowest
    ([0.0, 0.0, 2.8], 0),          # two of them: the middle is a bound
    ([3.0, 2.0], 1),               # an even count: the lower middle
])
def test_the_middle_seed_ranks_bounds_and_never_averages(values: list[float],
                                                         middle: int) -> None:
    sweeps = [sweep(2.25) for _ in values]
    picked = arena._middle_seed(values, sweeps)
    if middle == 0:
        assert values[picked] == 0.0
    else:
        assert values[picked] == values[middle]


def point(p99: float, load: float = 3.0) -> dict:
    return {"ttft_p99_s": p99, "errors": 0, "sessions_per_s": load}


def test_a_capacity_says_whether_it_is_a_bound() -> None:
    assert arena._bound_sign(3.75, [point(1.0), point(1.2, 3.75)], 2.0) == (3.75, 1)
    assert arena._bound_sign(0.0, [point(2.5, 2.25)], 2.0) == (2.25, -1)
    assert arena._bound_sign(2.9, [point(1.0), point(2.5, 3.75)], 2.0) == (2.9, 0)


def test_two_sweeps_that_never_missed_leave_the_ratio_undetermined(tmp_path) -> None:
    def row(router: str, seed: int, scale: float, p99: float) -> dict:
        return {"scenario": "paper-like", "seed": seed, "router": router, "replicas": 1,
                "rate_scale": scale, "requests": 400, "errors": 0, "hit": 0.9,
                "ttft_p50_s": 0.2, "ttft_p99_s": p99, "ttft_p99_lo_s": p99,
                "ttft_p99_hi_s": p99, "e2e_p99_s": 3.0, "imbalance": 1.1, "cpu_s": 1.0,
                "control_cpu_s": 1.0, "router_rss_mb": 80.0, "label": router,
                "sessions_per_s": 0.625 * scale}
    setup = type("Setup", (), {"slo_ttft_s": 2.0, "engine_kind": "emulator", "engines": 4,
                               "time_scale": 4.0, "kv_tokens": 60_000, "warmup_s": 72.0,
                               "measure_s": 40.0})()
    peer = "sglang cache_aware"
    rows = [row(r, 2, x, 1.5) for r in ("cacheroute", peer) for x in (4.0, 5.0)]
    cap = {"paper-like/cacheroute": 3.125, f"paper-like/{peer}": 3.125}
    per_seed = {k: [v] for k, v in cap.items()}
    out = arena.report([], cap, setup, tmp_path, [], 1.0, False, rows, per_seed)
    assert out["capacity_ratio_kind"] == "undetermined"
    assert out["capacity_ratio_vs_best_peer"] is None
    rows[1] = row("cacheroute", 2, 5.0, 2.5)  # ours missed at x5: ours exact, theirs a floor
    cap["paper-like/cacheroute"] = 2.9
    per_seed["paper-like/cacheroute"] = [2.9]
    out = arena.report([], cap, setup, tmp_path, [], 1.0, False, rows, per_seed)
    assert out["capacity_ratio_kind"] == "at_most"
    assert out["capacity_ratio_vs_best_peer"] == round(2.9 / 3.125, 3)


def test_tuned_peers_come_from_the_sweep_file_and_garbage_adds_none(tmp_path) -> None:
    sglang = arena.RouterSpec("sglang cache_aware", "sglang", "cache_aware")
    vllm = arena.RouterSpec("vllm cache_aware", "vllm", "cache_aware")
    path = tmp_path / "peer-settings.json"
    path.write_text(json.dumps({"best": {
        "sglang cache_aware": {"setting": "balance 4 / 1.1",
                               "flags": ["--balance-abs-threshold", "4"]},
        "vllm cache_aware": {"setting": "defaults", "flags": []}}}))
    tuned = arena.tuned_peers(path, [sglang, vllm])
    assert [t.name for t in tuned] == ["sglang cache_aware tuned"]  # defaults won for vLLM
    assert tuned[0].extra == ("--balance-abs-threshold", "4") and tuned[0].policy == "cache_aware"
    assert arena.replicated(tuned[0]) and not arena.replicated(
        arena.RouterSpec("vllm consistent_hash", "vllm", "consistent_hash"))
    for junk in ("not json", json.dumps({"best": {"sglang cache_aware": {"flags": [1, 2]}}}),
                 json.dumps({"best": []}), json.dumps([1])):
        path.write_text(junk)
        assert arena.tuned_peers(path, [sglang, vllm]) == []
    assert arena.tuned_peers(tmp_path / "missing.json", [sglang]) == []


def _swept(setting: str, flags: list[str], p99: float, lo: float, hit: float = 0.9,
           errors: int = 0) -> dict:
    return {"router": "sglang cache_aware", "setting": setting, "flags": flags, "hit": hit,
            "ttft_p99_s": p99, "ttft_p99_lo_s": lo, "errors": errors}


def test_a_setting_beats_the_peer_defaults_only_beyond_their_p99_interval() -> None:
    defaults = _swept("defaults", [], 1.94, 1.37)
    noise = _swept("cache 0.1", ["--cache-threshold", "0.1"], 1.76, 1.36)  # inside: noise
    assert arena.choose_setting([defaults, noise]) is defaults
    clear = _swept("balance 4", ["--balance-abs-threshold", "4"], 1.2, 1.1)
    assert arena.choose_setting([defaults, noise, clear]) is clear
    broken = _swept("balance 1", ["--balance-abs-threshold", "1"], 0.5, 0.4, errors=3)
    assert arena.choose_setting([defaults, broken]) is defaults  # errors never win
    nan = _swept("defaults", [], float("nan"), float("nan"))
    assert arena.choose_setting([nan, noise]) is noise  # nothing measured at the defaults


def test_the_summary_splits_the_hit_rate_by_first_and_later_turns() -> None:
    from planner_svc.devstack.traffic import Record

    def rec(sid: int, turn: int, sent: float, prompt: int, cached: int) -> Record:
        return Record(sid, turn, 0, sent, 0.1, 0.2, prompt, cached, 5, True)

    records = [rec(1, 0, 0.0, 1000, 900),  # warm-up: not measured
               rec(2, 0, 10.0, 100, 50), rec(2, 1, 11.0, 300, 270), rec(3, 2, 12.0, 600, 330)]
    s = arena.summarise(records, 5.0, [1.0, 1.0])
    assert s["hit"] == pytest.approx(650 / 1000)
    assert s["first_turn_hit"] == pytest.approx(0.5)
    assert s["later_turn_hit"] == pytest.approx(600 / 900)
    assert s["later_turn_token_share"] == pytest.approx(0.9)


def test_a_cacheroute_variant_is_never_ranked_as_a_peer() -> None:
    """`cacheroute no-rehome` (an A/B of a default) runs only when named, and the best peer
    is a peer router, however well the variant does."""
    rows = [{"router": r, "scenario": "paper-like", "replicas": 1, "hit": h}
            for r, h in (("cacheroute", 0.90), ("cacheroute no-rehome", 0.95),
                         ("sglang cache_aware", 0.91), ("vllm cache_aware", 0.89))]
    assert arena._best_peer(rows, "paper-like", 1) == "sglang cache_aware"
    assert "cacheroute no-rehome" in arena.OPT_IN
    assert any(r.name == "cacheroute no-rehome" and "--idle-rehome-s" in r.extra
               for r in arena.ROUTERS)


def test_the_arena_names_the_routers_its_capacity_sweep_leaves_out() -> None:
    """A CacheRoute variant is swept only when named; without names the best peer is
    chosen later, so only the variants are known to be left out."""
    names = ["cacheroute", "cacheroute no-rehome", "sglang cache_aware", "vllm cache_aware"]
    assert arena.unswept(names, []) == ["cacheroute no-rehome"]
    assert arena.unswept(names, ["cacheroute no-rehome"]) == [
        "sglang cache_aware", "vllm cache_aware"]
    assert arena.unswept(["cacheroute", "sglang cache_aware"], []) == []


def test_the_engine_side_counts_only_requests_that_arrived_in_the_measured_part() -> None:
    engines = [{"arrived_s": [1.0, 10.0, 11.0], "ttft_s": [9.0, 0.2, 0.4],
                "late_s": [5.0, 0.001, 0.003], "dropped": 0},
               {"arrived_s": [12.0], "ttft_s": [0.6], "late_s": [0.002], "dropped": 0}]
    side = arena.engine_side(engines, since=5.0)
    assert side["engine_ttft_p50_s"] == pytest.approx(0.4)  # the warm-up's 9 s left out
    assert 0.58 < side["engine_ttft_p99_s"] <= 0.6
    assert side["engine_late_p99_s"] < 0.0031
    assert arena.engine_side(engines, since=100.0) == {}
