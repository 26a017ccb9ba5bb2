"""The fallback guard: enter, stay, resume after its dwell, operator override."""

from __future__ import annotations

from planner_svc.control.guard import GuardState, Mode, ValidatedRange, force, guard_step
from planner_svc.control.telemetry import Telemetry

RANGE = ValidatedRange(
    active_keys_min=100, active_keys_max=1000, p99_ms_max=3500.0, hit_rate_min=0.8
)


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
        verdict = guard_step(GuardState(), 0.0, bad, RANGE, resume_dwell_s=60)
        assert verdict.changed_to is Mode.FALLBACK
        assert words in verdict.state.reason


def test_in_range_or_no_evidence_changes_nothing() -> None:
    assert guard_step(GuardState(), 0.0, window(0), RANGE, 60).changed_to is None
    assert guard_step(GuardState(), 0.0, None, RANGE, 60).changed_to is None
    fallen = GuardState(mode=Mode.FALLBACK)
    assert guard_step(fallen, 0.0, None, RANGE, 60).state.mode is Mode.FALLBACK


def test_resumes_only_after_staying_in_range_for_the_dwell() -> None:
    state = guard_step(GuardState(), 0.0, window(0, p99=9000.0), RANGE, 60).state
    # Flat-LB's own p99 and hit rate are worse; only the active set gates the resume.
    timeline = [
        (10, window(10, p99=5700.0, hit=0.6)),
        (40, window(40, active=5000)),
        (50, window(50)),
        (100, window(100)),
        (110, window(110)),
    ]
    changes = []
    for t, w in timeline:
        verdict = guard_step(state, float(t), w, RANGE, resume_dwell_s=60)
        state = verdict.state
        changes.append(verdict.changed_to)
    # In range from 10, broken at 40, in range again from 50: resume at 110 = 50 + 60.
    assert changes == [None, None, None, None, Mode.PLANNED]
    assert state.mode is Mode.PLANNED and "back in the validated range" in state.reason


def test_forced_mode_overrides_the_guard_until_released() -> None:
    verdict = force(GuardState(), Mode.FALLBACK, "maintenance")
    assert verdict.changed_to is Mode.FALLBACK
    state = verdict.state
    state = guard_step(state, 0.0, window(0), RANGE, 60).state  # in range, but forced
    assert state.mode is Mode.FALLBACK
    state = force(state, None, "").state
    verdict = guard_step(state, 1.0, window(1), RANGE, resume_dwell_s=60)
    assert verdict.changed_to is Mode.PLANNED  # released + in range: no dwell
    # Forcing planned keeps the plan even far out of range.
    state = force(GuardState(), Mode.PLANNED, "I know").state
    assert guard_step(state, 0.0, window(0, p99=9e3), RANGE, 60).changed_to is None


def test_guard_state_round_trips() -> None:
    state = GuardState(
        mode=Mode.FALLBACK, forced=Mode.FALLBACK, in_range_since_s=3.0, released=False, reason="x"
    )
    assert GuardState.from_dict(state.to_dict()) == state
