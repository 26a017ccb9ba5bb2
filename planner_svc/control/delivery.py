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
count), and the imbalance of those loads. The dip is over when the control loop saw the hit
rate settle, or for windows that began after the dip's expected duration (the rewarm time of
the moved traffic), whichever comes first: under drift the hit rate never stops moving.
"""

from __future__ import annotations

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


def predict(destinations: Sequence[str], weights: Sequence[float],
            expected_loads: Sequence[float], admitted_share: float,
            telemetry: Telemetry | None) -> Prediction:
    loads = np.asarray(expected_loads, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    hit = None
    if telemetry is not None and telemetry.planned_hit_rate is not None:
        cold = (telemetry.fallback_hit_rate if telemetry.fallback_hit_rate is not None
                else telemetry.hit_rate)
        hit = admitted_share * telemetry.planned_hit_rate + (1.0 - admitted_share) * cold
    return Prediction(tuple(destinations), tuple(map(float, w)), tuple(map(float, loads)),
                      float(imbalance(loads, w)) if loads.size else 1.0, hit)


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
        return replace(counted, windows=self.windows + 1,
                       cached_tokens=self.cached_tokens + t.hit_rate * tokens,
                       prompt_tokens=self.prompt_tokens + tokens, load_sums=sums)


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

    def to_dict(self) -> Mapping[str, object]:
        return {"version": self.version, "windows": self.windows,
                "dip_windows": self.dip_windows,
                "predicted_hit_rate": self.predicted.hit_rate, "hit_rate": self.hit_rate,
                "hit_gap": self.hit_gap, "hit_rate_since_install": self.hit_rate_since_install,
                "predicted_imbalance": self.predicted.imbalance,
                "imbalance": self.imbalance, "imbalance_gap": self.imbalance_gap,
                "destinations": list(self.predicted.destinations),
                "predicted_loads_per_s": list(self.predicted.loads_per_s),
                "loads_per_s": list(self.loads_per_s)}


def report(version: str, predicted: Prediction, realized: Realized) -> DeliveryReport:
    since = (realized.cached_since_install / realized.prompt_since_install
             if realized.prompt_since_install else None)
    if not realized.windows:
        return DeliveryReport(version, predicted, 0, realized.dip_windows, None, (), None,
                              since)
    loads = np.asarray(realized.load_sums, dtype=np.float64) / realized.windows
    hit = (realized.cached_tokens / realized.prompt_tokens) if realized.prompt_tokens else None
    imb = float(imbalance(loads, np.asarray(predicted.weights))) if loads.size else None
    return DeliveryReport(version, predicted, realized.windows, realized.dip_windows, hit,
                          tuple(map(float, loads)), imb, since)
