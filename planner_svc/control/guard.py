"""The fallback guard (deployment checklist step 5).

A plan is only trusted inside the range it was validated for (shadow replay /
canary): an active-set size, a p99 ceiling, a hit-rate floor, and a largest shortfall
of the served hit rate below what the installed plan predicted (a plan that does not
deliver was built on a wrong model: a q_cap, a cache size or a reuse pattern that
is not the fleet's), and a floor on the hit rate affinity is predicted to win over
Flat-LB on the current traffic (`planning.affinity`: where almost nothing is reusable,
planned routing loses capacity to Flat-LB, so the product serves Flat-LB). When fresh
telemetry leaves that range for `enter_after_s` the guard sends routers to
Flat-LB; when it is back for `resume_dwell_s` (and the fleet has been in fallback
for `min_fallback_s`) the guard resumes the plan.

Rules that keep the guard from flapping (a p99 held at 9 s against a 3.5 s limit
used to flip fallback <-> resume every ~70 s, because fallback ignored the p99):
- The p99 counts in both modes, with hysteresis: entering needs p99 above the
  limit, resuming needs it below `(1 - p99_resume_margin)` x the limit. An overload
  that Flat-LB does not cure keeps the fleet in fallback.
- The hit-rate floor counts only in planned mode: in fallback it is Flat-LB's hit
  rate, lower by construction, and would pin the fleet there. So does the prediction
  gap: a Flat-LB table predicts nothing, and the gap counts only once the plan has
  been measured for `GAP_MIN_WINDOWS` windows after its rewarm dip (persistence). The
  active set counts in both modes (it does not depend on routing), and so does the
  predicted affinity gain (a property of the traffic: keys, rates, prefix and prompt sizes,
  cache size), so traffic with too little to win stays on Flat-LB until that changes.
- The predicted gain sends a planned fleet to Flat-LB only when `gain_low_windows`
  consecutive windows agree (a window is one estimate from a few seconds of traffic; one
  low one right after a rewarm dip, or in a lull, is noise, and the fallback it triggers
  would cost the plan's whole warm cache). A window whose gain is unknown neither counts
  nor resets the run.
- Each fallback entered within `2 x` the dwell of the last resume doubles the next
  dwell (up to `max_resume_dwell_s`): a plan that fails again as soon as it resumes
  waits longer each time.
- An operator's forced mode overrides the guard until released; a release that finds
  the fleet in range resumes at once (the operator already waited).

Pure: `guard_step` maps (state, now, telemetry, settings) to a new state and a
transition. Telemetry passed here must already be fresh and not recovering.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

from planner_svc.control.delivery import DeliveryReport
from planner_svc.control.telemetry import Telemetry

# Windows measured after the rewarm dip before a prediction gap counts: one window can be
# a burst; the report's figure is the mean over these.
GAP_MIN_WINDOWS = 3


# The product's default floor on the predicted affinity gain (planner setting
# `validated_affinity_gain_min`): the low-reuse replay predicts 6 pp, where planned routing has
# 22 % less capacity than Flat-LB; paper-like predicts 77 pp and whales 26 pp (docs/replay.md).
DEFAULT_AFFINITY_GAIN_MIN = 0.10
# Low-gain windows in a row before the gain sends a planned fleet to Flat-LB: one window
# after a rewarm dip reads caches that have served little yet.
DEFAULT_GAIN_LOW_WINDOWS = 3


class Mode(StrEnum):
    PLANNED = "planned"
    FALLBACK = "fallback"


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardSettings:
    """How long the range must be left before falling back, and restored before resuming."""

    enter_after_s: float = 0.0
    resume_dwell_s: float = 60.0
    min_fallback_s: float = 0.0
    p99_resume_margin: float = 0.1  # resume needs p99 <= (1 - margin) x the validated p99
    max_resume_dwell_s: float = 3600.0
    # Consecutive windows with the predicted affinity gain below its floor before it sends a
    # planned fleet to Flat-LB (see the module doc); 1 = the first such window does.
    gain_low_windows: int = DEFAULT_GAIN_LOW_WINDOWS

    def __post_init__(self) -> None:
        if not (isinstance(self.gain_low_windows, int) and self.gain_low_windows >= 1):
            raise ValueError(f"guard gain_low_windows must be an integer >= 1, got "
                             f"{self.gain_low_windows!r}")
        for name in ("enter_after_s", "resume_dwell_s", "min_fallback_s", "max_resume_dwell_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"guard {name} must be >= 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.p99_resume_margin < 1.0:
            raise ValueError(f"guard p99_resume_margin must be in [0, 1), got "
                             f"{self.p99_resume_margin!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidatedRange:
    """Where the installed plan was validated; None = unchecked."""

    active_keys_min: int = 0
    active_keys_max: int | None = None
    p99_ms_max: float | None = None
    hit_rate_min: float | None = None
    hit_gap_max: float | None = None  # largest tolerated (predicted − served) hit rate
    # Smallest predicted affinity gain (Telemetry.affinity_gain) worth planning for: below
    # it pinning keys costs more balance than the prefill it saves, so Flat-LB serves.
    affinity_gain_min: float | None = None

    def violations(self, telemetry: Telemetry, mode: Mode,
                   p99_resume_margin: float = 0.0,
                   delivery: DeliveryReport | None = None, *, gain: bool = True) -> list[str]:
        """Human-readable reasons why `telemetry` (and the installed plan's `delivery`)
        are outside the range (empty = inside). In fallback the p99 must be below the
        limit by `p99_resume_margin`, and neither the hit rate nor the prediction gap is
        checked (see the module docstring); `gain=False` leaves the predicted gain out."""
        found = _active_set_violations(self, telemetry.active_keys)
        if gain:
            found += _gain_violations(self, telemetry)
        if mode is Mode.PLANNED:
            found += _p99_violations(self, telemetry, 0.0)
            found += _hit_violations(self, telemetry)
            found += _gap_violations(self, delivery)
        else:
            found += _p99_violations(self, telemetry, p99_resume_margin)
        return found

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _active_set_violations(r: ValidatedRange, active: int) -> list[str]:
    if active < r.active_keys_min:
        return [f"active set {active} keys is below the validated {r.active_keys_min}"]
    if r.active_keys_max is not None and active > r.active_keys_max:
        return [f"active set {active} keys is above the validated {r.active_keys_max}"]
    return []


def _gain_violations(r: ValidatedRange, t: Telemetry) -> list[str]:
    if r.affinity_gain_min is None or t.affinity_gain is None:
        return []
    if t.affinity_gain >= r.affinity_gain_min:
        return []
    return [f"predicted affinity gain {t.affinity_gain * 100:.1f} pp of prompt tokens is "
            f"below the {r.affinity_gain_min * 100:.1f} pp worth planning for"]


def _p99_violations(r: ValidatedRange, t: Telemetry, margin: float) -> list[str]:
    if r.p99_ms_max is None or t.p99_ms is None:
        return []
    limit = r.p99_ms_max * (1.0 - margin)
    if t.p99_ms <= limit:
        return []
    if margin:
        return [f"p99 {t.p99_ms:.0f} ms is above {limit:.0f} ms (the validated "
                f"{r.p99_ms_max:.0f} ms less the {margin:.0%} resume margin)"]
    return [f"p99 {t.p99_ms:.0f} ms is above the validated {r.p99_ms_max:.0f} ms"]


def _hit_violations(r: ValidatedRange, t: Telemetry) -> list[str]:
    if r.hit_rate_min is not None and t.hit_rate < r.hit_rate_min:
        return [f"hit rate {t.hit_rate:.1%} is below the validated {r.hit_rate_min:.1%}"]
    return []


def _gap_violations(r: ValidatedRange, d: DeliveryReport | None) -> list[str]:
    if r.hit_gap_max is None or d is None or d.windows < GAP_MIN_WINDOWS:
        return []
    gap = d.hit_gap
    if gap is None or -gap <= r.hit_gap_max:
        return []
    assert d.hit_rate is not None and d.predicted.hit_rate is not None
    return [f"plan {d.version} served {d.hit_rate:.1%} over {d.windows} windows, "
            f"{-gap:.1%} below its predicted {d.predicted.hit_rate:.1%} (tolerated "
            f"{r.hit_gap_max:.1%})"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardState:
    """Current mode, an operator override, and the clocks of the guard's rules."""

    mode: Mode = Mode.PLANNED
    forced: Mode | None = None
    in_range_since_s: float | None = None  # in fallback: back in range since
    released: bool = False  # an operator released a forced mode: resume without dwell
    reason: str = ""
    out_of_range_since_s: float | None = None  # in planned mode: out of range since
    fallback_since_s: float | None = None
    planned_since_s: float | None = None
    dwell_s: float | None = None  # the current resume dwell (None: the configured one)
    # In planned mode: consecutive windows with the predicted gain below its floor, and the
    # end of the last one counted (a window judged twice counts once).
    gain_low_windows: int = 0
    gain_window_end_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {f: getattr(self, f) for f in self.__dataclass_fields__}
        data["mode"] = str(self.mode)
        data["forced"] = None if self.forced is None else str(self.forced)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GuardState:
        forced = data["forced"]
        extra = {f: data[f] for f in ("out_of_range_since_s", "fallback_since_s",
                                      "planned_since_s", "dwell_s", "gain_low_windows",
                                      "gain_window_end_s") if f in data}
        return cls(
            mode=Mode(data["mode"]),
            forced=None if forced is None else Mode(forced),
            in_range_since_s=data["in_range_since_s"],
            released=data["released"],
            reason=data["reason"],
            **extra,
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
    settings: GuardSettings | None = None,
    delivery: DeliveryReport | None = None,
) -> GuardVerdict:
    """Advance the guard by one control step on fresh telemetry (None = no evidence);
    `delivery`: the installed plan's predicted vs served figures, if it predicted any."""
    g = settings or GuardSettings()
    if state.forced is not None or telemetry is None:
        return GuardVerdict(state)
    if state.mode is Mode.PLANNED:
        problems = validated.violations(telemetry, state.mode, g.p99_resume_margin, delivery,
                                        gain=False)
        state, gain_problems, waiting = _gain_run(state, telemetry, validated, g)
        return _maybe_fall_back(state, now_s, problems + gain_problems, g, waiting)
    problems = validated.violations(telemetry, state.mode, g.p99_resume_margin, delivery)
    if problems:
        return GuardVerdict(replace(state, in_range_since_s=None, released=False,
                                    reason="; ".join(problems)))
    return _maybe_resume(state, now_s, g)


def _gain_run(state: GuardState, t: Telemetry, validated: ValidatedRange,
              g: GuardSettings) -> tuple[GuardState, list[str], str]:
    """Planned mode: count this window into the run of low predicted gains. Returns the
    new state, the gain's violation once the run is long enough, and else what it waits on."""
    low = _gain_violations(validated, t)
    if t.affinity_gain is None:  # no estimate: the run neither grows nor ends
        run = state.gain_low_windows
        return state, [], (f"predicted affinity gain unknown ({run} of {g.gain_low_windows} "
                           "windows below its floor so far)" if run else "")
    if not low:
        return replace(state, gain_low_windows=0, gain_window_end_s=None), [], ""
    run = state.gain_low_windows
    if state.gain_window_end_s != t.window_end_s:
        run += 1
    state = replace(state, gain_low_windows=run, gain_window_end_s=t.window_end_s)
    if run >= g.gain_low_windows:
        return state, low, ""
    return state, [], f"{low[0]} ({run} of {g.gain_low_windows} windows)"


def _maybe_fall_back(state: GuardState, now_s: float, problems: list[str],
                     g: GuardSettings, waiting: str = "") -> GuardVerdict:
    if not problems:
        return GuardVerdict(replace(state, out_of_range_since_s=None, released=False,
                                    reason=waiting))
    since = now_s if state.out_of_range_since_s is None else state.out_of_range_since_s
    reason = "; ".join(problems)
    if now_s - since < g.enter_after_s:
        waiting = (f"{reason} (for {now_s - since:.0f} s; falls back after "
                   f"{g.enter_after_s:.0f} s)")
        return GuardVerdict(replace(state, out_of_range_since_s=since, reason=waiting))
    dwell = g.resume_dwell_s
    resumed = state.planned_since_s
    if resumed is not None and state.dwell_s is not None and \
            now_s - resumed < 2 * state.dwell_s:  # failed again soon after resuming
        dwell = min(g.max_resume_dwell_s, 2 * state.dwell_s)
    fallen = GuardState(mode=Mode.FALLBACK, fallback_since_s=now_s, dwell_s=dwell,
                        reason=reason)
    return GuardVerdict(fallen, Mode.FALLBACK)


def _maybe_resume(state: GuardState, now_s: float, g: GuardSettings) -> GuardVerdict:
    since = now_s if state.in_range_since_s is None else state.in_range_since_s
    dwell = g.resume_dwell_s if state.dwell_s is None else state.dwell_s
    in_fallback = now_s - (now_s if state.fallback_since_s is None else state.fallback_since_s)
    if state.released or (now_s - since >= dwell and in_fallback >= g.min_fallback_s):
        reason = (f"back in the validated range for {max(0.0, now_s - since):.0f} s "
                  f"(dwell {dwell:.0f} s)")
        return GuardVerdict(GuardState(mode=Mode.PLANNED, planned_since_s=now_s,
                                       dwell_s=dwell, reason=reason), Mode.PLANNED)
    return GuardVerdict(replace(state, in_range_since_s=since,
                                reason=f"in range for {now_s - since:.0f} s of {dwell:.0f} s"))
