"""Step 3 of Algorithm 1: LPT placement over distinct destinations, and the cold-tail baseline.

All functions work on the *healthy* destinations only (indices 0..H-1 of the arrays passed in);
callers map back to plan indices. "Least loaded" always means smallest load / capacity weight,
ties to the lower destination index, exactly like a min-heap keyed on (load / weight, index).

Two cold tails (`PlanningConfig.hashed_tail`):
- the paper's: routers spread unadmitted keys by power-of-two-choices, so the baseline is the
  unadmitted rate in proportion to capacity, and placement is plain LPT;
- hashed (the gateway's default, `cold_tail="hash"`): routers send an unadmitted key to its
  owner on the shared ring (`router_client.ring`), bounded at (1 + tail slack) × the mean.
  The baseline is then where the ring puts that traffic, and placement puts a key entering
  the plan on its ring owner whenever that keeps the owner within the balance limit: the key
  stays where its prefix is already cached, and if it later leaves the plan it goes back to
  the same place. Only keys that do not fit there are placed by LPT.
"""

from __future__ import annotations

import bisect
import functools
import operator
from collections.abc import Sequence

import numpy as np

from planner_svc.planning.stats import imbalance
from router_client.ring import DEFAULT_TAIL_SLACK, Ring

# The hashed tail's baseline follows the ring exactly for this many of the heaviest
# unadmitted keys; the rest (many small keys, spread evenly by the hash) go by capacity.
# Bounds the cost of a build at millions of keys to a few ms of hashing.
TAIL_KEYS_EXACT = 4096


def cold_tail_loads(unadmitted_rate: float, weights: np.ndarray) -> np.ndarray:
    """The fallback's expected load: power-of-two-choices spreads the unadmitted traffic over the
    healthy destinations in proportion to capacity."""
    return unadmitted_rate * weights / weights.sum()


def tail_ring(destination_ids: Sequence[str]) -> Ring:
    """The routers' cold-tail ring over these (healthy) destinations, owners 0..H-1; one per
    fleet (the control loop prices plans several times a step on the same destinations)."""
    return _ring_of(tuple(destination_ids))


@functools.lru_cache(maxsize=32)
def _ring_of(destination_ids: tuple[str, ...]) -> Ring:
    return Ring(list(destination_ids))


def ring_owners(keys: Sequence[str], index: np.ndarray, ring: Ring) -> np.ndarray:
    """The ring owner of keys[i] for each i in `index` (healthy positions)."""
    if len(index) == 0:
        return np.zeros(0, np.int64)
    picked = operator.itemgetter(*index.tolist())(keys)
    return ring.owners_of(picked if len(index) > 1 else (picked,))


def unserved(rates: np.ndarray, admitted: np.ndarray) -> np.ndarray:
    """`rates` with the admitted keys' zeroed: what the cold tail carries."""
    tail = rates.copy()
    tail[admitted] = 0.0
    return tail


def ring_tail_loads(keys: Sequence[str], tail: np.ndarray, ring: Ring) -> np.ndarray:
    """Where the ring puts the cold tail before any load bound: `tail[i]` is key i's rate if
    the plan does not serve it (else 0); the heaviest `TAIL_KEYS_EXACT` keys go to their
    owners exactly, the rest (many small keys) by each owner's share of the ring (not by
    capacity: with 64 points per destination the arcs differ by ±12 % or so)."""
    loads = np.zeros(ring.size)
    total_tail = float(tail.sum())
    if total_tail <= 0.0:
        return loads
    heavy = np.flatnonzero(tail > 0.0)
    if len(heavy) > TAIL_KEYS_EXACT:
        heavy = heavy[np.argpartition(-tail[heavy], TAIL_KEYS_EXACT)[:TAIL_KEYS_EXACT]]
    np.add.at(loads, ring_owners(keys, heavy, ring), tail[heavy])
    loads += (total_tail - float(tail[heavy].sum())) * ring.shares()
    return loads


def bound_tail(tail: np.ndarray, planned: np.ndarray, weights: np.ndarray,
               slack: float = DEFAULT_TAIL_SLACK) -> np.ndarray:
    """The routers' bound on the hashed tail: a destination whose whole load (planned and
    tail) would pass (1 + slack) × the fleet's mean relative load sends the tail beyond it on
    to the others, which take it in proportion to the room they have under the same bound."""
    total = float(tail.sum() + planned.sum())
    if total <= 0.0:
        return tail.copy()
    cap = np.maximum((1.0 + slack) * total * weights / weights.sum() - planned, 0.0)
    excess = np.maximum(tail - cap, 0.0)
    spill = float(excess.sum())
    if spill <= 0.0:
        return tail.copy()
    out = tail - excess
    room = np.maximum(cap - out, 0.0)
    spread = room if room.sum() > 0.0 else weights
    return out + spill * spread / spread.sum()


class TailModel:
    """One plan's hashed cold tail over the healthy destinations of `ring` (owners 0..H-1):
    where the ring puts it (computed once), then the routers' bound against the planned
    load, given as placed, or before placement taken as spread by capacity over the rest of
    `total_rate`."""

    def __init__(self, keys: Sequence[str], tail: np.ndarray, total_rate: float,
                 weights: np.ndarray, ring: Ring) -> None:
        self.unbounded = ring_tail_loads(keys, tail, ring)
        self.weights = weights
        self.planned_total = max(0.0, total_rate - float(tail.sum()))

    @classmethod
    def of_plan(cls, keys: Sequence[str], rates: np.ndarray, admitted: np.ndarray,
                destination_ids: Sequence[str], weights: np.ndarray) -> tuple[TailModel, Ring]:
        """The tail of a plan admitting `admitted` out of `keys` at `rates`, and its ring."""
        ring = tail_ring(destination_ids)
        return cls(keys, unserved(rates, admitted), float(rates.sum()), weights, ring), ring

    def loads(self, planned: np.ndarray | None = None) -> np.ndarray:
        """The tail's expected load per destination beside `planned` (None: before placement)."""
        w = self.weights
        if planned is None:
            planned = self.planned_total * w / w.sum()
        return bound_tail(self.unbounded, planned, w)

    def with_planned(self, planned: np.ndarray) -> np.ndarray:
        """Whole expected load per destination: `planned` plus the tail bounded against it."""
        return planned + self.loads(planned)


def hashed_tail_loads(
    keys: Sequence[str], tail: np.ndarray, total_rate: float, weights: np.ndarray,
    ring: Ring, planned: np.ndarray | None = None,
) -> np.ndarray:
    """The hashed cold tail's expected load per healthy destination (`TailModel.loads`)."""
    return TailModel(keys, tail, total_rate, weights, ring).loads(planned)


def affine_place(
    shares: np.ndarray, replicas: np.ndarray, owners: np.ndarray, loads: np.ndarray,
    weights: np.ndarray, limit: float,
) -> list[list[int]]:
    """Placement with locality (keys in λ desc order); returns each key's members; updates
    `loads`. A key's first member is its ring owner if that keeps the owner's relative load
    (load / weight) within `limit`; every member still missing is then placed by LPT on the
    least-loaded destinations the key does not use, multi-replica keys first, in λ order."""
    n = len(shares)
    sets: list[list[int]] = [[] for _ in range(n)]
    share_l, owner_l = shares.tolist(), owners.tolist()
    load_l, weight_l = loads.tolist(), weights.tolist()
    for j in range(n):
        o = owner_l[j]
        if o >= 0 and load_l[o] + share_l[j] <= limit * weight_l[o]:  # (-1: no owner)
            load_l[o] += share_l[j]
            sets[j].append(o)
    loads[:] = load_l
    k = replicas.tolist()
    unplaced = []
    for j in range(n):
        if k[j] == 1:
            if not sets[j]:
                unplaced.append(j)
            continue
        taken = set(sets[j])
        need = k[j] - len(sets[j])
        for m in least_loaded(loads, weights, len(loads)).tolist():
            if need == 0:
                break
            if m not in taken:
                sets[j].append(m)
                loads[m] += share_l[j]
                need -= 1
    if unplaced:
        idx = np.asarray(unplaced, np.int64)
        for j, m in zip(unplaced, _place_singles(shares[idx], loads, weights).tolist(),
                        strict=True):
            sets[j].append(m)
    return sets


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


def rebalance(
    sets: list[list[int]], shares: np.ndarray, loads: np.ndarray, w: np.ndarray, target: float
) -> int:
    """Move replicas off the most-loaded destination until imbalance <= target; return #moves.

    Every move lowers the donor and keeps the receiver at or under the target load, so the total
    excess above the target strictly falls; the loop also stops when no move can help.
    """
    limit = target * float(loads.sum()) / float(w.sum())
    if imbalance(loads, w) <= target:
        return 0
    on = _per_destination(sets, shares, len(loads))
    moves = 0
    while moves < 4 * len(sets) + len(loads):
        rel = loads / w
        donor = int(np.argmax(rel))
        if rel[donor] <= limit:
            break
        move = _best_move(on[donor], sets, rel, w, limit, (rel[donor] - limit) * w[donor])
        if move is None:
            break
        share, j, receiver = move
        _apply_move(on, sets, loads, donor, receiver, share, j)
        moves += 1
    return moves


def _per_destination(
    sets: list[list[int]], shares: np.ndarray, n: int
) -> list[list[tuple[float, int]]]:
    on: list[list[tuple[float, int]]] = [[] for _ in range(n)]
    share_list = shares.tolist()
    for j, s in enumerate(sets):
        for m in s:
            on[m].append((share_list[j], j))
    for items in on:
        items.sort()
    return on


def _best_move(
    items: list[tuple[float, int]], sets: list[list[int]], rel: np.ndarray, w: np.ndarray,
    limit: float, excess: float,
) -> tuple[float, int, int] | None:
    """(share, key, receiver): the smallest share >= excess that fits the receiver's room, else
    the largest share that fits; receivers tried from the least loaded (a few at most)."""
    for receiver in np.argsort(rel, kind="stable")[:8].tolist():
        room = (limit - rel[receiver]) * w[receiver]
        if room <= 0.0:
            break
        lo = bisect.bisect_left(items, (excess, -1))
        hi = bisect.bisect_right(items, (room, len(sets)))
        for pos in [*range(lo, hi), *range(min(lo, hi) - 1, -1, -1)]:
            share, j = items[pos]
            if receiver not in sets[j]:
                return share, j, receiver
    return None


def _apply_move(
    on: list[list[tuple[float, int]]], sets: list[list[int]], loads: np.ndarray,
    donor: int, receiver: int, share: float, j: int,
) -> None:
    on[donor].remove((share, j))
    bisect.insort(on[receiver], (share, j))
    sets[j][sets[j].index(donor)] = receiver
    loads[donor] -= share
    loads[receiver] += share
