"""A full plan applied as an edit of the held table (router_client.rebase) gives
exactly the table a from-scratch build gives, whatever happened in between."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router_client.delta import apply_delta, make_delta
from router_client.errors import PlanRejected
from router_client.plan import (
    DestinationSpec,
    KeyTable,
    PlanConfig,
    PlanStats,
    RoutingPlan,
    Version,
    encode_plan,
)
from router_client.rebase import plan_edit
from router_client.routing import RoutingTable, lookup_from_columns
from router_client.testing import perturb, synthetic_plan

DESTS = tuple(DestinationSpec(f"d{i}", "") for i in range(6))
# short keys, keys beyond the 64-byte fingerprint prefix that differ only at the
# end, and non-ASCII keys
KEYS = ([f"k{i}" for i in range(12)] + ["x" * 70 + "a", "x" * 70 + "b", "ключ", "键"])


def plan_of(entries: dict[str, tuple[int, ...]], seq: int,
            dests: tuple[DestinationSpec, ...] = DESTS) -> RoutingPlan:
    keys = list(entries)
    return RoutingPlan(
        config=PlanConfig(q_cap=1.0, warm_slots_per_destination=4, warm_slots=24),
        destinations=dests,
        table=KeyTable.from_sets(keys, [entries[k] for k in keys], [1.0] * len(keys)),
        stats=PlanStats(admitted_keys=len(keys), used_slots=0),
        version=Version(1, seq),
        created_at_ms=seq,
    )


sets = st.lists(st.integers(0, len(DESTS) - 1), min_size=1, max_size=3, unique=True).map(tuple)
plans = st.dictionaries(st.sampled_from(KEYS), sets, max_size=len(KEYS))


def built(plan: RoutingPlan, held: RoutingTable | None = None) -> RoutingTable:
    return RoutingTable.from_payload(encode_plan(plan), b"", held=held)


@settings(max_examples=200, deadline=None)
@given(plans, st.lists(plans, max_size=3), plans, st.randoms())
def test_an_edited_table_equals_a_fresh_build(first, deltas, last, rnd):
    """base -> some deltas -> a full plan (keys in any order): the same lookup."""
    held = built(plan_of(first, 1))
    previous = plan_of(first, 1)
    for i, entries in enumerate(deltas, start=2):
        target = plan_of(entries, i)
        held = apply_delta(held, make_delta(previous, target, held.digest, b"t%d" % i))
        previous = target
    order = list(last)
    rnd.shuffle(order)
    new = plan_of({k: last[k] for k in order}, 10)
    fresh = dict(built(new).lookup)
    # the edit itself, without the size check that would mask a wrong one
    edit = plan_edit(held.base, held.touched, built(new).base)
    assert edit is not None
    lookup = dict(held.lookup)
    for key in edit.drop:
        lookup.pop(key, None)
    lookup.update(lookup_from_columns(edit.keys, edit.set_offsets, edit.members))
    assert lookup == fresh
    # and as the router applies it
    edited = built(new, held=held)
    assert dict(edited.lookup) == fresh
    assert edited.version == Version(1, 10)


def test_the_edit_keeps_unchanged_entries_and_is_taken():
    base = synthetic_plan(2_000, 20)
    held = built(base)
    nxt = perturb(base, 0.05, version=Version(1, 2), seed=3)
    edited = built(nxt, held=held)
    assert dict(edited.lookup) == dict(built(nxt).lookup)
    # untouched keys are the held table's own str objects: the lookup was copied, not rebuilt
    held_keys = {k: k for k in held.lookup}
    same_objects = sum(k is held_keys[k] for k in edited.lookup if k in held_keys)
    assert same_objects >= 0.9 * len(edited.lookup)


def test_same_keys_after_deltas_edit_exactly():
    """The usual shape: identical key order, some sets moved, deltas in between."""
    base = synthetic_plan(3_000, 30)
    held = built(base)
    previous = base
    for seq in (2, 3):
        target = perturb(previous, 0.03, version=Version(1, seq), seed=seq)
        held = apply_delta(held, make_delta(previous, target, held.digest, b"t%d" % seq))
        previous = target
    new = perturb(previous, 0.03, version=Version(1, 4), seed=4)
    fresh = dict(built(new).lookup)
    edit = plan_edit(held.base, held.touched, built(new).base)
    assert edit is not None and 0 < len(edit.keys) < 0.2 * len(fresh)
    lookup = dict(held.lookup)
    for key in edit.drop:
        lookup.pop(key, None)
    lookup.update(lookup_from_columns(edit.keys, edit.set_offsets, edit.members))
    assert lookup == fresh
    # a full plan equal to the base, after the deltas: the touched keys go back
    back = dataclasses.replace(base, version=Version(1, 5))
    assert dict(built(back, held=held).lookup) == dict(built(base).lookup)


def test_a_duplicate_key_is_still_rejected_when_editing():
    held = built(plan_of({"a": (0,), "b": (1,)}, 1))
    dup = plan_of({"a": (0,), "b": (1,)}, 2)
    keys = ["a", "b", "a"]
    table = KeyTable.from_sets(keys, [(0,), (1,), (2,)], [1.0] * 3)
    dup = dataclasses.replace(dup, table=table)
    with pytest.raises(PlanRejected) as err:
        built(dup, held=held)
    assert err.value.reason == "duplicate_key"


def test_reordered_destinations_fall_back_to_a_fresh_build():
    held = built(plan_of({"a": (0,), "b": (1, 2)}, 1))
    reordered = plan_of({"a": (0,), "b": (1, 2)}, 2, dests=DESTS[::-1])
    table = built(reordered, held=held)
    assert dict(table.lookup) == {"a": 0, "b": (1, 2)}
    assert table.destination_ids == tuple(d.id for d in DESTS[::-1])


def test_fingerprints_and_byte_checks_in_chunks_agree(monkeypatch):
    import random

    import router_client.rebase as rebase

    base = synthetic_plan(500, 10)
    keys = list(base.table.keys)
    random.Random(3).shuffle(keys)  # another key order: the fingerprint path
    sets = dict(zip(base.table.keys, (base.table.set_of(i) for i in range(len(keys))),
                    strict=True))
    shuffled = dataclasses.replace(base, version=Version(1, 2), table=KeyTable.from_sets(
        keys, [sets[k] for k in keys], [1.0] * len(keys)))
    whole = built(shuffled, held=built(base))
    monkeypatch.setattr(rebase, "_CHUNK_KEYS", 7)
    chunked = built(shuffled, held=built(base))
    assert dict(chunked.lookup) == dict(whole.lookup) == dict(built(shuffled).lookup)
    start, end = rebase.spans(chunked.base)
    small = rebase.fingerprints(chunked.base.blob, start, end)
    monkeypatch.setattr(rebase, "_CHUNK_KEYS", 1 << 30)
    assert np.array_equal(small, rebase.fingerprints(chunked.base.blob, start, end))


def test_the_follower_counts_full_plans_applied_as_edits():
    from router_client import signing
    from router_client.follow import FULL, Applied, PlanFollower
    from router_client.layout import Pointer

    key = signing.generate_private_key()
    follower = PlanFollower([key.public_key()])
    plan = synthetic_plan(1_000, 8)
    for seq in (1, 2, 3):
        if seq > 1:
            plan = perturb(plan, 0.05, version=Version(1, seq), seed=seq)
        blob = signing.sign_blob(encode_plan(plan), signing.PLAN, key)
        _kind, _payload, digest = signing.verify_blob(blob, follower.public_keys)
        table = follower.table_from_plan(Pointer(plan.version, digest), blob)
        assert table.edited == (seq > 1)  # the first has nothing to edit
        follower.accept(Applied(table, FULL))
    assert (follower.applied_full, follower.applied_full_edited) == (3, 2)
