"""q_cap measured instead of typed in: the load a destination of weight 1 carries before its
engine starts to queue (pure).

Two kinds of evidence come from the engines' own metrics (streams/engines), joined with the
stream's per-destination arrival rates:

- **a knee**: a destination that stayed saturated (control.saturation) showed the rate it
  could serve; per unit of weight, that is q_cap measured. The fleet's figure is the median
  over the destinations that showed one.
- **served load**: a destination that carried a load without queueing can carry at least
  that. Without any knee, the highest such load per unit of weight is a lower bound: it
  can raise a q_cap typed in too low, never lower one.

With `learn_q_cap` the planner plans with the measured value, kept within [q/2, 2q] of the
operator's q_cap (a cold, idle or misreporting fleet moves it by at most a factor of two),
and with the operator's while nothing was measured. Passive measurement sees only the loads
that traffic offers: a fleet never driven near its knee teaches only the lower bound.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

KNEE, SERVED = "knee", "served"


@dataclass(frozen=True, slots=True)
class MeasuredQCap:
    value: float
    source: str  # KNEE: measured at saturation; SERVED: a lower bound from unsaturated load
    destinations: int  # how many destinations the figure comes from


def measured_q_cap(knees_per_weight: Sequence[float],
                   served_per_weight: Sequence[float]) -> MeasuredQCap | None:
    """`knees_per_weight`: each saturated destination's measured capacity / its configured
    weight; `served_per_weight`: each unsaturated destination's highest recent load / its
    weight. None without either."""
    knees = [k for k in knees_per_weight if k > 0]
    if knees:
        return MeasuredQCap(float(statistics.median(knees)), KNEE, len(knees))
    served = [s for s in served_per_weight if s > 0]
    if served:
        return MeasuredQCap(float(max(served)), SERVED, len(served))
    return None


def learned_q_cap(configured: float, measured: MeasuredQCap | None) -> float:
    """The q_cap to plan with: the measured knee, or a served load above the configured
    q_cap, within [q/2, 2q]; the configured q_cap otherwise."""
    if measured is None:
        return configured
    value = measured.value if measured.source == KNEE else max(configured, measured.value)
    return min(2 * configured, max(configured / 2, value))
