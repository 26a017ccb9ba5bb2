"""Layered lookups (router_client.layered): a delta shares the held dict and
layers its changes; the mapping, the routing and the flattened table agree with
a plain dict of the same content."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router_client.delta import apply_delta, make_delta
from router_client.layered import LayeredLookup
from router_client.plan import Version
from router_client.routing import RouterCore, RoutingTable
from router_client.testing import perturb, synthetic_plan

keys = st.sampled_from([f"k{i}" for i in range(20)])
values = st.one_of(st.integers(0, 5), st.tuples(st.integers(0, 5), st.integers(6, 9)))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(keys, values), st.dictionaries(keys, st.one_of(st.none(), values)))
def test_mapping_semantics_match_the_flat_dict(base, overlay):
    layered = LayeredLookup(base, overlay)
    expected = dict(base)
    for k, v in overlay.items():
        if v is None:
            expected.pop(k, None)
        else:
            expected[k] = v
    assert layered.flatten() == expected
    assert dict(layered) == expected and len(layered) == len(expected)
    assert layered == expected  # Mapping equality
    for k in [f"k{i}" for i in range(20)]:
        assert (k in layered) == (k in expected)
        assert layered.get(k) == expected.get(k)


def test_a_delta_layers_over_the_held_dict_and_routes_like_the_flat_table():
    base = synthetic_plan(3_000, 12, multi_share=0.1)
    held = RoutingTable.from_plan(base, b"B" * 32)
    target = perturb(base, 0.05, version=Version(1, 2), seed=7)
    delta = make_delta(base, target, b"B" * 32, b"T" * 32)
    applied = apply_delta(held, delta)
    assert isinstance(applied.lookup, LayeredLookup)
    assert applied.lookup.base is held.lookup  # shared, not copied
    assert held.lookup == RoutingTable.from_plan(base).lookup  # the old table is intact
    fresh = RoutingTable.from_plan(target)
    assert applied.lookup == fresh.lookup
    flat = applied.flattened()
    assert type(flat.lookup) is dict and flat.lookup == fresh.lookup
    # single-member keys route to their member; the same through either table
    layered_core, flat_core = RouterCore(fresh.destination_ids), RouterCore(fresh.destination_ids)
    layered_core.install(applied)
    flat_core.install(flat)
    for key in [*list(fresh.lookup)[:500], "not-admitted"]:
        m = fresh.lookup.get(key)
        got = layered_core.route(key)
        if isinstance(m, int):
            assert got == flat_core.route(key) == fresh.destination_ids[m]
        elif m is not None:
            assert got in {fresh.destination_ids[i] for i in m}
    assert layered_core.counters()["unadmitted"] >= 1


def test_a_second_delta_on_a_layered_table_keeps_one_base():
    plans = [synthetic_plan(2_000, 8)]
    table = RoutingTable.from_plan(plans[0], b"d1")
    for seq in (2, 3, 4):
        plans.append(perturb(plans[-1], 0.03, version=Version(1, seq), seed=seq))
        delta = make_delta(plans[-2], plans[-1], table.digest, b"d%d" % seq)
        nxt = apply_delta(table, delta)
        assert isinstance(nxt.lookup, LayeredLookup)
        base = table.lookup.base if isinstance(table.lookup, LayeredLookup) else table.lookup
        assert nxt.lookup.base is base
        table = nxt
    assert table.lookup == RoutingTable.from_plan(plans[-1]).lookup
