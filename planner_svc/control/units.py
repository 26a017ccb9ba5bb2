"""The one unit every penalty is expressed in: lost serving work.

Staleness and rewarm are both prefill work the fleet has to redo because a
prefix was not cached where the request landed (design-notes §1). We count it in
**recomputed prefill tokens**: a *rate* (tokens/s) for staleness, an *amount*
(tokens) for a one-off rewarm dip and for accumulated staleness. Dividing by a
destination's prefill throughput turns either into GPU-seconds (per second), a
share of cluster capacity; `tokens_to_gpu_seconds` does that for displays.

Pure: floats and numpy only.
"""

from __future__ import annotations

import numpy as np

# Names used in records and docs, so every figure says what it is.
RATE_UNIT = "recomputed prefill tokens/s"
AMOUNT_UNIT = "recomputed prefill tokens"


def hit_work_rate(
    rates: np.ndarray, prefix_tokens: np.ndarray, warm_advantage: np.ndarray
) -> float:
    """Σ λ_b · P_b · Δh_b: prefill tokens/s a warm placement saves over a cold one."""
    return float(np.dot(rates, prefix_tokens * warm_advantage))


def tokens_to_gpu_seconds(tokens: float, prefill_tokens_per_s: float) -> float:
    """Lost work in GPU-seconds (or GPU-s per second for a rate) at a given prefill speed."""
    if prefill_tokens_per_s <= 0:
        raise ValueError("prefill throughput must be positive")
    return tokens / prefill_tokens_per_s
