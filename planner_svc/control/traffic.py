"""Current traffic, and what an installed or candidate plan does with it.

`Traffic` is the control loop's view of one rates window: the keys the stream
saw, their request rates and (optionally) their mean reusable prompt tokens.
The functions below project a `RoutingPlan` onto that traffic:

- `aligned_rates(plan, traffic)`: each admitted key's *current* rate (0 if the
  key went quiet);
- `expected_loads(plan, traffic)`: requests/s each destination can expect when
  routers follow the plan under current rates. An admitted key's rate is split
  evenly over its k_b members (dispatch picks the least-loaded member, which
  equalises them in expectation); the cold tail is spread by power-of-two
  choices, i.e. in proportion to capacity over destinations that are not draining;
- `new_member_share(installed, candidate)`: per candidate key, the share of its
  destination set that the installed plan did not already give it, matching
  destinations by id (plans may differ in their destination lists). A key the
  installed plan did not admit counts as fully new.

Pure: numpy and `router_client.plan` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from router_client.plan import RoutingPlan

# Used when the stream does not know a key's reusable prefix length yet.
DEFAULT_PREFIX_TOKENS = 1024.0


@dataclass(frozen=True)
class Traffic:
    """One window of measured per-key traffic.

    `rates[i]` is key `keys[i]`'s request rate in requests/s; `prefix_tokens[i]`
    its mean reusable prompt tokens (0 or absent = unknown, replaced by
    `default_prefix_tokens`); `window_end_s` is when the window closed (freshness).
    """

    keys: Sequence[str]
    rates: np.ndarray
    prefix_tokens: np.ndarray | None = None
    window_end_s: float = 0.0
    default_prefix_tokens: float = DEFAULT_PREFIX_TOKENS

    @cached_property
    def index(self) -> dict[str, int]:
        """key -> position in `keys`."""
        return {k: i for i, k in enumerate(self.keys)}

    @cached_property
    def tokens(self) -> np.ndarray:
        """Reusable prompt tokens per key with unknowns defaulted."""
        if self.prefix_tokens is None:
            return np.full(len(self.keys), self.default_prefix_tokens)
        tokens = np.asarray(self.prefix_tokens, np.float64)
        return np.where(tokens > 0, tokens, self.default_prefix_tokens)

    @property
    def total_rate(self) -> float:
        return float(np.sum(self.rates))

    def mean_tokens_per_request(self) -> float:
        """Rate-weighted mean of the reusable prompt tokens."""
        total = self.total_rate
        if total <= 0:
            return self.default_prefix_tokens
        return float(np.dot(self.rates, self.tokens) / total)

    def positions(self, keys: Sequence[str]) -> np.ndarray:
        """Position of each of `keys` in this traffic, -1 where the key is absent."""
        index = self.index
        return np.fromiter((index.get(k, -1) for k in keys), np.int64, count=len(keys))


def _gather(values: np.ndarray, positions: np.ndarray, missing: float) -> np.ndarray:
    out = np.full(len(positions), missing, np.float64)
    present = positions >= 0
    out[present] = values[positions[present]]
    return out


def aligned_rates(plan: RoutingPlan, traffic: Traffic) -> np.ndarray:
    """Current rate of each key the plan admitted (plan-table order); 0 if quiet now."""
    return _gather(np.asarray(traffic.rates, np.float64), traffic.positions(plan.table.keys), 0.0)


def aligned_tokens(plan: RoutingPlan, traffic: Traffic) -> np.ndarray:
    """Reusable prompt tokens of each admitted key (plan-table order)."""
    positions = traffic.positions(plan.table.keys)
    return _gather(traffic.tokens, positions, traffic.default_prefix_tokens)


def capacities(plan: RoutingPlan) -> np.ndarray:
    """Per-destination capacity knee in requests/s: q_cap × capacity weight."""
    weights = np.array([d.capacity_weight for d in plan.destinations], np.float64)
    return plan.config.q_cap * weights


def _fallback_shares(plan: RoutingPlan) -> np.ndarray:
    weights = np.array(
        [0.0 if d.draining else d.capacity_weight for d in plan.destinations], np.float64
    )
    total = weights.sum()
    return weights / total if total > 0 else np.full(len(weights), 1.0 / len(weights))


def expected_loads(plan: RoutingPlan, traffic: Traffic) -> np.ndarray:
    """Requests/s per destination (plan order) if routers follow `plan` under `traffic`."""
    rates = aligned_rates(plan, traffic)
    cold_tail = max(0.0, traffic.total_rate - float(rates.sum()))
    return _loads(plan, rates, cold_tail)


def planned_loads(plan: RoutingPlan) -> np.ndarray:
    """Requests/s per destination under the rates the plan was built on."""
    expected = plan.stats.expected_load_per_s
    if len(expected) == len(plan.destinations):
        return np.asarray(expected, np.float64)
    rates = np.asarray(plan.table.rates, np.float64)
    if len(rates) != len(plan.table):
        rates = np.zeros(len(plan.table))
    return _loads(plan, rates, plan.stats.cold_tail_rate_per_s)


def _loads(plan: RoutingPlan, rates: np.ndarray, cold_tail: float) -> np.ndarray:
    table = plan.table
    k = table.replicas()
    per_member = np.repeat(rates / np.maximum(k, 1), k)
    members = table.members.astype(np.int64)
    n = len(plan.destinations)
    loads = np.bincount(members, weights=per_member, minlength=n).astype(np.float64)
    return loads + cold_tail * _fallback_shares(plan)


def imbalance(plan: RoutingPlan, loads: np.ndarray) -> float:
    """max/mean load over destinations that are not draining (1.0 when idle)."""
    active = np.array([not d.draining for d in plan.destinations])
    live = loads[active] if active.any() else loads
    mean = float(live.mean()) if len(live) else 0.0
    return float(live.max()) / mean if mean > 0 else 1.0


def _pair_codes(
    plan: RoutingPlan, key_pos: np.ndarray, dest_codes: np.ndarray, n: int
) -> np.ndarray:
    k = plan.table.replicas()
    owners = np.repeat(key_pos, k)
    dests = dest_codes[plan.table.members.astype(np.int64)]
    codes = owners * n + dests
    return codes[owners >= 0]


def new_member_share(installed: RoutingPlan, candidate: RoutingPlan) -> np.ndarray:
    """Per candidate key: share of its set the installed plan did not give it (0..1)."""
    names = dict.fromkeys(installed.destination_ids + candidate.destination_ids)
    ids = {d: i for i, d in enumerate(names)}
    n = len(ids)
    cand_codes_by_dest = np.array([ids[d] for d in candidate.destination_ids], np.int64)
    inst_codes_by_dest = np.array([ids[d] for d in installed.destination_ids], np.int64)
    cand_keys = candidate.table.keys
    cand_index = {key: i for i, key in enumerate(cand_keys)}
    inst_pos = np.fromiter(
        (cand_index.get(key, -1) for key in installed.table.keys), np.int64, len(installed.table)
    )
    kept = _pair_codes(installed, inst_pos, inst_codes_by_dest, n)
    k = candidate.table.replicas()
    mine = np.repeat(np.arange(len(cand_keys), dtype=np.int64), k)
    cand = mine * n + cand_codes_by_dest[candidate.table.members.astype(np.int64)]
    held = np.bincount(mine[np.isin(cand, kept)], minlength=len(cand_keys))
    return 1.0 - held / np.maximum(k, 1)


def dropped_rate(installed: RoutingPlan, candidate: RoutingPlan, traffic: Traffic) -> float:
    """Current rate of keys the installed plan admits and the candidate does not."""
    cand = set(candidate.table.keys)
    gone = [i for i, key in enumerate(installed.table.keys) if key not in cand]
    return float(aligned_rates(installed, traffic)[gone].sum()) if gone else 0.0


def moved_traffic_share(installed: RoutingPlan, candidate: RoutingPlan, traffic: Traffic) -> float:
    """Share of current traffic whose destinations change if `candidate` replaces `installed`.

    A key contributes λ_b × (new share of its set); keys entering admission move all
    their traffic off the fallback and keys leaving admission move all of it onto it.
    """
    total = traffic.total_rate
    if total <= 0:
        return 0.0
    fresh = new_member_share(installed, candidate)
    moved_in = float(np.dot(aligned_rates(candidate, traffic), fresh))
    return min(1.0, (moved_in + dropped_rate(installed, candidate, traffic)) / total)
