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

With a TTFT target (`q_cap_ttft_slo_s`) the engines' TTFT p99 joins the evidence, since a
queue that never grows can still make requests wait past the SLO (the arena's engines carried
5 req/s per destination without a growing queue, where the SLO capacity peaks at a q_cap of
2.1; docs/engine-setup.md):

- a served load counts only if the destination's TTFT p99 met the target;
- **an SLO break**: a destination whose TTFT p99 stayed over the target for two reports in a
  row showed a load it cannot carry within the SLO: an upper bound. The fleet's bound is the
  median over the destinations that showed one (one engine's burst does not set it), and the
  learned q_cap never exceeds it, whatever the knee or the served loads say. Planned at that
  bound, the hottest destinations carry less; if they still break the SLO the bound moves
  down again, until the loads the plan allows are loads the engines carry within it.
- **a persisting break**: the lowest load that broke the SLO is not always below the plan's
  q_cap: a destination carrying less than the bound can still break it when the plan stacks
  hot keys on it (bursts). While breaks keep coming, every `SLO_STEP_DWELL_S` the bound steps
  to `SLO_STEP` x the q_cap in use (`slo_step`), down to half the operator's value. On the arena
  fleet one run from 2x too high kept the bound at 3.7 req/s (no break after the first) while
  SLO capacity peaks at q_cap 1.5-2.1; passive evidence alone does not find that optimum
  (docs/engine-setup.md, bench/learning.py).

With `learn_q_cap` the planner plans with the measured value, kept within [q/2, 2q] of the
operator's q_cap (a cold, idle or misreporting fleet moves it by at most a factor of two),
and with the operator's while nothing was measured. Passive measurement sees only the loads
that traffic offers: a fleet never driven near its knee teaches only the lower bound.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

KNEE, SERVED, SLO = "knee", "served", "slo"
# Consecutive reports over the TTFT target before a destination's load counts as an SLO break.
SLO_BREAK_REPORTS = 2
# While breaks persist: the bound steps down by this factor of the q_cap in use, at most once
# per dwell (a plan built at the new bound must be installed and measured before it is judged).
SLO_STEP = 0.85
SLO_STEP_DWELL_S = 30.0


@dataclass(frozen=True, slots=True)
class MeasuredQCap:
    value: float
    # KNEE: measured at saturation; SERVED: a lower bound from loads carried (within the
    # SLO, when one is set); SLO: only an upper bound, from loads that broke the SLO.
    source: str
    destinations: int  # how many destinations the figure comes from
    # The SLO's upper bound (the median load that broke it), when any destination showed one.
    slo_bound: float | None = None


def slo_step(step: tuple[float, int] | None, q_cap_in_use: float,
             now_ms: int) -> tuple[float, int]:
    """A destination broke the TTFT target again (`SLO_BREAK_REPORTS` in a row) at `now_ms`.
    `step`: the stepped bound so far and when it last moved (None: none yet). The first
    persisting break starts the dwell (the breaking load bounds q_cap meanwhile); one a dwell
    later steps the bound to `SLO_STEP` x the q_cap in use."""
    if step is None:
        return (math.inf, now_ms)
    if now_ms - step[1] < SLO_STEP_DWELL_S * 1000:
        return step
    return (min(step[0], SLO_STEP * q_cap_in_use), now_ms)


def measured_q_cap(knees_per_weight: Sequence[float],
                   served_per_weight: Sequence[float],
                   slo_breaks_per_weight: Sequence[float] = (),
                   slo_stepped: float | None = None) -> MeasuredQCap | None:
    """`knees_per_weight`: each saturated destination's measured capacity / its configured
    weight; `served_per_weight`: each unsaturated destination's highest recent load / its
    weight; `slo_breaks_per_weight`: each destination's lowest recent load that broke the
    TTFT target / its weight; `slo_stepped`: the bound persisting breaks stepped down to
    (`slo_step`). None without any."""
    breaks = [b for b in slo_breaks_per_weight if b > 0]
    bound = float(statistics.median(breaks)) if breaks else None
    if slo_stepped is not None and math.isfinite(slo_stepped) and slo_stepped > 0:
        bound = slo_stepped if bound is None else min(bound, slo_stepped)
    knees = [k for k in knees_per_weight if k > 0]
    if knees:
        return MeasuredQCap(float(statistics.median(knees)), KNEE, len(knees), bound)
    served = [s for s in served_per_weight if s > 0]
    if served:
        return MeasuredQCap(float(max(served)), SERVED, len(served), bound)
    if bound is not None:
        return MeasuredQCap(bound, SLO, max(1, len(breaks)), bound)
    return None


def learned_q_cap(configured: float, measured: MeasuredQCap | None) -> float:
    """The q_cap to plan with: the measured knee, or a served load above the configured
    q_cap, never above the SLO's bound, within [q/2, 2q]; the configured q_cap otherwise."""
    if measured is None:
        return configured
    if measured.source == KNEE:
        value = measured.value
    elif measured.source == SERVED:
        value = max(configured, measured.value)
    else:
        value = configured
    if measured.slo_bound is not None:
        value = min(value, measured.slo_bound)
    return min(2 * configured, max(configured / 2, value))

