"""Holding a window's counting noise to the installed plan's rates (control.traffic.hold_noise)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_svc.control.traffic import Traffic, hold_noise

WINDOW_S = 20.0


def traffic(rates: dict[str, float], tokens: float = 800.0) -> Traffic:
    keys = list(rates)
    return Traffic(keys, np.array([rates[k] for k in keys], np.float64),
                   np.full(len(keys), tokens), window_end_s=100.0)


def as_dict(t: Traffic) -> dict[str, float]:
    return dict(zip(t.keys, t.rates.tolist(), strict=True))


def test_changes_within_the_noise_keep_the_plans_rates_and_real_changes_pass():
    ref = traffic({"a": 5.0, "b": 1.0, "c": 2.0})
    # a: 100 requests -> 110 (1 standard error); b: 20 -> 60 (about 5); c: 40 -> 34
    now = traffic({"a": 5.5, "b": 3.0, "c": 1.7, "new": 0.1})
    held = as_dict(hold_noise(now, ref, WINDOW_S, 2.0))
    assert held == {"a": 5.0, "b": 3.0, "c": 2.0, "new": 0.1}


def test_a_quiet_key_is_held_only_while_its_silence_is_within_the_noise():
    ref = traffic({"rare": 0.1, "busy": 2.0, "a": 1.0})  # expected counts 2 and 40
    now = traffic({"a": 1.0})
    held = hold_noise(now, ref, WINDOW_S, 2.0)
    assert as_dict(held) == {"a": 1.0, "rare": 0.1}  # 0 of 40 expected is a real drop
    assert held.tokens.tolist() == [800.0, 800.0]


def test_off_or_without_a_reference_the_window_is_planned_as_measured():
    now = traffic({"a": 5.5})
    assert hold_noise(now, None, WINDOW_S, 2.0) is now
    assert hold_noise(now, traffic({"a": 5.0}), WINDOW_S, 0.0) is now


def test_stationary_poisson_windows_are_mostly_held():
    """Counts drawn from the reference rates: about 95 % of keys (z = 2) keep the plan's
    rate, so a candidate fitted to the window sees the plan's traffic, not its noise."""
    rng = np.random.default_rng(7)
    rates = rng.lognormal(0.0, 1.5, 2_000)
    ref = traffic({f"k{i}": r for i, r in enumerate(rates)})
    counts = rng.poisson(rates * WINDOW_S)
    now = traffic({f"k{i}": c / WINDOW_S for i, c in enumerate(counts) if c > 0})
    held = as_dict(hold_noise(now, ref, WINDOW_S, 2.0))
    same = sum(held.get(k) == pytest.approx(r) for k, r in as_dict(ref).items())
    assert same >= 0.9 * len(rates), same


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.sampled_from([f"k{i}" for i in range(12)]), st.floats(0.0, 50.0),
                       max_size=12),
       st.dictionaries(st.sampled_from([f"k{i}" for i in range(12)]), st.floats(0.0, 50.0),
                       min_size=1, max_size=12),
       st.floats(0.5, 4.0))
def test_every_rate_is_either_measured_or_a_held_reference_within_z_errors(ref, now, z):
    held = as_dict(hold_noise(traffic(now), traffic(ref), WINDOW_S, z))
    assert set(now) <= set(held) <= set(now) | set(ref)
    for k, r in held.items():
        measured = now.get(k, 0.0)
        if r != measured:  # held: the reference, within z standard errors of the window
            assert k in ref and r == ref[k]
            assert abs(measured - r) <= z * np.sqrt(max(measured, r) / WINDOW_S) + 1e-12
