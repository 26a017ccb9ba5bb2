"""`repack`: churn-aware replanning from the installed plan (design notes §3).

Start from the installed assignment under the new rates and fix only what must change:
1. keys that left admission are dropped; members on destinations that are gone or draining are
   dropped (matched by destination id, so destinations may join, leave or reorder);
2. where k_b shrank, the most-loaded members are released; where it grew (or members were
   dropped), the least-loaded destinations not yet in the set are added;
3. newly admitted keys are placed greedily (LPT, λ desc) on the least-loaded destinations;
4. rebalance: while max/mean load exceeds the target (a fresh LPT plan's imbalance plus
   `imbalance_tolerance`, relaxed by `balance_effort`), move one replica off the most-loaded
   destination to a less-loaded one that the key does not use yet (distinctness), choosing the
   smallest share that brings the donor down to the target, else the largest that fits.
A key whose rate, k_b and destinations are unchanged is touched only by step 4. Moves are
measured in traffic (λ_b / k_b), since that is what must rewarm.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np

from planner_svc.planning.admission import Admission, admit, check_rates
from planner_svc.planning.build import assemble, balance_goal, warm_owners
from planner_svc.planning.config import PlanningConfig
from planner_svc.planning.placement import (
    TailModel,
    affine_place,
    cold_tail_loads,
    least_loaded,
    lpt_place,
    rebalance,
    ring_owners,
)
from planner_svc.planning.stats import imbalance
from router_client.plan import RoutingPlan


def repack(
    previous: RoutingPlan,
    keys: Sequence[str],
    rates: np.ndarray,
    config: PlanningConfig,
    *,
    prefix_tokens: np.ndarray | None = None,
    clock: Callable[[], float] | None = None,
    warm_at: np.ndarray | None = None,
) -> RoutingPlan:
    """A plan for the new rates that moves as little traffic as balance allows (built_by="repack").

    `warm_at` (per key: the index in `config.destinations` that last served it, -1 unknown):
    a key entering the plan goes there first while balance allows (its cache is warm there),
    as a hashed tail's keys go to their ring owners.

    Admission is the same top-rate rule as `build_plan` (unless `config.admission_hysteresis`
    favours the installed plan's keys); placement is churn-aware. Deterministic; `clock` fills
    `stats.build_seconds` as in `build_plan`.
    """
    started = clock() if clock else 0.0
    r = check_rates(len(keys), rates)
    if warm_at is not None and len(warm_at) != len(keys):
        raise ValueError(f"warm_at has {len(warm_at)} entries for {len(keys)} keys")
    # previous key -> its position in the installed table (replica hysteresis, kept sets)
    index = dict(zip(previous.table.keys, range(len(previous.table.keys)), strict=True))
    adm = admit(_held_replicas(previous, index, keys, r, config), config, prefix_tokens,
                incumbent=_incumbents(previous, keys, config))
    healthy = np.flatnonzero(config.active)
    weights = config.weights[healthy]
    shares = r[adm.index] / adm.replicas
    tail, ring = (TailModel.of_plan(keys, r, adm.index,
                                    [config.destinations[i].id for i in healthy.tolist()],
                                    weights) if config.hashed_tail else (None, None))
    base = (tail.loads() if tail is not None else
            cold_tail_loads(max(0.0, float(r.sum()) - float(r[adm.index].sum())), weights))
    goal = balance_goal(shares, adm.replicas, base, weights, config)
    sets = _kept_sets(previous, index, keys, adm, config)
    loads = base + _set_loads(sets, shares, len(healthy))
    _release_extra(sets, adm.replicas, shares, loads, weights)
    owners = ring_owners(keys, adm.index, ring) if ring is not None else None
    if warm_at is not None:
        owners = warm_owners(warm_at, adm.index, config, owners)
    _fill_short(sets, adm.replicas, shares, loads, weights, owners,
                goal * float(r.sum()) / float(weights.sum()))
    # Rebalance down to the goal, relaxed by (1 - balance_effort) towards where we are.
    target = goal + (1.0 - config.balance_effort) * max(0.0, imbalance(loads, weights) - goal)
    rebalance(sets, shares, loads, weights, target)
    flat = np.fromiter(itertools.chain.from_iterable(map(sorted, sets)), np.int64,
                       int(adm.replicas.sum()))
    members = healthy[flat]
    if tail is not None:  # the tail's bound against the planned load as placed
        loads = tail.with_planned(loads - base)
    return assemble(keys, r, config, adm, members, loads, "repack",
                    (clock() - started) if clock else 0.0)


def _held_replicas(
    previous: RoutingPlan, index: dict[str, int], keys: Sequence[str], rates: np.ndarray,
    config: PlanningConfig,
) -> np.ndarray:
    """The rates admission counts replicas from (`config.replica_hysteresis` h): an incumbent
    whose ⌈λ/q⌉ differs from its installed k while λ stays within q·k·(1 + h) above or
    q·(k − 1)·(1 − h) below is counted just inside its installed k. Only k_b and the order
    of admission see these rates; loads are planned on the true ones."""
    h = config.replica_hysteresis
    if h <= 0.0:
        return rates
    q = config.reference_capacity
    offsets = previous.table.set_offsets
    held = rates.copy()
    # Only a rate over q(1 - h) can be held: growing needs λ > q·k >= q, shrinking
    # λ >= q(k - 1)(1 - h) >= q(1 - h); so only the hot few are looked at.
    for i in np.flatnonzero(rates >= q * (1.0 - h)).tolist():
        j = index.get(keys[i])
        if j is None:
            continue
        k = int(offsets[j + 1] - offsets[j])
        lam = float(rates[i])
        if lam > q * k and lam <= q * k * (1.0 + h):
            held[i] = q * k * (1.0 - 1e-9)  # ⌈·/q⌉ = k
        elif k > 1 and lam <= q * (k - 1) and lam >= q * (k - 1) * (1.0 - h):
            held[i] = q * (k - 1) * (1.0 + 1e-9)  # just over k − 1: still k
    return held


def _incumbents(
    previous: RoutingPlan, keys: Sequence[str], config: PlanningConfig
) -> np.ndarray | None:
    """Bool per key: admitted by `previous` (only computed when hysteresis is on: one O(n) pass)."""
    if config.admission_hysteresis <= 0.0:
        return None
    admitted = set(previous.table.keys)
    return np.fromiter((k in admitted for k in keys), bool, len(keys))


def _kept_sets(
    previous: RoutingPlan, index: dict[str, int], keys: Sequence[str], adm: Admission,
    config: PlanningConfig,
) -> list[list[int]]:
    """Per admitted key, its previous members that are still healthy (healthy positions)."""
    position = {}
    for h, i in enumerate(np.flatnonzero(config.active).tolist()):
        position[config.destinations[i].id] = h
    remap = [position.get(d.id, -1) for d in previous.destinations]
    table = previous.table
    offsets = table.set_offsets.tolist()
    members = [remap[m] for m in table.members.tolist()]
    # Per key in Python (a replan's largest cost at ~10 k admitted keys): when every
    # previous destination is still healthy, a set is its slice, unfiltered.
    everyone = all(m >= 0 for m in remap)
    sets: list[list[int]] = []
    append = sets.append
    for i in adm.index.tolist():
        p = index.get(keys[i])
        if p is None:
            append([])
        elif everyone:
            append(members[offsets[p] : offsets[p + 1]])
        else:
            append([m for m in members[offsets[p] : offsets[p + 1]] if m >= 0])
    return sets


def _set_loads(sets: list[list[int]], shares: np.ndarray, n: int) -> np.ndarray:
    sizes = np.fromiter(map(len, sets), np.int64, len(sets))
    flat = np.fromiter(itertools.chain.from_iterable(sets), np.int64, int(sizes.sum()))
    return np.bincount(flat, np.repeat(shares, sizes), minlength=n).astype(np.float64)


def _release_extra(
    sets: list[list[int]], k: np.ndarray, shares: np.ndarray, loads: np.ndarray, w: np.ndarray
) -> None:
    """Where k_b shrank, drop the most-loaded members (ties: higher index first)."""
    sizes = np.fromiter(map(len, sets), np.int64, len(sets))
    for j in np.flatnonzero(sizes > k).tolist():  # only the few sets that shrank
        s = sets[j]
        for _ in range(len(s) - int(k[j])):
            worst = max(s, key=lambda m: (loads[m] / w[m], m))
            s.remove(worst)
            loads[worst] -= shares[j]


def _fill_short(
    sets: list[list[int]], k: np.ndarray, shares: np.ndarray, loads: np.ndarray, w: np.ndarray,
    owners: np.ndarray | None, limit: float,
) -> None:
    """Top up partial sets on the least-loaded unused destinations, then place new keys: by
    LPT, or (`owners` given: a hashed tail) on their ring owners within `limit` first."""
    sizes = np.fromiter(map(len, sets), np.int64, len(sets))
    fresh = np.flatnonzero(sizes == 0).tolist()
    for j in np.flatnonzero((sizes > 0) & (sizes < k)).tolist():
        _add_members(sets[j], int(k[j]) - int(sizes[j]), shares[j], loads, w)
    if fresh and owners is not None:
        idx = np.array(fresh, np.int64)
        placed = affine_place(shares[idx], k[idx], owners[idx], loads, w, limit)
        for j, members in zip(fresh, placed, strict=True):
            sets[j] = members
    elif fresh:
        idx = np.array(fresh, np.int64)
        flat = lpt_place(shares[idx], k[idx], loads, w)
        offsets = np.concatenate([[0], np.cumsum(k[idx])]).tolist()
        for n, j in enumerate(fresh):
            sets[j] = flat[offsets[n] : offsets[n + 1]].tolist()


def _add_members(s: list[int], count: int, share: float, loads: np.ndarray, w: np.ndarray) -> None:
    taken = set(s)
    for m in least_loaded(loads, w, len(loads)).tolist():
        if count == 0:
            break
        if m not in taken:
            s.append(m)
            loads[m] += share
            count -= 1
