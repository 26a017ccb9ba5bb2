"""`cacheroute plan explain`'s reasons (planner_svc.planning.explain): a key the plan holds
but the window does not, and a key an older plan admitted, are told apart from a key never
seen (a new user found "rank 0 of 943" and "never seen" for the hottest key of plan 1.1)."""

from __future__ import annotations

import dataclasses

import numpy as np

from planner_svc.planning import PlanningConfig, build_plan
from planner_svc.planning.explain import explain_key
from router_client.plan import Version

KEYS = [f"k{i}" for i in range(20)]
RATES = np.linspace(20.0, 1.0, len(KEYS))
CONFIG = PlanningConfig.uniform(4, 10.0, 2)


def test_an_admitted_key_with_no_traffic_in_the_window_is_not_ranked_as_if_it_had() -> None:
    plan = build_plan(KEYS, RATES, CONFIG)
    now = RATES.copy()
    now[0] = 0.0  # the hottest key went quiet; it is still in the window's key list
    e = explain_key("k0", plan, KEYS, now, CONFIG)
    assert e.admitted and e.seen and e.rank == 0
    assert "without traffic in the current window" in e.reason
    hot = explain_key("k1", plan, KEYS, now, CONFIG)
    assert hot.rank == 1 and hot.reason.startswith("admitted: rank 1 of 19")


def test_a_key_an_older_plan_admitted_is_not_called_never_seen() -> None:
    old = dataclasses.replace(build_plan(KEYS, RATES, CONFIG), version=Version(1, 1))
    plan = build_plan(KEYS[1:], RATES[1:], CONFIG)  # k0 left the window and the plan
    e = explain_key("k0", plan, KEYS[1:], RATES[1:], CONFIG, history=[old])
    assert not e.seen and not e.admitted
    assert "plan 1.1 admitted it" in e.reason and "never seen" not in e.reason
    fresh = explain_key("zz", plan, KEYS[1:], RATES[1:], CONFIG, history=[old])
    assert "never seen" in fresh.reason
