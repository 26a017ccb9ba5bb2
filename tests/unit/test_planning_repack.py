"""repack: minimal churn, mandatory fixes, rebalancing within tolerance, destination changes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_svc.planning import PlanningConfig, build_plan, diff, repack
from planner_svc.planning.admission import admit
from planner_svc.simulator.rates import lognormal_walk, paper_like_keys, paper_like_rates
from router_client.plan import DestinationSpec, RoutingPlan, decode_plan, encode_plan


def sets_by_id(plan: RoutingPlan) -> dict[str, frozenset[str]]:
    ids = plan.destination_ids
    return {k: frozenset(ids[m] for m in s) for k, s in plan.table.as_dict().items()}


def uniform(n: int, **options: object) -> PlanningConfig:
    return PlanningConfig.uniform(n, 10.0, 6, **options)


@st.composite
def drift_inputs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int, float]:
    n = draw(st.integers(1, 80))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    before = rng.lognormal(0.0, 1.5, n) * draw(st.sampled_from([1.0, 5.0]))
    changed = rng.random(n) < draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))
    after = np.where(changed, lognormal_walk(before, 0.6, rng), before)
    return before, after, draw(st.integers(1, 8)), draw(st.sampled_from([0.0, 0.5, 1.0]))


def check_sound(plan: RoutingPlan, keys: list[str], rates: np.ndarray, config: PlanningConfig):
    decode_plan(encode_plan(plan))  # distinct, non-empty sets, no draining member
    assert int(plan.table.replicas().sum()) <= config.slots
    fresh = build_plan(keys, rates, config)
    assert list(plan.table.keys) == list(fresh.table.keys)  # same top-rate admission
    assert np.array_equal(plan.table.replicas(), fresh.table.replicas())
    assert sum(plan.stats.expected_load_per_s) == pytest.approx(float(rates.sum()))
    assert plan.config.built_by == "repack"


@settings(max_examples=150, deadline=None)
@given(drift_inputs())
def test_repack_keeps_what_still_makes_sense(inputs: tuple) -> None:
    before, after, n_dest, effort = inputs
    keys = [f"k{i}" for i in range(len(before))]
    config = uniform(n_dest, balance_effort=effort)
    old = build_plan(keys, before, config)
    new = repack(old, keys, after, config)
    check_sound(new, keys, after, config)
    assert encode_plan(new) == encode_plan(repack(old, keys, after.copy(), config))
    old_sets, new_sets = sets_by_id(old), sets_by_id(new)
    k_old = dict(zip(old.table.keys, old.table.replicas().tolist(), strict=True))
    k_new = dict(zip(new.table.keys, new.table.replicas().tolist(), strict=True))
    untouched = [
        k for i, k in enumerate(keys)
        if k in old_sets and k in new_sets and before[i] == after[i] and k_old[k] == k_new[k]
    ]
    if effort == 0.0:  # no balance moves: every unchanged key keeps its set
        assert all(old_sets[k] == new_sets[k] for k in untouched)
    else:  # a key that did not change moved only because balance required it
        lazy = repack(old, keys, after, uniform(n_dest, balance_effort=0.0))
        if any(old_sets[k] != new_sets[k] for k in untouched):
            assert new.stats.imbalance_max_over_mean < lazy.stats.imbalance_max_over_mean


@settings(max_examples=100, deadline=None)
@given(drift_inputs(), st.data())
def test_drained_destination_ends_empty_and_only_its_keys_move(inputs: tuple, data) -> None:
    before, _, n_dest, _ = inputs
    n_dest = max(n_dest, 2)
    keys = [f"k{i}" for i in range(len(before))]
    config = uniform(n_dest, balance_effort=0.0, warm_slots=6 * n_dest)
    old = build_plan(keys, before, config)
    drained = data.draw(st.integers(0, n_dest - 1))
    dests = tuple(
        DestinationSpec(d.id, draining=(i == drained)) for i, d in enumerate(config.destinations)
    )
    new_config = PlanningConfig(dests, 10.0, 6, warm_slots=config.slots, balance_effort=0.0)
    new = repack(old, keys, before, new_config)
    check_sound(new, keys, before, new_config)
    gone = config.destinations[drained].id
    old_sets, new_sets = sets_by_id(old), sets_by_id(new)
    assert all(gone not in s for s in new_sets.values())
    for k, s in old_sets.items():
        if gone not in s and k in new_sets:
            assert new_sets[k] == s
        elif k in new_sets:
            assert s - {gone} <= new_sets[k]  # the surviving members stay


def test_destinations_are_matched_by_id_when_they_join_leave_and_reorder() -> None:
    keys = paper_like_keys(400)
    rates = paper_like_rates(400, 50.0, seed=5, max_share=0.01)
    old_cfg = PlanningConfig((*(DestinationSpec(i) for i in "abcde"),), 5.0, 10)
    old = build_plan(keys, rates, old_cfg)
    new_cfg = PlanningConfig(
        (*(DestinationSpec(i) for i in "edcbf"),), 5.0, 10, balance_effort=0.0
    )  # a left, f joined, order reversed
    new = repack(old, keys, rates, new_cfg)
    check_sound(new, keys, rates, new_cfg)
    old_sets, new_sets = sets_by_id(old), sets_by_id(new)
    for k, s in old_sets.items():
        if "a" not in s:
            assert new_sets[k] == s
    assert any("f" in s for s in new_sets.values())  # a's keys went to the least loaded: f
    d = diff(old, new)
    assert set(d.moved) == {k for k, s in old_sets.items() if "a" in s}
    assert d.load_change_per_s["a"] < 0 < d.load_change_per_s["f"]


def test_replica_count_changes_add_and_release_members() -> None:
    config = PlanningConfig.uniform(6, q_cap=10.0, warm_slots_per_destination=4, balance_effort=0)
    keys = ["grow", "shrink", *(f"s{i}" for i in range(8))]
    before = np.array([9.0, 35.0, *([2.0] * 8)])
    after = np.array([25.0, 15.0, *([2.0] * 8)])
    old = build_plan(keys, before, config)
    new = repack(old, keys, after, config)
    check_sound(new, keys, after, config)
    o, n = sets_by_id(old), sets_by_id(new)
    assert len(n["grow"]) == 3 and o["grow"] < n["grow"]
    assert len(n["shrink"]) == 2 and n["shrink"] < o["shrink"]
    assert all(o[k] == n[k] for k in keys[2:])


def test_repack_moves_little_traffic_and_stays_close_to_fresh_balance() -> None:
    n = 20_000
    keys = paper_like_keys(n)
    rates = paper_like_rates(n, 100.0, seed=2)
    config = PlanningConfig.uniform(30, q_cap=100.0 / 30, warm_slots_per_destination=32)
    rng = np.random.default_rng(9)
    installed = build_plan(keys, rates, config)
    for _ in range(3):
        rates = lognormal_walk(rates, 0.3, rng)
        fresh = build_plan(keys, rates, config)
        new = repack(installed, keys, rates, config)
        moved = diff(installed, new).moved_traffic_share
        scratch = diff(installed, fresh).moved_traffic_share
        assert moved <= 0.05 < 0.5 < scratch
        imb = new.stats.imbalance_max_over_mean
        assert imb <= fresh.stats.imbalance_max_over_mean + config.imbalance_tolerance + 1e-9
        installed = new


def test_balance_effort_trades_churn_for_balance() -> None:
    n = 5_000
    keys = paper_like_keys(n)
    rates = paper_like_rates(n, 100.0, seed=4)
    config = PlanningConfig.uniform(10, q_cap=50.0, warm_slots_per_destination=60)
    old = build_plan(keys, rates, config)
    drifted = lognormal_walk(rates, 0.8, np.random.default_rng(1))
    results = []
    for effort in (0.0, 0.5, 1.0):
        cfg = PlanningConfig.uniform(10, 50.0, 60, imbalance_tolerance=0.0, balance_effort=effort)
        new = repack(old, keys, drifted, cfg)
        results.append((diff(old, new).moved_traffic_share, new.stats.imbalance_max_over_mean))
    moved, imb = zip(*results, strict=True)
    assert moved[0] == 0.0 and moved[0] <= moved[1] <= moved[2] and moved[2] > 0
    assert imb[0] >= imb[1] >= imb[2]


def test_repack_of_an_empty_plan_places_everything_like_lpt() -> None:
    keys = paper_like_keys(300)
    rates = paper_like_rates(300, 30.0, seed=8, max_share=0.02)
    config = PlanningConfig.uniform(5, 3.0, 20)
    empty = RoutingPlan(config.plan_config("build"), config.destinations,
                        build_plan([], np.zeros(0), config).table)
    new = repack(empty, keys, rates, config)
    fresh = build_plan(keys, rates, config)
    assert new.table.as_dict() == fresh.table.as_dict()
    assert len(admit(rates, config).index) == len(new.table)


def test_byte_aware_repack_admits_like_a_byte_aware_build() -> None:
    n = 3_000
    keys = paper_like_keys(n)
    rates = paper_like_rates(n, 60.0, seed=6)
    tokens = np.random.default_rng(6).integers(100, 8_000, n).astype(np.float64)
    config = PlanningConfig.uniform(8, 4.0, 30, byte_aware=True)
    old = build_plan(keys, rates, config, prefix_tokens=tokens)
    drifted = lognormal_walk(rates, 0.3, np.random.default_rng(2))
    new = repack(old, keys, drifted, config, prefix_tokens=tokens)
    fresh = build_plan(keys, drifted, config, prefix_tokens=tokens)
    assert list(new.table.keys) == list(fresh.table.keys)
    slot_config = PlanningConfig.uniform(8, 4.0, 30)
    assert set(new.table.keys) != set(build_plan(keys, drifted, slot_config).table.keys)
    kept = set(old.table.keys) & set(new.table.keys)
    assert diff(old, new).moved_key_fraction < 0.2 < diff(old, fresh).moved_key_fraction
    assert kept


def test_admission_hysteresis_keeps_incumbents_near_the_boundary() -> None:
    n = 20_000
    keys = paper_like_keys(n)
    rates = paper_like_rates(n, 100.0, seed=2)
    drifted = lognormal_walk(rates, 0.3, np.random.default_rng(5))
    plain = PlanningConfig.uniform(30, q_cap=100.0 / 30, warm_slots_per_destination=32)
    sticky = PlanningConfig.uniform(30, 100.0 / 30, 32, admission_hysteresis=0.5)
    old = build_plan(keys, rates, plain)
    exact, held = repack(old, keys, drifted, plain), repack(old, keys, drifted, sticky)
    assert diff(old, held).added_traffic_share < 0.5 * diff(old, exact).added_traffic_share
    check = admit(drifted, sticky, incumbent=np.isin(keys, list(old.table.keys)))
    assert list(held.table.keys) == [keys[i] for i in check.index.tolist()]
    assert int(held.table.replicas().sum()) <= sticky.slots


def test_replica_hysteresis_keeps_a_hot_keys_replicas_while_its_rate_hovers() -> None:
    """A key at about one q_cap: without hysteresis each replan's noise adds or drops its
    second replica (rewarming it and moving the keys that make room); with h = 0.2 the
    installed count holds inside [q(k-1)(1-h), qk(1+h)] and changes past it."""
    plain = PlanningConfig.uniform(4, q_cap=10.0, warm_slots_per_destination=4,
                                   balance_effort=0)
    held = PlanningConfig.uniform(4, q_cap=10.0, warm_slots_per_destination=4,
                                  balance_effort=0, replica_hysteresis=0.2)
    keys = ["hot", *(f"s{i}" for i in range(6))]
    one = build_plan(keys, np.array([9.0, *([2.0] * 6)]), plain)
    two = build_plan(keys, np.array([15.0, *([2.0] * 6)]), plain)
    assert len(sets_by_id(one)["hot"]) == 1 and len(sets_by_id(two)["hot"]) == 2
    for rate, config, start, replicas in (
            (11.5, plain, one, 2), (11.5, held, one, 1),   # just over q: grows only without
            (12.5, held, one, 2),                          # past q(1 + h): grows
            (8.5, plain, two, 1), (8.5, held, two, 2),     # just under q: shrinks only without
            (7.5, held, two, 1)):                          # past q(1 - h): shrinks
        rates = np.array([rate, *([2.0] * 6)])
        new = repack(start, keys, rates, config)
        decode_plan(encode_plan(new))  # sound; a fresh build's k need not match with h > 0
        assert int(new.table.replicas().sum()) <= config.slots
        assert sum(new.stats.expected_load_per_s) == pytest.approx(float(rates.sum()))
        assert len(sets_by_id(new)["hot"]) == replicas, (rate, config.replica_hysteresis)
    with pytest.raises(Exception, match="replica_hysteresis"):
        PlanningConfig.uniform(4, q_cap=10.0, warm_slots_per_destination=4,
                               replica_hysteresis=1.0)


def test_a_key_entering_the_plan_goes_where_it_was_last_served_while_balance_allows() -> None:
    """`warm_at`: a new key's cache is warm where its requests went (the cold tail, or its
    conversations' history); LPT would put it on the least-loaded destination instead."""
    config = PlanningConfig.uniform(4, q_cap=10.0, warm_slots_per_destination=8)
    keys = [*(f"s{i}" for i in range(12)), "new"]
    before = np.array([3.0, 3.0, 2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.0])
    old = build_plan(keys, before, config)
    after = before.copy()
    after[-1] = 0.2
    lpt = sets_by_id(repack(old, keys, after, config))["new"]
    assert lpt == {"d002"}  # the least-loaded (4.5, first of two)

    def placed(warm: int, rate: float = 0.2) -> frozenset[str]:
        rates = before.copy()
        rates[-1] = rate
        warm_at = np.full(len(keys), -1)
        warm_at[-1] = warm
        plan = repack(old, keys, rates, config, warm_at=warm_at)
        check_sound(plan, keys, rates, config)
        return sets_by_id(plan)["new"]

    assert placed(3) == {"d003"}  # warm there, and within the balance limit: it stays warm
    assert placed(0) == lpt  # d000 carries 5.0 already: over the limit, placed by LPT
    assert placed(3, rate=0.8) == lpt  # too heavy for d003 (5.3 against a mean of 4.95)
    for unknown in (-1, 4, 99):  # never served, or an index the fleet does not have
        assert placed(unknown) == lpt
    with pytest.raises(ValueError, match="warm_at"):
        repack(old, keys, after, config, warm_at=np.zeros(3, np.int64))


def test_warm_placement_skips_a_draining_destination() -> None:
    config = PlanningConfig.uniform(4, q_cap=10.0, warm_slots_per_destination=8)
    keys = ["a", "b", "c", "new"]
    old = build_plan(keys, np.array([2.0, 2.0, 2.0, 0.0]), config)
    dests = tuple(dataclasses.replace(d, draining=d.id == "d003") for d in config.destinations)
    drained = dataclasses.replace(config, destinations=dests)
    plan = repack(old, keys, np.array([2.0, 2.0, 2.0, 0.5]), drained,
                  warm_at=np.array([-1, -1, -1, 3]))
    assert "d003" not in sets_by_id(plan)["new"]


def test_a_first_plan_keeps_keys_where_the_cold_tail_warmed_them_while_balance_allows() -> None:
    """Before the first plan every key went where the cold tail sent it; `build_plan(warm_at=)`
    keeps each there (its cache is warm) while balance allows, where plain LPT moves most."""
    config = PlanningConfig.uniform(4, q_cap=10.0, warm_slots_per_destination=8)
    keys = [f"k{i}" for i in range(12)]
    rates = np.array([3.0, 3.0, 2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5])
    warm_at = np.array([0, 1, 2, 2, 3, 3, 0, 1, 2, 3, 0, 1])  # as balanced as LPT: all fit
    lpt = build_plan(keys, rates, config)
    warm = build_plan(keys, rates, config, warm_at=warm_at)
    _check_first(warm, lpt, keys, rates)
    ids = [d.id for d in config.destinations]
    kept = sum(sets_by_id(warm)[k] == {ids[w]} for k, w in zip(keys, warm_at, strict=True))
    moved_by_lpt = sum(sets_by_id(lpt)[k] != {ids[w]} for k, w in zip(keys, warm_at, strict=True))
    assert kept == len(keys) and moved_by_lpt >= 6
    limit = lpt.stats.imbalance_max_over_mean + config.imbalance_tolerance + 1e-9
    assert warm.stats.imbalance_max_over_mean <= limit
    # everything warm on one destination: only what balance allows stays there
    crowded = build_plan(keys, rates, config, warm_at=np.zeros(len(keys), np.int64))
    _check_first(crowded, lpt, keys, rates)
    on_first = sum(ids[0] in s for s in sets_by_id(crowded).values())
    assert 1 <= on_first < len(keys)
    assert crowded.stats.imbalance_max_over_mean <= limit
    with pytest.raises(ValueError, match="warm_at"):
        build_plan(keys, rates, config, warm_at=np.zeros(3, np.int64))


def _check_first(plan, lpt, keys, rates) -> None:  # type: ignore[no-untyped-def]
    """A fresh plan like LPT's but for where its keys sit: same admission, every load."""
    assert plan.config.built_by == "build"
    assert list(plan.table.keys) == list(lpt.table.keys)
    assert np.array_equal(plan.table.replicas(), lpt.table.replicas())
    assert sum(plan.stats.expected_load_per_s) == pytest.approx(float(rates.sum()))
