"""Plan statistics used everywhere: loads, imbalance, admitted share, cold tail.

Imbalance is max over healthy destinations of (load / weight) divided by the cluster's mean
relative load (total load / total healthy weight): 1.0 is perfect balance, also with unequal
capacities. An idle cluster counts as balanced (1.0).
"""

from __future__ import annotations

import numpy as np

from router_client.plan import KeyTable, PlanStats


def imbalance(loads: np.ndarray, weights: np.ndarray) -> float:
    """max(load/weight) / (Σ load / Σ weight) over the destinations given (healthy ones)."""
    total = float(loads.sum())
    if total <= 0.0 or len(loads) == 0:
        return 1.0
    return float((loads / weights).max() / (total / float(weights.sum())))


def table_loads(table: KeyTable, rates: np.ndarray, n_destinations: int) -> np.ndarray:
    """Per-destination admitted load of `table` when key i runs at rates[i] (λ/k per member)."""
    k = table.replicas()
    share = np.repeat(np.asarray(rates, np.float64) / np.maximum(k, 1), k)
    return np.bincount(table.members.astype(np.int64), share, minlength=n_destinations)


def plan_stats(
    *,
    loads: np.ndarray,
    weights: np.ndarray,
    healthy: np.ndarray,
    total_rate: float,
    admitted_rate: float,
    table: KeyTable,
    build_seconds: float = 0.0,
) -> PlanStats:
    """PlanStats for a finished assignment; `loads` covers every destination of the plan."""
    return PlanStats(
        admitted_rate_share=admitted_rate / total_rate if total_rate > 0 else 0.0,
        cold_tail_rate_per_s=max(0.0, total_rate - admitted_rate),
        expected_load_per_s=tuple(float(x) for x in loads),
        imbalance_max_over_mean=imbalance(loads[healthy], weights[healthy]),
        admitted_keys=len(table),
        used_slots=len(table.members),
        build_seconds=build_seconds,
    )


def table_from_flat(
    keys: list[str], replicas: np.ndarray, members: np.ndarray, rates: np.ndarray
) -> KeyTable:
    """KeyTable from per-key replica counts and the flat member list (plan indices)."""
    offsets = np.zeros(len(replicas) + 1, np.uint32)
    np.cumsum(replicas, out=offsets[1:])
    return KeyTable(keys, offsets, members.astype(np.uint32), rates.astype(np.float64))
