"""The routing decision (router_client.routing): pure, no servers."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router_client.errors import NoPlanAvailable
from router_client.plan import DestinationSpec, KeyTable, PlanConfig, RoutingPlan, Version
from router_client.routing import FALLBACK, PLANNED, RouterCore, RoutingTable

CONFIG = PlanConfig(q_cap=10.0, warm_slots_per_destination=4, warm_slots=16)


def plan_of(sets: dict[str, tuple[int, ...]], n: int = 4, *, order=None, built_by="build"):
    ids = order or [f"d{i}" for i in range(n)]
    return RoutingPlan(
        config=PlanConfig(10.0, 4, 16, built_by=built_by),
        destinations=tuple(DestinationSpec(i) for i in ids),
        table=KeyTable.from_sets(list(sets), list(sets.values()), [1.0] * len(sets)),
        version=Version(1, 1),
    )


def core_with(sets, n=4, seed=0) -> RouterCore:
    core = RouterCore([f"d{i}" for i in range(n)], seed=seed)
    core.install(RoutingTable.from_plan(plan_of(sets, n)))
    return core


def test_table_holds_ints_for_single_keys_and_tuples_for_replicated():
    t = RoutingTable.from_plan(plan_of({"a": (2,), "b": (0, 3)}))
    assert t.lookup == {"a": 2, "b": (0, 3)}
    assert t.members_of("a") == (2,) and t.members_of("b") == (0, 3) and t.members_of("x") == ()
    assert t.version == Version(1, 1) and t.destination_ids == ("d0", "d1", "d2", "d3")


def test_admitted_single_key_goes_to_its_destination():
    core = core_with({"a": (2,)})
    assert {core.route("a") for _ in range(50)} == {"d2"}
    assert core.planned == 50 and core.mode == PLANNED


def test_replicated_key_goes_to_least_in_flight_member():
    core = core_with({"b": (0, 3)})
    core.started(0)
    assert {core.route_index("b") for _ in range(50)} == {3}
    core.started(3)
    core.started(3)
    assert {core.route_index("b") for _ in range(50)} == {0}


def test_ties_between_members_are_broken_at_random():
    core = core_with({"b": (0, 1, 3)})
    seen = Counter(core.route_index("b") for _ in range(3000))
    assert set(seen) == {0, 1, 3}
    assert min(seen.values()) > 800  # roughly uniform, not biased to the first member


def test_unhealthy_member_is_skipped_at_once_and_rerouted_when_whole_set_is_down():
    core = core_with({"a": (2,), "b": (0, 3)})
    core.mark_down("d0")
    assert {core.route_index("b") for _ in range(50)} == {3}
    core.mark_down("d2")
    picks = {core.route_index("a") for _ in range(200)}
    assert 2 not in picks and picks <= {1, 3}
    assert core.unhealthy_reroute == 200
    core.mark_up("d2")
    assert core.route_index("a") == 2


def test_unadmitted_key_uses_p2c_with_two_distinct_destinations():
    core = core_with({"a": (2,)}, n=2)
    core.started(0)
    # With two destinations P2C must sample both (without replacement): the idle one wins.
    assert {core.route_index("zzz") for _ in range(200)} == {1}
    assert core.unadmitted == 200


def test_p2c_spreads_over_all_healthy_destinations():
    core = core_with({}, n=5)
    seen = Counter(core.route_index(f"k{i}") for i in range(5000))
    assert set(seen) == {0, 1, 2, 3, 4}
    assert min(seen.values()) > 700


def test_no_table_means_fallback_over_known_destinations():
    core = RouterCore(["x", "y"], seed=1)
    assert core.mode == FALLBACK
    assert {core.route("a") for _ in range(100)} == {"x", "y"}
    assert core.fallback == 100


def test_empty_core_without_plan_raises():
    with pytest.raises(NoPlanAvailable):
        RouterCore([]).route("a")


def test_forced_fallback_and_planner_fallback_route_by_p2c():
    core = core_with({"a": (2,)})
    core.set_fallback(True)
    assert core.mode == FALLBACK
    assert len({core.route_index("a") for _ in range(200)}) > 1
    core.set_fallback(False)
    assert core.route_index("a") == 2
    core.install(RoutingTable.from_plan(plan_of({"a": (2,)}, built_by="fallback")))
    assert core.mode == FALLBACK


def test_new_table_with_other_destination_order_is_mapped_by_id():
    core = RouterCore(["d0", "d1", "d2"], seed=0)
    core.started(core.slot_of("d2"))
    plan = plan_of({"a": (0,), "b": (1, 2)}, order=["d2", "d9", "d0"])
    core.install(RoutingTable.from_plan(plan))
    assert core.route("a") == "d2"
    assert core.destination_ids == ["d0", "d1", "d2", "d9"]  # slots are stable, grow only
    # "b" is {d9, d0}: both idle, so both get chosen; d2's in-flight count survived the swap
    assert {core.route("b") for _ in range(100)} == {"d9", "d0"}
    assert core.inflight[core.slot_of("d2")] == 1
    # P2C now draws only from the new table's destinations (d1 is not in it)
    core.finished(core.slot_of("d2"))
    assert {core.route(f"x{i}") for i in range(300)} == {"d2", "d9", "d0"}


def test_alternating_destination_orders_map_by_id_every_time():
    # The core reuses its id -> slot mapping while the order stays the same; it must
    # still re-map when the order changes and changes back.
    core = RouterCore([], seed=0)
    forward = plan_of({"a": (0,), "b": (1,)}, order=["d0", "d1"])
    backward = plan_of({"a": (0,), "b": (1,)}, order=["d1", "d0"])
    for plan, a_goes_to in ((forward, "d0"), (backward, "d1"), (forward, "d0"), (forward, "d0")):
        core.install(RoutingTable.from_plan(plan))
        assert core.route("a") == a_goes_to
        assert core.route("b") == ({"d0", "d1"} - {a_goes_to}).pop()


def test_finished_never_goes_negative():
    core = core_with({"a": (1,)})
    core.finished(1)
    assert core.inflight[1] == 0


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 6),
    data=st.data(),
)
def test_route_stays_in_its_set_or_in_the_healthy_pool(n, data):
    keys = data.draw(st.lists(st.text("abc", min_size=1, max_size=3), unique=True, max_size=8))
    sets = {
        k: tuple(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True)))
        for k in keys
    }
    down = data.draw(st.sets(st.integers(0, n - 1), max_size=n - 1))
    core = core_with(sets, n=n, seed=data.draw(st.integers(0, 9)))
    for d in down:
        core.mark_down(f"d{d}")
    for key in [*keys, "unknown"]:
        slot = core.route_index(key)
        healthy_members = [m for m in sets.get(key, ()) if m not in down]
        if healthy_members:
            assert slot in healthy_members
            loads = [core.inflight[m] for m in healthy_members]
            assert core.inflight[slot] == min(loads)
        else:
            assert slot not in down
        core.started(slot)


def test_engine_reported_load_is_fused_with_the_routers_own_and_expires():
    core = core_with({"a": (0, 1)}, n=2)
    core.started(0)  # this router: one request on d0, none on d1
    core.report_engine_load({"d1": 5.0, "d0": 0.0})  # d1's engine is busy with others' work
    assert core.load == [1, 5] and core.inflight == [1, 0]
    assert {core.route_index("zzz") for _ in range(100)} == {0}  # P2C sees d1's queue
    assert {core.route_index("a") for _ in range(100)} == {0}  # so does least-loaded
    core.started(1)  # the router's own requests move the fused load until the next report
    assert core.load == [1, 6]
    core.finished(1)
    core.finished(0)
    assert core.load == [0, 5] and core.inflight == [0, 0]
    core.report_engine_load({})  # no fresh report: own counts only, nothing stale steers
    assert core.load == [0, 0]
    core.report_engine_load({"d0": float("nan"), "d1": 1e30})  # garbage is bounded
    assert core.load[0] == 0 and core.load[1] == 10**9


def test_first_token_balance_sends_to_the_fewest_awaiting_a_first_token():
    """`balance="first-token"`: in fallback a destination busy decoding (many in flight,
    none awaiting a first token) wins over one still prefilling a single request."""
    core = RouterCore(["d0", "d1", "d2"], seed=0, balance="first-token")
    core.set_fallback(True)
    for _ in range(5):
        core.started(0)
        core.first_token(0)  # five streams on d0, all past their first token
    core.started(1)  # one request on d1, still waiting for its first token
    core.started(2)
    assert core.awaiting == [0, 1, 1] and core.inflight == [5, 1, 1]
    assert {core.route_index("k") for _ in range(50)} == {0}
    p2c = RouterCore(["d0", "d1", "d2"], seed=0)  # the paper's: in-flight counts decide
    p2c.set_fallback(True)
    for slot, n in ((0, 5), (1, 1), (2, 1)):
        for _ in range(n):
            p2c.started(slot)
    assert 0 not in {p2c.route_index("k") for _ in range(50)}


def test_first_token_balance_breaks_ties_by_load_then_in_turn():
    core = RouterCore(["d0", "d1", "d2", "d3"], seed=0, balance="first-token")
    core.started(1)
    core.first_token(1)  # d1: one decoding, nothing awaiting
    # No plan: every destination has nothing awaiting, d1 has the higher load, so the
    # others take turns.
    picks = [core.route_index(f"k{i}") for i in range(6)]
    assert 1 not in picks and set(picks) == {0, 2, 3}
    assert Counter(picks) == Counter({0: 2, 2: 2, 3: 2})


def test_awaiting_counts_follow_first_tokens_and_ends_and_never_go_negative():
    core = RouterCore(["d0"], balance="first-token")
    core.started(0)
    core.started(0)
    core.first_token(0)
    core.finished(0, answered=True)  # a stream that got its first token, then ended
    assert core.awaiting == [1] and core.inflight == [1]
    core.finished(0)  # one that ended with no first token (an error, a plain response)
    assert core.awaiting == [0] and core.inflight == [0]
    core.first_token(0)
    core.finished(0)
    assert core.awaiting == [0] and core.inflight == [0]


def test_first_token_balance_weighs_destinations_by_capacity():
    plan = RoutingPlan(config=PlanConfig(10.0, 4, 16, built_by="fallback"),
                       destinations=(DestinationSpec("big", capacity_weight=4.0),
                                     DestinationSpec("small")),
                       table=KeyTable.from_sets([], [], []), version=Version(1, 1))
    core = RouterCore(["big", "small"], seed=0, balance="first-token")
    core.install(RoutingTable.from_plan(plan))
    for _ in range(40):  # nobody answers: all wait for a first token
        core.started(core.route_index("k"))
    assert core.awaiting == [32, 8]


def test_an_unknown_balance_is_refused():
    with pytest.raises(ValueError, match="balance"):
        RouterCore(["d0"], balance="round-robin")
