"""Ski rental: hysteresis, dwell, clamp, and the 2-competitive property."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from planner_svc.control.decision import (
    Action,
    Decision,
    DecisionSettings,
    Penalties,
    accumulate,
    ski_rental,
)
from planner_svc.control.drift import Drift


def decide(
    accumulated: float,
    rewarm: float = 100.0,
    since: float = 1e9,
    moved: float = 0.1,
    **knobs: float,
) -> tuple[Action, str, bool]:
    return ski_rental(
        accumulated=accumulated,
        rewarm_cost=rewarm,
        since_install_s=since,
        moved_share=moved,
        settings=DecisionSettings(**knobs),
    )


def test_installs_only_past_the_hysteresis_margin() -> None:
    assert decide(105.0, hysteresis=0.1)[0] is Action.KEEP
    action, reason, _ = decide(110.5, hysteresis=0.1)
    assert action is Action.INSTALL
    assert "rewarm cost" in reason and "install" in reason
    assert decide(100.0, hysteresis=0.0)[0] is Action.INSTALL


def test_minimum_dwell_keeps_a_fresh_plan_whatever_the_staleness() -> None:
    action, reason, _ = decide(1e9, since=30.0, min_dwell_s=60.0)
    assert action is Action.KEEP and "minimum dwell" in reason
    assert decide(1e9, since=60.0, min_dwell_s=60.0)[0] is Action.INSTALL


def test_clamp_refuses_a_large_move_and_asks_for_a_smaller_step() -> None:
    action, reason, smaller = decide(1e9, moved=0.35, max_moved_traffic_share=0.2)
    assert action is Action.SKIP and smaller
    assert "smaller step" in reason
    assert decide(1e9, moved=0.2, max_moved_traffic_share=0.2)[0] is Action.INSTALL
    # Below the price the clamp does not matter: renting is still cheaper.
    assert decide(1.0, moved=0.9, max_moved_traffic_share=0.2)[:2][0] is Action.KEEP


def test_nothing_to_gain_means_no_install_even_when_free() -> None:
    assert decide(0.0, rewarm=0.0)[0] is Action.KEEP
    assert decide(1e-9, rewarm=0.0)[0] is Action.INSTALL


def test_accumulate_is_a_trapezoid_and_ignores_negative_gaps() -> None:
    assert accumulate(1.0, 2.0, 4.0, 10.0) == 31.0
    assert accumulate(1.0, 2.0, 4.0, -5.0) == 1.0


def test_decision_record_round_trips_through_json() -> None:
    d = Decision(
        id=7,
        at_s=12.5,
        action=Action.SKIP,
        reason="why",
        drift=Drift(total_variation=0.2),
        penalties=Penalties(staleness_rate_measured=None, rewarm_cost=3.0),
        moved_traffic_share=0.4,
        needs_smaller_step=True,
    )
    assert Decision.from_dict(json.loads(json.dumps(d.to_dict()))) == d


def play(rents: list[float], price: float, hysteresis: float) -> tuple[float, float]:
    """One ski-rental game with the deterministic rule: (online cost, offline optimum).

    The staleness rate is piecewise linear through `rents` (one control step per unit
    of time), so the rent actually paid over a step is the trapezoid the loop adds to S.
    Once bought, the rent stops."""
    s, previous = 0.0, 0.0
    for i, rate in enumerate(rents):
        s = accumulate(s, previous, rate, 1.0 if i else 0.0)
        previous = rate
        action, _, _ = decide(s, rewarm=price, hysteresis=hysteresis)
        if action is Action.INSTALL:
            return s + price, min(price, total_rent(rents))
    return s, min(price, s)


def total_rent(rents: list[float]) -> float:
    return sum(0.5 * (a + b) for a, b in itertools.pairwise(rents))


@settings(max_examples=300, deadline=None)
@given(
    rents=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=200),
    price=st.floats(10.0, 500.0),
    hysteresis=st.sampled_from([0.0, 0.1]),
)
def test_never_pays_more_than_about_twice_the_offline_optimum(
    rents: list[float], price: float, hysteresis: float
) -> None:
    online, optimum = play(rents, price, hysteresis)
    # (2 + h) × OPT, plus at most one step's rent of overshoot (≤ 10 here).
    assert online <= (2.0 + hysteresis) * optimum + 10.0 + 1e-9
    if optimum >= price:  # the future was long enough for the overshoot to be small
        assert online <= (2.0 + hysteresis) * price + 10.0 + 1e-9
