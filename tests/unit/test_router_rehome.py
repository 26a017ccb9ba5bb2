"""Idle re-homing: a key idle longer than the eviction window is cold wherever it was, so it
goes to the least-loaded destination and stays there while it keeps coming back."""

from __future__ import annotations

from router_client.routing import RouterCore, RoutingTable
from tests.unit.test_router_routing import plan_of


def _core(window: float | None = 100.0) -> RouterCore:
    core = RouterCore(["d0", "d1", "d2", "d3"], seed=3, cold_tail="hash", idle_rehome_s=window)
    core.install(RoutingTable.from_plan(plan_of({"app": (2,), "hot": (0, 1)})))
    return core


def _load(core: RouterCore, loads: list[int]) -> None:
    for slot, n in enumerate(loads):
        for _ in range(n):
            core.started(slot)


def test_a_planned_key_follows_the_plan_until_it_goes_idle_then_finds_the_least_loaded():
    core = _core()
    _load(core, [3, 3, 3, 1])
    assert core.route_index("app", now=0.0) == 2  # first sight: the plan's member
    assert core.route_index("app", now=90.0) == 2  # back within the window: still warm there
    assert core.route_index("app", now=300.0) == 3  # idle 210 s: cold anywhere, least loaded
    assert core.counters()["rehomed"] == 1
    _load(core, [0, 0, 0, 2])  # 3, 3, 3, 3 now: its new home is not over twice the mean
    assert core.route_index("app", now=350.0) == 3  # stays with its new home while warm


def test_a_new_unplanned_key_goes_where_every_replica_sends_it_and_hot_keys_by_the_plan():
    """First sight is the hashed cold tail's owner, the same at every router replica (a
    tenant new to four gateways warms one destination, not four); only a key idle past the
    window is sent where the load is lowest."""
    a, b = _core(), _core()
    _load(a, [2, 0, 2, 2])
    _load(b, [0, 2, 1, 0])
    first = a.route_index("tail-key", now=0.0)
    assert b.route_index("tail-key", now=0.0) == first
    assert a.counters()["unadmitted"] == 1 and a.counters()["rehomed"] == 0
    _load(a, [0, 0, 0, 0])
    assert a.route_index("tail-key", now=500.0) == 1  # idle past the window: least loaded
    assert a.counters()["rehomed"] == 1
    _load(a, [0, 5, 0, 0])
    assert a.route_index("hot", now=1_000.0) == 0  # replicated: least loaded of its set


def test_a_key_the_plan_moves_follows_the_plan_even_while_warm_at_its_old_home():
    """The control loop priced the move against the cache left behind; re-homing keeps a
    key where it is only while the plan has not changed its mind."""
    core = _core()
    assert core.route_index("app", now=0.0) == 2
    assert core.route_index("app", now=10.0) == 2
    core.install(RoutingTable.from_plan(plan_of({"app": (1,), "hot": (0, 1)})))
    assert core.route_index("app", now=20.0) == 1
    assert core.route_index("app", now=30.0) == 1  # and stays with its new home
    assert core.counters()["planned"] == 4


def test_a_warm_home_well_over_twice_the_mean_is_left_and_without_a_clock_nothing_changes():
    core = _core()
    assert core.route_index("app", now=0.0) == 2
    # 8 with it against a mean of 2.75: over twice the mean, but within a Poisson
    # deviation of it (a burst, not an overload)
    _load(core, [1, 1, 7, 1])
    assert core.route_index("app", now=5.0) == 2
    _load(core, [0, 0, 5, 0])  # 13 against a mean of 4: over 2 x mean + sqrt(mean)
    assert core.route_index("app", now=10.0) != 2
    off, on = _core(None), _core()
    _load(off, [0, 0, 9, 0])
    _load(on, [0, 0, 9, 0])
    assert off.route_index("app", now=1e6) == 2 == on.route_index("app")  # the paper's rule
    assert off.counters()["rehomed"] == on.counters()["rehomed"] == 0


def test_re_homing_keeps_a_conversation_with_its_history():
    core = RouterCore(["d0", "d1", "d2", "d3"], seed=3, cold_tail="hash", idle_rehome_s=100.0,
                      history_slack=1.0)
    core.install(RoutingTable.from_plan(plan_of({"app": (2,)})))
    _load(core, [1, 1, 1, 0])
    first = core.route_index("app", "conv-1", now=0.0)
    assert first == 2
    core.remember("conv-1", 1)  # a retry took the turn to d1: its history is there
    assert core.route_index("app", "conv-1", now=50.0) == 1  # its history outranks the home
    # A new conversation goes to the key's home, not where another conversation's history
    # pulled a turn: the key stays where the plan put it.
    assert core.route_index("app", "conv-2", now=51.0) == 2
    # Both idle past the window: the history is evicted too, so the turn is re-homed with
    # its key (to the least busy) and the key's next conversation follows it there.
    assert core.route_index("app", "conv-1", now=500.0) == 3
    assert core.route_index("app", "conv-3", now=501.0) == 3


def test_a_key_the_plan_moved_stays_moved_while_its_old_conversations_go_on():
    """The plan moves a key: its conversations under way keep their history where they
    are, and each of their turns must not pull the key back there, or every new
    conversation follows the old ones and the move never lands (the simulator's arena
    replay at x7: one engine carried 194 requests against 500-780 for the others, the
    planner's loads no longer where it had put them)."""
    core = RouterCore(["d0", "d1", "d2", "d3"], seed=3, cold_tail="hash", idle_rehome_s=100.0,
                      history_slack=1.0)
    core.install(RoutingTable.from_plan(plan_of({"app": (0,)})))
    assert core.route_index("app", "old", now=0.0) == 0
    core.install(RoutingTable.from_plan(plan_of({"app": (1,)})))
    assert core.route_index("app", "new-1", now=10.0) == 1  # the plan moved it: follow it
    for t in (11.0, 12.0, 13.0):
        assert core.route_index("app", "old", now=t) == 0  # its history stays on d0
        assert core.route_index("app", f"new-{t:g}", now=t + 0.5) == 1


def test_the_gateway_flag_reaches_the_core_and_refuses_a_negative_window():
    import argparse

    import pytest

    from planner_svc.cli.edge_args import ROUTING_FLAGS, add_flags, build_client
    from router_client.routing import DEFAULT_IDLE_REHOME_S

    parser = argparse.ArgumentParser()
    add_flags(parser, ROUTING_FLAGS, "CACHEROUTE_TEST_")
    on = build_client(parser.parse_args(["--destinations", "a,b", "--idle-rehome-s", "180"]),
                      "r", "gateway")
    off = build_client(parser.parse_args(["--destinations", "a,b", "--idle-rehome-s", "0"]),
                       "r", "gateway")
    default = build_client(parser.parse_args(["--destinations", "a,b"]), "r", "gateway")
    assert on.core.idle_rehome_s == 180.0 and off.core.idle_rehome_s is None
    # On by default, learned from DEFAULT_IDLE_REHOME_S; without Redis no other router can
    # share the plan, so it runs from the start.
    assert default.core.idle_rehome_s == DEFAULT_IDLE_REHOME_S
    # queue-aware routing too (since 2026-12-06); 'off' restores the rule before it
    assert default.core.queue_aware and not build_client(parser.parse_args(
        ["--destinations", "a,b", "--queue-aware", "off"]), "r", "gateway").core.queue_aware
    assert default.core.rehome_window is not None and not default.core.rehome_paused
    # Other routers on the plan pause it, unless a front keeps each key on one router.
    default._note_peers(2)
    assert default.core.rehome_paused and default.peer_routers == 2
    default._note_peers(0)
    assert not default.core.rehome_paused
    default.rehome_with_peers = True
    default._note_peers(3)
    assert not default.core.rehome_paused
    # The window is learned from where it starts unless told not to (`--idle-rehome-learn`).
    assert on.core.rehome_window is not None and on.core.rehome_window.window_s == 180.0
    assert off.core.rehome_window is None
    fixed = build_client(parser.parse_args(["--destinations", "a,b", "--idle-rehome-s", "180",
                                            "--idle-rehome-learn", "off"]), "r", "gateway")
    assert fixed.core.idle_rehome_s == 180.0 and fixed.core.rehome_window is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--idle-rehome-learn", "maybe"])
    with pytest.raises(SystemExit, match="idle-rehome-s"):
        build_client(parser.parse_args(["--destinations", "a,b", "--idle-rehome-s", "-1"]),
                     "r", "gateway")


def test_with_first_token_balance_a_cold_key_goes_where_the_fewest_prefills_are_owed():
    core = RouterCore(["d0", "d1", "d2", "d3"], seed=3, cold_tail="hash", idle_rehome_s=100.0,
                      balance="first-token")
    core.install(RoutingTable.from_plan(plan_of({"app": (2,)})))
    _load(core, [4, 1, 1, 1])  # d0 busiest by in-flight requests...
    for _ in range(4):
        core.first_token(0)  # ...all of them decoding; d1-d3 each still owe a prefill
    assert core.route_index("app", now=0.0) == 2
    assert core.route_index("app", now=500.0) == 0  # idle: cold anywhere, no prefill owed at d0
    assert core.counters()["rehomed"] == 1


def test_with_re_homing_a_conversation_idle_past_the_window_has_no_history_to_keep():
    """Its last turn's history was evicted where it went: the next turn goes where its key
    goes (home while the key is warm), not back to a destination for a cache that is no
    longer there. A turn within the window keeps its history."""
    def core_with_history_on_d1() -> RouterCore:
        core = RouterCore(["d0", "d1", "d2", "d3"], seed=3, cold_tail="hash",
                          idle_rehome_s=100.0, history_slack=1.0)
        core.install(RoutingTable.from_plan(plan_of({"app": (2,)})))
        assert core.route_index("app", "conv-1", now=0.0) == 2
        core.remember("conv-1", 1)  # a retry took that turn to d1: its history is there
        _load(core, [0, 1, 1, 0])
        return core

    warm = core_with_history_on_d1()
    assert warm.route_index("app", "conv-1", now=50.0) == 1  # within the window: kept
    assert warm.counters()["history_kept"] == 1
    stale = core_with_history_on_d1()
    assert stale.route_index("app", "conv-2", now=60.0) == 2  # other conversations keep
    assert stale.route_index("app", "conv-2", now=120.0) == 2  # the key warm at its home
    assert stale.route_index("app", "conv-1", now=200.0) == 2  # idle 200 s: history evicted
    assert stale.counters()["history_kept"] == 1  # conv-2's second turn only
    # without re-homing the paper's rule is unchanged: history outranks everything
    plain = RouterCore(["d0", "d1"], seed=3, cold_tail="hash", history_slack=1.0)
    plain.route_index("k", "c", now=0.0)
    first = plain.route_index("k", "c")
    assert plain.route_index("k", "c", now=1e6) == first


def test_paused_re_homing_routes_by_the_plan_and_judges_no_return():
    core = _core()
    assert core.route_index("app", now=0.0) == 2
    core.rehome_paused = True
    _load(core, [3, 3, 3, 1])
    assert core.decide("app", now=300.0) == (2, 0.0, None)  # idle, but paused: the plan
    assert core.counters()["rehomed"] == 0
    core.rehome_paused = False
    assert core.route_index("app", now=600.0) == 3  # idle past the window: re-homed


def test_a_static_source_counts_the_other_routers_that_reported_recently():
    from cacheroute.v1 import plan_pb2 as pb
    from router_client.layout import ROUTER_STATUS_TTL_S
    from router_client.source import StaticPlanSource

    src = StaticPlanSource()
    assert src.report(pb.RouterStatus(router_id="a", reported_at_ms=1_000)) == 0
    assert src.report(pb.RouterStatus(router_id="b", reported_at_ms=1_500)) == 1
    later = 1_500 + ROUTER_STATUS_TTL_S * 1000 + 1
    assert src.report(pb.RouterStatus(router_id="b", reported_at_ms=later)) == 0


def test_a_planned_key_spills_a_burst_and_stays_where_the_plan_put_it():
    """A warm key whose planned slot is far over its bound sends that request elsewhere but
    keeps its home: moving it would carry its burst to a cold destination and leave it off
    the plan. A key off the plan has no slot to come back to, and makes the new place home."""
    core = _core()
    assert core.route_index("app", now=0.0) == 2
    tail = next(k for k in (f"t{i}" for i in range(100)) if core.route_index(k, now=0.0) == 2)
    _load(core, [0, 0, 13, 0])  # 13 against a mean of 3.25: over 2 x mean + sqrt(mean)
    spilled = core.route_index("app", now=5.0)
    assert spilled != 2 and core.counters()["spilled"] == 1
    assert core.counters()["rehomed"] == 0
    moved = core.route_index(tail, now=5.0)
    assert moved != 2 and core.counters()["rehomed"] == 1
    for _ in range(13):
        core.finished(2)
    assert core.route_index("app", now=6.0) == 2  # the burst is over: home, warm, planned
    assert core.route_index(tail, now=6.0) == moved  # its new home


def test_with_spilling_off_a_planned_key_over_its_bound_re_homes():
    """`--spill-planned off` restores the rule before the spill: the key moves with the
    request and stays at its new home once the burst is over."""
    core = _core()
    core.spill_planned = False
    assert core.route_index("app", now=0.0) == 2
    _load(core, [0, 0, 13, 0])
    moved = core.route_index("app", now=5.0)
    assert moved != 2 and core.counters()["spilled"] == 0 and core.counters()["rehomed"] == 1
    for _ in range(13):
        core.finished(2)
    assert core.route_index("app", now=6.0) == moved
