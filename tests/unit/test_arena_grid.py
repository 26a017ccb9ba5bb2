"""The scenario grid (planner_svc.simulator.sessions: GridCell, grid_cells, grid_sample) and
its per-cell figures (bench/grid_report.py): pure, no servers."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from planner_svc.simulator.sessions import (
    GRID_LOADS,
    GRID_SYSTEM_TOKENS,
    GRID_TENANTS,
    GRID_TURNS,
    GRID_ZIPF,
    SCENARIOS,
    grid_cells,
    grid_sample,
    grid_scenario,
    knee_requests_per_s,
    population,
    sessions,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import grid_report


def test_the_axes_are_the_issues() -> None:
    assert GRID_TENANTS == (30, 300, 3_000)
    assert GRID_SYSTEM_TOKENS == (256, 1_024, 4_096)
    assert GRID_ZIPF == (0.8, 1.0, 1.3)
    assert set(GRID_LOADS) == {"light", "knee"} and GRID_LOADS["light"] < GRID_LOADS["knee"]
    assert len(GRID_TURNS) >= 2


def test_every_combination_once() -> None:
    cells = grid_cells()
    assert len(cells) == 3 * 3 * 3 * len(GRID_TURNS) * len(GRID_LOADS)
    assert len({c.name for c in cells}) == len(cells)


def test_a_cell_is_the_workload_it_names() -> None:
    cell = next(c for c in grid_cells() if c.tenants == 300 and c.system_tokens == 1_024
                and c.zipf_s == 1.0 and c.turns == "long" and c.load == "knee")
    s = cell.scenario()
    assert (s.tenants, s.zipf_s, s.turns) == (300, 1.0, GRID_TURNS["long"])
    lo, hi = s.system_tokens
    assert lo <= 1_024 <= hi and hi - lo <= 1_024
    pop = population(s, 1)
    assert all(lo <= t <= hi for t in pop.system_tokens)
    # conversations at the rate that offers the knee share of the engines' knee
    per_s = s.sessions_per_s * sum(s.turns) / 2
    assert per_s == pytest.approx(GRID_LOADS["knee"] * knee_requests_per_s(s))
    assert grid_scenario(cell.name) == s


def test_loads_scale_with_the_engines_and_the_knee() -> None:
    light = next(c for c in grid_cells() if c.load == "light")
    knee = next(c for c in grid_cells() if c.name == light.name.replace("light", "knee"))
    ratio = knee.scenario().sessions_per_s / light.scenario().sessions_per_s
    assert ratio == pytest.approx(GRID_LOADS["knee"] / GRID_LOADS["light"])
    assert knee.scenario(8).sessions_per_s == pytest.approx(2 * knee.scenario(4).sessions_per_s)
    # longer prompts cost the engines more per request: a lower knee
    by_prompt = [knee_requests_per_s(c.scenario()) for c in grid_cells()
                 if c.tenants == 30 and c.zipf_s == 1.0 and c.turns == "long"
                 and c.load == "knee"]
    assert by_prompt == sorted(by_prompt, reverse=True)
    # paper-like is the knee's reference: its own knee is the measured one
    assert knee_requests_per_s(SCENARIOS["paper-like"]) == pytest.approx(48.0)


def test_the_sample_is_fixed_balanced_and_distinct() -> None:
    sample = grid_sample()
    assert sample == grid_sample()  # seeded: the same cells every run
    assert len(sample) >= 12 and len(set(sample)) == len(sample)
    assert set(sample) <= set(grid_cells())
    for axis, values in (("tenants", GRID_TENANTS), ("system_tokens", GRID_SYSTEM_TOKENS),
                         ("zipf_s", GRID_ZIPF), ("turns", tuple(GRID_TURNS)),
                         ("load", tuple(GRID_LOADS))):
        counts = Counter(getattr(c, axis) for c in sample)
        assert set(counts) == set(values), axis  # every value of every axis appears
        assert max(counts.values()) - min(counts.values()) <= 1, (axis, counts)
    assert grid_sample(seed=7) != sample


def test_a_cells_sessions_are_seeded() -> None:
    s = grid_sample()[0].scenario().offered(1.0, 2.0)
    a, b = sessions(population(s, 1), 20.0), sessions(population(s, 1), 20.0)
    assert a == b and a
    assert all(s.turns[0] <= len(x.turns) <= s.turns[1] for x in a)


def _row(cell: str, router: str, replicas: int, hit: float, p99: float) -> dict[str, object]:
    return {"scenario": cell, "router": router, "replicas": replicas, "hit": hit,
            "ttft_p99_s": p99}


def test_deltas_against_the_best_peer_by_hit() -> None:
    rows = [_row("a", "cacheroute", 1, 0.80, 0.20), _row("a", "smg cache_aware", 1, 0.85, 0.30),
            _row("a", "vllm cache_aware", 1, 0.82, 0.10),
            _row("a", "cacheroute no-queue-aware", 1, 0.95, 0.1),  # a variant, not a peer
            _row("a", "cacheroute", 4, 0.80, 0.20), _row("a", "smg cache_aware", 4, 0.60, 0.40),
            _row("b", "cacheroute", 1, 0.90, 0.33), _row("b", "smg cache_aware", 1, 0.895, 0.30)]
    deltas = grid_report.cell_deltas(rows)
    one = {d.cell: d for d in deltas if d.replicas == 1}
    assert one["a"].peer == "smg cache_aware"
    assert one["a"].hit_delta_pp == pytest.approx(-5.0)
    assert one["a"].p99_ratio == pytest.approx(0.2 / 0.3)
    s = grid_report.grid_summary(deltas)
    assert s["cells"] == 2 and s["cells_within_1pp_1r"] == 1 and s["cells_ahead_4r"] == 1
    assert s["worst_cell_hit_delta_1r_pp"] == pytest.approx(-5.0)
    assert s["worst_cell_1r"] == "a"
    assert s["worst_cell_p99_ratio_1r"] == pytest.approx(1.1)


def test_gateways_join_then_the_first_ones_leave() -> None:
    from tests.bench_module import load_bench

    arena = load_bench("arena")
    m = arena.Membership(4, 20.0, 30.0)
    assert list(m.active(0.0, 8)) == [0, 1, 2, 3]
    assert list(m.active(20.0, 8)) == list(range(8))
    assert list(m.active(30.0, 8)) == [4, 5, 6, 7]

    class Clock:  # a driver whose run began 25 s ago: every gateway is in
        started_at = arena.time.monotonic() - 25.0

    picks = [next(arena._Rotation(m, 8, Clock()).__iter__()) for _ in range(3)]
    assert all(0 <= p < 8 for p in picks)
    rotation = arena._Rotation(m, 8, Clock())
    assert sorted(next(rotation) for _ in range(8)) == list(range(8))  # round robin


def test_the_grid_runs_every_sampled_cell_at_one_four_and_eight_gateways() -> None:
    from tests.bench_module import load_bench

    arena = load_bench("arena")
    assert {n for _, n in arena.GRID_RUNS} == {1, 4, 8}
    assert ("cacheroute", 8) in arena.GRID_RUNS and ("smg cache_aware", 8) in arena.GRID_RUNS
    args = arena.argparse.Namespace(quick=False, grid_cells=0)
    assert arena.grid_cells_for(args) == grid_sample()
    args.quick = True
    assert arena.grid_cells_for(args) == grid_sample()[:arena.GRID_QUICK_CELLS]
