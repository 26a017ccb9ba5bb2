"""Did the plan deliver? What a plan predicts at install, against what the stream measures
while it serves (pure). `cacheroute plan report VERSION` and the prediction-gap metric.

Prediction, from the rates the plan was built on and the telemetry the planner held at
install: per-destination load (the plan's own `expected_load_per_s`), its max/mean imbalance
relative to capacity weights, and the served hit rate

    h = s · h_planned + (1 − s) · h_cold

with s the plan's admitted rate share and h_planned / h_cold the hit rates measured on
admitted and cold-tail keys in the last window before the install (a request-weighted mix of
token-weighted rates: the approximation the report is judged by). The first plan has no
measured planned hit rate to go on: its hit prediction is None.

Realized: the token-weighted hit rate and the mean per-destination load over the windows
that began after the install and after its rewarm dip (the dip is reported apart as a window
count), the imbalance of those loads, and each destination's p99 latency (the mean of its
per-window p99s). The dip is over when the control loop saw the hit
rate settle, or for windows that began after the dip's expected duration (the rewarm time of
the moved traffic), whichever comes first: under drift the hit rate never stops moving.

Capacity: the plan also predicts whether the fleet is overloaded. A destination's predicted
utilisation is its expected load over q_cap × its capacity weight; utilisation ≤ 1 promises
latency inside the validated p99 (the guard's `p99_ms_max`, the only latency target the
operator states). A wrong q_cap shows as that promise broken either way (`check_capacity`):
- *overstated*: a destination ran at or below q_cap, yet its p99 exceeded the target (the
  engines saturate below q_cap, so hot keys get too few replicas);
- *understated*: the fleet ran well above q_cap on average, yet every p99 stayed under half the
  target (the engines have capacity to spare, so keys are replicated over more caches than
  their load needs, k_b = ⌈rate / q_cap⌉, and each copy warms a fraction of the traffic).
The hit rate alone cannot show a wrong q_cap: the prediction is made from hit rates measured
under the same q_cap, so a plan that over-replicates predicts, and delivers, its lower hit.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from planner_svc.control.telemetry import Telemetry
from planner_svc.planning.stats import imbalance


@dataclass(frozen=True, slots=True)
class Prediction:
    destinations: tuple[str, ...]
    weights: tuple[float, ...]
    loads_per_s: tuple[float, ...]
    imbalance: float
    hit_rate: float | None
    q_cap: float = 0.0  # records from before the capacity check have none

    @property
    def utilisation(self) -> tuple[float, ...]:
        """Each destination's expected load over its capacity (q_cap × weight)."""
        return utilisation(self.loads_per_s, self.weights, self.q_cap)


def utilisation(loads: Sequence[float], weights: Sequence[float],
                q_cap: float) -> tuple[float, ...]:
    if q_cap <= 0:
        return ()
    return tuple(float(x) / (q_cap * w) if w > 0 else math.inf
                 for x, w in zip(loads, weights, strict=True))


def predict(destinations: Sequence[str], weights: Sequence[float],
            expected_loads: Sequence[float], admitted_share: float,
            telemetry: Telemetry | None, q_cap: float = 0.0) -> Prediction:
    loads = np.asarray(expected_loads, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    hit = None
    if telemetry is not None and telemetry.planned_hit_rate is not None:
        cold = (telemetry.fallback_hit_rate if telemetry.fallback_hit_rate is not None
                else telemetry.hit_rate)
        hit = admitted_share * telemetry.planned_hit_rate + (1.0 - admitted_share) * cold
    return Prediction(tuple(destinations), tuple(map(float, w)), tuple(map(float, loads)),
                      float(imbalance(loads, w)) if loads.size else 1.0, hit, float(q_cap))


def delivery_to_dict(predicted: Prediction, realized: Realized, since_s: float) -> dict[str, Any]:
    """JSON-safe form of one version's record (the planner's history keeps it)."""
    return {"predicted": asdict(predicted), "realized": asdict(realized), "since_s": since_s}


def delivery_from_dict(data: Mapping[str, Any]) -> tuple[Prediction, Realized, float]:
    """The inverse of `delivery_to_dict`; KeyError / TypeError / ValueError on a bad record."""
    def build(cls: Any, raw: Mapping[str, Any]) -> Any:
        values = {f.name: raw[f.name] for f in fields(cls) if f.name in raw}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})

    return (build(Prediction, data["predicted"]), build(Realized, data["realized"]),
            float(data["since_s"]))


@dataclass(frozen=True, slots=True)
class Realized:
    windows: int = 0
    dip_windows: int = 0  # windows of the rewarm dip, not counted in the figures
    cached_tokens: float = 0.0
    prompt_tokens: float = 0.0
    load_sums: tuple[float, ...] = ()
    # every window since the install, the dip included
    cached_since_install: float = 0.0
    prompt_since_install: float = 0.0
    # per destination, over the windows that reported one: Σ p99 and how many
    p99_sums_ms: tuple[float, ...] = ()
    p99_windows: tuple[int, ...] = ()

    def add(self, t: Telemetry, destinations: Sequence[str], *, in_dip: bool) -> Realized:
        span = t.window_s or 1.0
        tokens = t.prompt_tokens_per_s * span
        counted = replace(self, cached_since_install=self.cached_since_install
                          + t.hit_rate * tokens,
                          prompt_since_install=self.prompt_since_install + tokens)
        if in_dip:
            return replace(counted, dip_windows=self.dip_windows + 1)
        loads = [t.destination_loads_per_s.get(d, 0.0) for d in destinations]
        sums = tuple(a + b for a, b in zip(self.load_sums or [0.0] * len(loads), loads,
                                           strict=True))
        p99s = [t.destination_p99_ms.get(d, math.nan) for d in destinations]
        seen = [math.isfinite(p) for p in p99s]
        p99_sums = tuple(a + (p if ok else 0.0) for a, p, ok in zip(
            self.p99_sums_ms or [0.0] * len(p99s), p99s, seen, strict=True))
        p99_windows = tuple(n + ok for n, ok in zip(self.p99_windows or [0] * len(p99s), seen,
                                                    strict=True))
        return replace(counted, windows=self.windows + 1,
                       cached_tokens=self.cached_tokens + t.hit_rate * tokens,
                       prompt_tokens=self.prompt_tokens + tokens, load_sums=sums,
                       p99_sums_ms=p99_sums, p99_windows=p99_windows)


# Fleet utilisation (mean over destinations, q_cap units) above which a p99 under half the
# target means spare capacity rather than luck: a quarter over q_cap on every destination.
UNDERSTATED_UTILISATION = 1.25
UNDERSTATED_P99_FRACTION = 0.5


class CapacityVerdict(enum.Enum):
    CONSISTENT = "consistent"
    OVERSTATED = "q_cap_overstated"
    UNDERSTATED = "q_cap_understated"
    UNCHECKED = "unchecked"  # no latency target, no q_cap, or nothing measured yet


@dataclass(frozen=True, slots=True)
class CapacityCheck:
    verdict: CapacityVerdict
    reason: str
    p99_target_ms: float | None = None

    @property
    def misfit(self) -> bool:
        return self.verdict in (CapacityVerdict.OVERSTATED, CapacityVerdict.UNDERSTATED)


def check_capacity(destinations: Sequence[str], loads: Sequence[float],
                   weights: Sequence[float], p99_ms: Sequence[float], q_cap: float,
                   p99_target_ms: float | None) -> CapacityCheck:
    """Is q_cap consistent with the latency measured at the measured loads? (module doc)."""
    def unchecked(why: str) -> CapacityCheck:
        return CapacityCheck(CapacityVerdict.UNCHECKED, why, p99_target_ms)

    if not p99_target_ms or p99_target_ms <= 0:
        return unchecked("no latency target: set guard.p99_ms_max to check q_cap")
    if q_cap <= 0:
        return unchecked("the plan records no q_cap")
    rho = utilisation(loads, weights, q_cap)
    measured = [(d, u, p) for d, u, p in zip(destinations, rho, p99_ms, strict=True)
                if math.isfinite(p)]
    if not measured:
        return unchecked("no latency measured yet")
    slow = [(d, u, p) for d, u, p in measured if u <= 1.0 and p > p99_target_ms]
    if slow:
        d, u, p = max(slow, key=lambda m: m[2])
        return CapacityCheck(CapacityVerdict.OVERSTATED, (
            f"{d} ran at {u:.0%} of q_cap {q_cap:g} req/s, yet its p99 {p:,.0f} ms is above "
            f"the {p99_target_ms:,.0f} ms target: the engines saturate below q_cap"),
            p99_target_ms)
    mean_rho = float(np.mean(rho)) if rho else 0.0
    worst = max(p for _, _, p in measured)
    if (mean_rho > UNDERSTATED_UTILISATION
            and worst <= UNDERSTATED_P99_FRACTION * p99_target_ms):
        return CapacityCheck(CapacityVerdict.UNDERSTATED, (
            f"the fleet ran at {mean_rho:.0%} of q_cap {q_cap:g} req/s, yet no p99 exceeded "
            f"{worst:,.0f} ms (target {p99_target_ms:,.0f} ms): the engines have capacity to "
            f"spare, so keys are replicated over more caches than their load needs"),
            p99_target_ms)
    return CapacityCheck(CapacityVerdict.CONSISTENT, (
        f"mean utilisation {mean_rho:.0%} of q_cap {q_cap:g} req/s, worst p99 {worst:,.0f} ms "
        f"(target {p99_target_ms:,.0f} ms)"), p99_target_ms)


@dataclass(frozen=True, slots=True)
class DeliveryReport:
    version: str
    predicted: Prediction
    windows: int
    dip_windows: int
    hit_rate: float | None  # realized, after the dip
    loads_per_s: tuple[float, ...]
    imbalance: float | None
    hit_rate_since_install: float | None = None  # the dip included
    p99_ms: tuple[float, ...] = ()  # realized, per destination (NaN: none reported)
    capacity: CapacityCheck = CapacityCheck(CapacityVerdict.UNCHECKED, "nothing measured yet")

    @property
    def hit_gap(self) -> float | None:
        """Realized − predicted hit rate (None until both exist)."""
        if self.hit_rate is None or self.predicted.hit_rate is None:
            return None
        return self.hit_rate - self.predicted.hit_rate

    @property
    def imbalance_gap(self) -> float | None:
        if self.imbalance is None:
            return None
        return self.imbalance - self.predicted.imbalance

    @property
    def utilisation(self) -> tuple[float, ...]:
        """Realized load over capacity (q_cap × weight), per destination."""
        if not self.loads_per_s:
            return ()
        return utilisation(self.loads_per_s, self.predicted.weights, self.predicted.q_cap)

    def to_dict(self) -> Mapping[str, object]:
        def finite(xs: Sequence[float]) -> list[float | None]:
            return [x if math.isfinite(x) else None for x in xs]

        return {"version": self.version, "windows": self.windows,
                "dip_windows": self.dip_windows,
                "predicted_hit_rate": self.predicted.hit_rate, "hit_rate": self.hit_rate,
                "hit_gap": self.hit_gap, "hit_rate_since_install": self.hit_rate_since_install,
                "predicted_imbalance": self.predicted.imbalance,
                "imbalance": self.imbalance, "imbalance_gap": self.imbalance_gap,
                "destinations": list(self.predicted.destinations),
                "predicted_loads_per_s": list(self.predicted.loads_per_s),
                "loads_per_s": list(self.loads_per_s),
                "q_cap": self.predicted.q_cap,
                "predicted_utilisation": finite(self.predicted.utilisation),
                "utilisation": finite(self.utilisation), "p99_ms": finite(self.p99_ms),
                "p99_target_ms": self.capacity.p99_target_ms,
                "capacity_verdict": self.capacity.verdict.value,
                "capacity_reason": self.capacity.reason}


def report(version: str, predicted: Prediction, realized: Realized,
           p99_target_ms: float | None = None) -> DeliveryReport:
    """The report of one version; `p99_target_ms` (the guard's validated p99) is what the
    capacity check holds the measured latency to."""
    since = (realized.cached_since_install / realized.prompt_since_install
             if realized.prompt_since_install else None)
    if not realized.windows:
        return DeliveryReport(version, predicted, 0, realized.dip_windows, None, (), None,
                              since, capacity=check_capacity(
                                  (), (), (), (), predicted.q_cap, p99_target_ms))
    loads = np.asarray(realized.load_sums, dtype=np.float64) / realized.windows
    hit = (realized.cached_tokens / realized.prompt_tokens) if realized.prompt_tokens else None
    imb = float(imbalance(loads, np.asarray(predicted.weights))) if loads.size else None
    p99 = tuple(s / n if n else math.nan for s, n in zip(
        realized.p99_sums_ms or [0.0] * loads.size, realized.p99_windows or [0] * loads.size,
        strict=True))
    capacity = check_capacity(predicted.destinations, loads.tolist(), predicted.weights, p99,
                              predicted.q_cap, p99_target_ms)
    return DeliveryReport(version, predicted, realized.windows, realized.dip_windows, hit,
                          tuple(map(float, loads)), imb, since, p99, capacity)
