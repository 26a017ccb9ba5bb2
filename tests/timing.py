"""Timing bounds that hold on a quiet machine and are checked strictly only in the slow tier.

The CI tier runs on shared, noisy machines: an absolute latency there fails for reasons
that are not bugs. `bound(value, limit, what)` prints the figure and, in the CI tier,
fails only when the value is ten times over (a hang or a real regression); with
`CACHEROUTE_STRICT_TIMING=1` (set by `run.sh slow`) it fails at the limit itself.
"""

from __future__ import annotations

import os

LENIENCY = 10.0


def strict() -> bool:
    return os.environ.get("CACHEROUTE_STRICT_TIMING") == "1"


def bound(value: float, limit: float, what: str) -> None:
    allowed = limit if strict() else limit * LENIENCY
    print(f"timing: {what} = {value:.4g} (limit {limit:g}{'' if strict() else ', lenient'})")
    assert value <= allowed, f"{what}: {value:.4g} over {allowed:g}"
