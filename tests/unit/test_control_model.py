"""Traffic projection, drift and penalties of the control loop on tiny hand-made plans."""

from __future__ import annotations

import numpy as np
import pytest

from planner_svc.control.drift import measure_drift, total_variation
from planner_svc.control.penalties import (
    RewarmFactor,
    WarmAdvantage,
    measured_decline_rate,
    measured_staleness_rate,
    modelled_staleness_rate,
    rewarm_formula,
    rewarm_time_s,
    useful_work_rate,
)
from planner_svc.control.telemetry import Telemetry
from planner_svc.control.traffic import (
    Traffic,
    expected_loads,
    imbalance,
    moved_traffic_share,
    new_member_share,
    served_mask,
)
from router_client.plan import DestinationSpec, KeyTable, PlanConfig, PlanStats, RoutingPlan


def make_plan(
    sets: dict[str, tuple[int, ...]],
    rates: dict[str, float],
    *,
    n: int = 4,
    q_cap: float = 100.0,
    cold: float = 0.0,
    ids: list[str] | None = None,
) -> RoutingPlan:
    keys = list(sets)
    table = KeyTable.from_sets(keys, [sets[k] for k in keys], [rates[k] for k in keys])
    names = ids or [f"d{i}" for i in range(n)]
    return RoutingPlan(
        config=PlanConfig(q_cap=q_cap, warm_slots_per_destination=2, warm_slots=2 * len(names)),
        destinations=tuple(DestinationSpec(d) for d in names),
        table=table,
        stats=PlanStats(cold_tail_rate_per_s=cold),
    )


def traffic(rates: dict[str, float], tokens: float = 1000.0) -> Traffic:
    keys = list(rates)
    return Traffic(keys, np.array([rates[k] for k in keys]), np.full(len(keys), tokens))


def test_expected_loads_split_replicas_and_spread_the_cold_tail() -> None:
    plan = make_plan({"a": (0, 1), "b": (2,)}, {"a": 10.0, "b": 4.0})
    now = traffic({"a": 20.0, "b": 4.0, "c": 8.0})  # c is not admitted: cold tail
    loads = expected_loads(plan, now)
    assert loads == pytest.approx([10 + 2, 10 + 2, 4 + 2, 0 + 2])
    assert imbalance(plan, loads) == pytest.approx(12 / 8)


def test_new_member_share_matches_destinations_by_id_not_position() -> None:
    before = make_plan({"a": (0, 1), "b": (2,)}, {"a": 1, "b": 1}, ids=["x", "y", "z", "w"])
    # The same destinations listed in another order: a's set {x, y} is unchanged.
    after = make_plan(
        {"a": (1, 3), "b": (2,), "c": (0,)}, {"a": 1, "b": 1, "c": 1}, ids=["w", "y", "z", "x"]
    )
    assert new_member_share(before, after).tolist() == [0.0, 0.0, 1.0]
    # Same positions, other ids: a's set becomes {w, y}, so half of it is new.
    moved = make_plan({"a": (0, 1), "b": (2,)}, {"a": 1, "b": 1}, ids=["w", "y", "z", "x"])
    assert new_member_share(before, moved).tolist() == [0.5, 0.0]


def test_moved_traffic_share_counts_partial_moves_entries_and_exits() -> None:
    before = make_plan({"a": (0, 1), "b": (2,)}, {"a": 10, "b": 10})
    after = make_plan({"a": (0, 3), "c": (2,)}, {"a": 10, "c": 10})
    now = traffic({"a": 10.0, "b": 10.0, "c": 20.0})
    # a: half its traffic (5); b leaves admission (10); c enters (20); of 40 total.
    assert moved_traffic_share(before, after, now) == pytest.approx(35 / 40)
    assert moved_traffic_share(before, before, now) == 0.0


def test_total_variation_bounds() -> None:
    assert total_variation(np.array([1.0, 1.0]), np.array([2.0, 2.0])) == 0.0
    assert total_variation(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == 1.0
    assert total_variation(np.array([3.0, 1.0]), np.array([1.0, 1.0])) == pytest.approx(0.25)


def test_drift_reports_shape_change_admission_churn_and_imbalance() -> None:
    installed = make_plan({"a": (0,), "b": (1,)}, {"a": 10, "b": 10}, n=2)
    now = traffic({"a": 30.0, "b": 10.0, "c": 10.0})
    candidate = make_plan({"a": (0,), "c": (1,)}, {"a": 30, "c": 10}, n=2)
    d = measure_drift(installed, now, candidate)
    assert d.total_variation == pytest.approx(0.25)
    assert d.admission_churn_share == pytest.approx(20 / 50)  # b leaves, c enters
    assert d.imbalance_planned == pytest.approx(1.0)
    assert d.imbalance_now == pytest.approx(35 / 25)
    assert d.imbalance_change == pytest.approx(0.4)
    assert measure_drift(installed, traffic({"a": 10.0, "b": 10.0})).total_variation == 0.0


def test_modelled_staleness_is_the_candidates_extra_useful_work() -> None:
    warm = WarmAdvantage(global_value=0.5)
    installed = make_plan({"a": (0,)}, {"a": 10}, n=2)
    candidate = make_plan({"b": (0,)}, {"b": 10}, n=2)
    now = traffic({"a": 1.0, "b": 9.0}, tokens=100.0)
    # Hit work: candidate 9 × 100 × 0.5 = 450, installed 1 × 100 × 0.5 = 50.
    assert modelled_staleness_rate(installed, candidate, now, warm) == pytest.approx(400.0)
    assert modelled_staleness_rate(candidate, installed, now, warm) == 0.0


def test_overload_costs_the_warm_advantage_of_the_excess() -> None:
    warm = WarmAdvantage(global_value=0.5)
    piled = make_plan({"a": (0,), "b": (0,)}, {"a": 5, "b": 5}, n=2, q_cap=6.0)
    spread = make_plan({"a": (0,), "b": (1,)}, {"a": 5, "b": 5}, n=2, q_cap=6.0)
    now = traffic({"a": 5.0, "b": 5.0}, tokens=100.0)
    # Both admit everything (500 tokens/s); piled has 4 req/s above the knee of 6.
    assert useful_work_rate(spread, now, warm) == pytest.approx(500.0)
    assert useful_work_rate(piled, now, warm) == pytest.approx(500.0 - 4 * 100 * 0.5)
    assert modelled_staleness_rate(piled, spread, now, warm) == pytest.approx(200.0)


def test_rewarm_formula_is_one_miss_per_new_member_plus_warmup() -> None:
    warm = WarmAdvantage(global_value=0.5)
    installed = make_plan({"a": (0, 1), "b": (2,)}, {"a": 10, "b": 2})
    candidate = make_plan({"a": (0, 3), "b": (2,), "c": (1,)}, {"a": 10, "b": 2, "c": 1})
    now = traffic({"a": 10.0, "b": 2.0, "c": 1.0}, tokens=100.0)
    # a: half its set is new; τ = 2/10 + 1 s; ½ × 10 × 100 × 0.5 × 1.2 = 300.
    # c: new key; τ = 1/1 + 1 s; 1 × 100 × 0.5 × 2 = 100. b unchanged: 0.
    assert rewarm_formula(installed, candidate, now, warm, warmup_s=1.0) == pytest.approx(400.0)
    assert rewarm_formula(installed, installed, now, warm, warmup_s=1.0) == 0.0
    # Mean τ weighted by moved traffic: (5 × 1.2 + 1 × 2) / 6.
    assert rewarm_time_s(installed, candidate, now, 1.0) == pytest.approx(8 / 6)


def test_measured_decline_from_hit_drop_and_overload_growth() -> None:
    plan = make_plan({"a": (0,)}, {"a": 1}, n=2, q_cap=10.0)
    warm = WarmAdvantage(global_value=0.5)
    base = Telemetry(
        window_end_s=0,
        hit_rate=0.9,
        prompt_tokens_per_s=2000,
        requests=5000,
        destination_loads_per_s={"d0": 8.0, "d1": 8.0},
    )
    now = Telemetry(
        window_end_s=10,
        hit_rate=0.8,
        prompt_tokens_per_s=2000,
        requests=5000,
        destination_loads_per_s={"d0": 12.0, "d1": 4.0},
    )
    # 0.1 × 2000 + 2 req/s over the knee × 100 tokens × 0.5; signed: an improvement is negative.
    assert measured_decline_rate(now, base, plan, 100.0, warm) == pytest.approx(300.0)
    assert measured_decline_rate(base, now, plan, 100.0, warm) == pytest.approx(-300.0)


def test_measured_staleness_swaps_the_modelled_decline_for_the_measured_one() -> None:
    # The model expected the installed plan to lose 100 tokens/s, the stream saw 400.
    assert measured_staleness_rate(500.0, 100.0, 400.0) == pytest.approx(800.0)
    # A model that was too pessimistic is corrected down, never below zero.
    assert measured_staleness_rate(500.0, 400.0, 100.0) == pytest.approx(200.0)
    assert measured_staleness_rate(100.0, 400.0, 0.0) == 0.0


def test_learned_factors_converge_and_start_conservative() -> None:
    factor = RewarmFactor()
    assert factor.value > 1.0  # no history: price rewarm above the formula
    for _ in range(30):
        factor = factor.observe(measured_tokens=700.0, predicted_tokens=1000.0)
    assert factor.value == pytest.approx(0.7, rel=1e-6)
    assert factor.observe(5.0, 0.0) == factor  # nothing predicted: nothing learned
    warm = WarmAdvantage()
    for hit in (0.9, 0.92, 0.88) * 10:
        warm = warm.observe(hit, 0.6)
    assert warm.global_value == pytest.approx(0.3, abs=0.02)
    warm = warm.observe_keys(["a", "b"], np.array([0.95, 0.7]), cold_hit=0.6)
    assert warm.for_keys(["a", "b", "zz"]).tolist() == pytest.approx([0.35, 0.1, warm.global_value])


def test_a_drained_destination_turns_its_keys_cold_and_moves_their_load() -> None:
    warm = WarmAdvantage(global_value=0.5)
    installed = make_plan({"a": (0,), "b": (1,), "c": (0, 1)}, {"a": 4, "b": 4, "c": 2}, n=2)
    now = traffic({"a": 4.0, "b": 4.0, "c": 2.0}, tokens=100.0)
    fleet = (DestinationSpec("d0"), DestinationSpec("d1", draining=True))
    assert served_mask(installed, fleet).tolist() == [True, False, True]
    # b is cold tail now, spread over the only live destination; c keeps its live member.
    assert expected_loads(installed, now, fleet).tolist() == pytest.approx([10.0, 0.0])
    assert useful_work_rate(installed, now, warm, fleet=fleet) == pytest.approx(6 * 100 * 0.5)
    repacked = make_plan({"a": (0,), "b": (0,), "c": (0,)}, {"a": 4, "b": 4, "c": 2}, n=2)
    gap = modelled_staleness_rate(installed, repacked, now, warm, fleet=fleet)
    assert gap == pytest.approx(4 * 100 * 0.5)
    assert modelled_staleness_rate(installed, repacked, now, warm) == 0.0  # blind without it
