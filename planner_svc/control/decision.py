"""The install decision: deterministic ski rental, and the record every decision leaves.

Keeping a stale plan is renting (staleness, paid per second); installing the
candidate is buying (its rewarm cost, paid once). The deterministic ski-rental
rule buys once the rent paid since the last purchase reaches the price:

    install  iff  S ≥ rewarm × (1 + hysteresis)  and  S > 0,
    S = ∫ staleness rate dt since the last install (trapezoid over control steps).

Against any future staleness this pays at most (2 + hysteresis) × the offline
optimum plus one step's rent (the overshoot of a discrete step). Before the rule
runs, the minimum dwell keeps a fresh plan in place, and the move clamp refuses a
candidate that moves more traffic than one install may (the caller can ask
`repack` for a smaller step and offer it next time).

Pure: floats in, (action, reason) out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from planner_svc.control.drift import Drift


class Action(StrEnum):
    INSTALL = "install"  # install the candidate now
    KEEP = "keep"  # keep the installed plan (renting is still cheaper)
    SKIP = "skip"  # no decision possible: stale or recovering telemetry, fallback, clamp
    FALLBACK = "fallback"  # switch routers to Flat-LB
    RESUME = "resume"  # leave Flat-LB, back to the installed plan


@dataclass(frozen=True, slots=True, kw_only=True)
class Penalties:
    """Penalty figures of one step. Rates in tokens/s, amounts in tokens (see `units`)."""

    staleness_rate_modelled: float = 0.0
    staleness_rate_measured: float | None = None
    staleness_accumulated: float = 0.0
    rewarm_cost: float = 0.0
    measured_used: bool = False

    @property
    def staleness_rate_used(self) -> float:
        if self.measured_used and self.staleness_rate_measured is not None:
            return self.staleness_rate_measured
        return self.staleness_rate_modelled


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """One control step's outcome, with every figure it rests on."""

    id: int
    at_s: float
    action: Action
    reason: str
    drift: Drift
    penalties: Penalties
    moved_traffic_share: float = 0.0
    needs_smaller_step: bool = False
    mode: str = "planned"
    installed: str = ""  # the version ("epoch.seq") this decision installed, if any
    request_id: str = ""  # the operator's request that made it, if any

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe plain dict (the decision log's record format)."""
        data = asdict(self)
        data["action"] = str(self.action)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        return cls(
            **{
                **data,
                "action": Action(data["action"]),
                "drift": Drift(**data["drift"]),
                "penalties": Penalties(**data["penalties"]),
            }
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Figures:
    """The priced candidate: what `step` decides on, and a `Replan` dry run shows."""

    drift: Drift = field(default_factory=Drift)
    staleness_rate_modelled: float = 0.0
    staleness_rate_measured: float | None = None
    rewarm_formula_tokens: float = 0.0
    rewarm_cost: float = 0.0
    rewarm_time_s: float = 0.0
    moved_traffic_share: float = 0.0

    @property
    def measured_used(self) -> bool:
        return self.staleness_rate_measured is not None

    @property
    def staleness_rate(self) -> float:
        measured = self.staleness_rate_measured
        return self.staleness_rate_modelled if measured is None else measured


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionSettings:
    """Knobs of the rule: hysteresis margin, minimum dwell, largest traffic share one
    install may move (1.0 = no clamp)."""

    hysteresis: float = 0.1
    min_dwell_s: float = 0.0
    max_moved_traffic_share: float = 1.0


def accumulate(accumulated: float, previous_rate: float, rate: float, dt_s: float) -> float:
    """S after one more step: trapezoid of the staleness rate over `dt_s` seconds."""
    return accumulated + 0.5 * (previous_rate + rate) * max(0.0, dt_s)


def ski_rental(
    *,
    accumulated: float,
    rewarm_cost: float,
    since_install_s: float,
    moved_share: float,
    settings: DecisionSettings,
) -> tuple[Action, str, bool]:
    """(action, reason, needs_smaller_step) for a plan that is fresh and telemetry that holds."""
    price = rewarm_cost * (1.0 + settings.hysteresis)
    if since_install_s < settings.min_dwell_s:
        return Action.KEEP, _dwell(since_install_s, settings.min_dwell_s), False
    if accumulated <= 0 or accumulated < price:
        return Action.KEEP, _renting(accumulated, rewarm_cost, settings.hysteresis), False
    if moved_share > settings.max_moved_traffic_share:
        return Action.SKIP, _clamped(moved_share, settings.max_moved_traffic_share), True
    return (
        Action.INSTALL,
        _buying(accumulated, rewarm_cost, settings.hysteresis, moved_share),
        False,
    )


def _dwell(since_s: float, dwell_s: float) -> str:
    return f"the plan was installed {since_s:.0f} s ago, under the {dwell_s:.0f} s minimum dwell"


def _renting(accumulated: float, rewarm: float, hysteresis: float) -> str:
    return (
        f"accumulated staleness {accumulated:.3g} tokens is below the candidate's rewarm cost "
        f"{rewarm:.3g} tokens × {1 + hysteresis:.2f}: keeping the installed plan is cheaper"
    )


def _clamped(moved: float, limit: float) -> str:
    return (
        f"staleness would pay for the candidate, but it moves {moved:.1%} of traffic, above the "
        f"{limit:.1%} one install may move: ask repack for a smaller step"
    )


def _buying(accumulated: float, rewarm: float, hysteresis: float, moved: float) -> str:
    return (
        f"accumulated staleness {accumulated:.3g} tokens reached the candidate's rewarm cost "
        f"{rewarm:.3g} tokens × {1 + hysteresis:.2f}: install it (moves {moved:.1%} of traffic)"
    )
