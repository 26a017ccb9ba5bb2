"""What the stream measured in one window, as the control loop reads it.

The planner service fills a `Telemetry` from the newest complete
`RateSnapshot` set in a few lines:

- `window_end_s`: the window's end (`window_end_ms / 1000`);
- `recovering`: any part had `recovering` set (a stream worker rebuilt state);
- `hit_rate`: served, token-weighted KV hit rate of *all* traffic,
  Σ cached_tokens / Σ prompt_tokens over destinations;
- `prompt_tokens_per_s`: Σ prompt_tokens / window length;
- `planned_hit_rate` / `fallback_hit_rate`: the same ratio restricted to admitted
  keys (on their planned sets) and to the cold tail (sums of the per-key
  columns split by admission); None when not measured;
- `destination_loads_per_s`: destination id -> arrival rate;
- `p99_ms`: the worst destination's p99 end-to-end latency, None if unknown;
- `destination_p99_ms`: destination id -> its p99 end-to-end latency (those that reported);
- `active_keys`: the snapshot's `active_keys`;
- `key_hit_rates`: optional, admitted key -> its hit rate on its planned set
  (only keys with enough requests to mean something); feeds the per-key Δh.
  Not kept in snapshots (the loop only learns from it);
- `requests`: requests in the window (how much evidence the ratios rest on);
- `affinity_gain`: the served hit rate affinity is predicted to win over Flat-LB on this
  window's keys (`planning.affinity`, a fraction of prompt tokens; where the model is blind,
  `AffinityGain.judged_gain`, its bound), None if not estimated. It depends on the traffic,
  not on how it was routed.

Pure data; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Telemetry:
    """One window of stream measurements (see the module docstring for each field)."""

    window_end_s: float
    hit_rate: float
    prompt_tokens_per_s: float
    requests: int
    destination_loads_per_s: Mapping[str, float] = field(default_factory=dict)
    planned_hit_rate: float | None = None
    fallback_hit_rate: float | None = None
    p99_ms: float | None = None
    destination_p99_ms: Mapping[str, float] = field(default_factory=dict)
    active_keys: int = 0
    recovering: bool = False
    key_hit_rates: Mapping[str, float] = field(default_factory=dict)
    # The window's length: a window that began before an install still mixes in traffic
    # routed by the previous plan, so it says nothing yet about the new plan's dip.
    window_s: float = 0.0
    affinity_gain: float | None = None

    @property
    def window_start_s(self) -> float:
        return self.window_end_s - self.window_s

    def age_s(self, now_s: float) -> float:
        return now_s - self.window_end_s

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (JSON-safe) for snapshots."""
        return {
            "window_end_s": self.window_end_s,
            "hit_rate": self.hit_rate,
            "prompt_tokens_per_s": self.prompt_tokens_per_s,
            "requests": self.requests,
            "destination_loads_per_s": dict(self.destination_loads_per_s),
            "planned_hit_rate": self.planned_hit_rate,
            "fallback_hit_rate": self.fallback_hit_rate,
            "p99_ms": self.p99_ms,
            "destination_p99_ms": dict(self.destination_p99_ms),
            "active_keys": self.active_keys,
            "recovering": self.recovering,
            "window_s": self.window_s,
            "affinity_gain": self.affinity_gain,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Telemetry:
        return cls(**{**data, "destination_loads_per_s": dict(data["destination_loads_per_s"]),
                      "destination_p99_ms": dict(data.get("destination_p99_ms", {}))})
