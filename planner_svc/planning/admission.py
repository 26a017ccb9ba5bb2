"""Steps 1 and 2 of Algorithm 1: replica counts and top-rate admission with skip.

Replica count (eq. 2), with capacity weights: k_b = max(1, ceil(λ_b / q_ref)) where
q_ref = q_cap · mean capacity weight of the healthy destinations (so with all weights 1 it is
exactly eq. 2), capped at the number of healthy destinations (a key's set must be distinct).
Heterogeneity is then handled by placement, which compares loads relative to capacity.

Keys with λ_b <= 0 are never admitted (affinity buys nothing for a key nobody requests).

Slot admission (eq. 3): walk keys by (λ_b desc, key index asc); admit b while Σ k_b <= C, skip a
key that does not fit. Byte-aware admission: see `admit_by_tokens`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner_svc.planning.config import PlanningConfig
from planner_svc.planning.errors import PlanningError

# Strided sample used to guess the admission threshold before one exact, small partition.
_SAMPLE_TARGET = 16_384


@dataclass(frozen=True)
class Admission:
    """Admitted key indices in placement order (λ desc, index asc) and their replica counts."""

    index: np.ndarray  # int64, into the caller's keys
    replicas: np.ndarray  # int64, k_b per admitted key
    used_slots: int
    used_tokens: float = 0.0


def check_rates(n_keys: int, rates: np.ndarray) -> np.ndarray:
    """Rates as a float64 vector, one per key, finite and >= 0; else PlanningError."""
    r = np.ascontiguousarray(rates, dtype=np.float64)
    if r.ndim != 1 or len(r) != n_keys:
        raise PlanningError(f"need one rate per key: {n_keys} keys, rates of shape {r.shape}")
    if len(r) and not (np.isfinite(r).all() and r.min() >= 0.0):
        raise PlanningError("rates must be finite and >= 0")
    return r


def replica_counts(rates: np.ndarray, config: PlanningConfig) -> np.ndarray:
    """k_b for every entry of `rates` (eq. 2 with the capacity convention above)."""
    k = np.ceil(rates / config.reference_capacity)
    return np.clip(k, 1, config.n_active).astype(np.int64)


def admit(
    rates: np.ndarray,
    config: PlanningConfig,
    prefix_tokens: np.ndarray | None = None,
    *,
    incumbent: np.ndarray | None = None,
) -> Admission:
    """Admission for `config`: by tokens when byte-aware and sizes are given, else by slots.

    `incumbent` (bool per key: admitted by the installed plan) only matters when
    `config.admission_hysteresis` h > 0: incumbents then *rank* at λ_b·(1 + h), so a challenger
    must beat an incumbent by that margin to take its slot (k_b still uses the true λ_b).
    """
    rank = None
    if incumbent is not None and config.admission_hysteresis > 0.0:
        rank = np.where(incumbent, rates * (1.0 + config.admission_hysteresis), rates)
    if config.byte_aware and prefix_tokens is not None:
        return admit_by_tokens(rates, config, _check_tokens(len(rates), prefix_tokens), rank)
    if rank is not None:
        return admit_by_rank(rates, rank, config)
    return admit_by_slots(rates, config)


def admit_by_slots(rates: np.ndarray, config: PlanningConfig) -> Admission:
    """Top-rate admission with skip into C slots, without sorting all keys.

    Why no key outside the candidates can be admitted: k_b >= 2 iff λ_b > q_ref, so every
    multi-replica key precedes every single-replica key in the (λ desc) walk. After the m
    multi-replica keys (handled one by one, with skip), each single-replica key is admitted iff a
    slot is left, and admitting it uses exactly one; so the admitted single-replica keys are
    exactly the top min(C − used, #positive) of them by (λ desc, index asc). Selecting those needs
    a partition, not a sort; only the admitted ones are sorted, for placement.
    """
    q_ref = config.reference_capacity
    capacity = config.slots
    multi = np.flatnonzero(rates > q_ref)
    multi = multi[np.lexsort((multi, -rates[multi]))]
    k_multi = replica_counts(rates[multi], config)
    fits = _greedy_fit(k_multi.astype(np.float64), float(capacity))
    multi, k_multi = multi[fits], k_multi[fits]
    used = int(k_multi.sum())
    singles = _top_singles(rates, rates, q_ref, capacity - used)
    index = np.concatenate([multi, singles])
    replicas = np.concatenate([k_multi, np.ones(len(singles), np.int64)])
    return Admission(index, replicas, used + len(singles))


def admit_by_rank(rates: np.ndarray, rank: np.ndarray, config: PlanningConfig) -> Admission:
    """Slot admission walking keys by (rank desc, index asc) instead of λ (hysteresis).

    Candidates: every multi-replica key plus the top C single-replica keys by rank. Exact for the
    same reason as above: single-replica keys are admitted in rank order until a slot is
    missing, after which nothing fits, so no single outside the top C can be admitted.
    """
    q_ref = config.reference_capacity
    multi = np.flatnonzero(rates > q_ref)
    singles = _top_singles(rates, rank, q_ref, config.slots)
    cand = np.concatenate([multi, singles])
    cand = cand[np.lexsort((cand, -rank[cand]))]
    k = replica_counts(rates[cand], config)
    fits = _greedy_fit(k.astype(np.float64), float(config.slots))
    chosen, k_chosen = cand[fits], k[fits]
    placement = np.lexsort((chosen, -rates[chosen]))  # LPT walks by true λ
    return Admission(chosen[placement], k_chosen[placement], int(k_chosen.sum()))


def _greedy_fit(costs: np.ndarray, budget: float) -> np.ndarray:
    """Mask of items admitted by a walk in the given order that skips what does not fit."""
    cum = np.cumsum(costs)
    prefix = int(np.searchsorted(cum, budget, side="right"))
    take = np.zeros(len(costs), dtype=bool)
    take[:prefix] = True
    left = budget - (float(cum[prefix - 1]) if prefix else 0.0)
    if prefix == len(costs):
        return take
    # Past the first misfit, walk item by item; stop once nothing left can fit.
    suffix_min = np.minimum.accumulate(costs[::-1])[::-1]
    for i in range(prefix + 1, len(costs)):
        if suffix_min[i] > left:
            break
        if costs[i] <= left:
            take[i] = True
            left -= float(costs[i])
    return take


def _top_singles(rates: np.ndarray, rank: np.ndarray, q_ref: float, count: int) -> np.ndarray:
    """The `count` single-replica keys (rate in (0, q_ref]) with the largest rank, ordered by
    (rank desc, index asc)."""
    if count <= 0:
        return np.zeros(0, np.int64)
    threshold = _guess_threshold(rank, count)
    cand = np.flatnonzero((rank >= threshold) & (rates <= q_ref) & (rates > 0.0))
    if len(cand) < count and threshold > 0.0:
        cand = np.flatnonzero((rates <= q_ref) & (rates > 0.0))
    if len(cand) > count:
        cand = _exact_top(cand, rank[cand], count)
    order = np.argsort(-rank[cand], kind="stable")  # cand is index-ascending: ties by index
    return cand[order].astype(np.int64)


def _exact_top(cand: np.ndarray, values: np.ndarray, count: int) -> np.ndarray:
    """The `count` candidates with the largest values, ties to the lower index (cand ascending)."""
    kth = float(np.partition(values, len(values) - count)[len(values) - count])
    above = values > kth
    at = np.flatnonzero(values == kth)[: count - int(above.sum())]
    keep = above
    keep[at] = True
    return cand[keep]


def _guess_threshold(rates: np.ndarray, count: int) -> float:
    """A rate below the count-th largest with high probability (checked by the caller)."""
    n = len(rates)
    stride = max(1, n // _SAMPLE_TARGET)
    sample = rates[::stride]
    if stride == 1 or count * 4 > n:
        return 0.0
    expected = count * len(sample) / n
    rank = int(expected * 1.25 + 4.0 * math.sqrt(expected) + 16)
    if rank >= len(sample):
        return 0.0
    return float(np.partition(sample, len(sample) - rank)[len(sample) - rank])


def _check_tokens(n_keys: int, prefix_tokens: np.ndarray) -> np.ndarray:
    t = np.ascontiguousarray(prefix_tokens, dtype=np.float64)
    if t.ndim != 1 or len(t) != n_keys:
        raise PlanningError(f"need one prefix size per key: {n_keys} keys, shape {t.shape}")
    if len(t) and not (np.isfinite(t).all() and t.min() >= 0.0):
        raise PlanningError("prefix_tokens must be finite and >= 0")
    return t


def admit_by_tokens(
    rates: np.ndarray, config: PlanningConfig, tokens: np.ndarray, rank: np.ndarray | None = None
) -> Admission:
    """Byte-aware admission: a knapsack in tokens, filled greedily by value density.

    Key b caches its reusable prefix P_b on each of its k_b destinations, so it costs k_b · P_b
    tokens of the budget; warm, it saves λ_b · P_b prefill tokens per second. Its value density is
    therefore (λ_b · P_b) / (k_b · P_b) = λ_b / k_b: the per-replica revisit rate, which is what
    keeps a prefix resident (eq. 1). Walk keys by (density desc, value λ_b·P_b desc, index asc);
    admit while the token budget holds, skip a key that does not fit. Keys with P_b = 0 or λ_b = 0
    have nothing to keep warm and are not admitted. Budget: `token_budget`, else C × mean P_b over
    the keys with λ_b > 0. This sorts all eligible keys (O(n log n)); the slot path does not.
    With hysteresis, `rank` replaces λ_b in the density and value (not in k_b).
    """
    eligible = np.flatnonzero((rates > 0.0) & (tokens > 0.0))
    lam, size = rates[eligible], tokens[eligible]
    k = replica_counts(lam, config)
    score = lam if rank is None else rank[eligible]
    order = np.lexsort((eligible, -(score * size), -(score / k)))
    budget = _token_budget(rates, tokens, config)
    fits = _greedy_fit((k * size)[order], budget)
    chosen = order[fits]
    lam_c, idx_c = lam[chosen], eligible[chosen]
    placement = np.lexsort((idx_c, -lam_c))
    k_c = k[chosen][placement]
    used_tokens = float((k[chosen] * size[chosen]).sum())
    return Admission(idx_c[placement].astype(np.int64), k_c, int(k_c.sum()), used_tokens)


def _token_budget(rates: np.ndarray, tokens: np.ndarray, config: PlanningConfig) -> float:
    if config.token_budget is not None:
        return float(config.token_budget)
    requested = tokens[rates > 0.0]
    mean = float(requested.mean()) if len(requested) else 0.0
    return config.slots * mean
