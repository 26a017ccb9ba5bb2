"""The router's lookup dict says exactly what the plan's key table says."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from router_client.plan import KeyTable
from router_client.routing import lookup_from_columns

sets = st.lists(
    st.lists(st.integers(0, 50), min_size=1, max_size=5, unique=True), min_size=0, max_size=60
)


@given(sets)
def test_lookup_matches_the_key_table(member_sets: list[list[int]]) -> None:
    keys = [f"k{i}" for i in range(len(member_sets))]
    table = KeyTable.from_sets(keys, member_sets, [1.0] * len(keys))
    lookup = lookup_from_columns(table.keys, table.set_offsets, table.members)
    expected = {
        k: (s[0] if len(s) == 1 else tuple(s)) for k, s in zip(keys, member_sets, strict=True)
    }
    assert lookup == expected
