"""`diff`: what changes between two plans, by key and by destination id.

A key is *moved* when it is admitted in both plans and its destination set (as ids) differs.
Traffic shares are over plan b's admitted traffic, using `rates_by_key` when given, else the rate
each plan recorded (b's for moved and added keys, a's for removed ones). `rewarm_traffic_per_s`
counts moves the way rewarming costs them: for a moved key, λ_b/k_b for each new member.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from router_client.plan import RoutingPlan


@dataclass(frozen=True)
class PlanDiff:
    """Key-level and destination-level change from plan a to plan b."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    moved: tuple[str, ...]
    kept_keys: int  # admitted in both
    moved_key_fraction: float  # moved / keys admitted in both
    moved_traffic_share: float  # Σλ(moved) / Σλ(admitted in b)
    added_traffic_share: float
    removed_traffic_share: float
    rewarm_traffic_per_s: float
    load_change_per_s: dict[str, float]  # by destination id, b − a (expected loads)


def _sets_by_id(plan: RoutingPlan) -> dict[str, frozenset[str]]:
    ids = plan.destination_ids
    return {k: frozenset(ids[m] for m in s) for k, s in plan.table.as_dict().items()}


def _rates(plan: RoutingPlan, given: Mapping[str, float] | None) -> dict[str, float]:
    recorded = dict(zip(plan.table.keys, plan.table.rates.tolist(), strict=True))
    if given is not None:
        recorded.update({k: float(given[k]) for k in recorded if k in given})
    return recorded


def _load_change(a: RoutingPlan, b: RoutingPlan) -> dict[str, float]:
    la = dict(zip(a.destination_ids, a.stats.expected_load_per_s, strict=False))
    lb = dict(zip(b.destination_ids, b.stats.expected_load_per_s, strict=False))
    ids = list(dict.fromkeys([*a.destination_ids, *b.destination_ids]))
    return {d: lb.get(d, 0.0) - la.get(d, 0.0) for d in ids}


def diff(
    a: RoutingPlan, b: RoutingPlan, rates_by_key: Mapping[str, float] | None = None
) -> PlanDiff:
    """Added, removed and moved keys, the moved shares, and per-destination load change."""
    sa, sb = _sets_by_id(a), _sets_by_id(b)
    ra, rb = _rates(a, rates_by_key), _rates(b, rates_by_key)
    added = tuple(k for k in b.table.keys if k not in sa)
    removed = tuple(k for k in a.table.keys if k not in sb)
    kept = [k for k in b.table.keys if k in sa]
    moved = tuple(k for k in kept if sa[k] != sb[k])
    total_b = sum(rb.values())

    def share(total: float) -> float:
        return total / total_b if total_b > 0 else 0.0

    rewarm = sum(rb[k] / len(sb[k]) * len(sb[k] - sa[k]) for k in moved)
    return PlanDiff(
        added=added,
        removed=removed,
        moved=moved,
        kept_keys=len(kept),
        moved_key_fraction=len(moved) / len(kept) if kept else 0.0,
        moved_traffic_share=share(sum(rb[k] for k in moved)),
        added_traffic_share=share(sum(rb[k] for k in added)),
        removed_traffic_share=share(sum(ra[k] for k in removed)),
        rewarm_traffic_per_s=rewarm,
        load_change_per_s=_load_change(a, b),
    )
