"""`build_plan`: Algorithm 1 from scratch (admission, cold-tail baseline, LPT placement)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence

import numpy as np

from planner_svc.planning.admission import Admission, admit, check_rates
from planner_svc.planning.config import PlanningConfig
from planner_svc.planning.errors import PlanningError
from planner_svc.planning.placement import (
    TailModel,
    affine_place,
    cold_tail_loads,
    lpt_place,
    rebalance,
    ring_owners,
)
from planner_svc.planning.stats import imbalance, plan_stats, table_from_flat
from router_client.plan import RoutingPlan


def build_plan(
    keys: Sequence[str],
    rates: np.ndarray,
    config: PlanningConfig,
    *,
    prefix_tokens: np.ndarray | None = None,
    clock: Callable[[], float] | None = None,
    warm_at: np.ndarray | None = None,
) -> RoutingPlan:
    """A fresh plan (version 0.0, built_by="build") for keys at `rates` (req/s).

    `warm_at` (per key: the index in `config.destinations` that last served it, -1 unknown):
    each admitted key goes there first while balance allows, as in `repack`. A first plan
    needs it most: before it every key went where the cold tail sent it, and a plan that
    ignores that moves each admitted key off the engine its traffic warmed.

    Deterministic: the same inputs give the same plan byte for byte. `clock` (e.g.
    `time.perf_counter`) only fills `stats.build_seconds`; without it that field is 0.0 so that
    the encoded plan depends on the inputs alone.
    """
    started = clock() if clock else 0.0
    r = check_rates(len(keys), rates)
    if warm_at is not None and len(warm_at) != len(keys):
        raise ValueError(f"warm_at has {len(warm_at)} entries for {len(keys)} keys")
    adm = admit(r, config, prefix_tokens)
    healthy = np.flatnonzero(config.active)
    weights = config.weights
    total = float(r.sum())
    admitted_rate = float(r[adm.index].sum())
    shares = r[adm.index] / adm.replicas
    if config.hashed_tail or warm_at is not None:
        members_h, loads_h = _place_affine(keys, r, config, adm, shares, warm_at)
    else:
        loads_h = cold_tail_loads(max(0.0, total - admitted_rate), weights[healthy])
        members_h = lpt_place(shares, adm.replicas, loads_h, weights[healthy])
    return assemble(keys, r, config, adm, healthy[members_h], loads_h, "build",
                    (clock() - started) if clock else 0.0)


def _place_affine(
    keys: Sequence[str], r: np.ndarray, config: PlanningConfig, adm: Admission,
    shares: np.ndarray, warm_at: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Placement with locality: keys where they are warm (`warm_at`), else on their ring
    owners (with a hashed cold tail), within the balance a fresh LPT reaches
    (+ `imbalance_tolerance`); the rest by LPT, then rebalanced to that target."""
    healthy = np.flatnonzero(config.active)
    w = config.weights[healthy]
    tail, owners = None, None
    if config.hashed_tail:
        tail, ring = TailModel.of_plan(keys, r, adm.index,
                                       [config.destinations[i].id for i in healthy.tolist()], w)
        base = tail.loads()
        owners = ring_owners(keys, adm.index, ring)
    else:
        base = cold_tail_loads(max(0.0, float(r.sum()) - float(r[adm.index].sum())), w)
    if warm_at is not None:
        owners = warm_owners(warm_at, adm.index, config, owners)
    assert owners is not None
    goal = balance_goal(shares, adm.replicas, base, w, config)
    loads = base.copy()
    mean = float(r.sum()) / float(w.sum())
    sets = affine_place(shares, adm.replicas, owners, loads, w, goal * mean)
    rebalance(sets, shares, loads, w, goal)
    flat = np.fromiter((m for s in sets for m in sorted(s)), np.int64, int(adm.replicas.sum()))
    return flat, (tail.with_planned(loads - base) if tail is not None else loads)


def warm_owners(warm_at: np.ndarray, admitted: np.ndarray, config: PlanningConfig,
                ring: np.ndarray | None) -> np.ndarray:
    """Per admitted key, the healthy position that served it last (else its ring owner, or
    -1: placed by LPT)."""
    position = np.full(len(config.destinations), -1, np.int64)
    position[np.flatnonzero(config.active)] = np.arange(int(config.active.sum()))
    at = np.asarray(warm_at, np.int64)[admitted]
    known = (at >= 0) & (at < len(position))
    out = np.where(known, position[np.where(known, at, 0)], -1)
    if ring is not None:
        out = np.where(out >= 0, out, ring)
    return out


def balance_goal(
    shares: np.ndarray, replicas: np.ndarray, base: np.ndarray, w: np.ndarray,
    config: PlanningConfig,
) -> float:
    """The imbalance a fresh LPT plan reaches over `base`, plus `imbalance_tolerance`."""
    fresh = base.copy()
    lpt_place(shares, replicas, fresh, w)
    return imbalance(fresh, w) + config.imbalance_tolerance


def assemble(
    keys: Sequence[str],
    rates: np.ndarray,
    config: PlanningConfig,
    adm: Admission,
    members: np.ndarray,
    healthy_loads: np.ndarray,
    built_by: str,
    build_seconds: float,
) -> RoutingPlan:
    """The RoutingPlan for an admission and its flat member list (plan destination indices)."""
    healthy = np.flatnonzero(config.active)
    loads = np.zeros(len(config.destinations))
    loads[healthy] = healthy_loads
    admitted = check_unique(pick(keys, adm.index))
    table = table_from_flat(admitted, adm.replicas, members, rates[adm.index])
    stats = plan_stats(
        loads=loads, weights=config.weights, healthy=healthy, total_rate=float(rates.sum()),
        admitted_rate=float(rates[adm.index].sum()), table=table, build_seconds=build_seconds,
    )
    return RoutingPlan(config.plan_config(built_by), config.destinations, table, stats)


def pick(keys: Sequence[str], index: np.ndarray) -> list[str]:
    """keys[i] for i in index, as a list (itemgetter: one C loop instead of a comprehension)."""
    if len(index) < 2:
        return [keys[i] for i in index.tolist()]
    return list(operator.itemgetter(*index.tolist())(keys))


def check_unique(keys: list[str]) -> list[str]:
    """Admitted keys must be unique (routers refuse a plan that repeats one)."""
    if len(set(keys)) != len(keys):
        raise PlanningError("routing keys must be unique; an admitted key appears twice")
    return keys
