"""The planner's control loop: state plus one `step` per control interval.

The service calls, every interval:

    candidate = repack(installed, keys, rates, config)          # planning core
    decision = loop.step(now_s, installed=installed, traffic=Traffic(keys, rates, tokens,
                         window_end_s), candidate=candidate, telemetry=Telemetry(...))
    if decision.action is Action.INSTALL and publish(candidate):
        loop.record_install(now_s)
    elif decision.action in (Action.FALLBACK, Action.RESUME):
        switch routers' mode
    if decision.needs_smaller_step: offer a smaller repack next interval

Inputs of `step` (all plain data):
- `now_s`: the planner's clock in seconds (any epoch, monotone);
- `installed`: the `RoutingPlan` routers follow now;
- `traffic`: current per-key rates (`Traffic`, see `control.traffic`);
- `candidate`: the plan `repack` proposes under those rates, or None;
- `telemetry`: the stream's newest complete window (`Telemetry`), or None when
  the stream reports no hit statistics (then only the modelled staleness exists);
- `fleet`: the destinations as configured now (`DestinationSpec`s), or None to
  evaluate the installed plan on its own list. Pass it: a plan whose keys sit on
  a drained or removed destination is then priced as serving them cold.

What a step does, in order:
1. learn from fresh telemetry: follow the rewarm dip of the last install until
   the hit rate settles, then update the rewarm factor (measured dip / formula)
   and take that window as the baseline for measured staleness; update Δh;
2. run the guard (fallback / resume);
3. refuse to act on stale rates or on stale / recovering telemetry (SKIP, and
   the staleness integral does not advance over that gap);
4. price the candidate (drift, modelled and measured staleness rate, rewarm
   cost, moved traffic) and add the staleness rate to S (trapezoid);
5. decide by ski rental (`decision.ski_rental`), or SKIP while the last
   install is still rewarming.

`snapshot()` / `restore()` turn the whole state into a JSON-safe dict and back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from planner_svc.control.decision import (
    Action,
    Decision,
    DecisionSettings,
    Figures,
    Penalties,
    accumulate,
    ski_rental,
)
from planner_svc.control.delivery import DeliveryReport
from planner_svc.control.dip import InstallRecord, Settling
from planner_svc.control.drift import measure_drift
from planner_svc.control.guard import (
    GuardSettings,
    GuardState,
    Mode,
    ValidatedRange,
    force,
    guard_step,
)
from planner_svc.control.penalties import (
    RewarmFactor,
    WarmAdvantage,
    measured_decline_rate,
    measured_staleness_rate,
    modelled_staleness_rate,
    rewarm_formula,
    rewarm_time_s,
    useful_work_rate,
)
from planner_svc.control.telemetry import Telemetry
from planner_svc.control.traffic import Fleet, Traffic, moved_traffic_share
from router_client.plan import RoutingPlan

SNAPSHOT_SCHEMA = 1


@dataclass(frozen=True, kw_only=True)
class LoopSettings:
    """Every knob of the loop. Times in seconds."""

    decision: DecisionSettings = field(default_factory=DecisionSettings)
    warmup_s: float = 5.0  # engine warm-up added to each τ_b
    overload_weight: float = 1.0
    max_rates_age_s: float = 60.0  # older rates: SKIP
    max_telemetry_age_s: float = 60.0  # older telemetry: SKIP
    min_measured_requests: int = 1000  # evidence needed to decide on measured staleness
    settle_tolerance: float = 0.005  # hit-rate change between windows that counts as settled
    min_settle_s: float = 0.0
    # A dip is over after `settle_span` × its expected duration (τ̄ of the moved traffic), at
    # most `max_settle_s`, even if drift keeps the hit rate moving.
    settle_span: float = 3.0
    max_settle_s: float = 600.0
    guard: GuardSettings = field(default_factory=GuardSettings)
    # While an install rewarms, the guard falls back only once the validated range has been
    # left for this long (or its own `enter_after_s`, if longer): the install's dip is a
    # transient the loop priced when it bought the move, and falling back moves everything.
    # The demo fell back 5 s after an install that moved 16 % of its traffic (p99 4.1 s
    # against 3.5 s for ~10 s), then resumed, and again. Bounded: a violation that outlasts
    # it still falls back.
    rewarm_enter_after_s: float = 30.0
    history_limit: int = 100


class ControlLoop:
    """Staleness accumulator, install history and learned factors; `step` decides."""

    def __init__(
        self, settings: LoopSettings | None = None, *, validated: ValidatedRange | None = None
    ) -> None:
        self.settings = settings or LoopSettings()
        self.validated = validated or ValidatedRange()
        self.accumulated = 0.0  # S, tokens
        self.warm = WarmAdvantage()
        self.rewarm = RewarmFactor()
        self.guard = GuardState()
        self.installs: list[InstallRecord] = []
        self.baseline: Telemetry | None = None
        self.baseline_useful: float | None = None  # modelled useful(installed) at the baseline
        self.settling: Settling | None = None
        self.last_decision: Decision | None = None
        self.last_figures: Figures | None = None
        self._rate = 0.0  # staleness rate used at the previous step
        self._last_step_s: float | None = None
        self._last_install_s: float | None = None
        self._last_window_s: float | None = None
        self.last_window: Telemetry | None = None  # newest usable telemetry seen

    # --- pricing -------------------------------------------------------------

    def price(
        self,
        installed: RoutingPlan,
        traffic: Traffic,
        candidate: RoutingPlan | None = None,
        telemetry: Telemetry | None = None,
        fleet: Fleet | None = None,
    ) -> Figures:
        """Drift, staleness rates and the candidate's rewarm cost, without deciding.

        `fleet` is the current destination list (None: the installed plan's own); keys the
        installed plan pins only to destinations that left it are priced as cold."""
        drift = measure_drift(installed, traffic, candidate, fleet)
        w, s = self.warm, self.settings
        modelled = 0.0
        if candidate is not None:
            modelled = modelled_staleness_rate(
                installed, candidate, traffic, w, s.overload_weight, fleet
            )
        measured = self._measured_rate(installed, traffic, telemetry, modelled, fleet)
        if candidate is None:
            return Figures(drift=drift, staleness_rate_measured=measured)
        formula = rewarm_formula(installed, candidate, traffic, w, s.warmup_s)
        return Figures(
            drift=drift,
            staleness_rate_modelled=modelled,
            staleness_rate_measured=measured,
            rewarm_formula_tokens=formula,
            rewarm_cost=formula * self.rewarm.value,
            rewarm_time_s=rewarm_time_s(installed, candidate, traffic, s.warmup_s),
            moved_traffic_share=moved_traffic_share(installed, candidate, traffic),
        )

    def _measured_rate(
        self,
        installed: RoutingPlan,
        traffic: Traffic,
        telemetry: Telemetry | None,
        modelled: float,
        fleet: Fleet | None,
    ) -> float | None:
        base, base_useful = self.baseline, self.baseline_useful
        if telemetry is None or base is None or base_useful is None or self.settling is not None:
            return None
        if telemetry.requests < self.settings.min_measured_requests:
            return None
        if telemetry.window_end_s <= base.window_end_s:
            return None  # the baseline window itself: nothing measured against it yet
        weight = self.settings.overload_weight
        tokens = traffic.mean_tokens_per_request()
        measured_decline = measured_decline_rate(
            telemetry, base, installed, tokens, self.warm, weight, fleet
        )
        now_useful = useful_work_rate(installed, traffic, self.warm, weight, fleet)
        modelled_decline = base_useful - now_useful
        return measured_staleness_rate(modelled, modelled_decline, measured_decline)

    # --- the step --------------------------------------------------------------

    def step(
        self,
        now_s: float,
        *,
        installed: RoutingPlan,
        traffic: Traffic,
        candidate: RoutingPlan | None = None,
        telemetry: Telemetry | None = None,
        fleet: Fleet | None = None,
        delivery: DeliveryReport | None = None,
    ) -> Decision:
        """Run one control step at `now_s` and return its decision (see module docstring).
        `delivery`: the installed plan's predicted vs served figures (a guard condition)."""
        usable, unusable_reason = self._usable(now_s, telemetry)
        if usable is not None:
            self._learn(usable)
            self._anchor_baseline(installed, traffic, fleet)
        verdict = guard_step(self.guard, now_s, self._guard_view(usable), self.validated,
                             self._guard_settings(), delivery)
        self.guard = verdict.state
        figures = self.price(installed, traffic, candidate, usable, fleet)
        self.last_figures = figures
        dt = 0.0 if self._last_step_s is None else now_s - self._last_step_s
        self._last_step_s = now_s
        if verdict.changed_to is not None:
            return self._mode_changed(now_s, verdict.changed_to, figures)
        if self.guard.mode is Mode.FALLBACK:
            reason = f"in Flat-LB fallback ({self.guard.reason}): the plan is not serving"
            return self._emit(now_s, Action.SKIP, reason, figures)
        stale = self._rates_stale(now_s, traffic) or unusable_reason
        if stale:
            return self._emit(now_s, Action.SKIP, f"not acting: {stale}", figures)
        self.accumulated = accumulate(self.accumulated, self._rate, figures.staleness_rate, dt)
        self._rate = figures.staleness_rate
        return self._decide(now_s, candidate, figures)

    def _decide(self, now_s: float, candidate: RoutingPlan | None, figures: Figures) -> Decision:
        if candidate is None:
            return self._emit(now_s, Action.KEEP, "no candidate plan this step", figures)
        if self.settling is not None:
            reason = (
                "not acting on recovering telemetry: the install "
                f"{now_s - self.settling.since_s:.0f} s ago "
                "is still rewarming (its hit rate has not settled)"
            )
            return self._emit(now_s, Action.SKIP, reason, figures)
        action, reason, smaller = self.rule(now_s, figures)
        return self._emit(now_s, action, reason, figures, needs_smaller_step=smaller)

    def rule(self, now_s: float, figures: Figures) -> tuple[Action, str, bool]:
        """The install rule (ski rental with hysteresis, dwell and clamp) on `figures`: the
        one place it is decided, for the loop's own steps and for an operator's replan."""
        since = float("inf") if self._last_install_s is None else now_s - self._last_install_s
        return ski_rental(
            accumulated=self.accumulated,
            rewarm_cost=figures.rewarm_cost,
            since_install_s=since,
            moved_share=figures.moved_traffic_share,
            settings=self.settings.decision,
        )

    def _usable(self, now_s: float, t: Telemetry | None) -> tuple[Telemetry | None, str]:
        if t is None:
            return None, ""
        if t.recovering:
            return None, "the stream reports recovering state"
        age = t.age_s(now_s)
        if age > self.settings.max_telemetry_age_s:
            return (
                None,
                f"telemetry is {age:.0f} s old (limit {self.settings.max_telemetry_age_s:.0f} s)",
            )
        return t, ""

    def _rates_stale(self, now_s: float, traffic: Traffic) -> str:
        age = now_s - traffic.window_end_s
        if age > self.settings.max_rates_age_s:
            return f"rates are {age:.0f} s old (limit {self.settings.max_rates_age_s:.0f} s)"
        return ""

    # --- learning ------------------------------------------------------------

    def _learn(self, t: Telemetry) -> None:
        if self._last_window_s is not None and t.window_end_s <= self._last_window_s:
            return  # this window was already seen
        self._last_window_s = t.window_end_s
        self.last_window = t
        if self.settling is not None:
            self._follow_dip(self.settling, t)
            return
        if self.baseline is None and self.guard.mode is Mode.PLANNED:
            self.baseline = t
        self._learn_warm_advantage(t)

    def _anchor_baseline(
        self, installed: RoutingPlan, traffic: Traffic, fleet: Fleet | None
    ) -> None:
        # The model's view of the installed plan when the baseline window was taken, so the
        # measured decline can replace the modelled one (penalties.measured_staleness_rate).
        if self.baseline is not None and self.baseline_useful is None:
            weight = self.settings.overload_weight
            self.baseline_useful = useful_work_rate(installed, traffic, self.warm, weight, fleet)

    def _learn_warm_advantage(self, t: Telemetry) -> None:
        cold = t.fallback_hit_rate
        if cold is None or t.requests < self.settings.min_measured_requests:
            return
        if t.planned_hit_rate is not None:
            self.warm = self.warm.observe(t.planned_hit_rate, cold)
        if t.key_hit_rates:
            keys = list(t.key_hit_rates)
            hits = np.fromiter(t.key_hit_rates.values(), np.float64, count=len(keys))
            self.warm = self.warm.observe_keys(keys, hits, cold)

    def _follow_dip(self, settling: Settling, t: Telemetry) -> None:
        if t.window_start_s < settling.since_s:
            return  # still mixes in traffic from before the install
        settling = settling.with_sample(t.window_end_s, t.hit_rate, t.prompt_tokens_per_s)
        self.settling = settling
        if settling.settled(self.settings.settle_tolerance):
            self._end_dip(settling, t)

    def _end_dip(self, settling: Settling, t: Telemetry) -> None:
        if settling.measurable:
            dip = settling.dip_tokens()
            self.rewarm = self.rewarm.observe(dip, settling.predicted_tokens)
            if self.installs and self.installs[-1].at_s == settling.since_s:
                self.installs[-1] = replace(self.installs[-1], measured_dip_tokens=dip)
        self.settling = None
        self.baseline, self.baseline_useful = t, None

    # --- installs and modes ----------------------------------------------------

    def record_install(
        self, now_s: float, *, figures: Figures | None = None, forced: bool = False
    ) -> InstallRecord:
        """Tell the loop a plan was published at `now_s` (priced by `figures`, default:
        the last step's candidate). Resets S and starts following the rewarm dip."""
        f = figures if figures is not None else (self.last_figures or Figures())
        record = InstallRecord(
            at_s=now_s,
            predicted_tokens=f.rewarm_formula_tokens,
            rewarm_cost=f.rewarm_cost,
            moved_traffic_share=f.moved_traffic_share,
            forced=forced,
        )
        self.installs = [*self.installs, record][-self.settings.history_limit :]
        self.accumulated, self._rate = 0.0, 0.0
        self._last_install_s = now_s
        self._start_dip(now_s, f.rewarm_formula_tokens, f.rewarm_time_s, self._expected_hit(f))
        return record

    def _expected_hit(self, f: Figures) -> float | None:
        before = self.last_window
        if before is None or before.prompt_tokens_per_s <= 0:
            return None
        return min(1.0, before.hit_rate + f.staleness_rate_modelled / before.prompt_tokens_per_s)

    def _start_dip(
        self,
        now_s: float,
        predicted_tokens: float,
        expected_s: float,
        reference_hit: float | None = None,
    ) -> None:
        s = self.settings
        min_settle = min(max(s.min_settle_s, expected_s), s.max_settle_s)
        longest = min(max(min_settle, s.settle_span * expected_s), s.max_settle_s)
        self.settling = Settling(
            since_s=now_s,
            predicted_tokens=predicted_tokens,
            min_settle_s=min_settle,
            max_settle_s=longest,
            reference_hit=reference_hit,
        )
        self.baseline, self.baseline_useful = None, None

    def set_validated_range(self, validated: ValidatedRange) -> None:
        """Record the range the installed plan was validated for (shadow replay / canary)."""
        self.validated = validated

    def guard_only(self, now_s: float, telemetry: Telemetry | None,
                   delivery: DeliveryReport | None = None) -> Decision | None:
        """The guard alone, for steps where the plan itself is held (an operator's rollback
        pins the plan, not the safety net): a decision when the mode changes, else None."""
        usable, _ = self._usable(now_s, telemetry)
        verdict = guard_step(self.guard, now_s, self._guard_view(usable), self.validated,
                             self._guard_settings(), delivery)
        self.guard = verdict.state
        if verdict.changed_to is None:
            return None
        return self._mode_changed(now_s, verdict.changed_to, self.last_figures or Figures())

    def _guard_settings(self) -> GuardSettings:
        """The guard's settings for this step: while an install rewarms (planned mode), a
        violation must last `rewarm_enter_after_s` before the fleet goes to Flat-LB."""
        g = self.settings.guard
        if self.settling is None or self.guard.mode is not Mode.PLANNED:
            return g
        return replace(g, enter_after_s=max(g.enter_after_s, self.settings.rewarm_enter_after_s))

    def _guard_view(self, usable: Telemetry | None) -> Telemetry | None:
        """What the guard judges. While an install rewarms, the predicted affinity gain
        does not send the fleet to Flat-LB: the gain reads each key's reusable prefix from
        what the engines served from cache, and caches still warming under the plan have
        served little (the arena's four gateways fell back 4 s after their first plan on a
        predicted 9.3 pp and served 74 % against 94 % with one, `bench/arena.py
        --warmup-s 45`). In fallback it still counts, so a resume waits for the gain."""
        if usable is None or self.settling is None or self.guard.mode is not Mode.PLANNED:
            return usable
        return replace(usable, affinity_gain=None)

    def force_mode(self, now_s: float, mode: Mode | None, reason: str) -> Decision:
        """Operator override: force `mode` until released with `mode=None`."""
        verdict = force(self.guard, mode, reason)
        self.guard = verdict.state
        figures = self.last_figures or Figures()
        if verdict.changed_to is not None:
            return self._mode_changed(now_s, verdict.changed_to, figures)
        text = "operator released the forced mode" if mode is None else f"operator: {reason}"
        return self._emit(now_s, Action.KEEP, text, figures)

    def _mode_changed(self, now_s: float, mode: Mode, figures: Figures) -> Decision:
        if mode is Mode.FALLBACK:
            reason = f"fall back to Flat-LB: {self.guard.reason}"
            return self._emit(now_s, Action.FALLBACK, reason, figures)
        # Back on the plan: its destinations went cold under Flat-LB, follow that dip too.
        self._start_dip(now_s, 0.0, self.settings.warmup_s)
        self.accumulated, self._rate = 0.0, 0.0
        reason = f"resume the plan: {self.guard.reason}"
        return self._emit(now_s, Action.RESUME, reason, figures)

    # --- records ----------------------------------------------------------------

    def _emit(
        self,
        now_s: float,
        action: Action,
        reason: str,
        figures: Figures,
        *,
        needs_smaller_step: bool = False,
    ) -> Decision:
        penalties = Penalties(
            staleness_rate_modelled=figures.staleness_rate_modelled,
            staleness_rate_measured=figures.staleness_rate_measured,
            staleness_accumulated=self.accumulated,
            rewarm_cost=figures.rewarm_cost,
            measured_used=figures.measured_used,
        )
        decision = Decision(
            id=0,  # numbered by whoever keeps the decision log (the planner)
            at_s=now_s,
            action=action,
            reason=reason,
            drift=figures.drift,
            penalties=penalties,
            moved_traffic_share=figures.moved_traffic_share,
            needs_smaller_step=needs_smaller_step,
            mode=str(self.guard.mode),
        )
        self.last_decision = decision
        return decision

    # --- persistence ------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The loop's whole state as a JSON-safe dict (settings are not included)."""
        return {
            "schema": SNAPSHOT_SCHEMA,
            "accumulated": self.accumulated,
            "rate": self._rate,
            "last_step_s": self._last_step_s,
            "last_install_s": self._last_install_s,
            "last_window_s": self._last_window_s,
            "warm": self.warm.to_dict(),
            "rewarm": self.rewarm.to_dict(),
            "guard": self.guard.to_dict(),
            "validated": self.validated.to_dict(),
            "baseline": None if self.baseline is None else self.baseline.to_dict(),
            "last_window": None if self.last_window is None else self.last_window.to_dict(),
            "baseline_useful": self.baseline_useful,
            "settling": None if self.settling is None else self.settling.to_dict(),
            "installs": [asdict(r) for r in self.installs],
            "last_decision": None if self.last_decision is None else self.last_decision.to_dict(),
        }

    @classmethod
    def restore(cls, data: Mapping[str, Any], settings: LoopSettings | None = None) -> ControlLoop:
        """Rebuild a loop from `snapshot()` output."""
        if data.get("schema") != SNAPSHOT_SCHEMA:
            raise ValueError(f"control loop snapshot schema {data.get('schema')!r} is not 1")
        loop = cls(settings, validated=ValidatedRange(**data["validated"]))
        loop.accumulated, loop._rate = data["accumulated"], data["rate"]
        loop._last_step_s, loop._last_install_s = data["last_step_s"], data["last_install_s"]
        loop._last_window_s = data["last_window_s"]
        loop.warm = WarmAdvantage.from_dict(data["warm"])
        loop.rewarm = RewarmFactor.from_dict(data["rewarm"])
        loop.guard = GuardState.from_dict(data["guard"])
        baseline, settling = data["baseline"], data["settling"]
        loop.baseline = None if baseline is None else Telemetry.from_dict(baseline)
        loop.baseline_useful = data["baseline_useful"]
        last = data["last_window"]
        loop.last_window = None if last is None else Telemetry.from_dict(last)
        loop.settling = None if settling is None else Settling.from_dict(settling)
        loop.installs = [InstallRecord(**r) for r in data["installs"]]
        last = data["last_decision"]
        loop.last_decision = None if last is None else Decision.from_dict(last)
        return loop
