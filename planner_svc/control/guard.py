"""The fallback guard (deployment checklist step 5).

A plan is only trusted inside the range it was validated for (shadow replay /
canary): an active-set size, a p99 ceiling, a hit-rate floor. When fresh
telemetry leaves that range the guard sends routers to Flat-LB; when it comes
back and stays back for `resume_dwell_s`, the guard resumes the plan.

Two rules keep the guard honest:
- p99 and hit rate are only checked in planned mode: in fallback they are
  Flat-LB's figures (worse by construction) and would pin the fleet there. The
  active set is checked in both modes, since it does not depend on routing.
- An operator's forced mode overrides the guard until released; a release
  that finds the fleet in range resumes at once (the operator already waited).

Pure: `guard_step` maps (state, now, telemetry) to a new state and a transition.
Telemetry passed here must already be fresh and not recovering (the loop checks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

from planner_svc.control.telemetry import Telemetry


class Mode(StrEnum):
    PLANNED = "planned"
    FALLBACK = "fallback"


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidatedRange:
    """Where the installed plan was validated; None = unchecked."""

    active_keys_min: int = 0
    active_keys_max: int | None = None
    p99_ms_max: float | None = None
    hit_rate_min: float | None = None

    def violations(self, telemetry: Telemetry, mode: Mode) -> list[str]:
        """Human-readable reasons why `telemetry` is outside the range (empty = inside)."""
        found = _active_set_violations(self, telemetry.active_keys)
        if mode is Mode.PLANNED:
            found += _service_violations(self, telemetry)
        return found

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _active_set_violations(r: ValidatedRange, active: int) -> list[str]:
    if active < r.active_keys_min:
        return [f"active set {active} keys is below the validated {r.active_keys_min}"]
    if r.active_keys_max is not None and active > r.active_keys_max:
        return [f"active set {active} keys is above the validated {r.active_keys_max}"]
    return []


def _service_violations(r: ValidatedRange, t: Telemetry) -> list[str]:
    found = []
    if r.p99_ms_max is not None and t.p99_ms is not None and t.p99_ms > r.p99_ms_max:
        found.append(f"p99 {t.p99_ms:.0f} ms is above the validated {r.p99_ms_max:.0f} ms")
    if r.hit_rate_min is not None and t.hit_rate < r.hit_rate_min:
        found.append(f"hit rate {t.hit_rate:.1%} is below the validated {r.hit_rate_min:.1%}")
    return found


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardState:
    """Current mode, an operator override, and since when the fleet has been in range."""

    mode: Mode = Mode.PLANNED
    forced: Mode | None = None
    in_range_since_s: float | None = None
    released: bool = False  # an operator released a forced mode: resume without dwell
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": str(self.mode),
            "forced": None if self.forced is None else str(self.forced),
            "in_range_since_s": self.in_range_since_s,
            "released": self.released,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GuardState:
        forced = data["forced"]
        return cls(
            mode=Mode(data["mode"]),
            forced=None if forced is None else Mode(forced),
            in_range_since_s=data["in_range_since_s"],
            released=data["released"],
            reason=data["reason"],
        )


@dataclass(frozen=True, slots=True)
class GuardVerdict:
    """The guard's new state and, when the mode changed, the new mode."""

    state: GuardState
    changed_to: Mode | None = None


def force(state: GuardState, mode: Mode | None, reason: str) -> GuardVerdict:
    """Operator override (`mode`), or release of one (`None`)."""
    if mode is None:
        # The next in-range window resumes at once: the operator has decided.
        return GuardVerdict(replace(state, forced=None, released=True, reason="operator released"))
    new = replace(state, mode=mode, forced=mode, released=False, reason=f"operator: {reason}")
    return GuardVerdict(new, mode if mode is not state.mode else None)


def guard_step(
    state: GuardState,
    now_s: float,
    telemetry: Telemetry | None,
    validated: ValidatedRange,
    resume_dwell_s: float,
) -> GuardVerdict:
    """Advance the guard by one control step on fresh telemetry (None = no evidence)."""
    if state.forced is not None or telemetry is None:
        return GuardVerdict(state)
    problems = validated.violations(telemetry, state.mode)
    if problems:
        reason = "; ".join(problems)
        changed = Mode.FALLBACK if state.mode is Mode.PLANNED else None
        fallen = replace(state, mode=Mode.FALLBACK, in_range_since_s=None, released=False)
        return GuardVerdict(replace(fallen, reason=reason), changed)
    if state.mode is Mode.PLANNED:
        return GuardVerdict(replace(state, in_range_since_s=None, released=False, reason=""))
    return _maybe_resume(state, now_s, resume_dwell_s)


def _maybe_resume(state: GuardState, now_s: float, dwell_s: float) -> GuardVerdict:
    since = now_s if state.in_range_since_s is None else state.in_range_since_s
    if state.released or now_s - since >= dwell_s:
        reason = f"back in the validated range for {max(0.0, now_s - since):.0f} s"
        return GuardVerdict(GuardState(mode=Mode.PLANNED, reason=reason), Mode.PLANNED)
    return GuardVerdict(replace(state, in_range_since_s=since))
