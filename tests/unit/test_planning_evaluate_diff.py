"""The load projection (control.traffic, the one the control loop prices with) against the
planner's own stats, diff (what changes between plans), rates."""

from __future__ import annotations

import numpy as np
import pytest

from planner_svc.control.traffic import Traffic, expected_loads, imbalance
from planner_svc.planning import PlanningConfig, build_plan, diff
from planner_svc.simulator.rates import (
    cap_shares,
    gini,
    lognormal_walk,
    paper_like_keys,
    paper_like_rates,
)
from router_client.plan import DestinationSpec


def test_projection_at_the_planning_rates_reproduces_the_plan_stats() -> None:
    keys = paper_like_keys(2_000)
    rates = paper_like_rates(2_000, 60.0, seed=1)
    config = PlanningConfig.uniform(6, q_cap=12.0, warm_slots_per_destination=40)
    plan = build_plan(keys, rates, config)
    loads = expected_loads(plan, Traffic(keys, rates))
    assert loads == pytest.approx(np.array(plan.stats.expected_load_per_s))
    assert imbalance(plan, loads) == pytest.approx(plan.stats.imbalance_max_over_mean)


def test_projection_under_new_rates_sends_new_keys_to_the_fallback() -> None:
    config = PlanningConfig.uniform(3, q_cap=10.0, warm_slots_per_destination=1)
    plan = build_plan(["a", "b", "c", "tail"], np.array([6.0, 5.0, 4.0, 3.0]), config)
    assert plan.table.as_dict() == {"a": (0,), "b": (1,), "c": (2,)}
    # a triples, c disappears from the key list, a new key shows up: it goes to the fallback.
    loads = expected_loads(plan, Traffic(["a", "b", "tail", "new"],
                                         np.array([18.0, 5.0, 3.0, 3.0])))
    assert loads.tolist() == [20.0, 7.0, 2.0]
    assert imbalance(plan, loads) == pytest.approx(20.0 / (29.0 / 3))


def test_projection_sends_keys_of_removed_destinations_to_the_fallback() -> None:
    config = PlanningConfig.uniform(3, q_cap=10.0, warm_slots_per_destination=1)
    plan = build_plan(["a", "b", "c"], np.array([6.0, 5.0, 4.0]), config)
    now = (DestinationSpec("d001"), DestinationSpec("d002", draining=True),
           DestinationSpec("d009"))
    loads = expected_loads(plan, Traffic(["a", "b", "c"], np.array([6.0, 5.0, 4.0])), now)
    assert loads.tolist() == [10.0, 0.0, 5.0]


def test_one_imbalance_definition_with_unequal_weights() -> None:
    """Loads [4, 1] on weights [2, 1]: max(load/w) / (Σ load / Σ w) = 2 / (5/3) = 1.2, from
    the plan's stats and from the control loop's projection alike."""
    specs = (DestinationSpec("a", capacity_weight=2.0), DestinationSpec("b"))
    config = PlanningConfig(specs, 10.0, 1)
    plan = build_plan(["x", "y"], np.array([4.0, 1.0]), config)
    assert plan.stats.imbalance_max_over_mean == pytest.approx(1.2)
    assert imbalance(plan, np.array([4.0, 1.0])) == pytest.approx(1.2)


def test_diff_reports_added_removed_moved_and_traffic_shares() -> None:
    config = PlanningConfig.uniform(3, q_cap=10.0, warm_slots_per_destination=1)
    a = build_plan(["x", "y", "z", "w"], np.array([6.0, 5.0, 4.0, 1.0]), config)
    b = build_plan(["x", "y", "z", "w"], np.array([4.0, 5.0, 1.0, 6.0]), config)
    assert a.table.as_dict() == {"x": (0,), "y": (1,), "z": (2,)}
    assert b.table.as_dict() == {"w": (0,), "y": (1,), "x": (2,)}
    d = diff(a, b)
    assert d.added == ("w",) and d.removed == ("z",) and d.moved == ("x",)
    assert d.kept_keys == 2 and d.moved_key_fraction == 0.5
    assert d.moved_traffic_share == pytest.approx(4.0 / 15.0)
    assert d.added_traffic_share == pytest.approx(6.0 / 15.0)
    assert d.removed_traffic_share == pytest.approx(4.0 / 15.0)
    assert d.rewarm_traffic_per_s == pytest.approx(4.0)
    assert set(d.load_change_per_s) == {"d000", "d001", "d002"}
    assert sum(d.load_change_per_s.values()) == pytest.approx(0.0)
    same = diff(a, a, rates_by_key={"x": 100.0})
    assert same.moved == () and same.moved_traffic_share == 0.0


def test_diff_compares_sets_by_destination_id_not_index() -> None:
    c1 = PlanningConfig((DestinationSpec("a"), DestinationSpec("b")), 10.0, 1)
    c2 = PlanningConfig((DestinationSpec("b"), DestinationSpec("a")), 10.0, 1)
    p1 = build_plan(["k", "j"], np.array([2.0, 1.0]), c1)  # k -> a, j -> b
    p2 = build_plan(["k", "j"], np.array([1.0, 2.0]), c2)  # j -> b (index 0), k -> a
    assert diff(p1, p2).moved == ()


def test_paper_like_rates_match_the_paper_workload_shape() -> None:
    n = 128_824
    rates = paper_like_rates(n, 176.0, seed=0)
    assert rates.sum() == pytest.approx(176.0)
    assert gini(rates) == pytest.approx(0.756, abs=0.005)
    assert rates.max() / rates.sum() <= 0.003 + 1e-12
    top = np.sort(rates)[::-1][: int(0.04 * n)].sum() / rates.sum()
    assert 0.42 <= top <= 0.50  # "~4 % of keys carry 47 % of requests"
    assert np.array_equal(rates, paper_like_rates(n, 176.0, seed=0))


def test_rate_helpers() -> None:
    assert gini(np.ones(10)) == pytest.approx(0.0)
    assert gini(np.array([0.0, 0.0, 0.0, 1.0])) == pytest.approx(0.75)
    shares = cap_shares(np.array([100.0, 1.0, 1.0, 1.0, 1.0]), 0.3)
    assert shares.max() == pytest.approx(0.3) and shares.sum() == pytest.approx(1.0)
    assert cap_shares(np.array([5.0, 1.0]), 0.1).tolist() == [0.5, 0.5]  # infeasible cap
    rng = np.random.default_rng(0)
    walked = lognormal_walk(np.full(200_000, 2.0), 0.3, rng)
    assert walked.mean() == pytest.approx(2.0, rel=0.01) and walked.std() > 0.4
    keys = paper_like_keys(1_000)
    assert len(set(keys)) == 1_000 and keys[0] == "tenant-00000000"
