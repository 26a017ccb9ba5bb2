"""Drift: how far current traffic is from the traffic the installed plan was built on.

Three figures, each cheap and each meaningful to an operator on its own:

- `total_variation`: ½ Σ |p_b − q_b| between the admitted keys' rate shares at
  build time (p, from the plan's rate column) and now (q). 0 = same shape of
  admitted mass, 1 = disjoint. It ignores the cold tail on purpose: that traffic
  is Flat-LB's in both cases.
- `admission_churn_share`: share of current traffic carried by keys that would
  enter or leave admission if the candidate were installed.
- `imbalance_change`: expected max/mean load of the installed plan under current
  rates minus the same figure under the rates it was built on.

Drift describes; it does not decide. The penalties turn it into lost work.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner_svc.control.traffic import (
    Fleet,
    Traffic,
    aligned_rates,
    expected_loads,
    imbalance,
    planned_loads,
)
from router_client.plan import RoutingPlan


@dataclass(frozen=True, slots=True, kw_only=True)
class Drift:
    """Drift figures of one control step (all dimensionless)."""

    total_variation: float = 0.0
    admission_churn_share: float = 0.0
    imbalance_change: float = 0.0
    imbalance_planned: float = 1.0
    imbalance_now: float = 1.0


def total_variation(planned: np.ndarray, current: np.ndarray) -> float:
    """½ Σ |p − q| of two non-negative rate vectors, each normalised to 1."""
    p_sum, q_sum = float(planned.sum()), float(current.sum())
    if p_sum <= 0 and q_sum <= 0:
        return 0.0
    if p_sum <= 0 or q_sum <= 0:
        return 1.0
    return 0.5 * float(np.abs(planned / p_sum - current / q_sum).sum())


def admission_churn_share(
    installed: RoutingPlan, candidate: RoutingPlan, traffic: Traffic
) -> float:
    """Rate share (of all current traffic) of keys entering or leaving admission."""
    total = traffic.total_rate
    if total <= 0:
        return 0.0
    before, after = set(installed.table.keys), set(candidate.table.keys)
    changed = [traffic.index[k] for k in before ^ after if k in traffic.index]
    return float(np.asarray(traffic.rates)[changed].sum()) / total if changed else 0.0


def measure_drift(
    installed: RoutingPlan,
    traffic: Traffic,
    candidate: RoutingPlan | None = None,
    fleet: Fleet | None = None,
) -> Drift:
    """Drift of `installed` under `traffic` on `fleet` (None: the plan's destinations).

    Admission churn needs the candidate (else 0)."""
    planned_rates = np.asarray(installed.table.rates, np.float64)
    current = aligned_rates(installed, traffic)
    if len(planned_rates) != len(current):
        planned_rates = np.zeros_like(current)
    then = imbalance(installed, planned_loads(installed))
    now = imbalance(installed, expected_loads(installed, traffic, fleet), fleet)
    churn = 0.0 if candidate is None else admission_churn_share(installed, candidate, traffic)
    return Drift(
        total_variation=total_variation(planned_rates, current),
        admission_churn_share=churn,
        imbalance_change=now - then,
        imbalance_planned=then,
        imbalance_now=now,
    )
