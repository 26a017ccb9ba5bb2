"""Plan deltas: what changed from one plan version to the next, and applying it.

A delta lists removed keys, keys added or re-assigned (with their whole new
set, in the target's destination indices), and the target's full destination
list - or, when that list is the base's, only says so (`same_destinations`).
Sets are compared by destination *id*, so a delta stays correct when the
target lists destinations in another order or adds / drops some: the router
re-indexes the keys the delta does not touch.

The router applies a delta only onto the exact base it names (version and
digest); otherwise it fetches the full plan. The delta is signed by the planner
like a plan, so its `target_digest` is trusted rather than recomputed (that
would mean re-encoding the whole plan on every router).

Pure: protobuf and numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from google.protobuf.message import DecodeError

from cacheroute.v1 import plan_pb2
from router_client.errors import PlanRejected
from router_client.layered import Members, layer
from router_client.plan import (
    MAX_PLAN_BYTES,
    SCHEMA,
    KeyTable,
    RoutingPlan,
    _version_pb,
    check_table,
    config_from_pb,
    config_to_pb,
    decode_keys,
    destinations_to_pb,
    encode_keys,
    stats_to_pb,
    table_from_pb,
    table_to_pb,
    version_from_pb,
)
from router_client.routing import (
    RoutingTable,
    destination_columns,
    lookup_from_columns,
)

# An overlay is flattened at apply time beyond this many keys (or 1/8 of the base).
_MIN_OVERLAY_TO_FLATTEN = 4096


def _lookup(plan: RoutingPlan) -> dict[str, Members]:
    t = plan.table
    return lookup_from_columns(t.keys, t.set_offsets, t.members)


def _reindex(m: Members, index_of: Sequence[int]) -> Members:
    return index_of[m] if isinstance(m, int) else tuple(index_of[i] for i in m)


def make_delta(
    base: RoutingPlan, target: RoutingPlan, base_digest: bytes, target_digest: bytes
) -> plan_pb2.PlanDelta:
    """The PlanDelta that turns `base` into `target` (compared by destination id)."""
    base_lookup = _lookup(base)
    target_ids = target.destination_ids
    if base.destination_ids != target_ids:
        pos = {d: i for i, d in enumerate(target_ids)}
        index_of = [pos.get(d, -1) for d in base.destination_ids]
        base_lookup = {k: _reindex(m, index_of) for k, m in base_lookup.items()}
    target_lookup = _lookup(target)
    removed = [k for k in base_lookup if k not in target_lookup]
    changed = [i for i, k in enumerate(target.table.keys) if base_lookup.get(k) != target_lookup[k]]
    t = target.table
    upserts = KeyTable.from_sets(
        [t.keys[i] for i in changed], [t.set_of(i) for i in changed], t.rates[changed].tolist()
    )
    same_destinations = tuple(base.destinations) == tuple(target.destinations)
    return plan_pb2.PlanDelta(
        schema=SCHEMA,
        base=_version_pb(base.version),
        target=_version_pb(target.version),
        base_digest=base_digest,
        target_digest=target_digest,
        removed_keys=encode_keys(removed),
        upserts=table_to_pb(upserts),
        destinations=() if same_destinations else destinations_to_pb(target.destinations),
        same_destinations=same_destinations,
        created_at_ms=target.created_at_ms,
        config=config_to_pb(target.config),
        stats=stats_to_pb(target.stats),
    )


def decode_delta(payload: bytes) -> plan_pb2.PlanDelta:
    if len(payload) > MAX_PLAN_BYTES:
        raise PlanRejected("oversize", f"delta of {len(payload)} bytes exceeds {MAX_PLAN_BYTES}")
    pb = plan_pb2.PlanDelta()
    try:
        pb.ParseFromString(payload)
    except DecodeError as exc:
        raise PlanRejected("malformed", f"delta does not parse: {exc}") from exc
    if pb.schema != SCHEMA:
        raise PlanRejected("unknown_schema", f"delta schema {pb.schema} is not {SCHEMA}")
    return pb


def apply_delta(table: RoutingTable, delta: plan_pb2.PlanDelta) -> RoutingTable:
    """The table of the delta's target; raise PlanRejected if it does not fit `table`."""
    if version_from_pb(delta.base) != table.version or delta.base_digest != table.digest:
        raise PlanRejected("delta_base_mismatch", f"delta is not based on {table.version}")
    target = version_from_pb(delta.target)
    if target <= table.version:
        raise PlanRejected("stale", f"delta target {target} is not newer than {table.version}")
    if delta.same_destinations:
        if len(delta.destinations):
            raise PlanRejected("malformed", "a delta with same_destinations lists destinations")
        ids, addresses, draining = table.destination_ids, table.addresses, sorted(table.draining)
        weights = table.weights
    else:
        ids, addresses, draining, weights = destination_columns(delta.destinations)
    if ids == table.destination_ids:
        ids = table.destination_ids  # the same object: the router's slot cache hits on `is`
    upserts = table_from_pb(delta.upserts, len(ids))
    if draining:
        check_table(upserts, len(ids), draining)
    removed = decode_keys(delta.removed_keys)
    upserted = lookup_from_columns(upserts.keys, upserts.set_offsets, upserts.members)
    lookup: Mapping[str, Members]
    if ids is table.destination_ids:
        # The same indices: share the held base dict, layer the changes over it.
        layered = layer(table.lookup, removed, upserted)
        lookup = layered
        if len(layered.overlay) > max(_MIN_OVERLAY_TO_FLATTEN, len(layered.base) // 8):
            lookup = layered.flatten()  # deltas came faster than the client flattens
    else:
        flat_lookup = _reindexed(table, ids)
        for key in removed:
            flat_lookup.pop(key, None)
        flat_lookup.update(upserted)
        _check_no_dropped(flat_lookup)
        lookup = flat_lookup
    return RoutingTable(
        version=target,
        destination_ids=ids,
        lookup=lookup,
        created_at_ms=delta.created_at_ms,
        digest=bytes(delta.target_digest),
        planner_fallback=config_from_pb(delta.config).is_fallback,
        draining=frozenset(draining),
        addresses=addresses,
        weights=weights,
        # the next full plan is an edit from the same base; these keys may differ from it
        base=table.base,
        touched=(*table.touched, bytes(delta.removed_keys), bytes(delta.upserts.keys))
        if table.base is not None else (),
    )


def _reindexed(table: RoutingTable, ids: tuple[str, ...]) -> dict[str, Members]:
    """The held lookup in the target's destination indices (-1: destination gone)."""
    pos = {d: i for i, d in enumerate(ids)}
    index_of = [pos.get(d, -1) for d in table.destination_ids]
    return {k: _reindex(m, index_of) for k, m in table.lookup.items()}


def _check_no_dropped(lookup: Mapping[str, Members]) -> None:
    for key, m in lookup.items():
        if m == -1 or (not isinstance(m, int) and -1 in m):
            raise PlanRejected("inconsistent", f"key {key!r} still names a dropped destination")
