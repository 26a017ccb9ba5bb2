"""The fallback guard: enter, stay, resume after its dwell with hysteresis, operator override."""

from __future__ import annotations

import pytest

from planner_svc.control.delivery import DeliveryReport, Prediction
from planner_svc.control.guard import (
    GAP_MIN_WINDOWS,
    GuardSettings,
    GuardState,
    Mode,
    ValidatedRange,
    force,
    guard_step,
)
from planner_svc.control.telemetry import Telemetry

RANGE = ValidatedRange(
    active_keys_min=100, active_keys_max=1000, p99_ms_max=3500.0, hit_rate_min=0.8
)
DWELL_60 = GuardSettings(resume_dwell_s=60)


def window(t: float, *, active: int = 500, p99: float = 1800.0, hit: float = 0.9) -> Telemetry:
    return Telemetry(
        window_end_s=t,
        hit_rate=hit,
        prompt_tokens_per_s=1e5,
        requests=10_000,
        p99_ms=p99,
        active_keys=active,
    )


def test_each_limit_triggers_fallback_with_a_reason() -> None:
    for bad, words in (
        (window(0, active=5000), "above the validated 1000"),
        (window(0, active=10), "below the validated 100"),
        (window(0, p99=5700.0), "p99 5700 ms"),
        (window(0, hit=0.6), "hit rate 60.0%"),
    ):
        verdict = guard_step(GuardState(), 0.0, bad, RANGE, DWELL_60)
        assert verdict.changed_to is Mode.FALLBACK
        assert words in verdict.state.reason


def test_in_range_or_no_evidence_changes_nothing() -> None:
    assert guard_step(GuardState(), 0.0, window(0), RANGE, DWELL_60).changed_to is None
    assert guard_step(GuardState(), 0.0, None, RANGE, DWELL_60).changed_to is None
    fallen = GuardState(mode=Mode.FALLBACK)
    assert guard_step(fallen, 0.0, None, RANGE, DWELL_60).state.mode is Mode.FALLBACK


def test_resumes_only_after_staying_in_range_for_the_dwell() -> None:
    state = guard_step(GuardState(), 0.0, window(0, p99=9000.0), RANGE, DWELL_60).state
    # Flat-LB's hit rate is lower by construction and does not gate the resume; the
    # active set and the p99 (less the resume margin) do.
    timeline = [
        (10, window(10, hit=0.6)),
        (40, window(40, active=5000)),
        (50, window(50, hit=0.6)),
        (60, window(60, p99=3400.0)),  # under the limit, not under 90 % of it
        (70, window(70)),
        (120, window(120)),
        (130, window(130)),
    ]
    changes = []
    for t, w in timeline:
        verdict = guard_step(state, float(t), w, RANGE, DWELL_60)
        state = verdict.state
        changes.append(verdict.changed_to)
    # In range from 10, broken at 40 and at 60, in range again from 70: resume at 130.
    assert changes == [None, None, None, None, None, None, Mode.PLANNED]
    assert state.mode is Mode.PLANNED and "back in the validated range" in state.reason


def test_a_p99_held_above_the_limit_falls_back_once_and_stays_then_resumes_once() -> None:
    """The flapping the operator saw: p99 9 s against 3.5 s flipped every ~70 s."""
    state, changes = GuardState(), []
    for t in range(0, 600, 5):  # ten minutes at the limit x 2.6
        verdict = guard_step(state, float(t), window(t, p99=9000.0), RANGE, DWELL_60)
        state = verdict.state
        changes.append((t, verdict.changed_to))
    assert [c for c in changes if c[1]] == [(0, Mode.FALLBACK)]
    assert state.mode is Mode.FALLBACK and "p99 9000 ms" in state.reason
    for t in range(600, 700, 5):  # restored
        verdict = guard_step(state, float(t), window(t, p99=1500.0), RANGE, DWELL_60)
        state = verdict.state
        changes.append((t, verdict.changed_to))
    assert [c for c in changes if c[1]] == [(0, Mode.FALLBACK), (660, Mode.PLANNED)]


def test_entering_needs_the_condition_for_enter_after_s() -> None:
    g = GuardSettings(enter_after_s=30, resume_dwell_s=60)
    state = GuardState()
    for t in (0, 10, 20):
        verdict = guard_step(state, float(t), window(t, p99=9000.0), RANGE, g)
        assert verdict.changed_to is None and "falls back after 30 s" in verdict.state.reason
        state = verdict.state
    state = guard_step(state, 25.0, window(25), RANGE, g).state  # a good window resets it
    for t in (30, 40, 50):
        verdict = guard_step(state, float(t), window(t, p99=9000.0), RANGE, g)
        state = verdict.state
    assert verdict.changed_to is None
    assert guard_step(state, 60.0, window(60, p99=9000.0), RANGE, g).changed_to is Mode.FALLBACK


def test_a_plan_that_fails_right_after_resuming_waits_twice_as_long() -> None:
    g = GuardSettings(resume_dwell_s=60, max_resume_dwell_s=200)
    state, resumes = GuardState(), []
    t = 0
    for _round in range(4):  # fail in planned mode, recover in fallback, again and again
        state = guard_step(state, float(t), window(t, p99=9000.0), RANGE, g).state
        assert state.mode is Mode.FALLBACK
        start = t
        while state.mode is Mode.FALLBACK:
            t += 5
            state = guard_step(state, float(t), window(t), RANGE, g).state
        resumes.append(t - start)
        t += 5
    assert resumes == [65, 125, 205, 205]  # dwell 60, 120, 200 (the cap), 200: + the first step


def test_min_fallback_s_holds_the_fallback_even_when_the_range_is_back() -> None:
    g = GuardSettings(resume_dwell_s=0, min_fallback_s=100)
    state = guard_step(GuardState(), 0.0, window(0, p99=9000.0), RANGE, g).state
    assert guard_step(state, 50.0, window(50), RANGE, g).changed_to is None
    assert guard_step(state, 100.0, window(100), RANGE, g).changed_to is Mode.PLANNED


def test_guard_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="p99_resume_margin"):
        GuardSettings(p99_resume_margin=1.5)
    with pytest.raises(ValueError, match="enter_after_s"):
        GuardSettings(enter_after_s=-1)


def test_forced_mode_overrides_the_guard_until_released() -> None:
    verdict = force(GuardState(), Mode.FALLBACK, "maintenance")
    assert verdict.changed_to is Mode.FALLBACK
    state = verdict.state
    state = guard_step(state, 0.0, window(0), RANGE, DWELL_60).state  # in range, but forced
    assert state.mode is Mode.FALLBACK
    state = force(state, None, "").state
    verdict = guard_step(state, 1.0, window(1), RANGE, DWELL_60)
    assert verdict.changed_to is Mode.PLANNED  # released + in range: no dwell
    # Forcing planned keeps the plan even far out of range.
    state = force(GuardState(), Mode.PLANNED, "I know").state
    assert guard_step(state, 0.0, window(0, p99=9e3), RANGE, DWELL_60).changed_to is None


def test_guard_state_round_trips() -> None:
    state = GuardState(
        mode=Mode.FALLBACK, forced=Mode.FALLBACK, in_range_since_s=3.0, released=False, reason="x"
    )
    assert GuardState.from_dict(state.to_dict()) == state


def _delivery(predicted: float, served: float, windows: int) -> DeliveryReport:
    p = Prediction(("d0", "d1"), (1.0, 1.0), (5.0, 5.0), 1.0, predicted)
    return DeliveryReport("1.7", p, windows, 2, served, (5.0, 5.0), 1.0)


GAP_RANGE = ValidatedRange(hit_gap_max=0.05)


def test_a_plan_that_serves_persistently_below_its_prediction_falls_back() -> None:
    missed = _delivery(predicted=0.73, served=0.60, windows=GAP_MIN_WINDOWS)
    verdict = guard_step(GuardState(), 0.0, window(0), GAP_RANGE, DWELL_60, missed)
    assert verdict.changed_to is Mode.FALLBACK
    assert "served 60.0% over 3 windows, 13.0% below its predicted 73.0%" in verdict.state.reason


def test_a_gap_within_tolerance_too_few_windows_or_no_prediction_changes_nothing() -> None:
    for d in (_delivery(0.73, 0.70, GAP_MIN_WINDOWS),   # 3 points short, 5 tolerated
              _delivery(0.73, 0.40, GAP_MIN_WINDOWS - 1),  # not persistent yet
              _delivery(0.73, 0.90, GAP_MIN_WINDOWS),   # better than predicted
              None):                                    # a table that predicts nothing
        assert guard_step(GuardState(), 0.0, window(0), GAP_RANGE, DWELL_60, d).changed_to is None
    unchecked = ValidatedRange()
    assert guard_step(GuardState(), 0.0, window(0), unchecked, DWELL_60,
                      _delivery(0.73, 0.1, 10)).changed_to is None


def test_the_gap_does_not_hold_the_fleet_in_fallback() -> None:
    """In fallback a Flat-LB table is serving: the last plan's gap must not block resuming."""
    fallen = GuardState(mode=Mode.FALLBACK, fallback_since_s=0.0)
    missed = _delivery(0.73, 0.40, 10)
    state = guard_step(fallen, 0.0, window(0), GAP_RANGE, DWELL_60, missed).state
    verdict = guard_step(state, 61.0, window(61), GAP_RANGE, DWELL_60, missed)
    assert verdict.changed_to is Mode.PLANNED


def gain_window(t: float, gain: float | None) -> Telemetry:
    return Telemetry(window_end_s=t, hit_rate=0.9, prompt_tokens_per_s=1e5, requests=10_000,
                     active_keys=500, affinity_gain=gain)


GAIN_FLOOR = ValidatedRange(affinity_gain_min=0.10)


def test_a_low_predicted_gain_falls_back_only_when_consecutive_windows_agree() -> None:
    g = GuardSettings(gain_low_windows=3)
    state = GuardState()
    # One low window after a dip, a good one, then a window judged twice, an unknown one:
    # none of them is a run of three distinct low windows.
    for t, gain in ((0, 0.05), (1, 0.30), (2, 0.05), (3, 0.05), (3, 0.05), (4, None)):
        verdict = guard_step(state, float(t), gain_window(t, gain), GAIN_FLOOR, g)
        assert verdict.changed_to is None, (t, verdict.state)
        state = verdict.state
    assert state.gain_low_windows == 2 and "2 of 3 windows" in state.reason
    verdict = guard_step(state, 5.0, gain_window(5, 0.04), GAIN_FLOOR, g)
    assert verdict.changed_to is Mode.FALLBACK
    assert "predicted affinity gain 4.0 pp" in verdict.state.reason
    # In fallback the gain counts at once (resuming waits for it), and the run restarts
    # from zero on the next resume.
    assert verdict.state.gain_low_windows == 0
    one = GuardSettings(gain_low_windows=1)
    assert guard_step(GuardState(), 0.0, gain_window(0, 0.05), GAIN_FLOOR,
                      one).changed_to is Mode.FALLBACK
    with pytest.raises(ValueError, match="gain_low_windows"):
        GuardSettings(gain_low_windows=0)


def test_the_gain_run_survives_a_snapshot() -> None:
    state = guard_step(GuardState(), 0.0, gain_window(0, 0.05), GAIN_FLOOR).state
    again = GuardState.from_dict(state.to_dict())
    assert again == state and again.gain_low_windows == 1
