"""build_plan: Algorithm 1 exactly (against a slow reference), invariants, determinism, options."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_planning_reference import reference_admission, reference_lpt

from planner_svc.planning import PlanningConfig, PlanningError, build_plan
from planner_svc.planning.admission import admit, admit_by_tokens
from router_client.plan import DestinationSpec, decode_plan, encode_plan

# Rates drawn from a small grid so that ties (rate and load) are common.
rate_values = st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, 3.0, 3.5, 7.0, 12.0, 40.0])


@st.composite
def plan_inputs(draw: st.DrawFn) -> tuple[list[str], np.ndarray, PlanningConfig]:
    n_dest = draw(st.integers(1, 7))
    dests = tuple(
        DestinationSpec(
            f"d{i}",
            capacity_weight=draw(st.sampled_from([1.0, 1.0, 0.5, 2.0])),
            draining=draw(st.booleans()) if i else False,
        )
        for i in range(n_dest)
    )
    rates = np.array(draw(st.lists(rate_values, max_size=60)), np.float64)
    rates = rates * draw(st.sampled_from([1.0, 0.37, 1e-3]))
    config = PlanningConfig(
        dests,
        q_cap=draw(st.sampled_from([1.0, 2.5, 10.0, 1e3])),
        warm_slots_per_destination=draw(st.integers(0, 6)),
        warm_slots=draw(st.none() | st.integers(0, 40)),
    )
    return [f"k{i}" for i in range(len(rates))], rates, config


@settings(max_examples=300, deadline=None)
@given(plan_inputs())
def test_build_is_algorithm_1_exactly(inputs: tuple[list[str], np.ndarray, PlanningConfig]) -> None:
    keys, rates, config = inputs
    plan = build_plan(keys, rates, config)
    admitted = reference_admission(rates, config)
    sets, loads = reference_lpt(rates, config, admitted)
    assert list(plan.table.keys) == [keys[i] for i, _ in admitted]  # top-rate with skip
    got = plan.table.as_dict()
    assert [list(got[keys[i]]) for i, _ in admitted] == sets  # each step: least-loaded dests
    assert list(plan.stats.expected_load_per_s) == loads


@settings(max_examples=200, deadline=None)
@given(plan_inputs())
def test_build_invariants_and_determinism(
    inputs: tuple[list[str], np.ndarray, PlanningConfig],
) -> None:
    keys, rates, config = inputs
    plan = build_plan(keys, rates, config)
    k = plan.table.replicas()
    assert int(k.sum()) <= config.slots == plan.config.warm_slots
    for members in plan.table.as_dict().values():
        assert len(set(members)) == len(members)
        assert not any(config.destinations[m].draining for m in members)
    payload = encode_plan(plan)
    assert payload == encode_plan(build_plan(list(keys), rates.copy(), config))
    decoded = decode_plan(payload)  # the router-side checks accept it
    assert decoded.table.as_dict() == plan.table.as_dict()
    assert plan.config.built_by == "build" and (plan.version.epoch, plan.version.seq) == (0, 0)
    total = float(rates.sum())
    assert sum(plan.stats.expected_load_per_s) == pytest.approx(total, rel=1e-9, abs=1e-9)


def test_multi_replica_keys_spread_their_rate_over_distinct_destinations() -> None:
    config = PlanningConfig.uniform(4, q_cap=10.0, warm_slots_per_destination=2)
    plan = build_plan(["hot", "warm", "a", "b"], np.array([25.0, 11.0, 4.0, 3.0]), config)
    sets = plan.table.as_dict()
    assert len(sets["hot"]) == 3 and len(sets["warm"]) == 2  # ceil(25/10), ceil(11/10)
    assert plan.stats.used_slots == 7 and plan.stats.admitted_keys == 4
    loads = np.array(plan.stats.expected_load_per_s)
    assert loads.sum() == pytest.approx(43.0)
    assert plan.stats.imbalance_max_over_mean == pytest.approx(loads.max() / loads.mean())


def test_key_that_does_not_fit_is_skipped_and_a_smaller_later_key_admitted() -> None:
    config = PlanningConfig.uniform(4, q_cap=10.0, warm_slots_per_destination=1)  # C = 4
    rates = np.array([35.0, 25.0, 5.0, 4.0])  # k = 4, 3, 1, 1
    plan = build_plan(["a", "b", "c", "d"], rates, config)
    assert list(plan.table.keys) == ["a"]  # a fills all 4 slots; b, c, d skipped
    config = PlanningConfig.uniform(4, q_cap=10.0, warm_slots_per_destination=1, warm_slots=5)
    plan = build_plan(["a", "b", "c", "d"], rates, config)
    assert list(plan.table.keys) == ["a", "c"]  # b (k=3) skipped, c fits the last slot
    assert plan.stats.cold_tail_rate_per_s == pytest.approx(29.0)
    assert plan.stats.admitted_rate_share == pytest.approx(40.0 / 69.0)


def test_cold_tail_is_spread_by_capacity_and_loads_compared_relative_to_it() -> None:
    dests = (DestinationSpec("big", capacity_weight=3.0), DestinationSpec("small"))
    config = PlanningConfig(dests, q_cap=100.0, warm_slots_per_destination=0, warm_slots=2)
    keys = ["x", "y", *(f"t{i}" for i in range(8))]
    plan = build_plan(keys, np.array([3.0, 2.0, *([1.0] * 8)]), config)
    # tail 8 splits 6 / 2 (relative 2 / 2); x (3) goes to big (tie -> lower index): relative 3;
    # y then goes to small (relative 2 < 3): 4.
    assert plan.table.as_dict() == {"x": (0,), "y": (1,)}
    assert plan.stats.expected_load_per_s == (9.0, 4.0)
    assert plan.stats.imbalance_max_over_mean == pytest.approx(4.0 / (13.0 / 4.0))


def test_draining_destination_gets_neither_keys_nor_fallback_traffic() -> None:
    dests = (DestinationSpec("a"), DestinationSpec("b", draining=True), DestinationSpec("c"))
    config = PlanningConfig(dests, q_cap=1.0, warm_slots_per_destination=2)
    assert config.slots == 4
    plan = build_plan([f"k{i}" for i in range(6)], np.arange(1.0, 7.0) / 10, config)
    assert all(1 not in s for s in plan.table.as_dict().values())
    assert plan.stats.expected_load_per_s[1] == 0.0


def test_large_input_matches_the_reference_admission() -> None:
    rng = np.random.default_rng(3)
    rates = np.round(rng.lognormal(0.0, 1.6, 20_000), 2)  # rounding forces many ties
    config = PlanningConfig.uniform(30, q_cap=20.0, warm_slots_per_destination=16)
    plan = build_plan([str(i) for i in range(len(rates))], rates, config)
    assert [int(k) for k in plan.table.keys] == [i for i, _ in reference_admission(rates, config)]


def test_clock_fills_build_seconds_only_when_given() -> None:
    config = PlanningConfig.uniform(2, 1.0, 1)
    ticks = iter([10.0, 10.25])
    plan = build_plan(["a"], np.array([1.0]), config, clock=lambda: next(ticks))
    assert plan.stats.build_seconds == 0.25
    assert build_plan(["a"], np.array([1.0]), config).stats.build_seconds == 0.0


def test_byte_aware_admission_fills_a_token_budget_by_density() -> None:
    config = PlanningConfig.uniform(
        4, q_cap=10.0, warm_slots_per_destination=1, byte_aware=True, token_budget=5_000
    )
    keys = ["hot-big", "hot-small", "mid", "cold", "empty"]
    rates = np.array([8.0, 6.0, 5.0, 1.0, 9.0])
    tokens = np.array([4_000.0, 500.0, 2_000.0, 400.0, 0.0])
    plan = build_plan(keys, rates, config, prefix_tokens=tokens)
    # density λ/k: empty has no tokens (never admitted); hot-big 4000 + hot-small 500 fit, mid
    # (2000) does not, cold (400) does: 4900 tokens.
    assert set(plan.table.keys) == {"hot-big", "hot-small", "cold"}
    assert list(plan.table.keys) == ["hot-big", "hot-small", "cold"]  # placed by λ desc
    assert plan.config.byte_aware


@settings(max_examples=150, deadline=None)
@given(plan_inputs(), st.lists(st.sampled_from([0.0, 100.0, 250.0, 1000.0]), min_size=60))
def test_byte_aware_matches_a_reference_knapsack_walk(
    inputs: tuple[list[str], np.ndarray, PlanningConfig], sizes: list[float]
) -> None:
    keys, rates, config = inputs
    tokens = np.array(sizes[: len(keys)])
    budget = float(np.mean(tokens[rates > 0])) * config.slots if (rates > 0).any() else 0.0
    got = admit_by_tokens(rates, config, tokens)
    q_ref = config.reference_capacity
    cand = [i for i in range(len(keys)) if rates[i] > 0 and tokens[i] > 0]
    k = {i: int(min(config.n_active, max(1, np.ceil(rates[i] / q_ref)))) for i in cand}
    cand.sort(key=lambda i: (-rates[i] / k[i], -rates[i] * tokens[i], i))
    left, chosen = budget, []
    for i in cand:
        if k[i] * tokens[i] <= left:
            chosen.append(i)
            left -= k[i] * tokens[i]
    assert sorted(got.index.tolist()) == sorted(chosen)
    assert got.used_tokens <= budget + 1e-6


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"q_cap": 0.0}, "q_cap"),
        ({"q_cap": float("nan")}, "q_cap"),
        ({"warm_slots_per_destination": -1}, "warm_slots_per_destination"),
        ({"warm_slots": 2.5}, "warm_slots"),
        ({"imbalance_tolerance": -0.1}, "imbalance_tolerance"),
        ({"balance_effort": 1.5}, "balance_effort"),
        ({"token_budget": 0}, "token_budget"),
    ],
)
def test_config_rejects_bad_values_with_a_clear_message(kwargs: dict, message: str) -> None:
    base = {"destinations": (DestinationSpec("a"),), "q_cap": 1.0, "warm_slots_per_destination": 1}
    with pytest.raises(PlanningError, match=message):
        PlanningConfig(**{**base, **kwargs})


def test_config_rejects_bad_destination_lists() -> None:
    with pytest.raises(PlanningError, match="at least one"):
        PlanningConfig((), 1.0, 1)
    with pytest.raises(PlanningError, match="unique"):
        PlanningConfig((DestinationSpec("a"), DestinationSpec("a")), 1.0, 1)
    with pytest.raises(PlanningError, match="capacity_weight"):
        PlanningConfig((DestinationSpec("a", capacity_weight=0.0),), 1.0, 1)
    with pytest.raises(PlanningError, match="draining"):
        PlanningConfig((DestinationSpec("a", draining=True),), 1.0, 1)


def test_bad_rates_are_refused() -> None:
    config = PlanningConfig.uniform(2, 1.0, 1)
    with pytest.raises(PlanningError, match="one rate per key"):
        build_plan(["a", "b"], np.array([1.0]), config)
    with pytest.raises(PlanningError, match="finite"):
        build_plan(["a"], np.array([-1.0]), config)
    with pytest.raises(PlanningError, match="prefix size"):
        byte_cfg = PlanningConfig.uniform(2, 1.0, 1, byte_aware=True)
        build_plan(["a"], np.array([1.0]), byte_cfg, prefix_tokens=np.array([1.0, 2.0]))


def test_batched_lpt_equals_the_sequential_walk_on_a_large_skewed_input() -> None:
    rng = np.random.default_rng(11)
    rates = rng.lognormal(0.0, 1.7, 6_000)
    dests = tuple(
        DestinationSpec(f"d{i}", capacity_weight=float(w))
        for i, w in enumerate(rng.choice([0.5, 1.0, 1.5, 4.0], 13))
    )
    config = PlanningConfig(dests, q_cap=8.0, warm_slots_per_destination=90)
    plan = build_plan([str(i) for i in range(len(rates))], rates, config)
    admitted = reference_admission(rates, config)
    sets, loads = reference_lpt(rates, config, admitted)
    got = plan.table.as_dict()
    assert [list(got[str(i)]) for i, _ in admitted] == sets
    assert list(plan.stats.expected_load_per_s) == loads
    assert int(plan.table.replicas().max()) > 1


def test_duplicate_admitted_keys_are_refused() -> None:
    with pytest.raises(PlanningError, match="unique"):
        build_plan(["a", "a"], np.array([1.0, 2.0]), PlanningConfig.uniform(2, 5.0, 2))


def test_public_api_is_exactly_what_all_lists() -> None:
    import planner_svc.planning as planning

    public = {n for n in dir(planning) if not n.startswith("_")}
    modules = {"admission", "affinity", "build", "config", "diff", "errors", "explain", "placement",
               "repack", "stats"}
    assert set(planning.__all__) <= public and public - set(planning.__all__) <= modules
    assert {"PlanningConfig", "PlanningError", "build_plan", "repack",
            "diff", "PlanDiff"} <= set(planning.__all__)


@settings(max_examples=200, deadline=None)
@given(plan_inputs(), st.lists(st.booleans(), min_size=60), st.sampled_from([0.1, 0.5, 3.0]))
def test_hysteresis_admission_walks_by_boosted_rank(
    inputs: tuple[list[str], np.ndarray, PlanningConfig], flags: list[bool], h: float
) -> None:
    _, rates, config = inputs
    config = replace(config, admission_hysteresis=h)
    incumbent = np.array(flags[: len(rates)], dtype=bool)
    got = admit(rates, config, incumbent=incumbent)
    rank = np.where(incumbent, rates * (1 + h), rates)
    expected = reference_admission(rates, config, rank)
    assert list(zip(got.index.tolist(), got.replicas.tolist(), strict=True)) == expected
