"""Why a key is (or is not) where the plan puts it (pure): `cacheroute plan explain KEY`.

Everything is recomputed from what the planner decided on: the installed plan, the rates of
the window it holds, the planning configuration, the next repack's candidate and the retained
versions. Nothing here is a new rule; the figures are Algorithm 1's own:

- k_b = max(1, ceil(λ_b / q_ref)), capped at the healthy destinations (eq. 2);
- admission walks keys by rate (desc), admitting while Σ k_b fits the C slots and skipping a
  key whose k_b does not fit (eq. 3); byte-aware admission ranks by λ_b / k_b under a token
  budget instead;
- the cut-off is the lowest rate the plan admitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from planner_svc.planning.admission import replica_counts
from planner_svc.planning.config import PlanningConfig
from router_client.plan import RoutingPlan


@dataclass(frozen=True)
class KeyExplanation:
    key: str
    seen: bool  # in the rates of the current window
    rate_per_s: float
    rank: int  # 1-based among keys with a rate > 0 (0: not ranked)
    keys_with_traffic: int
    replicas: int  # k_b by eq. 2 at this rate (0: unseen)
    replicas_why: str
    admitted: bool  # in the installed plan
    reason: str
    destinations: tuple[str, ...] = ()
    destination_loads_per_s: tuple[float, ...] = ()  # the plan's expected load of each
    planned_rate_per_s: float = 0.0  # the rate the installed plan placed it at
    cutoff_rate_per_s: float = 0.0  # the lowest rate the installed plan admitted
    slots_used: int = 0
    slots: int = 0
    next_destinations: tuple[str, ...] | None = None  # the next repack (None: not admitted)
    history: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())  # newest first


def _members(plan: RoutingPlan, key: str) -> tuple[tuple[str, ...], float] | None:
    table = plan.table
    try:
        i = list(table.keys).index(key)
    except ValueError:
        return None
    ids = tuple(plan.destinations[m].id for m in table.set_of(i))
    return ids, float(table.rates[i])


def explain_key(
    key: str,
    plan: RoutingPlan,
    keys: Sequence[str],
    rates: np.ndarray,
    config: PlanningConfig,
    *,
    candidate: RoutingPlan | None = None,
    history: Sequence[RoutingPlan] = (),
) -> KeyExplanation:
    """The explanation of `key` under `plan`, the window's `keys`/`rates` and `config`;
    `candidate` is what the next repack would install, `history` older plans (newest first)."""
    r = np.asarray(rates, dtype=np.float64)
    positions = {k: i for i, k in enumerate(keys)}
    seen = key in positions
    rate = float(r[positions[key]]) if seen else 0.0
    positive = int(np.count_nonzero(r > 0))
    rank = int(np.count_nonzero(r > rate)) + 1 if seen and rate > 0 else 0
    q_ref = config.reference_capacity
    k = int(replica_counts(np.array([rate]), config)[0]) if seen else 0
    why = (f"k_b = max(1, ceil({rate:.3g} / q_ref {q_ref:.3g})) = {k}"
           + (f", capped at the {config.n_active} healthy destinations"
              if seen and np.ceil(rate / q_ref) > config.n_active else "")) if seen else ""
    placed = _members(plan, key)
    past = []
    for older in history:
        found = _members(older, key)
        past.append((str(older.version), found[0] if found is not None else ()))
    last_planned = next((version for version, ids in past if ids), None)
    table = plan.table
    cutoff = float(table.rates.min()) if len(table) else 0.0
    used = int(table.replicas().sum()) if len(table) else 0
    slots = config.slots
    loads = plan.stats.expected_load_per_s
    by_id = {d.id: i for i, d in enumerate(plan.destinations)}
    if placed is not None:
        ids, planned_rate = placed
        reason = (f"admitted: rank {rank} of {positive} keys with traffic, k_b {len(ids)}"
                  if rate > 0 else "admitted by the installed plan, but without traffic in the "
                  "current window (the next plan drops it unless it returns)")
        dest_loads = tuple(float(loads[by_id[d]]) if loads else 0.0 for d in ids)
    else:
        ids, planned_rate, dest_loads = (), 0.0, ()
        if not seen and last_planned is not None:
            reason = (f"not in the current window's rates (plan {last_planned} admitted it); it "
                      "is routed by the cold tail (consistent hashing or power-of-two-choices)")
        elif not seen:
            reason = ("never seen: not in the current window's rates; it is routed by the cold "
                      "tail (consistent hashing or power-of-two-choices)")
        elif rate <= 0:
            reason = "no traffic in the current window: a key nobody requests is not admitted"
        elif config.byte_aware:
            reason = (f"not admitted: byte-aware admission ranks by λ/k_b = {rate / max(k, 1):.3g} "
                      "req/s per replica, and the token budget was spent on denser keys")
        elif rate < cutoff or (rate == cutoff and used >= slots):
            reason = (f"not admitted: rate {rate:.3g} req/s is below the cut-off {cutoff:.3g} "
                      f"(rank {rank} of {positive}; {used} of {slots} slots used)")
        else:
            reason = (f"skipped: its k_b {k} did not fit the slots left when its rank {rank} was "
                      f"reached ({used} of {slots} used); smaller keys after it were admitted")
    nxt = None
    if candidate is not None:
        found = _members(candidate, key)
        nxt = found[0] if found is not None else None
    return KeyExplanation(
        key=key, seen=seen, rate_per_s=rate, rank=rank, keys_with_traffic=positive,
        replicas=k, replicas_why=why, admitted=placed is not None, reason=reason,
        destinations=ids, destination_loads_per_s=dest_loads, planned_rate_per_s=planned_rate,
        cutoff_rate_per_s=cutoff, slots_used=used, slots=slots, next_destinations=nxt,
        history=tuple(past))
