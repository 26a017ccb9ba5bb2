"""Current traffic, and what an installed or candidate plan does with it.

`Traffic` is the control loop's view of one rates window: the keys the stream
saw, their request rates and (optionally) their mean reusable prompt tokens.
The functions below project a `RoutingPlan` onto that traffic:

- `aligned_rates(plan, traffic)`: each admitted key's *current* rate (0 if the
  key went quiet);
- `expected_loads(plan, traffic, fleet)`: requests/s each destination of the
  fleet can expect when routers follow the plan under current rates. An admitted
  key's rate is split evenly over its members that are still live (dispatch
  picks the least-loaded member, which equalises them in expectation); a key
  with no live member left, and every unadmitted key, is cold tail, spread by
  power-of-two choices, i.e. in proportion to capacity over live destinations, or, for a
  plan built for a hashed tail (`PlanConfig.hashed_tail`), where the routers' ring puts
  each such key (`planning.placement.hashed_tail_loads`, the planner's own model).
  `fleet` is the current destination list (None = the plan's own), so a plan
  pinned to a drained or removed destination is priced as what it now is;
- `new_member_share(installed, candidate)`: per candidate key, the share of its
  destination set that the installed plan did not already give it, matching
  destinations by id (plans may differ in their destination lists). A key the
  installed plan did not admit counts as fully new.

Pure: numpy and `router_client.plan` only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from planner_svc.planning.placement import hashed_tail_loads, tail_ring
from planner_svc.planning.stats import imbalance as stats_imbalance
from router_client.plan import DestinationSpec, RoutingPlan

# The destinations as they are now (ids, draining flags, capacity weights).
Fleet = Sequence[DestinationSpec]

# Used when the stream does not know a key's reusable prefix length yet.
DEFAULT_PREFIX_TOKENS = 1024.0


@dataclass(frozen=True)
class Traffic:
    """One window of measured per-key traffic.

    `rates[i]` is key `keys[i]`'s request rate in requests/s; `prefix_tokens[i]`
    its mean reusable prompt tokens (0 or absent = unknown, replaced by
    `default_prefix_tokens`); `window_end_s` is when the window closed (freshness);
    `last_destination[i]` where its newest request went, an index into
    `last_destination_names` (-1 or absent: unknown).
    """

    keys: Sequence[str]
    rates: np.ndarray
    prefix_tokens: np.ndarray | None = None
    window_end_s: float = 0.0
    default_prefix_tokens: float = DEFAULT_PREFIX_TOKENS
    last_destination: np.ndarray | None = None
    last_destination_names: tuple[str, ...] = ()

    def warm_at(self, destinations: Sequence[str]) -> np.ndarray | None:
        """Per key, the index in `destinations` its newest request went to (-1: unknown or
        not one of them); None when nothing was reported."""
        if self.last_destination is None or len(self.last_destination) != len(self.keys):
            return None
        position = {d: i for i, d in enumerate(destinations)}
        table = np.array([position.get(n, -1) for n in self.last_destination_names] + [-1],
                         np.int64)  # (index -1 reads the trailing -1)
        return table[np.asarray(self.last_destination, np.int64)]

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


def fleet_of(plan: RoutingPlan, fleet: Fleet | None = None) -> tuple[DestinationSpec, ...]:
    """The destinations to evaluate on: the current `fleet` if given, else the plan's own."""
    return plan.destinations if fleet is None else tuple(fleet)


def capacities(plan: RoutingPlan, fleet: Fleet | None = None) -> np.ndarray:
    """Per-destination capacity knee in requests/s (fleet order): q_cap × capacity weight."""
    weights = np.array([d.capacity_weight for d in fleet_of(plan, fleet)], np.float64)
    return plan.config.q_cap * weights


def _fallback_shares(dests: Sequence[DestinationSpec],
                     weights: Sequence[float] | None = None) -> np.ndarray:
    """Cold-tail shares by weight (`weights`, else the destinations' own), draining ones 0."""
    given = [d.capacity_weight for d in dests] if weights is None else weights
    shares = np.array([0.0 if d.draining else w for d, w in zip(dests, given, strict=True)],
                      np.float64)
    total = shares.sum()
    return shares / total if total > 0 else np.full(len(shares), 1.0 / len(shares))


def _placement(
    plan: RoutingPlan, dests: Sequence[DestinationSpec]
) -> tuple[np.ndarray, np.ndarray]:
    """(fleet position of each member entry, -1 if gone or draining; owning key of each entry)."""
    live = {d.id: i for i, d in enumerate(dests) if not d.draining}
    remap = np.array([live.get(d.id, -1) for d in plan.destinations], np.int64)
    member = remap[plan.table.members.astype(np.int64)]
    owner = np.repeat(np.arange(len(plan.table), dtype=np.int64), plan.table.replicas())
    return member, owner


def served_mask(plan: RoutingPlan, fleet: Fleet | None = None) -> np.ndarray:
    """Per plan key: whether any of its members is still live (else the fallback serves it)."""
    member, owner = _placement(plan, fleet_of(plan, fleet))
    return np.bincount(owner[member >= 0], minlength=len(plan.table)) > 0


def expected_loads(plan: RoutingPlan, traffic: Traffic, fleet: Fleet | None = None) -> np.ndarray:
    """Requests/s per destination (fleet order) if routers follow `plan` under `traffic`."""
    dests = fleet_of(plan, fleet)
    # A fallback plan sends everything by P2C, whatever tail it was built for.
    hashed = plan.config.hashed_tail and not plan.config.is_fallback
    return _loads(plan, aligned_rates(plan, traffic), traffic.total_rate, dests,
                  traffic if hashed else None)


def planned_loads(plan: RoutingPlan) -> np.ndarray:
    """Requests/s per destination under the rates the plan was built on."""
    expected = plan.stats.expected_load_per_s
    if len(expected) == len(plan.destinations):
        return np.asarray(expected, np.float64)
    rates = np.asarray(plan.table.rates, np.float64)
    if len(rates) != len(plan.table):
        rates = np.zeros(len(plan.table))
    total = float(rates.sum()) + plan.stats.cold_tail_rate_per_s
    return _loads(plan, rates, total, plan.destinations)


def _loads(
    plan: RoutingPlan, rates: np.ndarray, total: float, dests: Sequence[DestinationSpec],
    hashed: Traffic | None = None,
) -> np.ndarray:
    # A key's rate splits evenly over its live members; a key with none joins the cold tail.
    member, owner = _placement(plan, dests)
    alive = member >= 0
    live_k = np.bincount(owner[alive], minlength=len(rates))
    served = live_k > 0
    share = np.where(served, rates / np.maximum(live_k, 1), 0.0)
    loads = np.bincount(member[alive], weights=share[owner[alive]], minlength=len(dests))
    cold_tail = max(0.0, total - float(rates[served].sum()))
    # Routers spread the cold tail by the weights of the plan they follow; `dests` says
    # which destinations are live and, for ones the plan does not name, their weight.
    in_plan = {d.id: d.capacity_weight for d in plan.destinations}
    weights = [in_plan.get(d.id, d.capacity_weight) for d in dests]
    if hashed is not None and cold_tail > 0.0:
        planned = loads.astype(np.float64)
        return planned + _hashed_tail(plan, served, hashed, dests, weights, planned)
    return loads.astype(np.float64) + cold_tail * _fallback_shares(dests, weights)


def _hashed_tail(plan: RoutingPlan, served: np.ndarray, traffic: Traffic,
                 dests: Sequence[DestinationSpec], weights: Sequence[float],
                 planned: np.ndarray) -> np.ndarray:
    """The cold tail on the routers' ring over the live destinations: every key of the
    traffic the plan does not serve (unadmitted, or no live member left) at its rate,
    bounded against the `planned` load as the routers bound it."""
    tail = np.asarray(traffic.rates, np.float64).copy()
    pos = traffic.positions(plan.table.keys)
    tail[pos[(pos >= 0) & served]] = 0.0
    live = [i for i, d in enumerate(dests) if not d.draining]
    out = np.zeros(len(dests))
    if not live:
        return out
    w = np.array([weights[i] for i in live], np.float64)
    ring = tail_ring([dests[i].id for i in live])
    out[live] = hashed_tail_loads(traffic.keys, tail, traffic.total_rate, w, ring,
                                  planned=planned[live])
    return out


def imbalance(plan: RoutingPlan, loads: np.ndarray, fleet: Fleet | None = None) -> float:
    """`planning.stats.imbalance` (the one definition) over the live destinations."""
    dests = fleet_of(plan, fleet)
    live = np.array([not d.draining for d in dests])
    weights = np.array([d.capacity_weight for d in dests], np.float64)
    if not live.any():
        live = np.ones(len(dests), bool)
    return stats_imbalance(np.asarray(loads, np.float64)[live], weights[live])


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


def hold_noise(now: Traffic, reference: Traffic | None, window_s: float, z: float) -> Traffic:
    """The rates to plan and price on: `now`'s, except where a key's rate differs from
    `reference` (the rates the installed plan was built on) by no more than `z` Poisson
    standard errors of a count over `window_s`; there, the reference rate.

    On stationary traffic a window's per-key rates still move by counting noise (about
    √n of n requests), and a candidate fitted to them always looks better than the plan
    fitted to the last window's noise: the loop would count that as staleness and churn
    keys between engines for nothing. A key in the reference that the window did not see
    keeps its reference rate while that silence is itself within the noise (an expected
    count of at most z²). Keys new to the window keep their measured rate. `z <= 0` (or no
    reference) returns `now` unchanged: the paper's behaviour.
    """
    if z <= 0 or reference is None or window_s <= 0:
        return now
    ref = dict(zip(reference.keys, reference.rates.tolist(), strict=True))
    rates = now.rates.astype(np.float64, copy=True)
    known = np.fromiter((k in ref for k in now.keys), bool, count=len(now.keys))
    if known.any():
        r_ref = np.fromiter((ref.get(k, 0.0) for k in now.keys), np.float64,
                            count=len(now.keys))
        stderr = np.sqrt(np.maximum(rates, r_ref) / window_s)
        held = known & (np.abs(rates - r_ref) <= z * stderr)
        rates[held] = r_ref[held]
    seen = set(now.keys)
    ref_tokens = reference.tokens
    quiet = [i for i, k in enumerate(reference.keys)
             if k not in seen and float(reference.rates[i]) * window_s <= z * z]
    if not quiet:
        return dataclasses.replace(now, rates=rates)
    tokens = now.tokens
    last = (None if now.last_destination is None else
            np.concatenate([now.last_destination, np.full(len(quiet), -1, np.int32)]))
    return Traffic([*now.keys, *(reference.keys[i] for i in quiet)],
                   np.concatenate([rates, reference.rates[quiet].astype(np.float64)]),
                   np.concatenate([tokens, ref_tokens[quiet]]), now.window_end_s,
                   now.default_prefix_tokens, last, now.last_destination_names)
