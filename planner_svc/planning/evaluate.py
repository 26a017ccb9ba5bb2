"""`evaluate`: what an installed plan does under new rates (for the modelled staleness penalty).

Model (the same one `build_plan` plans with): a key of the plan runs at its *current* rate, split
evenly over its members that are still healthy in `config` (matched by destination id); a plan key
with no healthy member left, and every key outside the plan, goes to the fallback, which spreads
that cold tail over the healthy destinations by capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner_svc.planning.admission import check_rates
from planner_svc.planning.config import PlanningConfig
from planner_svc.planning.placement import cold_tail_loads
from planner_svc.planning.stats import imbalance
from router_client.plan import RoutingPlan


@dataclass(frozen=True)
class PlanEvaluation:
    """Expected effect of a plan under given rates; loads are per `destination_ids`."""

    destination_ids: tuple[str, ...]
    expected_load_per_s: np.ndarray
    total_rate_per_s: float
    admitted_rate_per_s: float
    admitted_rate_share: float
    cold_tail_rate_per_s: float
    imbalance_max_over_mean: float
    overload_rate_per_s: float  # Σ_d max(0, load_d − q_cap · w_d)
    overloaded_destinations: tuple[str, ...]
    orphaned_keys: int  # plan keys with no healthy member left (served by the fallback)


def plan_key_rates(plan: RoutingPlan, keys: Sequence[str], rates: np.ndarray) -> np.ndarray:
    """Current rate of every key of the plan's table (0 for keys absent from `keys`).

    One pass over `keys` against a dict of the plan's keys: no per-key object is kept, so this
    stays cheap in memory for millions of keys.
    """
    where = {k: j for j, k in enumerate(plan.table.keys)}
    slot = np.fromiter((where.get(k, -1) for k in keys), np.int64, len(keys))
    found = np.flatnonzero(slot >= 0)
    out = np.zeros(len(plan.table.keys))
    out[slot[found]] = rates[found]
    return out


def evaluate(
    plan: RoutingPlan, keys: Sequence[str], rates: np.ndarray, config: PlanningConfig
) -> PlanEvaluation:
    """Expected per-destination load, admitted share, cold tail, imbalance and overload."""
    r = check_rates(len(keys), rates)
    healthy = np.flatnonzero(config.active)
    w = config.weights
    loads, admitted, orphaned = _admitted_loads(plan, plan_key_rates(plan, keys, r), config)
    total = float(r.sum())
    loads[healthy] += cold_tail_loads(max(0.0, total - admitted), w[healthy])
    over = np.where(config.active, np.maximum(0.0, loads - config.q_cap * w), 0.0)
    ids = tuple(d.id for d in config.destinations)
    return PlanEvaluation(
        destination_ids=ids,
        expected_load_per_s=loads,
        total_rate_per_s=total,
        admitted_rate_per_s=admitted,
        admitted_rate_share=admitted / total if total > 0 else 0.0,
        cold_tail_rate_per_s=max(0.0, total - admitted),
        imbalance_max_over_mean=imbalance(loads[healthy], w[healthy]),
        overload_rate_per_s=float(over.sum()),
        overloaded_destinations=tuple(ids[i] for i in np.flatnonzero(over > 0).tolist()),
        orphaned_keys=orphaned,
    )


def _admitted_loads(
    plan: RoutingPlan, lam: np.ndarray, config: PlanningConfig
) -> tuple[np.ndarray, float, int]:
    """Loads of the plan's keys on `config`'s destinations (by id), admitted rate, #orphans."""
    position = {d.id: i for i, d in enumerate(config.destinations) if not d.draining}
    remap = np.array([position.get(d.id, -1) for d in plan.destinations], np.int64)
    member = remap[plan.table.members.astype(np.int64)]
    owner = np.repeat(np.arange(len(lam)), plan.table.replicas())
    alive = member >= 0
    live_k = np.bincount(owner[alive], minlength=len(lam))
    served = live_k > 0
    share = np.where(served, lam / np.maximum(live_k, 1), 0.0)
    n = len(config.destinations)
    loads = np.bincount(member[alive], share[owner[alive]], minlength=n).astype(np.float64)
    return loads, float(lam[served].sum()), int((~served).sum())
