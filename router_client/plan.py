"""The routing plan as routers read it, and its wire codec.

This module is the plan's single definition: the planner builds `RoutingPlan`
values and encodes them with `encode_plan`; routers, the simulator and the CLI
decode them with `decode_plan`. It is pure (protobuf and numpy only, no I/O).

Invariants every decoded plan satisfies (checked by `decode_plan`, so a router
never swaps in a table that breaks them):
- keys are unique, non-empty, NUL-free UTF-8;
- every key's destination set is non-empty, has distinct members, and names
  only destinations of the plan that are not draining;
- `set_offsets` starts at 0, never decreases and ends at `len(members)`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from cacheroute import keyblob
from cacheroute.keyblob import encode_keys
from cacheroute.v1 import plan_pb2
from router_client.errors import PlanRejected

SCHEMA = 1
# A plan payload above this size is refused before it is parsed (bounded memory).
MAX_PLAN_BYTES = 256 * 1024 * 1024
MAX_KEY_BYTES = keyblob.MAX_KEY_BYTES


# The versions a planner can reach: epochs count takeovers and restarts, seqs installs. A
# version reported beyond these (by a router's status, say) is a lie, and taking it at face
# value would push the planner's next epoch past what a version can hold (2^64).
MAX_EPOCH = 1 << 32
MAX_SEQ = 1 << 48


@dataclass(frozen=True, slots=True, order=True)
class Version:
    """Plan versions order by (epoch, seq); (0, 0) means "not yet installed"."""

    epoch: int = 0
    seq: int = 0

    def __str__(self) -> str:
        return f"{self.epoch}.{self.seq}"

    @classmethod
    def parse(cls, text: str) -> Version:
        """`"3.17"` -> Version(3, 17); a bare `"17"` means epoch 0."""
        parts = text.strip().split(".")
        if len(parts) == 1:
            return cls(0, int(parts[0]))
        if len(parts) != 2:
            raise ValueError(f"version must look like EPOCH.SEQ, got {text!r}")
        return cls(int(parts[0]), int(parts[1]))


@dataclass(frozen=True, slots=True)
class DestinationSpec:
    id: str
    address: str = ""
    capacity_weight: float = 1.0
    draining: bool = False


def parse_destination(text: str) -> DestinationSpec:
    """`id[=address][*weight]`, e.g. `e0=http://10.0.0.5:8000*2` (weight 2.0)."""
    spec, _, weight = text.strip().partition("*")
    ident, _, address = spec.partition("=")
    ident = ident.strip()
    if not ident:
        raise ValueError(f"destination {text!r}: empty id")
    try:
        w = float(weight) if weight else 1.0
    except ValueError:
        raise ValueError(f"destination {text!r}: weight {weight!r} is not a number") from None
    if not 0 < w < float("inf"):
        raise ValueError(f"destination {text!r}: weight must be positive")
    return DestinationSpec(ident, address.strip(), w)


def parse_destinations(items: str | Sequence[str]) -> list[DestinationSpec]:
    """A comma-separated list (or a sequence) of `parse_destination` items, ids unique."""
    parts = items.split(",") if isinstance(items, str) else list(items)
    specs = [parse_destination(p) for p in parts if p.strip()]
    ids = [d.id for d in specs]
    if len(set(ids)) != len(ids):
        raise ValueError("a destination id appears twice")
    return specs


class BuiltBy:
    """What made a plan: `PlanConfig.built_by` on the wire (plan.proto), for people and the
    audit log. Routers act on `PlanConfig.fallback` instead (`is_fallback`)."""

    BUILD = "build"  # fresh LPT (planning.build)
    REPACK = "repack"  # churn-aware repack of the installed plan (planning.repack)
    FALLBACK = "fallback"  # the installed plan re-published in fallback mode
    ROLLBACK = "rollback:"  # + the version an operator rolled back to

    @staticmethod
    def rollback(version: object) -> str:
        return f"{BuiltBy.ROLLBACK}{version}"


@dataclass(frozen=True, slots=True)
class PlanConfig:
    q_cap: float
    warm_slots_per_destination: int
    warm_slots: int
    byte_aware: bool = False
    imbalance_tolerance: float = 0.03
    built_by: str = BuiltBy.BUILD
    fallback: bool = False  # route everything by power-of-two-choices (see plan.proto)
    hashed_tail: bool = False  # built for a consistent-hashed cold tail (see plan.proto)

    @property
    def is_fallback(self) -> bool:
        return self.fallback or self.built_by == BuiltBy.FALLBACK  # older planners: built_by

@dataclass(eq=False)
class PlanKeys:
    """The key columns of a full plan as they came off the wire: NUL-terminated
    UTF-8 keys and CSR sets over the plan's destination indices. A router keeps
    them beside the table built from that plan, so the next full plan can be
    applied as an edit (`router_client.rebase`), which caches what it derives in
    `derived`."""

    blob: bytes
    set_offsets: np.ndarray
    members: np.ndarray
    destination_ids: tuple[str, ...]
    key_ends: np.ndarray  # offset of each key's NUL in `blob` (found while checking it)
    derived: dict[str, Any] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return max(int(self.set_offsets.size) - 1, 0)


@dataclass(frozen=True)
class KeyTable:
    """Admitted keys and their destination sets, columnar.

    Key i is `keys[i]`; its set is `members[set_offsets[i]:set_offsets[i+1]]`
    (indices into the plan's destinations); `rates[i]` is the rate it was planned at.
    """

    keys: Sequence[str]
    set_offsets: np.ndarray  # uint32, len(keys) + 1
    members: np.ndarray  # uint32
    rates: np.ndarray  # float64, len(keys)

    def __len__(self) -> int:
        return len(self.keys)

    def replicas(self) -> np.ndarray:
        """k_b per admitted key."""
        return np.diff(self.set_offsets.astype(np.int64))

    def set_of(self, i: int) -> tuple[int, ...]:
        lo, hi = int(self.set_offsets[i]), int(self.set_offsets[i + 1])
        return tuple(int(m) for m in self.members[lo:hi])

    def as_dict(self) -> dict[str, tuple[int, ...]]:
        """key -> destination indices, for tests and tools (routers use `routing.RoutingTable`)."""
        offs = self.set_offsets.tolist()
        mem = self.members.tolist()
        return {k: tuple(mem[offs[i] : offs[i + 1]]) for i, k in enumerate(self.keys)}

    @classmethod
    def empty(cls) -> KeyTable:
        return cls(
            keys=(),
            set_offsets=np.zeros(1, np.uint32),
            members=np.zeros(0, np.uint32),
            rates=np.zeros(0, np.float64),
        )

    @classmethod
    def from_sets(
        cls, keys: Sequence[str], sets: Sequence[Sequence[int]], rates: Sequence[float]
    ) -> KeyTable:
        sizes = np.fromiter((len(s) for s in sets), np.int64, count=len(sets))
        offsets = np.zeros(len(sets) + 1, np.uint32)
        np.cumsum(sizes, out=offsets[1:])
        members = np.fromiter((m for s in sets for m in s), np.uint32, count=int(sizes.sum()))
        return cls(list(keys), offsets, members, np.asarray(rates, np.float64))


@dataclass(frozen=True, slots=True)
class PlanStats:
    admitted_rate_share: float = 0.0
    cold_tail_rate_per_s: float = 0.0
    expected_load_per_s: tuple[float, ...] = ()
    imbalance_max_over_mean: float = 1.0
    admitted_keys: int = 0
    used_slots: int = 0
    build_seconds: float = 0.0


@dataclass(frozen=True)
class RoutingPlan:
    config: PlanConfig
    destinations: tuple[DestinationSpec, ...]
    table: KeyTable
    stats: PlanStats = field(default_factory=PlanStats)
    version: Version = Version()
    created_at_ms: int = 0
    rates_window_end_ms: int = 0

    @property
    def destination_ids(self) -> list[str]:
        return [d.id for d in self.destinations]


# --- key blobs ---------------------------------------------------------------


def decode_keys(blob: bytes) -> list[str]:
    """The plan's keys (`cacheroute.keyblob`); PlanRejected if the blob is malformed."""
    try:
        return keyblob.decode_keys(blob)
    except ValueError as exc:
        raise PlanRejected("malformed", str(exc)) from exc


# --- plan <-> protobuf ---------------------------------------------------------


def _version_pb(v: Version) -> plan_pb2.PlanVersion:
    return plan_pb2.PlanVersion(epoch=v.epoch, seq=v.seq)


def version_from_pb(v: plan_pb2.PlanVersion) -> Version:
    return Version(int(v.epoch), int(v.seq))


def config_to_pb(c: PlanConfig) -> plan_pb2.PlanConfig:
    return plan_pb2.PlanConfig(
        q_cap=c.q_cap,
        warm_slots_per_destination=c.warm_slots_per_destination,
        warm_slots=c.warm_slots,
        byte_aware=c.byte_aware,
        imbalance_tolerance=c.imbalance_tolerance,
        built_by=c.built_by,
        fallback=c.fallback,
        hashed_tail=c.hashed_tail,
    )


def config_from_pb(c: plan_pb2.PlanConfig) -> PlanConfig:
    return PlanConfig(
        q_cap=c.q_cap,
        warm_slots_per_destination=c.warm_slots_per_destination,
        warm_slots=c.warm_slots,
        byte_aware=c.byte_aware,
        imbalance_tolerance=c.imbalance_tolerance,
        built_by=c.built_by,
        fallback=c.fallback,
        hashed_tail=c.hashed_tail,
    )


def destinations_to_pb(dests: Sequence[DestinationSpec]) -> list[plan_pb2.Destination]:
    return [
        plan_pb2.Destination(
            id=d.id, address=d.address, capacity_weight=d.capacity_weight, draining=d.draining
        )
        for d in dests
    ]


def checked_weight(weight: float) -> float:
    """A destination's capacity weight off the wire: unset (0) is 1.0, else finite and > 0."""
    w = weight or 1.0
    if not 0.0 < w < math.inf:  # NaN fails too
        raise PlanRejected("bad_weight", "a destination's capacity weight is not positive")
    return w


def destinations_from_pb(dests: Sequence[plan_pb2.Destination]) -> tuple[DestinationSpec, ...]:
    return tuple(
        DestinationSpec(d.id, d.address, checked_weight(d.capacity_weight), d.draining)
        for d in dests
    )


def stats_to_pb(s: PlanStats) -> plan_pb2.PlanStats:
    return plan_pb2.PlanStats(
        admitted_rate_share=s.admitted_rate_share,
        cold_tail_rate_per_s=s.cold_tail_rate_per_s,
        expected_load_per_s=list(s.expected_load_per_s),
        imbalance_max_over_mean=s.imbalance_max_over_mean,
        admitted_keys=s.admitted_keys,
        used_slots=s.used_slots,
        build_seconds=s.build_seconds,
    )


def stats_from_pb(s: plan_pb2.PlanStats) -> PlanStats:
    return PlanStats(
        admitted_rate_share=s.admitted_rate_share,
        cold_tail_rate_per_s=s.cold_tail_rate_per_s,
        expected_load_per_s=tuple(s.expected_load_per_s),
        imbalance_max_over_mean=s.imbalance_max_over_mean,
        admitted_keys=s.admitted_keys,
        used_slots=s.used_slots,
        build_seconds=s.build_seconds,
    )


def table_to_pb(t: KeyTable) -> plan_pb2.KeyTable:
    return plan_pb2.KeyTable(
        keys=encode_keys(t.keys),
        set_offsets_u32le=np.asarray(t.set_offsets, "<u4").tobytes(),
        members_u32le=np.asarray(t.members, "<u4").tobytes(),
        rates_f32le=np.asarray(t.rates, "<f4").tobytes(),
    )


def table_from_pb(
    pb: plan_pb2.KeyTable, n_destinations: int, *, unique_keys_checked_by_caller: bool = False
) -> KeyTable:
    """Decode and check a key table. A caller that builds a dict of the keys anyway
    may skip the duplicate-key check here and compare the dict's size instead."""
    keys = decode_keys(pb.keys)
    offsets = _u32(pb.set_offsets_u32le, "set offsets")
    members = _u32(pb.members_u32le, "members")
    if len(pb.rates_f32le) % 4:
        raise PlanRejected("malformed", "rates column is not a whole number of float32")
    rates = np.frombuffer(pb.rates_f32le, "<f4").astype(np.float64)
    table = KeyTable(keys, offsets, members, rates)
    check_table(
        table,
        n_destinations,
        key_bytes=_key_byte_lengths(pb.keys),
        unique_keys=unique_keys_checked_by_caller,
    )
    return table


def _key_byte_lengths(blob: bytes) -> np.ndarray:
    return _key_lengths(_key_ends(blob))


def _key_ends(blob: bytes) -> np.ndarray:
    return np.flatnonzero(np.frombuffer(blob, np.uint8) == 0)


def _key_lengths(ends: np.ndarray) -> np.ndarray:
    # Key lengths from the NUL positions: far cheaper than len() over 100k strings.
    return np.diff(ends, prepend=-1) - 1


def _u32(raw: bytes, what: str) -> np.ndarray:
    if len(raw) % 4:
        raise PlanRejected("malformed", f"{what} column is not a whole number of uint32")
    return np.frombuffer(raw, "<u4")


def check_table(
    t: KeyTable,
    n_destinations: int,
    draining: Sequence[int] = (),
    key_bytes: np.ndarray | None = None,
    unique_keys: bool = False,
) -> None:
    """Raise PlanRejected unless `t` satisfies the module invariants.

    `key_bytes` (UTF-8 length of each key) may be passed when the caller already
    has it; otherwise it is computed. `unique_keys=True` skips the duplicate-key
    check (the caller has made it).
    """
    n = len(t.keys)
    if key_bytes is None:
        key_bytes = np.fromiter((len(k.encode()) for k in t.keys), np.int64, count=n)
    check_columns(t.set_offsets, t.members, len(t.rates), n_destinations, key_bytes, draining)
    if not unique_keys and len(set(t.keys)) != n:
        raise PlanRejected("duplicate_key", "a key appears twice")


def check_columns(
    set_offsets: np.ndarray,
    members: np.ndarray,
    n_rates: int,
    n_destinations: int,
    key_bytes: np.ndarray,
    draining: Sequence[int] = (),
) -> None:
    """The checks of `check_table` that need no key strings (all but uniqueness)."""
    n = len(key_bytes)
    offs = set_offsets
    if len(offs) != n + 1 or (n and n_rates not in (0, n)):
        raise PlanRejected("inconsistent", "key table columns differ in length")
    if offs[0] != 0 or int(offs[-1]) != len(members):
        raise PlanRejected("inconsistent", "set offsets do not span the member list")
    sizes = np.diff(offs.astype(np.int64))
    if n and sizes.min() <= 0:
        raise PlanRejected("empty_set", "a key has an empty destination set")
    if len(members) and int(members.max()) >= n_destinations:
        raise PlanRejected("unknown_destination", "a key names a destination the plan lacks")
    if n and (int(key_bytes.min()) == 0 or int(key_bytes.max()) > MAX_KEY_BYTES):
        raise PlanRejected("bad_key", "a key is empty or longer than the limit")
    _check_distinct_members(members, sizes)
    if len(draining) and len(members) and np.isin(members, np.asarray(draining)).any():
        raise PlanRejected("draining_destination", "a key is placed on a draining destination")


def plan_keys_from_pb(
    pb: plan_pb2.KeyTable, destination_ids: tuple[str, ...], draining: Sequence[int] = ()
) -> PlanKeys:
    """A plan's key columns, checked like `table_from_pb` but with the keys left as
    bytes; uniqueness is checked by whoever builds the lookup from them."""
    blob = pb.keys
    if blob and not blob.endswith(b"\0"):
        raise PlanRejected("malformed", "key blob is not NUL-terminated")
    try:
        blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanRejected("malformed", f"key blob is not UTF-8: {exc}") from exc
    offsets = _u32(pb.set_offsets_u32le, "set offsets")
    members = _u32(pb.members_u32le, "members")
    if len(pb.rates_f32le) % 4:
        raise PlanRejected("malformed", "rates column is not a whole number of float32")
    check_columns(offsets, members, len(pb.rates_f32le) // 4, len(destination_ids),
                  _key_lengths(ends := _key_ends(blob)), draining)
    return PlanKeys(blob, offsets, members, destination_ids, ends)


def _check_distinct_members(members: np.ndarray, sizes: np.ndarray) -> None:
    # Vectorised: sort members within each set, then look for equal neighbours
    # that belong to the same set.
    if not len(sizes) or int(sizes.max()) <= 1:
        return
    in_multi = np.repeat(sizes > 1, sizes)
    owner = np.repeat(np.arange(len(sizes)), sizes)[in_multi]
    span = int(members.max()) + 1
    tagged = np.sort(owner * span + members[in_multi].astype(np.int64))
    dup = np.nonzero(tagged[1:] == tagged[:-1])[0]
    if len(dup):
        row = int(tagged[dup[0]] // span)
        raise PlanRejected("duplicate_member", f"key #{row} lists a destination twice")


def plan_to_pb(plan: RoutingPlan) -> plan_pb2.RoutingPlan:
    return plan_pb2.RoutingPlan(
        schema=SCHEMA,
        version=_version_pb(plan.version),
        created_at_ms=plan.created_at_ms,
        config=config_to_pb(plan.config),
        destinations=destinations_to_pb(plan.destinations),
        table=table_to_pb(plan.table),
        stats=stats_to_pb(plan.stats),
        rates_window_end_ms=plan.rates_window_end_ms,
    )


def encode_plan(plan: RoutingPlan) -> bytes:
    return plan_to_pb(plan).SerializeToString()


def plan_from_pb(pb: plan_pb2.RoutingPlan) -> RoutingPlan:
    if pb.schema != SCHEMA:
        raise PlanRejected("unknown_schema", f"plan schema {pb.schema} is not {SCHEMA}")
    dests = destinations_from_pb(pb.destinations)
    if not dests:
        raise PlanRejected("no_destinations", "the plan names no destination")
    if len({d.id for d in dests}) != len(dests):
        raise PlanRejected("duplicate_destination", "a destination id appears twice")
    table = table_from_pb(pb.table, len(dests))
    draining = [i for i, d in enumerate(dests) if d.draining]
    if draining:
        check_table(table, len(dests), draining)
    return RoutingPlan(
        config=config_from_pb(pb.config),
        destinations=dests,
        table=table,
        stats=stats_from_pb(pb.stats),
        version=version_from_pb(pb.version),
        created_at_ms=pb.created_at_ms,
        rates_window_end_ms=pb.rates_window_end_ms,
    )


def decode_plan(payload: bytes) -> RoutingPlan:
    """Parse and check a serialized RoutingPlan; raise PlanRejected if it is not sound."""
    return plan_from_pb(parse_plan_pb(payload))


def parse_plan_pb(payload: bytes) -> plan_pb2.RoutingPlan:
    """Size check, parse and schema check only (no table checks)."""
    if len(payload) > MAX_PLAN_BYTES:
        raise PlanRejected("oversize", f"plan of {len(payload)} bytes exceeds {MAX_PLAN_BYTES}")
    pb = plan_pb2.RoutingPlan()
    try:
        pb.ParseFromString(payload)
    except DecodeError as exc:
        raise PlanRejected("malformed", f"plan does not parse: {exc}") from exc
    if pb.schema != SCHEMA:
        raise PlanRejected("unknown_schema", f"plan schema {pb.schema} is not {SCHEMA}")
    return pb
