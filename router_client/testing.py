"""Synthetic plans for tests, benchmarks and users' own tests of their routers.

Deterministic for a given seed; shaped like real plans (most keys k_b = 1, a
few hot keys replicated), but not built by Algorithm 1.
"""

from __future__ import annotations

import numpy as np

from router_client.plan import (
    DestinationSpec,
    KeyTable,
    PlanConfig,
    PlanStats,
    RoutingPlan,
    Version,
)

_FIRST = Version(1, 1)


def synthetic_plan(
    n_keys: int,
    n_destinations: int,
    *,
    version: Version = _FIRST,
    seed: int = 0,
    multi_share: float = 0.02,
    max_replicas: int = 4,
    created_at_ms: int = 0,
) -> RoutingPlan:
    """A plan of `n_keys` keys `k00000042`-style over destinations `d0000`..."""
    rng = np.random.default_rng(seed)
    dests = tuple(
        DestinationSpec(f"d{i:04d}", f"10.0.{i // 250}.{i % 250}:8000")
        for i in range(n_destinations)
    )
    sizes = np.ones(n_keys, np.int64)
    hot = rng.random(n_keys) < multi_share
    sizes[hot] = rng.integers(2, max(3, min(max_replicas, n_destinations) + 1), int(hot.sum()))
    sizes = np.minimum(sizes, n_destinations)
    sets = [_distinct(rng, n_destinations, int(k)) for k in sizes]
    keys = [f"k{i:08d}" for i in range(n_keys)]
    rates = np.sort(rng.pareto(1.2, n_keys) + 0.01)[::-1].tolist()
    return RoutingPlan(
        config=PlanConfig(
            q_cap=100.0,
            warm_slots_per_destination=max(1, n_keys // max(1, n_destinations)),
            warm_slots=n_keys,
        ),
        destinations=dests,
        table=KeyTable.from_sets(keys, sets, rates),
        stats=PlanStats(admitted_keys=n_keys, used_slots=int(sizes.sum())),
        version=version,
        created_at_ms=created_at_ms,
    )


def _distinct(rng: np.random.Generator, n: int, k: int) -> tuple[int, ...]:
    if k == 1:
        return (int(rng.integers(n)),)
    return tuple(int(x) for x in rng.choice(n, size=k, replace=False))


def perturb(
    plan: RoutingPlan, share: float, *, version: Version, seed: int = 0, created_at_ms: int = 0
) -> RoutingPlan:
    """`plan` with about `share` of its keys moved: each chosen key with k_b = 1 moves
    to another destination (replicated keys keep their sets, so the columns keep
    their shape and this stays cheap for 100k-key plans)."""
    rng = np.random.default_rng(seed)
    t = plan.table
    n, r = len(t), len(plan.destinations)
    if n == 0 or r < 2:
        return RoutingPlan(plan.config, plan.destinations, t, plan.stats, version, created_at_ms)
    chosen = rng.choice(n, size=round(n * share), replace=False)
    sizes = np.diff(t.set_offsets.astype(np.int64))
    pos = t.set_offsets[chosen[sizes[chosen] == 1]].astype(np.int64)
    members = t.members.copy()
    members[pos] = (members[pos] + 1 + rng.integers(0, r - 1, len(pos))) % r
    table = KeyTable(t.keys, t.set_offsets, members, t.rates)
    return RoutingPlan(plan.config, plan.destinations, table, plan.stats, version, created_at_ms)
