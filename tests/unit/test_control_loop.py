"""ControlLoop end to end on tiny plans: accumulate, install, skip, learn, guard, persist."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_svc.control import (
    Action,
    ControlLoop,
    Decision,
    DecisionSettings,
    GuardSettings,
    LoopSettings,
    Mode,
    Telemetry,
    Traffic,
    ValidatedRange,
)
from router_client.plan import DestinationSpec, KeyTable, PlanConfig, RoutingPlan

TOKENS = 1000.0


def make_plan(sets: dict[str, tuple[int, ...]], n: int = 3, q_cap: float = 100.0) -> RoutingPlan:
    keys = list(sets)
    table = KeyTable.from_sets(keys, [sets[k] for k in keys], [1.0] * len(keys))
    return RoutingPlan(
        config=PlanConfig(q_cap=q_cap, warm_slots_per_destination=1, warm_slots=n),
        destinations=tuple(DestinationSpec(f"d{i}") for i in range(n)),
        table=table,
    )


# The installed plan admits a and b; traffic moved to c, which the candidate admits.
INSTALLED = make_plan({"a": (0,), "b": (1,)})
CANDIDATE = make_plan({"a": (0,), "c": (2,)})


def traffic(at_s: float) -> Traffic:
    return Traffic(["a", "b", "c"], np.array([5.0, 1.0, 4.0]), np.full(3, TOKENS), at_s)


def window(at_s: float, hit: float = 0.9, requests: int = 10_000, **kw: Any) -> Telemetry:
    return Telemetry(
        window_end_s=at_s, hit_rate=hit, prompt_tokens_per_s=1e4, requests=requests, **kw
    )


def loop(**knobs: Any) -> ControlLoop:
    decision = DecisionSettings(hysteresis=0.1, min_dwell_s=0.0)
    return ControlLoop(LoopSettings(decision=decision, warmup_s=1.0, **knobs))


def step(lp: ControlLoop, t: float, telemetry: Telemetry | None = None) -> Decision:
    return lp.step(
        t, installed=INSTALLED, traffic=traffic(t), candidate=CANDIDATE, telemetry=telemetry
    )


def test_keeps_until_staleness_pays_for_the_rewarm_then_installs() -> None:
    lp = loop()
    figures = lp.price(INSTALLED, traffic(0), CANDIDATE)
    rate, price = figures.staleness_rate_modelled, figures.rewarm_cost * 1.1
    # c: 4 req/s × 1000 tokens × Δh 0.3 gained, b: 1 req/s lost.
    assert rate == pytest.approx(3 * TOKENS * 0.3)
    dt = 0.26 * price / rate  # the fourth step's rent buys the candidate
    actions = [step(lp, i * dt).action for i in range(6)]
    assert actions == [Action.KEEP] * 4 + [Action.INSTALL, Action.INSTALL]
    decision = lp.last_decision
    assert decision is not None and decision.penalties.staleness_accumulated >= price
    assert decision.penalties.measured_used is False
    lp.record_install(5 * dt)
    assert lp.accumulated == 0.0 and lp.installs[-1].predicted_tokens > 0


def test_stale_rates_or_stale_or_recovering_telemetry_are_never_acted_on() -> None:
    lp = loop(max_rates_age_s=30.0, max_telemetry_age_s=30.0)
    step(lp, 0.0)
    s = lp.accumulated
    old_rates = lp.step(1e6, installed=INSTALLED, traffic=traffic(0.0), candidate=CANDIDATE)
    assert old_rates.action is Action.SKIP and "rates are" in old_rates.reason
    assert step(lp, 2e6, window(2e6 - 100)).reason.startswith("not acting: telemetry is 100 s")
    recovering = step(lp, 3e6, window(3e6, recovering=True))
    assert recovering.action is Action.SKIP and "recovering" in recovering.reason
    assert lp.accumulated == s  # the integral did not advance over the unusable gap


def test_decides_on_measured_staleness_once_there_is_a_baseline() -> None:
    lp = loop(min_measured_requests=1000)
    first = step(lp, 0.0, window(0.0, hit=0.9))
    assert first.penalties.measured_used is False  # this window becomes the baseline
    later = step(lp, 10.0, window(10.0, hit=0.85))
    assert later.penalties.measured_used is True
    # Modelled gap 900 tokens/s; same rates, so the model expects no decline, but the
    # stream measured a 5 pp drop of 1e4 prompt tokens/s: 900 + 500.
    assert later.penalties.staleness_rate_modelled == pytest.approx(900.0)
    assert later.penalties.staleness_rate_measured == pytest.approx(900.0 + 0.05 * 1e4)
    thin = step(lp, 20.0, window(20.0, hit=0.85, requests=10))
    assert thin.penalties.measured_used is False  # too little evidence: modelled


def install_and_dip(
    lp: ControlLoop, t0: float, true_factor: float, window_before: bool = True
) -> list[Action]:
    """Install at t0, then feed windows whose hit deficit is `true_factor` × predicted."""
    if window_before:
        step(lp, t0 - 5.0, window(t0 - 5.0, hit=0.9))
    lp.record_install(t0, figures=lp.price(INSTALLED, traffic(t0), CANDIDATE))
    predicted = lp.installs[-1].predicted_tokens
    assert lp.settling is not None
    # Without a window before the install the settled window is the reference; with one,
    # that window's hit plus the candidate's modelled gain (0.9 + 900 / 1e4 here).
    reference = lp.settling.reference_hit or 0.9
    assert reference == pytest.approx(0.99 if window_before else 0.9)
    depth = true_factor * predicted / (1e4 * 10.0)  # one 10 s window deep
    hits = [reference - depth, reference, reference]
    return [
        step(lp, t0 + 10 * (i + 1), window(t0 + 10 * (i + 1), hit=h)).action
        for i, h in enumerate(hits)
    ]


def test_skips_while_rewarming_and_learns_the_rewarm_factor() -> None:
    lp = loop(min_measured_requests=1000, min_settle_s=15.0)
    assert lp.rewarm.value == 2.0  # conservative default before any install
    actions = install_and_dip(lp, 0.0, true_factor=0.6, window_before=False)
    assert actions[0] is Action.SKIP  # 10 s after the install the dip has not settled
    assert actions[1] is not Action.SKIP
    assert lp.settling is None and lp.baseline is not None
    assert lp.rewarm.value == pytest.approx(0.6, rel=1e-6)
    assert lp.installs[-1].measured_dip_tokens == pytest.approx(
        0.6 * lp.installs[-1].predicted_tokens
    )
    for i in range(1, 25):
        install_and_dip(lp, 1000.0 * i, true_factor=1.5 if i % 2 else 0.5)
    assert lp.rewarm.value == pytest.approx(1.0, abs=0.25)  # the EWMA tracks the mean ratio


def test_guard_falls_back_and_resumes_through_the_loop() -> None:
    lp = loop(guard=GuardSettings(resume_dwell_s=30.0))
    lp.set_validated_range(ValidatedRange(p99_ms_max=3500.0, active_keys_max=10))
    assert step(lp, 0.0, window(0.0, p99_ms=1000.0, active_keys=3)).action is Action.KEEP
    bad = step(lp, 10.0, window(10.0, p99_ms=9000.0, active_keys=3))
    assert bad.action is Action.FALLBACK and "p99 9000 ms" in bad.reason
    assert bad.mode == "fallback"
    assert step(lp, 20.0, window(20.0, p99_ms=9000.0, active_keys=3)).action is Action.SKIP
    # still above the limit in fallback: no resume (it used to resume here, then flap)
    assert step(lp, 50.0, window(50.0, p99_ms=9000.0, active_keys=3)).action is Action.SKIP
    assert step(lp, 60.0, window(60.0, p99_ms=1000.0, active_keys=3)).action is Action.SKIP
    assert step(lp, 90.0, window(90.0, p99_ms=1000.0, active_keys=3)).action is Action.RESUME
    assert lp.settling is not None  # back on a cold plan: follow its dip


def test_an_install_rewarming_does_not_send_the_fleet_to_flat_lb_on_a_short_p99_spike() -> None:
    """The guard judged p99 inside the rewarm dip of an install the loop had just bought and
    fell back 5 s later (the 600-s demo, twice). While an install rewarms, a violation must
    last `rewarm_enter_after_s`; one that outlasts it still falls back."""
    lp = loop(min_settle_s=120.0)  # a dip that takes a while, as the demo's did
    lp.set_validated_range(ValidatedRange(p99_ms_max=3500.0))
    assert step(lp, 0.0, window(0.0, p99_ms=1000.0)).action is Action.KEEP
    lp.record_install(5.0, figures=lp.price(INSTALLED, traffic(5.0), CANDIDATE))
    assert lp.settling is not None
    # the dip: the hit rate falls and climbs back while the caches rewarm
    spike = step(lp, 10.0, window(10.0, hit=0.5, p99_ms=4100.0))
    assert spike.action is not Action.FALLBACK and lp.guard.mode is Mode.PLANNED
    assert lp.settling is not None and "falls back after 30 s" in lp.guard.reason
    assert step(lp, 20.0, window(20.0, hit=0.6, p99_ms=1200.0)).action is not Action.FALLBACK
    assert lp.guard.out_of_range_since_s is None  # the spike ended: the clock starts over
    # a violation that outlasts the grace still falls back, rewarming or not
    step(lp, 25.0, window(25.0, hit=0.65, p99_ms=9000.0))
    assert step(lp, 40.0, window(40.0, hit=0.7, p99_ms=9000.0)).action is not Action.FALLBACK
    assert step(lp, 56.0, window(56.0, hit=0.75, p99_ms=9000.0)).action is Action.FALLBACK


def test_without_an_install_rewarming_the_guard_falls_back_at_once() -> None:
    lp = loop()
    lp.set_validated_range(ValidatedRange(p99_ms_max=3500.0))
    step(lp, 0.0, window(0.0, p99_ms=1000.0))
    assert lp.settling is None
    assert step(lp, 10.0, window(10.0, p99_ms=4100.0)).action is Action.FALLBACK


def test_operator_forces_and_releases_fallback() -> None:
    lp = loop(guard=GuardSettings(resume_dwell_s=1e9))
    step(lp, 0.0, window(0.0))
    forced = lp.force_mode(1.0, Mode.FALLBACK, "maintenance window")
    assert forced.action is Action.FALLBACK and "maintenance window" in forced.reason
    assert step(lp, 2.0, window(2.0)).action is Action.SKIP
    assert lp.force_mode(3.0, None, "").action is Action.KEEP
    assert step(lp, 4.0, window(4.0)).action is Action.RESUME


def test_snapshot_restore_round_trip_continues_identically() -> None:
    lp = loop(min_measured_requests=1000)
    step(lp, 0.0, window(0.0))
    lp.record_install(5.0)
    step(lp, 10.0, window(10.0, hit=0.7))  # mid-dip: settling state is persisted too
    lp.warm = lp.warm.observe_keys(["a"], np.array([0.95]), 0.6)
    data = json.loads(json.dumps(lp.snapshot()))
    twin = ControlLoop.restore(data, lp.settings)
    assert twin.snapshot() == lp.snapshot()
    for t, hit in ((20.0, 0.9), (30.0, 0.9), (40.0, 0.8)):
        a, b = step(lp, t, window(t, hit=hit)), step(twin, t, window(t, hit=hit))
        assert a == b
    assert twin.snapshot() == lp.snapshot()
    with pytest.raises(ValueError, match="schema"):
        ControlLoop.restore({**data, "schema": 99})


# A candidate that only moves key a: no modelled gain, a fixed rewarm price.
MOVE_ONLY = make_plan({"a": (1,)})
STAY = make_plan({"a": (0,)})
ONLY_A = Traffic(["a"], np.array([2.0]), np.array([TOKENS]), 0.0)


@settings(max_examples=60, deadline=None)
@given(rents=st.lists(st.floats(0.0, 200.0), min_size=2, max_size=40))
def test_loop_pays_at_most_about_twice_the_offline_optimum(rents: list[float]) -> None:
    """Measured staleness follows `rents` (tokens/s, one step per second); price is fixed."""
    base = loop(min_measured_requests=0, max_rates_age_s=1e9).settings
    lp = ControlLoop(replace(base, decision=DecisionSettings(hysteresis=0.0)))
    paid = None
    for t, rent in enumerate([0.0, *rents]):
        hit = 0.9 - rent / 1e4  # measured decline = rent (same rates: no modelled decline)
        d = lp.step(
            float(t),
            installed=STAY,
            traffic=ONLY_A,
            candidate=MOVE_ONLY,
            telemetry=window(float(t), hit=hit),
        )
        price = d.penalties.rewarm_cost
        if d.action is Action.INSTALL:
            paid = d.penalties.staleness_accumulated + price
            break
    total = sum(0.5 * (a + b) for a, b in itertools.pairwise([0.0, *rents]))
    optimum = min(price, total)
    online = total if paid is None else paid
    assert price > 0
    assert online <= 2.0 * optimum + 200.0 + 1e-6  # + at most one step's rent of overshoot


def test_clamp_through_the_loop_asks_for_a_smaller_step() -> None:
    lp = ControlLoop(
        LoopSettings(decision=DecisionSettings(hysteresis=0.0, max_moved_traffic_share=0.2))
    )
    step(lp, 0.0)
    d = step(lp, 1e6)  # staleness long since paid for the candidate, which moves 50 %
    assert d.action is Action.SKIP and d.needs_smaller_step
    assert d.moved_traffic_share == pytest.approx(0.5)  # b leaves (1), c enters (4) of 10
    assert "smaller step" in d.reason


def test_warm_advantage_is_learned_globally_and_per_key_from_windows() -> None:
    lp = loop(min_measured_requests=1000)
    for t in range(20):
        w = window(
            float(t),
            planned_hit_rate=0.85,
            fallback_hit_rate=0.6,
            key_hit_rates={"a": 0.95, "c": 0.7},
        )
        step(lp, float(t), w)
    assert lp.warm.global_value == pytest.approx(0.25, abs=1e-3)
    assert lp.warm.for_keys(["a", "c", "b"]).tolist() == pytest.approx([0.35, 0.1, 0.25], abs=1e-3)
