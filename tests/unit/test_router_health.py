"""Destination health (router_client.health) and how the decision uses health, drain and
capacity weights (router_client.routing). Pure: time is passed in."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router_client.health import HealthPolicy, HealthTracker, Outcome
from router_client.plan import DestinationSpec, KeyTable, PlanConfig, RoutingPlan, Version
from router_client.routing import RouterCore, RoutingTable

FAIL = Outcome.HTTP_5XX


def table(sets, specs) -> RoutingTable:
    return RoutingTable.from_plan(RoutingPlan(
        config=PlanConfig(10.0, 4, 16, built_by="build"),
        destinations=tuple(specs),
        table=KeyTable.from_sets(list(sets), list(sets.values()), [1.0] * len(sets)),
        version=Version(1, 1),
    ))


def core_of(sets, specs, seed=0) -> RouterCore:
    core = RouterCore([d.id for d in specs], seed=seed)
    core.install(table(sets, specs))
    return core


def fleet(n, **kw) -> list[DestinationSpec]:
    return [DestinationSpec(f"d{i}", **kw) for i in range(n)]


# --- the tracker -----------------------------------------------------------------------

def tracker(n=4, **policy) -> HealthTracker:
    t = HealthTracker(HealthPolicy(**policy))
    t.track([f"d{i}" for i in range(n)], 0.0)
    return t


def test_consecutive_failures_eject_and_the_ejection_expires():
    t = tracker(consecutive_failures=3, base_ejection_s=10, max_ejection_s=100)
    assert t.record("d0", FAIL, 1.0) == [] and t.record("d0", Outcome.TIMEOUT, 1.1) == []
    assert t.record("d0", Outcome.CONNECT_ERROR, 1.2) == [("d0", False)]
    assert not t.is_routable("d0") and t.unroutable() == ["d0"]
    assert t.tick(11.1) == []  # 10 s from 1.2
    assert t.tick(11.2) == [("d0", True)] and t.is_routable("d0")


def test_a_success_resets_the_streak_and_client_errors_do_not_count():
    t = tracker(consecutive_failures=2)
    t.record("d0", FAIL, 0)
    t.record("d0", Outcome.SUCCESS, 0)
    t.record("d0", Outcome.CLIENT_ERROR, 0)
    assert t.record("d0", FAIL, 0) == []
    assert t.record("d0", FAIL, 0) == [("d0", False)]


def test_repeated_ejections_grow_up_to_the_cap_and_are_forgotten_after_a_healthy_spell():
    t = tracker(consecutive_failures=1, base_ejection_s=10, max_ejection_s=25)
    spans = []
    now = 0.0
    for _ in range(4):
        t.record("d0", FAIL, now)
        until = next(v for v in t.views(now) if v.destination == "d0").ejected_for_s
        spans.append(until)
        now += until
        t.tick(now)
    assert spans == [10, 20, 25, 25]
    t.record("d0", Outcome.SUCCESS, now + 26)  # healthy for a whole max_ejection_s
    t.record("d0", FAIL, now + 26)
    assert next(v for v in t.views(now + 26) if v.destination == "d0").ejected_for_s == 10


def test_never_more_than_the_allowed_fraction_is_ejected_but_always_one_may_be():
    t = tracker(n=4, consecutive_failures=1, max_ejected_fraction=0.5)
    for d in ("d0", "d1", "d2", "d3"):
        t.record(d, FAIL, 0)
    assert t.unroutable() == ["d0", "d1"]
    small = tracker(n=2, consecutive_failures=1, max_ejected_fraction=0.1)
    small.record("d0", FAIL, 0)
    small.record("d1", FAIL, 0)
    assert small.unroutable() == ["d0"]


def test_probes_mark_down_after_the_threshold_and_up_after_successes():
    t = tracker(unhealthy_after=2, healthy_after=2)
    assert t.probed("d1", False, 0) == []
    assert t.probed("d1", False, 1) == [("d1", False)]
    assert t.probed("d1", True, 2) == []
    assert t.probed("d1", True, 3) == [("d1", True)]


def test_a_probed_down_destination_stays_down_when_its_ejection_expires():
    t = tracker(consecutive_failures=1, base_ejection_s=5, unhealthy_after=1)
    t.record("d0", FAIL, 0)
    t.probed("d0", False, 1)
    assert t.tick(6) == [] and not t.is_routable("d0")
    assert t.probed("d0", True, 7) == [("d0", True)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(list(Outcome)),
                          st.floats(0, 5), st.booleans()), max_size=80))
def test_reported_changes_always_match_the_routable_state(events):
    """Whatever happens, applying the returned changes reproduces `is_routable`."""
    t = tracker(consecutive_failures=2, base_ejection_s=3, max_ejection_s=9, unhealthy_after=2)
    view = {f"d{i}": True for i in range(4)}
    now = 0.0
    for dest, outcome, dt, probe in events:
        now += dt
        d = f"d{dest}"
        changes = t.probed(d, outcome.is_failure is False, now) if probe else \
            t.record(d, outcome, now)
        for name, ok in [*changes, *t.tick(now)]:
            assert view[name] != ok  # a change is a change
            view[name] = ok
        assert view == {x: t.is_routable(x) for x in view}
        assert sum(not v for v in view.values()) <= 4


# --- the decision: health, drain, weights ---------------------------------------------

def test_unhealthy_members_are_skipped_within_the_set_then_p2c_over_healthy():
    core = core_of({"k": (0, 1)}, fleet(4))
    core.mark_down("d0")
    assert {core.route("k") for _ in range(200)} == {"d1"}
    core.mark_down("d1")
    assert {core.route("k") for _ in range(400)} == {"d2", "d3"}
    assert core.unhealthy_reroute == 400


def test_a_draining_destination_gets_no_new_request_on_any_path():
    specs = [*fleet(3), DestinationSpec("d3", draining=True)]
    core = core_of({"k": (3, 0)}, specs)  # a stale set may still name it
    routed = Counter(core.route(key) for key in ["k", "other", "x", "y"] * 500)
    assert routed["d3"] == 0
    assert not core.is_usable("d3") and core.is_usable("d0")


def test_draining_destinations_serve_only_when_nothing_else_is_healthy():
    specs = [DestinationSpec("d0"), DestinationSpec("d1", draining=True)]
    core = core_of({}, specs)
    core.mark_down("d0")
    assert {core.route("x") for _ in range(50)} == {"d1"}


def test_a_lone_request_goes_to_the_larger_idle_destination():
    core = core_of({}, [DestinationSpec("big", capacity_weight=4.0), DestinationSpec("small")])
    assert {core.route(f"u{i}") for i in range(200)} == {"big"}


@pytest.mark.parametrize("concurrency", [5, 10, 50, 200])
def test_closed_loop_traffic_is_held_4_to_1_at_any_concurrency(concurrency: int):
    """A request finishes, the next is routed: in-flight settles at 4:1 per weight."""
    core = core_of({}, [DestinationSpec("big", capacity_weight=4.0), DestinationSpec("small")])
    rng = __import__("random").Random(concurrency)
    running = [core.route_index("u") for _ in range(concurrency)]
    for s in running:
        core.started(s)
    served = Counter()
    for _ in range(20_000):
        done = running.pop(rng.randrange(len(running)))
        core.finished(done)
        served[done] += 1
        nxt = core.route_index("u")
        core.started(nxt)
        running.append(nxt)
    assert served[0] / served[1] == pytest.approx(4.0, rel=0.1)


def test_p2c_balances_in_flight_per_unit_of_weight_under_load():
    core = core_of({}, [DestinationSpec("big", capacity_weight=4.0), DestinationSpec("small")])
    for _ in range(500):  # requests that never finish: in flight grows by the decision
        core.started(core.route_index("u"))
    big, small = core.inflight[core.slot_of("big")], core.inflight[core.slot_of("small")]
    assert big / small == pytest.approx(4.0, rel=0.1)
    assert core.load_of("big") == pytest.approx(core.load_of("small"), rel=0.1)


def test_least_loaded_member_compares_in_flight_relative_to_weight():
    specs = [DestinationSpec("d0", capacity_weight=3.0), DestinationSpec("d1")]
    core = core_of({"k": (0, 1)}, specs)
    core.started(0)  # one more on d0 makes (1+1)/3 = 0.67 of it, on d1 (1+1)/1 = 2
    core.started(1)
    assert {core.route("k") for _ in range(50)} == {"d0"}
    core.started(0)
    core.started(0)
    core.started(0)  # (4+1)/3 = 1.67 < 2: still d0; one more and it is d1's turn
    assert core.route("k") == "d0"
    core.started(0)
    core.started(0)
    assert core.route("k") == "d1"


def test_many_destinations_weighted_shares_follow_weights():
    weights = [1.0, 2.0, 3.0, 4.0]
    core = core_of({}, [DestinationSpec(f"d{i}", capacity_weight=w)
                        for i, w in enumerate(weights)], seed=3)
    for _ in range(4000):
        core.started(core.route_index("u"))
    shares = [core.inflight[i] / 4000 for i in range(4)]
    assert shares == pytest.approx([w / 10 for w in weights], abs=0.02)


def test_equal_weights_keep_the_unweighted_path():
    core = core_of({}, fleet(4, capacity_weight=2.0))
    assert not core._active.weighted


# --- beyond the paper: the cold tail by bounded-load hashing, affinity inside a set ---------

def test_cold_tail_hash_sends_a_key_to_the_same_place_and_spreads_keys():
    core = RouterCore([f"d{i}" for i in range(8)], seed=1, cold_tail="hash")
    core.install(table({}, fleet(8)))
    assert len({core.route("tenant-a") for _ in range(100)}) == 1
    spread = Counter(core.route(f"k{i}") for i in range(4000))
    assert len(spread) == 8 and max(spread.values()) < 2 * min(spread.values())


def test_cold_tail_hash_is_the_same_in_every_router():
    owners = []
    for seed in (1, 2):
        core = RouterCore([f"d{i}" for i in range(8)], seed=seed, cold_tail="hash")
        core.install(table({}, fleet(8)))
        owners.append([core.route(f"k{i}") for i in range(200)])
    assert owners[0] == owners[1]


def test_cold_tail_hash_bounds_the_load_of_a_hot_owner():
    core = RouterCore([f"d{i}" for i in range(4)], seed=1, cold_tail="hash", tail_slack=0.25)
    core.install(table({}, fleet(4)))
    for _ in range(400):  # one hot unadmitted key, requests never finishing
        core.started(core.route_index("hot"))
    assert max(core.inflight) <= 1.25 * 400 / 4 + 2


def test_affinity_keeps_a_conversation_on_one_member_within_the_load_bound():
    core = core_of({"app": (0, 1, 2)}, fleet(4))
    homes = {c: core.route_index("app", affinity=c) for c in ("conv-1", "conv-2", "conv-3")}
    assert all(core.route_index("app", affinity=c) == h for c, h in homes.items())
    assert len({core.route_index("app", affinity=f"c{i}") for i in range(60)}) == 3
    victim = homes["conv-1"]
    for _ in range(20):
        core.started(victim)  # far ahead of the set's mean: the least loaded takes over
    assert core.route_index("app", affinity="conv-1") != victim


def test_the_paper_behaviour_stays_the_default():
    core = core_of({}, fleet(8))
    assert core.cold_tail == "p2c"
    assert len({core.route("same-key") for _ in range(400)}) > 1  # P2C sprays one cold key
