"""Slow, obviously-correct reference implementations of Algorithm 1 (imported by the planning
tests), and a check of the reference itself."""

from __future__ import annotations

import math

import numpy as np

from planner_svc.planning import PlanningConfig


def reference_admission(
    rates: np.ndarray, config: PlanningConfig, rank: np.ndarray | None = None
) -> list[tuple[int, int]]:
    """(key index, k_b) admitted by a full sort and a walk with skip, in placement order.

    The walk goes by `rank` (default: the rates); placement order is always by rate."""
    w = [d.capacity_weight for d in config.destinations if not d.draining]
    q_ref = config.q_cap * float(np.mean(w))
    by = rates if rank is None else rank
    order = sorted(range(len(rates)), key=lambda i: (-by[i], i))
    used, out = 0, []
    for i in order:
        if rates[i] <= 0:
            continue
        k = min(len(w), max(1, math.ceil(rates[i] / q_ref)))
        if used + k <= config.slots:
            out.append((i, k))
            used += k
    return sorted(out, key=lambda ik: (-rates[ik[0]], ik[0]))


def reference_lpt(
    rates: np.ndarray, config: PlanningConfig, admitted: list[tuple[int, int]]
) -> tuple[list[list[int]], list[float]]:
    """Sequential LPT from the cold-tail baseline; sets as sorted plan indices, loads per dest."""
    healthy = [i for i, d in enumerate(config.destinations) if not d.draining]
    w = np.array([config.destinations[i].capacity_weight for i in healthy])
    idx = np.array([i for i, _ in admitted], np.int64)
    cold = max(0.0, float(rates.sum()) - float(rates[idx].sum()))
    loads = list(cold * w / w.sum())
    sets = []
    for i, k in admitted:
        share = float(rates[i] / k)
        ranked = sorted(range(len(healthy)), key=lambda d: (loads[d] / w[d], d))
        chosen = ranked[:k]
        for d in chosen:
            loads[d] = loads[d] + share
        sets.append(sorted(healthy[d] for d in chosen))
    full = [0.0] * len(config.destinations)
    for h, i in enumerate(healthy):
        full[i] = loads[h]
    return sets, full


def test_reference_walk_skips_what_does_not_fit() -> None:
    config = PlanningConfig.uniform(4, q_cap=10.0, warm_slots_per_destination=1, warm_slots=5)
    admitted = reference_admission(np.array([35.0, 25.0, 5.0, 4.0]), config)
    assert admitted == [(0, 4), (2, 1)]
    sets, loads = reference_lpt(np.array([35.0, 25.0, 5.0, 4.0]), config, admitted)
    assert sets == [[0, 1, 2, 3], [0]]
    assert loads == [29 / 4 + 8.75 + 5.0, 29 / 4 + 8.75, 29 / 4 + 8.75, 29 / 4 + 8.75]
