"""Step 3 of Algorithm 1: LPT placement over distinct destinations, and the cold-tail baseline.

All functions work on the *healthy* destinations only (indices 0..H-1 of the arrays passed in);
callers map back to plan indices. "Least loaded" always means smallest load / capacity weight,
ties to the lower destination index, exactly like a min-heap keyed on (load / weight, index).
"""

from __future__ import annotations

import numpy as np


def cold_tail_loads(unadmitted_rate: float, weights: np.ndarray) -> np.ndarray:
    """The fallback's expected load: power-of-two-choices spreads the unadmitted traffic over the
    healthy destinations in proportion to capacity."""
    return unadmitted_rate * weights / weights.sum()


def least_loaded(loads: np.ndarray, weights: np.ndarray, count: int) -> np.ndarray:
    """The `count` least-loaded destinations, least first (ties to the lower index)."""
    return np.argsort(loads / weights, kind="stable")[:count]


def lpt_place(
    shares: np.ndarray, replicas: np.ndarray, loads: np.ndarray, weights: np.ndarray
) -> np.ndarray:
    """Place keys (given in λ desc order) LPT-style; return the flat member list; update `loads`.

    Key j takes the replicas[j] currently least-loaded destinations (distinct) and adds shares[j]
    (= λ_j / k_j) to each. Multi-replica keys all precede single-replica ones (they have larger λ),
    so they are placed one by one and the single-replica tail in exact batches.
    """
    n_multi = int(np.searchsorted(-replicas, -1, side="left"))  # replicas are non-increasing
    parts = []
    for j in range(n_multi):
        chosen = least_loaded(loads, weights, int(replicas[j]))
        loads[chosen] += shares[j]
        parts.append(np.sort(chosen))
    parts.append(_place_singles(shares[n_multi:], loads, weights))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _place_singles(shares: np.ndarray, loads: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Sequential LPT for single-replica keys, computed in batches with identical results.

    With destinations sorted by (load/weight, index), items p, p+1, … go to the 1st, 2nd, …
    destination as long as each next destination is *strictly* below every destination already
    filled in this batch: then it is still the unique least-loaded one, as in the sequential walk.
    The first item of a batch is always valid, so every batch places at least one key; loads are
    updated with the same float operation (load + share) as the sequential walk.
    """
    out = np.empty(len(shares), np.int64)
    p, n, h = 0, len(shares), len(loads)
    while p < n:
        m = min(h, n - p)
        order = np.argsort(loads / weights, kind="stable")[:m]
        new_loads = loads[order] + shares[p : p + m]
        new_rel = new_loads / weights[order]
        still_least = (loads[order[1:]] / weights[order[1:]]) < np.minimum.accumulate(new_rel)[:-1]
        j = m if still_least.all() else 1 + int(np.argmin(still_least))
        loads[order[:j]] = new_loads[:j]
        out[p : p + j] = order[:j]
        p += j
    return out
