"""The q_cap probe (control.q_cap_probe): a hill climb on the fleet's TTFT score."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_svc.control.q_cap_probe import (
    SCORE_CAP,
    Probe,
    ProbeSettings,
    fleet_score,
    probe_step,
    start_probe,
)

SETTINGS = ProbeSettings(low=0.5, high=12.0, settle_s=10.0, measure_s=20.0, rest_s=60.0)
REPORT_S = 5.0


def valley(q: float) -> float:
    """A landscape with its best at 2.1: queues above it, cold replicas below (a step
    moves the score by ~25 %, more than the margin and the noise)."""
    return 0.6 * max(q / 2.1, 2.1 / q) ** 1.5


def run(probe: Probe, landscape, seconds: float, noise: float = 0.0, seed: int = 0,
        cfg: ProbeSettings = SETTINGS) -> tuple[Probe, list[float], list[float]]:
    rng = random.Random(seed)
    values: list[float] = []
    bases: list[float] = []
    t = probe.phase_start_s
    while t < seconds:
        t += REPORT_S
        score = landscape(probe.value) * (1 + rng.gauss(0, noise))
        probe = probe_step(probe, t, score, cfg)
        values.append(probe.value)
        bases.append(probe.base)
    return probe, values, bases


@pytest.mark.parametrize("start", [4.2, 1.05, 8.4, 0.6])
def test_the_probe_climbs_down_the_valley_from_either_side(start: float) -> None:
    # The kept value settles beside the best; trials keep probing one step either side.
    _, values, bases = run(start_probe(start, 0.0, SETTINGS), valley, 3000.0, noise=0.05)
    tail = len(values) * 2 // 3
    assert all(abs(b / 2.1 - 1) <= 0.1 for b in bases[tail:]), (start, set(bases[tail:]))
    assert abs(statistics.median(values[tail:]) / 2.1 - 1) <= 0.1
    assert all(abs(v / 2.1 - 1) <= 0.3 for v in values[tail:]), (start, set(values[tail:]))


def test_a_flat_landscape_keeps_the_value_within_one_step() -> None:
    # Inside the plateau no trial beats its base by the margin: it keeps coming back.
    probe, values, _ = run(start_probe(3.0, 0.0, SETTINGS), lambda q: 0.9, 2000.0, noise=0.02)
    assert probe.base == pytest.approx(3.0)
    assert min(values) >= 3.0 * SETTINGS.step - 1e-9
    assert max(values) <= 3.0 / SETTINGS.step + 1e-9


def test_a_quiet_fleet_is_not_probed() -> None:
    probe, values, _ = run(start_probe(1.05, 0.0, SETTINGS), lambda q: 0.2, 1000.0)
    assert set(values) == {1.05}
    assert probe.base_score == pytest.approx(0.2)


def test_a_lost_trial_returns_and_tries_the_other_way_then_rests() -> None:
    cfg = ProbeSettings(low=0.5, high=12.0, settle_s=0.0, measure_s=10.0, rest_s=100.0)
    probe = start_probe(2.0, 0.0, cfg)
    probe = probe_step(probe, 10.0, 1.0, cfg)  # base measured: a trial down
    assert probe.trial == pytest.approx(1.7) and probe.base_score == 1.0
    probe = probe_step(probe, 20.0, 1.0, cfg)  # no better: back, the other way next
    assert probe.trial is None and probe.direction == 1 and "lost" in probe.last
    probe = probe_step(probe, 30.0, 1.0, cfg)
    assert probe.trial == pytest.approx(2.0 / 0.85)
    probe = probe_step(probe, 40.0, 1.2, cfg)  # worse: both lost, rest
    assert probe.trial is None and probe.rest_until_s == pytest.approx(140.0)
    for t in (50.0, 60.0, 130.0):
        probe = probe_step(probe, t, 1.0, cfg)
        assert probe.trial is None
    probe = probe_step(probe, 150.0, 1.0, cfg)
    assert probe.trial is not None


def test_a_trial_at_the_bound_turns_around() -> None:
    cfg = ProbeSettings(low=2.0, high=12.0, settle_s=0.0, measure_s=10.0)
    probe = probe_step(start_probe(2.0, 0.0, cfg), 10.0, 1.0, cfg)
    assert probe.trial == pytest.approx(2.0 / 0.85) and probe.direction == 1


def test_samples_before_the_settle_do_not_count() -> None:
    cfg = ProbeSettings(low=0.5, high=12.0, settle_s=10.0, measure_s=10.0)
    probe = start_probe(2.0, 0.0, cfg)
    probe = probe_step(probe, 5.0, 9.0, cfg)  # the caches still rewarming
    assert probe.samples == ()
    probe = probe_step(probe, 15.0, 1.0, cfg)
    probe = probe_step(probe, 20.0, 1.0, cfg)
    assert probe.base_score == 1.0


def test_fleet_score_caps_each_destination_and_skips_nan() -> None:
    assert fleet_score([1.0, math.inf, math.nan], 2.0) == pytest.approx((0.5 + SCORE_CAP) / 2)
    assert fleet_score([], 2.0) is None
    with pytest.raises(ValueError):
        fleet_score([1.0], 0.0)


@pytest.mark.parametrize("bad", [dict(low=0.0, high=1.0), dict(low=2.0, high=1.0),
                                 dict(low=1.0, high=2.0, step=1.0),
                                 dict(low=1.0, high=2.0, measure_s=0.0),
                                 dict(low=1.0, high=2.0, margin=1.0)])
def test_bad_settings_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        ProbeSettings(**bad)


@settings(max_examples=60, deadline=None)
@given(start=st.floats(0.1, 50.0), scores=st.lists(
    st.one_of(st.none(), st.floats(0.0, 10.0), st.just(math.inf)), max_size=80))
def test_the_value_stays_in_the_operators_range(start: float,
                                                scores: list[float | None]) -> None:
    probe = start_probe(start, 0.0, SETTINGS)
    for i, score in enumerate(scores):
        probe = probe_step(probe, 5.0 * (i + 1), score, SETTINGS)
        assert SETTINGS.low <= probe.value <= SETTINGS.high
        assert SETTINGS.low <= probe.base <= SETTINGS.high
