"""What the planner reads from a complete stream window: the rates to plan on and the
measurements the control loop decides with. Pure conversions, no I/O."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from planner_svc.control.telemetry import Telemetry
from planner_svc.control.traffic import Traffic


def traffic_from_window(window: Any, rate_column: str = "rate") -> Traffic:
    """Per-key rates of a streams.assembly.CompleteWindow ("rate" or its "ewma")."""
    rates = window.ewma_rate_per_s if rate_column == "ewma" else window.rate_per_s
    return Traffic(
        keys=list(window.keys),
        rates=np.asarray(rates, np.float64),
        prefix_tokens=np.asarray(window.reusable_prefix_tokens, np.float64),
        window_end_s=window.window_end_ms / 1000.0,
    )


def telemetry_from_window(window: Any, admitted: set[str]) -> Telemetry:
    """The control loop's view of a stream window (see planner_svc.control.telemetry)."""
    span_s = max(1e-9, (window.window_end_ms - window.window_start_ms) / 1000.0)
    prompt = np.asarray(window.prompt_tokens, np.float64)
    cached = np.asarray(window.cached_tokens, np.float64)
    mask = np.fromiter((k in admitted for k in window.keys), bool, count=len(window.keys))
    p99s = {d: s.p99_e2e_ms for d, s in window.destinations.items()
            if not math.isnan(s.p99_e2e_ms)}
    return Telemetry(
        window_end_s=window.window_end_ms / 1000.0,
        window_s=span_s,
        hit_rate=_ratio(cached.sum(), prompt.sum()),
        prompt_tokens_per_s=float(prompt.sum()) / span_s,
        requests=int(np.sum(window.requests)),
        destination_loads_per_s={d: s.arrival_rate_per_s for d, s in window.destinations.items()},
        planned_hit_rate=_ratio(cached[mask].sum(), prompt[mask].sum()) if mask.any() else None,
        fallback_hit_rate=_ratio(cached[~mask].sum(), prompt[~mask].sum())
        if (~mask).any()
        else None,
        p99_ms=max(p99s.values()) if p99s else None,
        destination_p99_ms=p99s,
        active_keys=int(window.active_keys),
        recovering=bool(window.recovering),
    )


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den > 0 else 0.0
