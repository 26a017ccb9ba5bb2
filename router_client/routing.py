"""The routing decision: pure, lock-free, and the hot path of every router.

`RoutingTable` is an immutable key -> destination-set lookup built once per plan
version. `RouterCore` holds what a router tracks between plans (in-flight counts,
destination health, its RNG) and routes one key:

- an admitted key goes to the least-loaded *usable* member of its set T(b), ties
  broken at random;
- an unadmitted key, a key whose whole set is unusable, or any key while there is no
  plan or the core is in fallback mode, goes to power-of-two-choices over the usable
  destinations: two *distinct* ones sampled without replacement, the less loaded wins,
  ties at random (baselines.md §1).

Two options go beyond the paper (its behaviour is the default, `cold_tail="p2c"` and no
affinity):
- `cold_tail="hash"`: an unadmitted key goes to its consistent-hash owner among the usable
  destinations, or the next one on the ring, as long as that one's load stays within
  `(1 + tail_slack)` × the mean (consistent hashing with bounded loads, CHWBL). A cold key
  then keeps meeting its cache, where P2C sprays it over every destination; the bound keeps
  the cold tail spread as evenly as P2C's, so the planner's cold-tail baseline holds.
- an *affinity* string (`route_index(key, affinity)`, e.g. the conversation inside an
  application's key): a key planned on several destinations sends each affinity to the
  same member (rendezvous hashing), unless that member is more than `(1 + set_slack)` ×
  the set's mean load ahead, then to the least-loaded one. Conversations keep their history
  without giving up the plan's balance.
- `history_slack` (with affinities): a conversation's next turn goes back to the
  destination its previous turn went to, where its history is cached, while that one's
  load stays within `(1 + history_slack)` × the mean; only then does the rule above place
  it. Every decision above depends on load at the moment of the turn, so without this a
  conversation moved by a burst (or by a new plan) loses its history twice: once on the
  move and again if the next turn moves back. A new conversation follows the plan, so the
  plan still decides where a key's traffic goes; running conversations drain to it. The
  memory is bounded (least recently used forgotten first) and, with `share_history`, shared:
  the core keeps where its conversations newly went (`drain_history`) and learns where other
  routers' went (`learn_history`), so a turn that reaches another replica of the router
  still finds its history (router_client.shared_history carries them between routers).
- `idle_rehome_s` (with a clock: `route_index(key, affinity, now)`): a key not planned on
  several destinations that has been idle longer than this is cold wherever it was, so
  affinity buys it nothing: it goes to the least-loaded destination and stays there (its
  home, over the plan, until the plan moves it) while it comes back within the window and
  that one is within twice the mean load plus a Poisson deviation (`_within`; with
  `balance="first-token"` it goes to the one with the fewest requests awaiting a first
  token, as the balance below). A key's first request goes where the plan or the hashed
  tail puts it. Set it to the fleet's eviction window, or start it
  there and let `learn_idle_rehome` measure it: each key sent home after an idle gap
  (`Decision.returned`) either finds its prefix cached there or not, which the caller reports
  (`observe_return`, with `key_finished` when each request ends), and the window moves to
  the gap that separates the two (router_client.eviction_window). On the wide-active-set
  replay (equally hot keys, a working set larger than the fleet's cache) a window computed
  from Che's time is ~1.4x the measured one; learned, CacheRoute's capacity there passes
  Preble-like's (docs/replay.md).

- `balance="first-token"`: wherever the paper uses P2C (fallback, no plan, the cold tail
  and its overflow), send the request to the usable destination with the fewest of this
  router's requests still waiting for their first token, ties to the lower in-flight load,
  then to the next in turn after the last one chosen (round robin among equals). A request
  waiting for its first token is one the engine has yet to prefill (or is prefilling): what
  a new request queues behind. In-flight counts are mostly decodes, which cost a new
  request little, and P2C on them loses to plain round robin on low-reuse traffic (arena
  simulator, one router, TTFT p99 at x4-x5: P2C 1.38-2.22 s, round robin 0.87-1.70 s,
  fewest awaiting a first token 0.95-1.56 s; docs/arena.md). A caller that never reports
  first tokens (`first_token`) gets least in-flight, in turn among equals.

*Usable* means healthy (not marked down: see `router_client.health`) and not draining.
A draining destination gets no new request on any path; only when nothing else is
healthy does P2C fall back to the healthy draining ones, then to every destination (a
router that refuses every request helps nobody).

*Load* is in-flight requests relative to the destination's capacity weight (the plan's
`capacity_weight`, 1.0 = a reference replica), counted with the request being placed:
`(in-flight + 1) / weight`, the load the destination would have if it got this request.
With unequal weights P2C also draws its two candidates in proportion to weight, and exact
ties go to a candidate in proportion to its weight. So a 4:1 fleet holds in-flight 4:1 at
any concurrency of 5 and more, and a lone request goes to the larger destination (it is
idle and faster). With equal weights (the common case) the decision is the unweighted one,
on a separate fast path.

Indices returned by `route_index` are *slots* of the core: positions in
`RouterCore.destination_ids`, which only ever grows, so a slot keeps naming the
same destination across plans even when a new plan lists destinations in another
order (tables are mapped into slots by id on install).

Concurrency: there are no locks. Everything a decision reads about the current
plan sits in one `_Active` object, and install / health changes replace that one
reference, so a `route` sees the old state or the new one, never a mix. Counters
and in-flight counts are plain ints: under free threading an increment may be
lost, which skews a statistic, never a decision's validity.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import random
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, NamedTuple

import numpy as np

from cacheroute.v1 import plan_pb2
from router_client.errors import NoPlanAvailable, PlanRejected
from router_client.eviction_window import EvictionWindow
from router_client.layered import LayeredLookup, Members, flat
from router_client.plan import (
    BuiltBy,
    PlanKeys,
    RoutingPlan,
    Version,
    checked_weight,
    decode_keys,
    parse_plan_pb,
    plan_keys_from_pb,
    version_from_pb,
)
from router_client.rebase import plan_edit
from router_client.ring import DEFAULT_TAIL_SLACK, Ring, key_hash, mix, stable_hash

# A router's routing mode (RouterCore.mode, the router status): by the plan, or all by P2C.
PLANNED = "planned"
FALLBACK = "fallback"
# How the core balances where the paper uses P2C (module doc): the paper's, or by the
# requests still awaiting their first token.
BALANCES = ("p2c", "first-token")


@dataclass(frozen=True)
class RoutingTable:
    """key -> plan destination index (k_b = 1) or tuple of indices (k_b > 1)."""

    version: Version
    destination_ids: tuple[str, ...]
    lookup: Mapping[str, Members]
    created_at_ms: int = 0
    digest: bytes = b""
    # The planner published a plan in fallback mode: route everything by P2C.
    planner_fallback: bool = False
    draining: frozenset[int] = field(default_factory=frozenset)
    # Destination addresses as the plan gives them ("" where it gives none).
    addresses: tuple[str, ...] = ()
    # Capacity weight per destination (empty: all 1.0).
    weights: tuple[float, ...] = ()
    # The key columns of the last full plan this table derives from, and the key
    # blobs of the deltas applied since: what lets the next full plan be applied
    # as an edit of `lookup` (router_client.rebase). None for tables built otherwise.
    base: PlanKeys | None = field(default=None, repr=False, compare=False)
    touched: tuple[bytes, ...] = field(default=(), repr=False, compare=False)
    # The lookup was edited from the held table's (True) or built from scratch.
    edited: bool = field(default=False, repr=False, compare=False)

    @classmethod
    def from_plan(cls, plan: RoutingPlan, digest: bytes = b"") -> RoutingTable:
        return cls(
            version=plan.version,
            destination_ids=tuple(plan.destination_ids),
            lookup=lookup_from_columns(plan.table.keys, plan.table.set_offsets, plan.table.members),
            created_at_ms=plan.created_at_ms,
            digest=digest,
            planner_fallback=plan.config.is_fallback,
            draining=frozenset(i for i, d in enumerate(plan.destinations) if d.draining),
            addresses=tuple(d.address for d in plan.destinations),
            weights=_weights_or_empty(tuple(d.capacity_weight for d in plan.destinations)),
        )

    @classmethod
    def from_payload(
        cls, payload: bytes, digest: bytes = b"", held: RoutingTable | None = None
    ) -> RoutingTable:
        """Decode a serialized RoutingPlan straight into a table (the router's fast path).

        The same checks as `decode_plan`, without building the parts of the plan a
        router does not route by (destination specs, stats, rates). With `held`, the
        table the router holds, the lookup is an edit of `held.lookup` when that
        is possible (same destinations, `held.base` known): see router_client.rebase.
        """
        pb = parse_plan_pb(payload)
        ids, addresses, draining, weights = destination_columns(pb.destinations)
        if held is not None and ids == held.destination_ids:
            ids = held.destination_ids  # the same object: the router's slot cache hits on `is`
        keys = plan_keys_from_pb(pb.table, ids, draining)
        lookup = _edited_lookup(held, keys) if held is not None else None
        edited = lookup is not None
        if lookup is None:
            lookup = lookup_from_columns(decode_keys(keys.blob), keys.set_offsets, keys.members)
            if len(lookup) != len(keys):
                raise PlanRejected("duplicate_key", "a key appears twice")
        return cls(
            version=version_from_pb(pb.version),
            destination_ids=ids,
            lookup=lookup,
            created_at_ms=pb.created_at_ms,
            digest=digest,
            planner_fallback=pb.config.fallback or pb.config.built_by == BuiltBy.FALLBACK,
            draining=frozenset(draining),
            addresses=addresses,
            weights=weights,
            base=keys,
            edited=edited,
        )

    def __len__(self) -> int:
        return len(self.lookup)

    def flattened(self) -> RoutingTable:
        """This table with a single-dict lookup (itself if it has one already)."""
        if not isinstance(self.lookup, LayeredLookup):
            return self
        return dataclasses.replace(self, lookup=self.lookup.flatten())

    def address_of(self, destination_id: str) -> str:
        """The plan's address for a destination id ("" if unknown)."""
        try:
            return self.addresses[self.destination_ids.index(destination_id)]
        except (ValueError, IndexError):
            return ""

    def members_of(self, key: str) -> tuple[int, ...]:
        """T(b) as plan indices; () for an unadmitted key."""
        m = self.lookup.get(key)
        if m is None:
            return ()
        return (m,) if isinstance(m, int) else m


class DestinationColumns(NamedTuple):
    ids: tuple[str, ...]
    addresses: tuple[str, ...]
    draining: list[int]  # indices
    weights: tuple[float, ...]  # empty when every weight is 1.0


def destination_columns(dests: Sequence[plan_pb2.Destination]) -> DestinationColumns:
    """The columns of protobuf destinations, checked: non-empty, unique ids, weights
    positive and finite (0 in the message means "not set", i.e. 1.0). C-level maps:
    1,000 destinations in well under 1 ms."""
    ids = tuple(map(_id_of, dests))
    addresses = tuple(map(_address_of, dests))
    draining = [i for i, flag in enumerate(map(_draining_of, dests)) if flag]
    if not ids:
        raise PlanRejected("no_destinations", "the plan names no destination")
    if len(set(ids)) != len(ids):
        raise PlanRejected("duplicate_destination", "a destination id appears twice")
    weights = tuple(map(checked_weight, map(_weight_of, dests)))
    return DestinationColumns(ids, addresses, draining, _weights_or_empty(weights))


def _weights_or_empty(weights: tuple[float, ...]) -> tuple[float, ...]:
    return () if all(w == 1.0 for w in weights) else weights


_id_of = attrgetter("id")
_address_of = attrgetter("address")
_draining_of = attrgetter("draining")
_weight_of = attrgetter("capacity_weight")


def _edited_lookup(held: RoutingTable, keys: PlanKeys) -> dict[str, Members] | None:
    """The lookup of the plan with `keys`, as an edit of `held`'s; None when the
    table must be built from scratch instead."""
    if held.base is None or keys.destination_ids != held.destination_ids:
        return None  # values of untouched keys are only valid in the same indices
    edit = plan_edit(held.base, held.touched, keys)
    if edit is None:
        return None
    lookup = flat(held.lookup)  # a C-level copy of the hash table
    for key in edit.drop:  # drops first: a key dropped and written again ends present
        lookup.pop(key, None)
    lookup.update(lookup_from_columns(edit.keys, edit.set_offsets, edit.members))
    # A key listed twice (or an edit gone wrong) shows here: build from scratch,
    # which says what is wrong.
    return lookup if len(lookup) == len(keys) else None


def lookup_from_columns(
    keys: Sequence[str], set_offsets: np.ndarray, members: np.ndarray
) -> dict[str, Members]:
    """Build the lookup dict without a Python tuple per key: ints for k_b = 1."""
    if not len(keys):
        return {}
    offs = np.asarray(set_offsets, np.int64)
    mem = np.asarray(members)
    values: list[Members] = mem[offs[:-1]].tolist()
    sizes = np.diff(offs)
    multi = np.nonzero(sizes > 1)[0]
    if len(multi):
        # One gather of just the multi-replica keys' members (a few percent of keys),
        # instead of converting every member and offset to Python ints.
        msizes = sizes[multi]
        ends = np.cumsum(msizes)
        starts = ends - msizes
        flat = mem[np.repeat(offs[multi] - starts, msizes) + np.arange(int(ends[-1]))].tolist()
        for i, s, e in zip(multi.tolist(), starts.tolist(), ends.tolist(), strict=True):
            values[i] = tuple(flat[s:e])
    return dict(zip(keys, values, strict=False))  # lengths checked by decode


def translate_lookup(lookup: Mapping[str, Members], slot_of: Sequence[int]) -> dict[str, Members]:
    """Re-index a lookup through `slot_of[plan index] -> slot` (when orders differ)."""
    out: dict[str, Members] = {}
    for key, m in lookup.items():
        out[key] = slot_of[m] if isinstance(m, int) else tuple(slot_of[i] for i in m)
    return out


def _two_distinct(n: int, rand: Callable[[], float]) -> tuple[int, int]:
    """Two distinct indices below n (n >= 2), uniformly: two draws without replacement."""
    i = int(rand() * n)
    j = int(rand() * (n - 1))
    return i, (j + 1 if j >= i else j)


class _Active:
    """Everything a decision reads about the installed table, swapped as one reference."""

    __slots__ = ("cumulative", "fallback", "inv_weight", "lookup", "overlay", "pool", "ring",
                 "table", "table_slots", "total_weight", "usable", "weighted")

    def __init__(
        self,
        table: RoutingTable | None,
        lookup: Mapping[str, Members],
        overlay: Mapping[str, Members | None] | None,
        table_slots: tuple[int, ...],
        fallback: bool,
        usable: tuple[bool, ...],
        inv_weight: tuple[float, ...],
        pool: tuple[int, ...],
    ) -> None:
        self.table = table
        self.lookup = lookup  # a plain dict: the base layer of a LayeredLookup
        self.overlay = overlay  # its changes (None value = key removed), or None
        self.table_slots = table_slots  # the fleet P2C draws from
        self.fallback = fallback
        self.usable = usable  # per slot: healthy and not draining
        self.inv_weight = inv_weight  # per slot: 1 / capacity weight
        self.pool = pool  # the slots P2C draws from (usable ones, see the module doc)
        self.ring: Ring | None = None  # built on the first cold-tail hash decision
        self.total_weight = sum(1.0 / inv_weight[s] for s in pool) or 1.0
        # Unequal weights in the pool: the weighted decision, else the plain one.
        self.weighted = len({inv_weight[s] for s in pool}) > 1
        self.cumulative: list[float] = []  # running weight over `pool`, for weighted draws
        if self.weighted:
            total = 0.0
            for s in pool:
                total += 1.0 / inv_weight[s]
                self.cumulative.append(total)

    def members(self, key: str) -> Members | None:
        """The plan's entry for `key` (a slot, a tuple of them, or None: not planned). The
        hot decisions (`route`, `_decide`, `_idle`) inline this lookup: a call costs as
        much as the decision there."""
        over = self.overlay
        return self.lookup.get(key) if over is None else over.get(key, self.lookup.get(key))


# An idle return home as `decide` judged it: (idle gap s, its outcome's weight, slot).
Return = tuple[float, float, int]


class Decision(NamedTuple):
    """One request's placement by `RouterCore.decide`."""

    slot: int
    # The prefill work it brings there (`queue_aware`), given back at its first token.
    owed: float = 0.0
    # It was sent home after an idle gap: its cache outcome teaches the re-homing window
    # (`RouterCore.observe_return`).
    returned: Return | None = None


# Conversations a router remembers the destination of (about 100 bytes each).
HISTORY_CAPACITY = 100_000
# Placements kept for other routers between two drains; past it the oldest are dropped
# (counted): a router that stopped draining must not grow without bound.
HISTORY_OUTBOX_CAPACITY = 20_000
# The gateway's default: a turn leaves its history only for a destination at over twice
# the mean load (a turn's history is most of its prompt; a queue costs less than that).
DEFAULT_HISTORY_SLACK = 1.0
# What one request's prefill costs an engine beyond its tokens (a scheduler step, the
# sampler, the first token's decode), in tokens of prefill: 20 ms at ~10k tokens/s on the
# engine model's reference replica (planner_svc.simulator.replica). `queue_aware` counts it
# per request awaiting a first token, so ten short requests queue like ten, not like one.
PREFILL_STEP_TOKENS = 200
# How much sooner a recompute elsewhere must finish prefilling before `queue_aware` leaves
# the warm slot: the router's owed work is an estimate (its own requests only, the cached
# share guessed from the body; 1.4x the engine model's true backlog at the median, busy),
# and a move on noise costs a cold prefill and the conversation's next turns. Simulated
# one-replica capacity on the arena's fleet (six seeds, bench/sim_capacity_1r.py
# --queue-aware): margin 1.0 6.67x the base rate, 1.1 7.25, 1.25 and 1.35 7.75, 1.5 7.42,
# 2.0 7.33; off 7.17.
QUEUE_SPILL_MARGIN = 1.3
# The gateway's default for `queue_aware` (`--queue-aware`; the measurements behind it are in
# docs/arena.md): the simulator's policies run as the gateway take it from here.
DEFAULT_QUEUE_AWARE = True


def cold_owed(uncached_tokens: int) -> float:
    """The prefill work a request owes where `uncached_tokens` of its prompt are not cached:
    those tokens and one step (`queue_aware`'s books)."""
    return float(max(0, uncached_tokens) + PREFILL_STEP_TOKENS)

# The gateway's idle re-homing window, where the learned one starts: a guess at how long an
# idle prefix survives in a busy engine's cache, corrected from the cache outcomes of the
# keys the router sends home (`learn_idle_rehome`). From 300 s the wide-active-set replay
# settles where it does from a cache model's window (docs/replay.md).
DEFAULT_IDLE_REHOME_S = 300.0


def _lru_put(memory: OrderedDict[str, Any], key: str, value: Any, capacity: int) -> None:
    """Remember `key` as the most recent, forgetting the least recent past `capacity`."""
    memory[key] = value
    memory.move_to_end(key)
    if len(memory) > capacity:
        memory.popitem(last=False)


class RouterCore:
    """In-flight counts, health and the decision; no I/O, no clock, no locks."""

    def __init__(self, destination_ids: Sequence[str], *, seed: int | None = None,
                 cold_tail: str = "p2c", tail_slack: float = DEFAULT_TAIL_SLACK,
                 set_slack: float = 0.5, history_slack: float | None = None,
                 history_capacity: int = HISTORY_CAPACITY,
                 idle_rehome_s: float | None = None, balance: str = "p2c") -> None:
        if cold_tail not in ("p2c", "hash"):
            raise ValueError("cold_tail is 'p2c' (the paper's) or 'hash' (bounded-load CH)")
        if balance not in BALANCES:
            raise ValueError(f"balance is one of {BALANCES}, got {balance!r}")
        self.balance = balance
        self._turn = 0  # where the next `first-token` scan starts (rotation among ties)
        self.cold_tail = cold_tail
        self.tail_slack = tail_slack
        self.set_slack = set_slack
        # A single-member or unplanned key idle longer than this is cold wherever it was:
        # it goes by P2C and stays where that sent it while it keeps coming back sooner.
        self.idle_rehome_s = idle_rehome_s
        # key -> (its last arrival or finish at its home, the home, its requests open there,
        # the plan's slot for it then: -1 if none)
        self._seen: OrderedDict[str, tuple[float, int, int, int]] = OrderedDict()
        self.rehomed = 0
        self.rehome_kept = 0  # returns within the window to where re-homing sent the key
        self.spilled = 0  # a planned key's requests sent off its overloaded slot, home kept
        # Off: a planned key over its bound re-homes like any other, a switch to compare
        # the two live (`--spill-planned`).
        self.spill_planned = True
        # `queue_aware` (off in the core; on in the gateway, DEFAULT_QUEUE_AWARE): the
        # prefill work owed per slot by this router's requests awaiting a first token, in
        # tokens (`started(slot, owed)`), and a request moved off the slot its affinity
        # chose when waiting there would cost more than recomputing its prompt on the
        # least-owed slot (`_worth_the_queue`).
        self.queue_aware = False
        self.owed: list[float] = []
        self.queue_spilled = 0  # on top of the decision each overrode (counted there too)
        # Set by the shell while other routers share this plan's traffic (their idle
        # clocks are their own): the plan, history and tail decide meanwhile.
        self.rehome_paused = False
        # With `learn_idle_rehome`: the window learned from returns' cache outcomes.
        self.rehome_window: EvictionWindow | None = None
        # With idle re-homing: affinity -> its last turn's time (`_history_gone`).
        self._history_at: OrderedDict[str, float] = OrderedDict()
        # affinity -> the slot its last request went to (see the module doc); None: off
        self.history_slack = history_slack
        self._history: OrderedDict[str, int] = OrderedDict()
        self._history_capacity = max(1, history_capacity)
        self.history_kept = 0
        # affinity -> slot placed here since the last drain (None: history not shared)
        self._history_out: OrderedDict[str, int] | None = None
        self.history_learned = 0
        self.history_unshared = 0  # placements dropped from a full outbox
        self.destination_ids: list[str] = []
        self._slot: dict[str, int] = {}
        self._plain: list[Decision] = []  # per slot: the decision that owes and returns nothing
        # Own requests in flight per slot (what this router sent and has not seen finish),
        # and the load its decisions compare: the same, plus what the engine reported
        # beyond it (`report_engine_load`; zero unless engine loads are fed in).
        self.inflight: list[int] = []
        self.load: list[int] = []
        # Own requests per slot sent and not yet answered with a first token (`first_token`).
        self.awaiting: list[int] = []
        self._external: list[int] = []
        self._healthy: list[bool] = []
        for d in destination_ids:
            self._slot_for(d)
        self._rand = random.Random(seed).random
        self._forced_fallback = False
        self.planned = 0
        self.unadmitted = 0
        self.fallback = 0
        self.unhealthy_reroute = 0
        self._slots_cache: tuple[tuple[str, ...], tuple[int, ...], bool] | None = None
        self._active = self._build_active(None, {}, None,
                                          tuple(range(len(self.destination_ids))))

    # --- state changes (rare) ------------------------------------------------

    def install(self, table: RoutingTable | None) -> None:
        """Swap in a new table (None: no plan: every key by the cold tail, P2C or hashed).
        Maps destinations by id."""
        if table is None:
            slots = tuple(range(len(self.destination_ids)))
            self._active = self._build_active(None, {}, None, slots)
            return
        slots, identity = self._slots_of(table.destination_ids)
        if not identity:
            self._active = self._build_active(
                table, translate_lookup(table.lookup, slots), None, slots)
        elif isinstance(table.lookup, LayeredLookup):
            self._active = self._build_active(
                table, table.lookup.base, table.lookup.overlay, slots)
        else:
            self._active = self._build_active(table, table.lookup, None, slots)

    def _slots_of(self, ids: tuple[str, ...]) -> tuple[tuple[int, ...], bool]:
        # Consecutive plans almost always list the same destinations: reuse the mapping
        # (a slot never changes once given), saving ~1,000 lookups per delta apply.
        cached = self._slots_cache
        if cached is not None and (ids is cached[0] or ids == cached[0]):
            return cached[1], cached[2]
        slots = tuple(self._slot_for(d) for d in ids)
        identity = all(s == i for i, s in enumerate(slots))
        self._slots_cache = (ids, slots, identity)
        return slots, identity

    def mark_down(self, destination_id: str) -> None:
        """Skip this destination from the next decision on, until `mark_up`."""
        self._set_health(destination_id, False)

    def mark_up(self, destination_id: str) -> None:
        self._set_health(destination_id, True)

    def set_fallback(self, on: bool) -> None:
        """Force (or release) fallback routing: everything by P2C, whatever the plan says."""
        self._forced_fallback = on
        self._refresh()

    def started(self, slot: int, owed: float = 0.0) -> None:
        """A request goes to `slot`; `owed`: the prefill work it brings there
        (`Decision.owed`), given back at its first token."""
        self.inflight[slot] += 1
        self.load[slot] += 1
        self.awaiting[slot] += 1
        if owed:
            self.owed[slot] += owed

    def first_token(self, slot: int, owed: float = 0.0) -> None:
        """A request sent to `slot` got its first token (once per request, at most)."""
        if self.awaiting[slot] > 0:
            self.awaiting[slot] -= 1
        if owed:
            self._repaid(slot, owed)

    def finished(self, slot: int, *, answered: bool = False, owed: float = 0.0) -> None:
        """A request sent to `slot` ended; `answered`: `first_token` was called for it."""
        if self.inflight[slot] > 0:
            self.inflight[slot] -= 1
            self.load[slot] -= 1
        if not answered:
            if self.awaiting[slot] > 0:
                self.awaiting[slot] -= 1
            if owed:
                self._repaid(slot, owed)

    def _repaid(self, slot: int, owed: float) -> None:
        left = self.owed[slot] - owed
        self.owed[slot] = left if left > 1e-6 else 0.0  # no float dust below zero

    def report_engine_load(self, reported: Mapping[str, float]) -> None:
        """Fuse what the engines say they hold (running + waiting, all routers' requests
        and any other traffic) with this router's own counts: a destination's load becomes
        the larger of the two, then moves with this router's own requests until the next
        report. Destinations absent from `reported` (no fresh report) count only their own
        requests: a stale figure never steers traffic."""
        for slot, dest in enumerate(self.destination_ids):
            value = reported.get(dest)
            own = self.inflight[slot]
            extra = 0
            if value is not None and value == value and value > own:
                extra = int(min(value, 1e9)) - own
            self._external[slot] = extra
            self.load[slot] = own + extra

    # --- queries --------------------------------------------------------------

    @property
    def table(self) -> RoutingTable | None:
        return self._active.table

    @property
    def forced_fallback(self) -> bool:
        return self._forced_fallback

    @property
    def mode(self) -> str:
        a = self._active
        return FALLBACK if a.fallback or a.table is None else PLANNED

    def slot_of(self, destination_id: str) -> int:
        return self._slot[destination_id]

    def is_healthy(self, destination_id: str) -> bool:
        return self._healthy[self._slot[destination_id]]

    @property
    def usable_slots(self) -> tuple[bool, ...]:
        """Per slot: healthy and not draining. The tuple is replaced (never changed) when
        health, drain or the plan change, so a caller may cache what it derives from it
        by its identity."""
        return self._active.usable

    def is_usable(self, destination_id: str) -> bool:
        """Healthy and not draining: new requests may go there."""
        slot = self._slot.get(destination_id)
        a = self._active
        return slot is not None and slot < len(a.usable) and a.usable[slot]

    def unhealthy(self) -> list[str]:
        """Destinations marked down, by id."""
        return [d for d, ok in zip(self.destination_ids, self._healthy, strict=True) if not ok]

    def load_of(self, destination_id: str) -> float:
        """Load (in-flight requests, fused with the engine's report) per unit of weight."""
        slot = self._slot[destination_id]
        return self.load[slot] * self._active.inv_weight[slot]

    def counters(self) -> dict[str, int]:
        return {
            "planned": self.planned,
            "unadmitted": self.unadmitted,
            "fallback": self.fallback,
            "unhealthy_reroute": self.unhealthy_reroute,
            "history_kept": self.history_kept,
            "rehomed": self.rehomed,
            "rehome_kept": self.rehome_kept,
            "spilled": self.spilled,
            "queue_spilled": self.queue_spilled,
        }

    # --- shared conversation memory (the shell carries it between routers) -------

    def share_history(self, on: bool = True) -> None:
        """Keep this router's new conversation placements for `drain_history`."""
        self._history_out = OrderedDict() if on else None

    def drain_history(self) -> list[tuple[str, str]]:
        """(affinity, destination id) of every conversation placed somewhere new since the
        last drain (the latest placement of each), oldest first."""
        out = self._history_out
        if not out:
            return []
        ids = self.destination_ids
        moves = [(affinity, ids[slot]) for affinity, slot in out.items()]
        out.clear()
        return moves

    def learn_history(self, moves: Sequence[tuple[str, str]]) -> int:
        """Where other routers sent conversations: their next turns here go there too (by
        the same load rule as this router's own memory). Unknown destinations are skipped;
        returns how many were learned."""
        if self.history_slack is None:
            return 0
        history, slot_of, learned = self._history, self._slot.get, 0
        for affinity, destination in moves:
            slot = slot_of(destination)
            if slot is None:
                continue
            history[affinity] = slot
            history.move_to_end(affinity)
            learned += 1
        while len(history) > self._history_capacity:
            history.popitem(last=False)
        self.history_learned += learned
        return learned

    def _placed(self, affinity: str, slot: int) -> None:
        out = self._history_out
        if out is None:
            return
        out[affinity] = slot
        out.move_to_end(affinity)
        if len(out) > HISTORY_OUTBOX_CAPACITY:
            out.popitem(last=False)
            self.history_unshared += 1

    # --- the decision (hot) -------------------------------------------------------

    def decide(self, key: str, affinity: str | None = None, now: float | None = None,
               prompt_tokens: int = 0, cacheable_tokens: int = 0) -> Decision:
        """Where `key` goes, and what the request brings there. Does not count it in flight:
        call `started` (or use `router_client.lifecycle.Request`, which does). With
        `queue_aware`: `prompt_tokens`, and how many of them the slot its affinity picks
        holds cached (its conversation's history, else its key's prefix), weigh that slot's
        queue against a recompute elsewhere (`_worth_the_queue`).

        The stages, in order: idle re-homing may pick the key's home (`_idle`); the
        conversation's history may keep the turn where it went last (`_with_history`);
        otherwise the plan's set or the cold tail decides (`_decide`); queue-aware routing
        may move the request off a slot whose queue costs more than a recompute."""
        if self.idle_rehome_s is None or now is None or self.rehome_paused:
            slot = self._with_history(key, affinity, -1, now)
            if not self.queue_aware:
                return self._plain[slot]  # (slot, nothing owed, no return): built once
            pick, home, plan, returned = -1, -1, -1, None
        else:
            pick, home, plan, returned = self._idle(key, now)
            slot = self._with_history(key, affinity, pick, now)
        owed = 0.0
        if self.queue_aware:
            slot, owed = self._worth_the_queue(slot, key, affinity, prompt_tokens,
                                               cacheable_tokens)
        if home >= 0:
            # The key's home is where `_idle` put it even when the turn goes with its
            # conversation's history elsewhere: a conversation begun before the plan moved
            # its key must not pull the key back, or every new conversation of it follows
            # the old ones there and the plan's move never lands (the destinations drift
            # from the plan: one engine at 194 requests against 500-780 for the others,
            # arena paper-like x7 in the simulator).
            self._seen_at(key, now, home, plan, opened=slot == home)  # type: ignore[arg-type]
        return Decision(slot, owed, returned)

    def route_index(self, key: str, affinity: str | None = None,
                    now: float | None = None, prompt_tokens: int = 0,
                    cacheable_tokens: int = 0) -> int:
        """`decide`'s slot alone (its common case without building a `Decision`)."""
        if not self.queue_aware and (self.idle_rehome_s is None or now is None
                                     or self.rehome_paused):
            return self._with_history(key, affinity, -1, now)
        return self.decide(key, affinity, now, prompt_tokens, cacheable_tokens).slot

    def _with_history(self, key: str, affinity: str | None, pick: int,
                      now: float | None) -> int:
        """The final slot: the conversation's last destination while its history is worth
        a queue there (`history_slack`), else `pick` (idle re-homing's) or the plan's."""
        if affinity is None or self.history_slack is None:
            return pick if pick >= 0 else self._decide(key, affinity)
        history = self._history
        a = self._active
        last = history.get(affinity)
        if pick >= 0 and self._history_gone(affinity, now) and last is not None:  # type: ignore[arg-type]
            last = None  # its history is evicted: the turn goes where its key goes
        if last is not None and not a.fallback and self._within(last, a, self.history_slack):
            history.move_to_end(affinity)
            self.history_kept += 1
            return last
        slot = pick if pick >= 0 else self._decide(key, affinity)
        if slot != last and self._history_out is not None:
            self._placed(affinity, slot)
        _lru_put(history, affinity, slot, self._history_capacity)
        return slot

    def _worth_the_queue(self, slot: int, key: str, affinity: str | None, prompt_tokens: int,
                         cacheable_tokens: int) -> tuple[int, float]:
        """`queue_aware`: `slot` (where the plan, the key's home or the conversation's
        history sends the request, warm for `cacheable_tokens`) unless the least-owed
        usable slot would finish prefilling the whole prompt clearly sooner (by
        `QUEUE_SPILL_MARGIN`): owed work there plus the prompt against owed work here plus
        what is not cached here, per unit of capacity. This is the rule of the simulator's
        clairvoyant reference (planner_svc.simulator.clairvoyant: the engines' true caches
        and queues), with what one router knows: its own requests awaiting a first token,
        and the prompt's cached share taken where its affinity points. A request moved off
        keeps its key's home (a burst passes; the plan's slot keeps the prefix); its
        conversation follows it (the newest history is cached there).

        A key the plan replicates moves only among its replicas: the plan sized them
        for its load, each holds its prefix, and a move off them recomputes a hot key's
        prefix on an engine the plan did not give it (on the replay's 30-engine whale
        fleet, moves anywhere put the p99 at the knee at 1.96 s, against 1.26 s without
        the rule and 1.19 s with moves among members; on the arena's four engines the
        restriction costs the simulated one-replica capacity 1-2 %: docs/replay.md)."""
        a = self._active
        prompt = max(0, prompt_tokens)
        cold = cold_owed(prompt)
        if a.fallback or prompt == 0 or slot >= len(a.usable) or not a.usable[slot]:
            return slot, cold
        warm = cold_owed(prompt - min(max(0, cacheable_tokens), prompt))
        owed, inv = self.owed, a.inv_weight
        best, best_cost = slot, (owed[slot] + warm) * inv[slot]
        usable = a.usable
        members = a.members(key)  # a replicated key weighs only its replicas
        candidates = members if isinstance(members, tuple) else a.pool
        for s in candidates:
            if s != slot and usable[s]:
                cost = (owed[s] + cold) * inv[s] * QUEUE_SPILL_MARGIN
                if cost < best_cost:
                    best, best_cost = s, cost
        if best == slot:
            return slot, warm
        self.queue_spilled += 1
        if affinity is not None and self.history_slack is not None:
            self.remember(affinity, best)
        return best, cold

    def _history_gone(self, affinity: str, now: float) -> bool:
        """With idle re-homing: whether the conversation's last turn came longer ago than
        the eviction window (its history is no longer cached where it went, so it earns the
        turn no place there). Notes this turn's time. A history learned from another router
        has no time here and counts as present."""
        previous = self._history_at.get(affinity)
        _lru_put(self._history_at, affinity, now, self._history_capacity)
        window = self.idle_rehome_s
        return previous is not None and window is not None and now - previous > window

    def _idle(self, key: str, now: float) -> tuple[int, int, int, Return | None]:
        """Idle re-homing (`idle_rehome_s`), for a key not planned on several destinations:
        the slot it picks, the key's home from now on (the same slot but for a spill) and
        the plan's slot for it (-1: not planned), and the return home it judged (with a
        learner, for `observe_return`); (-1, -1, -1, None) lets the plan decide. Records
        nothing: `route_index` notes the sighting (`_seen_at`) once the final slot is known.
        A key seen here for the first time goes where the plan or the hashed cold tail puts
        it (the same at every router replica); one the plan has moved since its last request
        follows the plan; one back within the window returns where it went last (its prefix
        is cached there) unless that is over twice the mean load plus one Poisson deviation
        (`_within`): then the request spills where the balance sends it, and a key the plan
        put there keeps its home; one idle longer is cold everywhere, so affinity buys it
        nothing and it goes where the balance sends it, its home from then on."""
        returned = None  # set below only for a return home
        a = self._active
        if a.fallback:
            return -1, -1, -1, None
        over = a.overlay
        m = a.lookup.get(key) if over is None else over.get(key, a.lookup.get(key))
        if m is not None and m.__class__ is not int:
            return -1, -1, -1, None  # replicated: hot, and the plan balances its set
        seen = self._seen.get(key)
        window = self.idle_rehome_s
        assert window is not None
        learner = self.rehome_window
        plan = -1 if m is None else m  # type: ignore[assignment]
        if seen is not None and plan >= 0 and plan != seen[3] and a.usable[plan]:
            # The plan moved the key (or admitted it) since its last request: the control
            # loop priced that move against the cache it leaves behind; follow it.
            slot = plan
            self.planned += 1
        elif (seen is not None and (now - seen[0] <= window or (
                learner is not None and now - seen[0] <= 2 * window
                and self._rand() < learner.probe_share))
                # A burst of a few requests on a small fleet does not make a warm home
                # overloaded: one Poisson deviation of the mean on top of twice it.
                and self._within(seen[1], a, DEFAULT_HISTORY_SLACK, deviations=1.0)):
            # Home (within the window, or a learner's probe just past it).
            slot = seen[1]
            if slot == plan:
                self.planned += 1
            elif plan < 0:
                self.unadmitted += 1
            else:
                self.rehome_kept += 1  # placed by an earlier re-homing
            if learner is not None and seen[2] == 0:
                # Evidence only when its last request there had finished: one still queued
                # has not written the prefix yet, and its miss says nothing of eviction.
                gap = now - seen[0]
                returned = (gap, learner.weight(gap), slot)
        elif seen is None:
            # First sight here: where the plan, or the hashed cold tail, puts it. Both are
            # the same at every router replica, so a key new to several of them (a tenant's
            # first conversations, each turn at another replica) warms one destination.
            slot = self._decide(key, None)
        else:
            # Cold wherever it goes: its whole prefill is owed, so with `first-token` it
            # goes where the fewest prefills are owed.
            slot = (self._least_loaded(a.pool, a) if self.balance == "p2c" or not a.pool
                    else self._fewest_awaiting(a))
            if slot < 0:
                return -1, -1, -1, None
            if (self.spill_planned and now - seen[0] <= window and plan >= 0
                    and seen[1] == plan):
                # Warm at the plan's slot, which is over its bound: a burst (often the
                # key's own). This request goes elsewhere; the key stays where the plan and
                # its cache are. Moving it would carry the burst to a cold destination, a
                # whole prefill per request in flight (simulated arena, seed 8 at x4: TTFT
                # 4 s there, p99 2.56 s against 1.94 s spilling), and leave it off the
                # plan's slot until the plan moves it (replay: imbalance 1.12 -> 1.05 on
                # paper-like). A key off the plan re-homes: it has no slot to come back to.
                self.spilled += 1
                return slot, seen[1], plan, None
            self.rehomed += 1
        return slot, slot, plan, returned

    def _seen_at(self, key: str, now: float, home: int, plan: int, *, opened: bool) -> None:
        """Note a sighting of `key` at `now`: its home, the plan's slot for it then, and its
        requests still open at home (`opened`: this one went there)."""
        seen = self._seen.get(key)
        open_ = seen[2] if seen is not None and seen[1] == home else 0
        _lru_put(self._seen, key, (now, home, open_ + opened, plan), self._history_capacity)

    def key_finished(self, key: str, slot: int, now: float) -> None:
        """A request of `key` that went to `slot` ended at `now` (with idle re-homing): its
        prefix was last touched there then, so the key's idle time counts from now."""
        seen = self._seen.get(key)
        if seen is not None and seen[1] == slot:
            self._seen[key] = (max(now, seen[0]), slot, max(0, seen[2] - 1), seen[3])

    def learn_idle_rehome(self, window: EvictionWindow | None) -> None:
        """Learn the idle re-homing window from returns' cache outcomes (`observe_return`),
        starting from `window.window_s`; None stops learning (the window stays)."""
        self.rehome_window = window
        if window is not None:
            self.idle_rehome_s = window.window_s

    def observe_return(self, returned: tuple[float, float, int] | None, slot: int,
                       hit: bool | None) -> None:
        """How a request ended that `route_index` sent home after an idle gap
        (`Decision.returned`): `hit`: its reusable prefix was served from cache
        at `slot`, where it went in the end (a request moved elsewhere teaches nothing)."""
        learner = self.rehome_window
        if learner is None or returned is None or hit is None or returned[2] != slot:
            return
        learner.observe(returned[0], hit, returned[1])
        self.idle_rehome_s = learner.window_s

    def _within(self, slot: int, a: _Active, slack: float, deviations: float = 0.0) -> bool:
        """Usable and, with one more request, within (1 + slack) x the pool's mean load
        (+ one request, + `deviations` standard deviations of a Poisson count around the
        mean): where a conversation's history, or a re-homed key's prefix, is worth a queue
        (a queue costs less than a recompute up to there)."""
        if slot >= len(a.usable) or not a.usable[slot]:
            return False
        load, inv = self.load, a.inv_weight
        mean = (sum(load[s] for s in a.pool) + 1) / a.total_weight
        bound = (1.0 + slack) * mean
        if deviations:
            bound += deviations * math.sqrt(mean)
        return (load[slot] + 1) * inv[slot] <= bound + inv[slot]

    def remember(self, affinity: str, slot: int) -> None:
        """Where `affinity`'s request went after all (a retry that moved it)."""
        if self.history_slack is not None and affinity in self._history:
            if self._history[affinity] != slot:
                self._placed(affinity, slot)
            self._history[affinity] = slot

    def _decide(self, key: str, affinity: str | None) -> int:
        a = self._active
        if a.fallback:
            self.fallback += 1
            return self._p2c(a)
        over = a.overlay
        m = a.lookup.get(key) if over is None else over.get(key, a.lookup.get(key))
        if m is None:
            self.unadmitted += 1
            return self._tail(key, a)
        if m.__class__ is int:
            if a.usable[m]:  # type: ignore[index]
                self.planned += 1
                return m  # type: ignore[return-value]
        else:
            best = (self._affine_member(m, a, affinity) if affinity is not None  # type: ignore[arg-type]
                    else self._least_loaded(m, a))  # type: ignore[arg-type]
            if best >= 0:
                self.planned += 1
                return best
        self.unhealthy_reroute += 1
        return self._tail(key, a)

    def _tail(self, key: str, a: _Active) -> int:
        """Where a key the plan does not route goes: P2C, or bounded-load consistent hashing."""
        if self.cold_tail == "p2c" or len(a.pool) <= 1:
            return self._p2c(a)
        ring = a.ring
        if ring is None:
            ids = self.destination_ids
            ring = a.ring = Ring([ids[s] for s in a.pool], a.pool)
        inflight, inv = self.load, a.inv_weight
        total = sum(inflight[s] for s in a.pool) + 1
        cap = (1.0 + self.tail_slack) * total / a.total_weight
        for s in ring.walk(key_hash(key)):
            if (inflight[s] + 1) * inv[s] <= cap + inv[s]:
                return s
        return self._p2c(a)

    def _affine_member(self, members: tuple[int, ...], a: _Active, affinity: str) -> int:
        """The rendezvous-hash member for `affinity` unless it is too far ahead in load."""
        usable, inflight, inv = a.usable, self.load, a.inv_weight
        h = stable_hash(affinity)
        best, best_score, loads, n = -1, -1, 0.0, 0
        for m in members:
            if not usable[m]:
                continue
            score = mix(h ^ (m * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF))
            if score > best_score:
                best, best_score = m, score
            loads += inflight[m] * inv[m]
            n += 1
        if best < 0:
            return -1
        if inflight[best] * inv[best] <= (1.0 + self.set_slack) * loads / n + inv[best]:
            return best
        return self._least_loaded(members, a)

    def route(self, key: str) -> str:
        """The destination id for `key`: `route_index` inlined, since a Python call
        costs as much as the decision itself on this path."""
        a = self._active
        if not a.fallback:
            over = a.overlay
            m = a.lookup.get(key) if over is None else over.get(key, a.lookup.get(key))
            if m.__class__ is int:
                if a.usable[m]:  # type: ignore[index]
                    self.planned += 1
                    return self.destination_ids[m]  # type: ignore[index]
                self.unhealthy_reroute += 1
            elif m is None:
                self.unadmitted += 1
            else:
                best = self._least_loaded(m, a)  # type: ignore[arg-type]
                if best >= 0:
                    self.planned += 1
                    return self.destination_ids[best]
                self.unhealthy_reroute += 1
            if self.cold_tail != "p2c":
                return self.destination_ids[self._tail(key, a)]
        else:
            self.fallback += 1
        return self.destination_ids[self._p2c(a)]

    def route_avoiding(self, key: str, avoid: Collection[int]) -> int | None:
        """A slot for `key` that is not in `avoid` (destinations already tried, or full);
        None when no usable destination is left. The slow path of retries: the planned set
        first, then power-of-two-choices over the rest of the pool."""
        a = self._active
        if not a.fallback:
            m = a.members(key)
            if m is not None:
                members = (m,) if m.__class__ is int else m
                left = tuple(x for x in members if x not in avoid)  # type: ignore[union-attr]
                best = self._least_loaded(left, a) if left else -1
                if best >= 0:
                    return best
        pool = tuple(s for s in a.pool if s not in avoid and a.usable[s])
        if not pool:
            return None
        n = len(pool)
        if n == 1:
            return pool[0]
        i, j = _two_distinct(n, self._rand)
        x, y = pool[i], pool[j]
        lx = (self.load[x] + 1) * a.inv_weight[x]
        ly = (self.load[y] + 1) * a.inv_weight[y]
        return x if lx <= ly else y

    def _least_loaded(self, members: tuple[int, ...], a: _Active) -> int:
        if a.weighted:
            return self._least_loaded_weighted(members, a)
        usable, inflight, rand = a.usable, self.load, self._rand
        best, best_load, ties = -1, 0, 0
        for m in members:
            if not usable[m]:
                continue
            load = inflight[m]
            if best < 0 or load < best_load:
                best, best_load, ties = m, load, 1
            elif load == best_load:
                ties += 1  # reservoir sampling: each tied member wins with 1/ties
                if rand() * ties < 1.0:
                    best = m
        return best

    def _least_loaded_weighted(self, members: tuple[int, ...], a: _Active) -> int:
        usable, inv, inflight, rand = a.usable, a.inv_weight, self.load, self._rand
        best, best_load, tied_weight = -1, 0.0, 0.0
        for m in members:
            if not usable[m]:
                continue
            load = (inflight[m] + 1) * inv[m]
            if best < 0 or load < best_load:
                best, best_load, tied_weight = m, load, 1.0 / inv[m]
            elif load == best_load:
                w = 1.0 / inv[m]
                tied_weight += w  # weighted reservoir: each tied member wins by its weight
                if rand() * tied_weight < w:
                    best = m
        return best

    def _p2c(self, a: _Active) -> int:
        pool = a.pool
        n = len(pool)
        if n <= 1:
            if n:
                return pool[0]
            raise NoPlanAvailable("no plan and no known destination to route to")
        if self.balance != "p2c":
            return self._fewest_awaiting(a)
        if a.weighted:
            return self._p2c_weighted(a)
        rand = self._rand
        i, j = _two_distinct(n, rand)
        x, y = pool[i], pool[j]
        lx, ly = self.load[x], self.load[y]
        if lx < ly:
            return x
        if ly < lx:
            return y
        return x if rand() < 0.5 else y

    def _fewest_awaiting(self, a: _Active) -> int:
        """`balance="first-token"` (module doc): per unit of weight, the fewest requests
        awaiting a first token, then the lowest load, then the next in turn after the last
        one chosen."""
        pool, inv, awaiting, load = a.pool, a.inv_weight, self.awaiting, self.load
        n = len(pool)
        start = self._turn if self._turn < n else 0
        best, at = pool[start], start
        best_wait = (awaiting[best] + 1) * inv[best]
        best_load = (load[best] + 1) * inv[best]
        for j in range(1, n):
            i = start + j
            if i >= n:
                i -= n
            s = pool[i]
            wait = (awaiting[s] + 1) * inv[s]
            if wait < best_wait or (wait == best_wait and (load[s] + 1) * inv[s] < best_load):
                best, at, best_wait, best_load = s, i, wait, (load[s] + 1) * inv[s]
        self._turn = at + 1  # the next scan starts after the winner: round robin among equals
        return best

    def _p2c_weighted(self, a: _Active) -> int:
        pool, cum, inv, rand = a.pool, a.cumulative, a.inv_weight, self._rand
        total = cum[-1]
        i = bisect.bisect_right(cum, rand() * total)
        j = i
        for _ in range(8):  # the second draw, by weight, distinct from the first
            j = bisect.bisect_right(cum, rand() * total)
            if j != i:
                break
        if j == i:  # one weight dominates the pool: any other member
            j = (i + 1 + int(rand() * (len(pool) - 1))) % len(pool)
        x, y = pool[min(i, len(pool) - 1)], pool[min(j, len(pool) - 1)]
        lx, ly = (self.load[x] + 1) * inv[x], (self.load[y] + 1) * inv[y]
        if lx < ly:
            return x
        if ly < lx:
            return y
        wx, wy = 1.0 / inv[x], 1.0 / inv[y]
        return x if rand() * (wx + wy) < wx else y

    # --- helpers ----------------------------------------------------------------

    def _slot_for(self, destination_id: str) -> int:
        slot = self._slot.get(destination_id)
        if slot is None:
            slot = len(self.destination_ids)
            self.inflight.append(0)
            self.load.append(0)
            self.awaiting.append(0)
            self.owed.append(0.0)
            self._plain.append(Decision(slot))
            self._external.append(0)
            self._healthy.append(True)
            self.destination_ids.append(destination_id)
            self._slot[destination_id] = slot
        return slot

    def _set_health(self, destination_id: str, healthy: bool) -> None:
        self._healthy[self._slot_for(destination_id)] = healthy
        self._refresh()

    def _refresh(self) -> None:
        a = self._active
        self._active = self._build_active(a.table, a.lookup, a.overlay, a.table_slots)

    def _build_active(
        self,
        table: RoutingTable | None,
        lookup: Mapping[str, Members],
        overlay: Mapping[str, Members | None] | None,
        slots: tuple[int, ...],
    ) -> _Active:
        n = len(self.destination_ids)
        draining = [False] * n
        inv_weight = [1.0] * n
        if table is not None:
            for i in table.draining:
                draining[slots[i]] = True
            for i, w in enumerate(table.weights):
                inv_weight[slots[i]] = 1.0 / w
        healthy = self._healthy
        usable = tuple(healthy[s] and not draining[s] for s in range(n))
        pool = (tuple(s for s in slots if usable[s])
                or tuple(s for s in slots if healthy[s])
                or slots)
        # Without a plan, a hashed cold tail routes every key (the plan-less fleet keeps its
        # locality, and the first plan finds keys where the tail put them); P2C otherwise.
        fallback = ((table is None and self.cold_tail == "p2c")
                    or (table is not None and table.planner_fallback) or self._forced_fallback)
        return _Active(table, lookup, overlay, slots, fallback, usable, tuple(inv_weight), pool)
