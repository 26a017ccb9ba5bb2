"""Plan deltas (router_client.delta) and the key layout (router_client.layout)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router_client.delta import apply_delta, decode_delta, make_delta
from router_client.errors import PlanRejected
from router_client.layout import Layout, Pointer, parse_member, version_member
from router_client.plan import DestinationSpec, KeyTable, PlanConfig, RoutingPlan, Version
from router_client.routing import RoutingTable
from router_client.testing import perturb, synthetic_plan


def _plan(sets, ids, version):
    return RoutingPlan(
        config=PlanConfig(1.0, 1, 1),
        destinations=tuple(DestinationSpec(i) for i in ids),
        table=KeyTable.from_sets(list(sets), list(sets.values()), [1.0] * len(sets)),
        version=version,
    )


def _by_id(table: RoutingTable) -> dict[str, frozenset[str]]:
    return {
        k: frozenset(table.destination_ids[i] for i in table.members_of(k)) for k in table.lookup
    }


def _round_trip(base, target):
    delta = make_delta(base, target, b"B" * 32, b"T" * 32)
    delta = decode_delta(delta.SerializeToString())
    return apply_delta(RoutingTable.from_plan(base, b"B" * 32), delta)


def test_delta_of_a_perturbed_plan_rebuilds_the_target():
    base = synthetic_plan(2000, 30, multi_share=0.1)
    target = perturb(base, 0.02, version=Version(1, 2), seed=3)
    delta = make_delta(base, target, b"B" * 32, b"T" * 32)
    assert len(delta.upserts.set_offsets_u32le) // 4 - 1 <= 40
    applied = _round_trip(base, target)
    assert applied.lookup == RoutingTable.from_plan(target).lookup
    assert applied.version == Version(1, 2) and applied.digest == b"T" * 32


def test_unchanged_destinations_are_not_resent_and_draining_survives():
    base = synthetic_plan(500, 8)
    drained = tuple(DestinationSpec(d.id, d.address, draining=(i == 3))
                    for i, d in enumerate(base.destinations))
    base = RoutingPlan(base.config, drained, base.table, base.stats, base.version)
    # keys on the draining destination must move off it: re-place them first
    members = base.table.members.copy()
    members[members == 3] = 4
    table = KeyTable(base.table.keys, base.table.set_offsets, members, base.table.rates)
    base = RoutingPlan(base.config, drained, table, base.stats, base.version)
    target = perturb(base, 0.05, version=Version(1, 2), seed=1)
    target = RoutingPlan(target.config, drained, KeyTable(
        target.table.keys, target.table.set_offsets,
        np.where(target.table.members == 3, 5, target.table.members).astype(np.uint32),
        target.table.rates), target.stats, target.version)
    delta = make_delta(base, target, b"B" * 32, b"T" * 32)
    assert delta.same_destinations and not len(delta.destinations)
    applied = _round_trip(base, target)
    assert applied.lookup == RoutingTable.from_plan(target).lookup
    assert applied.draining == frozenset({3})
    assert applied.addresses == tuple(d.address for d in drained)
    # a delta that says "same" but lists destinations is refused
    delta.destinations.add(id="x")
    with pytest.raises(PlanRejected):
        apply_delta(RoutingTable.from_plan(base, b"B" * 32), delta)


ids_strategy = st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=7, unique=True)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), base_ids=ids_strategy, target_ids=ids_strategy)
def test_delta_is_correct_when_destinations_change_order_or_membership(data, base_ids, target_ids):
    keys = st.lists(st.sampled_from([f"k{i}" for i in range(12)]), unique=True, max_size=12)

    def sets_for(ids):
        return {
            k: tuple(
                data.draw(
                    st.lists(
                        st.integers(0, len(ids) - 1), min_size=1, max_size=len(ids), unique=True
                    )
                )
            )
            for k in data.draw(keys)
        }

    base = _plan(sets_for(base_ids), base_ids, Version(1, 1))
    target = _plan(sets_for(target_ids), target_ids, Version(1, 2))
    applied = _round_trip(base, target)
    assert applied.destination_ids == tuple(target_ids)
    assert _by_id(applied) == _by_id(RoutingTable.from_plan(target))


def test_delta_onto_the_wrong_base_is_refused():
    base = synthetic_plan(50, 4)
    target = perturb(base, 0.1, version=Version(1, 2))
    delta = make_delta(base, target, b"B" * 32, b"T" * 32)
    with pytest.raises(PlanRejected) as err:
        apply_delta(RoutingTable.from_plan(base, b"X" * 32), delta)
    assert err.value.reason == "delta_base_mismatch"


def test_version_members_sort_like_versions():
    vs = [Version(0, 9), Version(1, 0), Version(1, 10), Version(1, 2), Version(2**40, 1)]
    assert sorted(vs, key=version_member) == sorted(vs)
    assert all(parse_member(version_member(v)) == v for v in vs)
    p = Pointer(Version(3, 4), b"\x01" * 32)
    assert Pointer.decode(p.encode().encode()) == p


def test_every_key_shares_one_cluster_hash_tag():
    lay = Layout("fleet-a")
    names = [
        lay.current,
        lay.versions,
        lay.channel,
        lay.routers,
        lay.plan(Version(1, 1)),
        lay.delta(Version(1, 1)),
        lay.digest(Version(1, 1)),
        lay.router_status("r"),
    ]
    assert all(n.startswith("fleet-a:{plan}:") for n in names)
