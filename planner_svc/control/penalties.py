"""Staleness and rewarm penalties, in lost prefill work (see `units`).

Modelled staleness rate (tokens/s) of keeping `installed` instead of `candidate`:

    max(0, useful(candidate) − useful(installed)),
    useful(plan) = Σ_{b admitted} λ_b · P_b · Δh_b − overload(plan),
    overload(plan) = Σ_d max(0, load_d − cap_d) · P̄ · Δh̄ · overload_weight.

λ are *current* rates, loads the plan's expected per-destination loads under them
and cap_d = q_cap × capacity weight. Requests above a destination's knee are
taken to spill to a cold replica, losing the warm advantage (weight 1); raise
`overload_weight` to price the tail latency they also cost.

Measured staleness rate: the modelled gap with the installed plan's *decline*
replaced by the decline the stream measured since the plan settled:

    max(0, modelled staleness + measured decline − modelled decline),
    measured decline = (h_baseline − h_now) × prompt tokens/s now
                       + measured overload(now) − measured overload(baseline),
    modelled decline = useful(installed) at the baseline − useful(installed) now.

Why not the measured decline alone: it sees what the installed plan lost, never
what a fresh plan would gain (keys that grew outside admission while the
admitted ones kept their hit rate). In the six-interval benchmark a loop that
decided on the decline alone never installed and paid as much as never
replanning. With a perfect model the measured and modelled figures agree; where
the real fleet degrades faster or slower than modelled, the measurement wins.

Rewarm cost (tokens, one-off) of installing `candidate`:

    factor × Σ_b f_b · λ_b · P_b · Δh_b · τ_b,   τ_b = k_b / λ_b + warmup_s,

f_b the share of b's set that is new to it (1 for a newly admitted key). τ_b is
one per-destination inter-arrival plus the engine's warm-up; `factor` corrects
the formula with what earlier installs measured (`RewarmFactor`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from planner_svc.control.telemetry import Telemetry
from planner_svc.control.traffic import (
    Fleet,
    Traffic,
    aligned_rates,
    aligned_tokens,
    capacities,
    expected_loads,
    fleet_of,
    new_member_share,
    served_mask,
)
from router_client.plan import RoutingPlan

# Served-hit gap between a warm planned set and Flat-LB in the paper: 93.2 % vs 64.1 %.
DEFAULT_WARM_ADVANTAGE = 0.3
# Until an install has been measured, assume dips last twice what the formula says:
# over-pricing a rewarm only delays an install, under-pricing it causes flapping.
DEFAULT_REWARM_FACTOR = 2.0


def _ewma(old: float, new: float, alpha: float) -> float:
    return (1.0 - alpha) * old + alpha * new


@dataclass(frozen=True, kw_only=True)
class WarmAdvantage:
    """Δh = h_warm − h_cold, learned globally and per key from measured hit rates."""

    global_value: float = DEFAULT_WARM_ADVANTAGE
    per_key: Mapping[str, float] = field(default_factory=dict)
    observations: int = 0
    alpha: float = 0.3

    def for_keys(self, keys: Sequence[str]) -> np.ndarray:
        """Δh per key: its own estimate where there is one, else the global one."""
        if not self.per_key:
            return np.full(len(keys), self.global_value)
        get, default = self.per_key.get, self.global_value
        return np.fromiter((get(k, default) for k in keys), np.float64, count=len(keys))

    def observe(self, warm_hit: float, cold_hit: float) -> WarmAdvantage:
        """Fold in one measured pair; the first observation replaces the default."""
        sample = float(np.clip(warm_hit - cold_hit, 0.0, 1.0))
        value = sample if self.observations == 0 else _ewma(self.global_value, sample, self.alpha)
        return replace(self, global_value=value, observations=self.observations + 1)

    def observe_keys(
        self, keys: Sequence[str], warm_hits: np.ndarray, cold_hit: float
    ) -> WarmAdvantage:
        """Fold in per-key warm hit rates measured on the keys' planned sets."""
        table = dict(self.per_key)
        for key, hit in zip(keys, np.clip(np.asarray(warm_hits) - cold_hit, 0.0, 1.0), strict=True):
            old = table.get(key)
            table[key] = float(hit) if old is None else _ewma(old, float(hit), self.alpha)
        return replace(self, per_key=table)

    def to_dict(self) -> dict[str, Any]:
        return {
            "global_value": self.global_value,
            "per_key": dict(self.per_key),
            "observations": self.observations,
            "alpha": self.alpha,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WarmAdvantage:
        return cls(**{**data, "per_key": dict(data["per_key"])})


@dataclass(frozen=True, kw_only=True)
class RewarmFactor:
    """measured dip / predicted dip, smoothed; conservative until there is history."""

    value: float = DEFAULT_REWARM_FACTOR
    observations: int = 0
    alpha: float = 0.3
    lower: float = 0.1
    upper: float = 10.0

    def observe(self, measured_tokens: float, predicted_tokens: float) -> RewarmFactor:
        """Fold in one install's measured dip; ignored when nothing was predicted."""
        if predicted_tokens <= 0:
            return self
        ratio = float(np.clip(measured_tokens / predicted_tokens, self.lower, self.upper))
        value = ratio if self.observations == 0 else _ewma(self.value, ratio, self.alpha)
        return replace(self, value=value, observations=self.observations + 1)

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "observations": self.observations, "alpha": self.alpha}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RewarmFactor:
        return cls(**data)


def overload_loss_rate(
    loads: np.ndarray,
    caps: np.ndarray,
    tokens_per_request: float,
    warm_advantage: float,
    weight: float = 1.0,
) -> float:
    """Tokens/s lost by requests above their destination's capacity knee."""
    excess = float(np.maximum(loads - caps, 0.0).sum())
    return excess * tokens_per_request * warm_advantage * weight


def useful_work_rate(
    plan: RoutingPlan,
    traffic: Traffic,
    warm: WarmAdvantage,
    overload_weight: float = 1.0,
    fleet: Fleet | None = None,
) -> float:
    """Warm hit work the plan earns under current traffic, minus its overload loss.

    Keys whose members all left `fleet` (drained, removed) earn nothing: the fallback
    serves them cold."""
    rates = aligned_rates(plan, traffic) * served_mask(plan, fleet)
    gain = float(np.dot(rates, aligned_tokens(plan, traffic) * warm.for_keys(plan.table.keys)))
    loss = overload_loss_rate(
        expected_loads(plan, traffic, fleet),
        capacities(plan, fleet),
        traffic.mean_tokens_per_request(),
        warm.global_value,
        overload_weight,
    )
    return gain - loss


def modelled_staleness_rate(
    installed: RoutingPlan,
    candidate: RoutingPlan,
    traffic: Traffic,
    warm: WarmAdvantage,
    overload_weight: float = 1.0,
    fleet: Fleet | None = None,
) -> float:
    """Tokens/s the candidate would earn over the installed plan, now (never negative)."""
    better = useful_work_rate(candidate, traffic, warm, overload_weight, fleet)
    return max(0.0, better - useful_work_rate(installed, traffic, warm, overload_weight, fleet))


def _measured_overload(
    sample: Telemetry,
    plan: RoutingPlan,
    tokens_per_request: float,
    dh: float,
    weight: float,
    fleet: Fleet | None,
) -> float:
    ids = [d.id for d in fleet_of(plan, fleet)]
    loads = np.array([sample.destination_loads_per_s.get(d, 0.0) for d in ids])
    return overload_loss_rate(loads, capacities(plan, fleet), tokens_per_request, dh, weight)


def measured_decline_rate(
    now: Telemetry,
    baseline: Telemetry,
    plan: RoutingPlan,
    tokens_per_request: float,
    warm: WarmAdvantage,
    overload_weight: float = 1.0,
    fleet: Fleet | None = None,
) -> float:
    """Tokens/s the installed plan lost since its baseline window, as measured (signed)."""
    hit_drop = (baseline.hit_rate - now.hit_rate) * now.prompt_tokens_per_s
    args = (plan, tokens_per_request, warm.global_value, overload_weight, fleet)
    return hit_drop + _measured_overload(now, *args) - _measured_overload(baseline, *args)


def measured_staleness_rate(
    modelled_staleness: float, modelled_decline: float, measured_decline: float
) -> float:
    """The modelled staleness with the modelled decline swapped for the measured one."""
    return max(0.0, modelled_staleness + measured_decline - modelled_decline)


def rewarm_formula(
    installed: RoutingPlan,
    candidate: RoutingPlan,
    traffic: Traffic,
    warm: WarmAdvantage,
    warmup_s: float,
) -> float:
    """Σ f_b λ_b P_b Δh_b τ_b in tokens, before the learned factor.

    Written as f_b P_b Δh_b (k_b + λ_b warmup_s) so a quiet key (λ_b → 0) costs one
    cold miss per new destination instead of dividing by zero.
    """
    share = new_member_share(installed, candidate)
    rates = aligned_rates(candidate, traffic)
    k = candidate.table.replicas().astype(np.float64)
    per_key = aligned_tokens(candidate, traffic) * warm.for_keys(candidate.table.keys)
    return float(np.dot(share * per_key, k + rates * warmup_s))


def rewarm_time_s(
    installed: RoutingPlan, candidate: RoutingPlan, traffic: Traffic, warmup_s: float
) -> float:
    """Moved-traffic-weighted mean τ_b: how long the candidate's dip should last."""
    share = new_member_share(installed, candidate)
    rates = aligned_rates(candidate, traffic)
    moved = float(np.dot(share, rates))
    if moved <= 0:
        return warmup_s
    k = candidate.table.replicas().astype(np.float64)
    return float(np.dot(share, k + rates * warmup_s)) / moved
