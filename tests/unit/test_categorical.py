"""Categorical string columns (streams.categorical)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from streams.categorical import Categorical


def test_of_keeps_first_appearance_order_and_rows():
    c = Categorical.of(["b", "a", "b", "c", "a"])
    assert c.names == ["b", "a", "c"]
    assert c.codes.tolist() == [0, 1, 0, 2, 1]
    assert c.tolist() == ["b", "a", "b", "c", "a"]
    assert c[3] == "c" and len(c) == 5


def test_take_then_used_lists_only_names_rows_still_use():
    c = Categorical.of(["x", "y", "z", "y"]).take(np.array([3, 2]))
    names, pos = c.used()
    assert names == ["y", "z"]  # "x" is not used by any remaining row
    assert [names[p] for p in pos.tolist()] == c.tolist()


def test_per_row_spreads_per_name_values():
    c = Categorical.of(["ab", "", "ab", "abc"])
    assert c.per_row(c.name_lengths()).tolist() == [2, 0, 2, 3]


@given(st.lists(st.sampled_from(["a", "b", "c", "d", "é"]), max_size=30), st.data())
def test_used_agrees_with_the_rows(values, data):
    c = Categorical.of(values)
    rows = np.array(data.draw(st.lists(st.integers(0, max(len(values) - 1, 0)),
                                       max_size=len(values))) if values else [], dtype=np.int64)
    sub = c.take(rows)
    names, pos = sub.used()
    assert [names[p] for p in pos.tolist()] == sub.tolist()
    assert names == list(dict.fromkeys(sub.tolist()))  # first-use order, each once
