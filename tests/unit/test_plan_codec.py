"""The plan codec's checks (router_client.plan), including the vectorised ones."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router_client.errors import PlanRejected
from router_client.plan import (
    MAX_KEY_BYTES,
    KeyTable,
    check_table,
    decode_plan,
    encode_plan,
)
from router_client.testing import synthetic_plan


def test_round_trip_keeps_the_table():
    plan = synthetic_plan(500, 12, multi_share=0.2)
    back = decode_plan(encode_plan(plan))
    assert back.table.as_dict() == plan.table.as_dict()
    assert back.destinations == plan.destinations and back.version == plan.version


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=4), min_size=1, max_size=30))
def test_duplicate_member_check_matches_the_obvious_rule(sets):
    table = KeyTable.from_sets([f"k{i}" for i in range(len(sets))], sets, [1.0] * len(sets))
    has_dup = any(len(set(s)) != len(s) for s in sets)
    if has_dup:
        with pytest.raises(PlanRejected) as err:
            check_table(table, 6)
        assert err.value.reason == "duplicate_member"
    else:
        check_table(table, 6)


def _table(keys):
    return KeyTable.from_sets(keys, [(0,)] * len(keys), [1.0] * len(keys))


@pytest.mark.parametrize(
    ("keys", "reason"),
    [
        (["a", "a"], "duplicate_key"),
        (["a", ""], "bad_key"),
        (["é" * (MAX_KEY_BYTES // 2 + 1)], "bad_key"),  # over the limit in UTF-8 bytes
    ],
)
def test_bad_keys_are_rejected(keys, reason):
    with pytest.raises(PlanRejected) as err:
        check_table(_table(keys), 1)
    assert err.value.reason == reason


def test_decode_checks_key_bytes_from_the_blob():
    plan = synthetic_plan(3, 2)
    pb_plan = encode_plan(plan).replace(b"k00000001\0", b"k00000002\0")
    with pytest.raises(PlanRejected) as err:
        decode_plan(pb_plan)
    assert err.value.reason == "duplicate_key"


def test_unknown_destination_and_broken_offsets_are_rejected():
    t = KeyTable(["a"], np.array([0, 1], np.uint32), np.array([7], np.uint32), np.ones(1))
    with pytest.raises(PlanRejected, match="unknown_destination"):
        check_table(t, 3)
    t = KeyTable(["a"], np.array([0, 2], np.uint32), np.array([1], np.uint32), np.ones(1))
    with pytest.raises(PlanRejected, match="inconsistent"):
        check_table(t, 3)


@pytest.mark.parametrize("weight", [float("inf"), float("nan"), -2.0])
def test_both_decoders_refuse_a_weight_that_is_not_positive_and_finite(weight):
    """Found by the fuzz test: decode_plan took an infinite weight that routers refused."""
    from cacheroute.v1 import plan_pb2
    from router_client.routing import RoutingTable

    pb = plan_pb2.RoutingPlan.FromString(encode_plan(synthetic_plan(n_keys=5, n_destinations=3)))
    pb.destinations[1].capacity_weight = weight
    for decode in (decode_plan, RoutingTable.from_payload):
        with pytest.raises(PlanRejected) as err:
            decode(pb.SerializeToString())
        assert err.value.reason == "bad_weight"


def test_fallback_is_a_plan_field_and_older_plans_saying_it_in_built_by_still_count():
    import dataclasses

    from router_client.routing import RoutingTable

    plan = synthetic_plan(n_keys=5, n_destinations=3)
    for config, expected in (
        (dataclasses.replace(plan.config, fallback=True), True),
        (dataclasses.replace(plan.config, built_by="fallback"), True),  # an older planner
        (plan.config, False),
    ):
        payload = encode_plan(dataclasses.replace(plan, config=config))
        assert decode_plan(payload).config.is_fallback is expected
        assert RoutingTable.from_payload(payload).planner_fallback is expected
