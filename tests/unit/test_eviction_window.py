"""The re-homing window learned from returns' cache outcomes (router_client.eviction_window),
alone and in the router core."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router_client.eviction_window import MIN_WINDOW_S, EvictionWindow, prefix_hit
from router_client.routing import RouterCore, RoutingTable
from tests.unit.test_router_routing import plan_of


def _feed(learner: EvictionWindow, cliff_s: float, n: int, *, rng: random.Random,
          span: float = 3.0, noise: float = 0.0) -> None:
    """Returns at gaps up to `span` x the window in use, warm iff under `cliff_s`, a
    `noise` share of labels flipped; beyond the window only a probe share comes back, as
    the core sends them."""
    for _ in range(n):
        gap = rng.uniform(0.0, span * max(cliff_s, learner.window_s))
        if gap > learner.window_s and (gap > 2 * learner.window_s
                                       or rng.random() >= learner.probe_share):
            continue  # re-homed: no outcome at the old home
        hit = (gap < cliff_s) != (rng.random() < noise)
        learner.observe(gap, hit, learner.weight(gap))


@settings(max_examples=40, deadline=None)
@given(cliff=st.floats(1.0, 20_000.0), start=st.floats(0.25, 4.0), seed=st.integers(0, 99))
def test_the_window_lands_on_the_cliff_from_above_or_below(cliff: float, start: float,
                                                           seed: int) -> None:
    learner = EvictionWindow(cliff * start)
    _feed(learner, cliff, 30_000, rng=random.Random(seed))
    assert learner.window_s == pytest.approx(cliff, rel=0.12)


def test_a_noisy_cliff_is_found_and_a_moved_one_followed() -> None:
    rng = random.Random(7)
    learner = EvictionWindow(300.0)
    _feed(learner, 120.0, 20_000, rng=rng, noise=0.1)
    assert learner.window_s == pytest.approx(120.0, rel=0.12)
    _feed(learner, 60.0, 60_000, rng=rng, noise=0.1)  # the caches shrank: old outcomes fade
    assert learner.window_s == pytest.approx(60.0, rel=0.12)


def test_nothing_moves_before_enough_outcomes_and_bad_figures_teach_nothing() -> None:
    learner = EvictionWindow(100.0, min_outcomes=200)
    for gap in (1.0, 2.0, 3.0):
        for _ in range(50):
            learner.observe(gap, False)
    assert learner.window_s == 100.0  # 150 outcomes: below the floor
    before = learner.outcomes
    for gap, weight in ((math.nan, 1.0), (-1.0, 1.0), (math.inf, 1.0), (5.0, 0.0),
                        (5.0, math.nan), (5.0, 1e9)):
        learner.observe(gap, True, weight)
    assert learner.outcomes == before
    for bad in (0.0, -5.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="starting window"):
            EvictionWindow(bad)
    with pytest.raises(ValueError, match="probe_share"):
        EvictionWindow(10.0, probe_share=1.0)


def test_all_cold_teaches_nothing_and_a_cache_keeping_almost_nothing_floors_it() -> None:
    # An engine that reports no cached tokens reads as every return cold: no evidence.
    silent = EvictionWindow(100.0, min_outcomes=10, refresh_every=1)
    for i in range(400):
        silent.observe(1.0 + i % 40, False)
    assert silent.window_s == 100.0
    # Warm only right after the last request: the window falls between the two, never
    # under its floor.
    short = EvictionWindow(100.0, min_outcomes=10, refresh_every=1)
    for i in range(400):
        short.observe(0.2, True)
        short.observe(2.0 + i % 40, False)
    assert MIN_WINDOW_S <= short.window_s <= 2.0
    floor = EvictionWindow(100.0, min_outcomes=10, refresh_every=1)
    for i in range(400):
        floor.observe(0.2, True)
        floor.observe(0.5 + i % 40, False)
    assert floor.window_s == MIN_WINDOW_S


def test_a_window_that_already_errs_least_stays_where_it_is() -> None:
    """Warm returns at ~5 s, cold probes at ~150 s: every cut between errs alike, and the
    window in use (100 s) is one of them. Taking the lowest tied cut slid it to 5 s, from
    where probes (at most 2x) never reach back (the review's reproduction)."""
    learner = EvictionWindow(100.0, min_outcomes=10, refresh_every=1)
    for _ in range(300):
        learner.observe(5.0, True)
        learner.observe(150.0, False, learner.weight(150.0))
    assert learner.window_s == 100.0


def test_a_hit_is_half_the_reported_prefix_or_more_and_no_prefix_is_no_evidence() -> None:
    assert prefix_hit(100, 200) is True
    assert prefix_hit(99, 200) is False
    assert prefix_hit(500, 0) is None
    assert prefix_hit(0, 20) is None  # under two blocks: a miss whatever the cache holds


# --- in the router core --------------------------------------------------------------------


def _core(window: float) -> RouterCore:
    core = RouterCore(["d0", "d1", "d2", "d3"], seed=3, cold_tail="hash", idle_rehome_s=window)
    core.install(RoutingTable.from_plan(plan_of({"app": (2,)})))
    core.learn_idle_rehome(EvictionWindow(window, probe_share=0.5, min_outcomes=1,
                                          refresh_every=1))
    return core


def test_the_core_reports_a_return_home_and_learns_only_from_where_it_went() -> None:
    core = _core(100.0)
    assert core.decide("app", now=0.0) == (2, 0.0, None)  # first sight
    # its first request is still open: its prefix may not be there
    assert core.decide("app", now=5.0) == (2, 0.0, None)
    core.key_finished("app", 2, 8.0)
    core.key_finished("app", 2, 10.0)
    slot, _, returned = core.decide("app", now=60.0)
    assert slot == 2
    assert returned == (50.0, 1.0, 2)  # idle since its last request there finished
    core.observe_return(returned, 1, False)  # it went elsewhere in the end (a retry)
    core.observe_return(returned, 2, None)  # no prefix reported
    assert core.rehome_window is not None and core.rehome_window.outcomes == 0
    core.observe_return(returned, 2, True)
    assert core.rehome_window.outcomes == 1
    assert core.idle_rehome_s == core.rehome_window.window_s >= 100.0


def test_a_probe_past_the_window_goes_home_and_counts_for_the_returns_it_stands_for() -> None:
    core = _core(100.0)
    probes = 0
    for i in range(200):
        key = f"tail-{i}"
        home = core.route_index(key, now=0.0)
        core.key_finished(key, home, 0.0)
        slot, _, returned = core.decide(key, now=150.0)  # idle 150 s: past the window, within 2x
        if returned is not None:
            assert slot == home and returned == (150.0, pytest.approx(2.0), home)
            probes += 1
        decision = core.decide(key, now=500.0)
        assert decision.slot >= 0 and decision.returned is None  # > 2x
    assert 70 <= probes <= 130  # probe_share 0.5 of 200


def test_returns_behind_a_queue_teach_nothing_so_an_overload_does_not_shrink_the_window(
) -> None:
    """Each key's requests queue for 30 s (an overloaded fleet) and come back every 10 s:
    every return finds its last request still open, so none is evidence, and the window
    stays where it was instead of reading the queue as evictions."""
    core = _core(100.0)
    assert core.rehome_window is not None
    open_until: dict[str, list[tuple[float, int]]] = {}
    for step in range(3_000):
        now = step * 0.1
        key = f"k{step % 100}"
        for done_at, slot in [x for x in open_until.get(key, []) if x[0] <= now]:
            core.key_finished(key, slot, done_at)
            open_until[key].remove((done_at, slot))
        slot, _, returned = core.decide(key, now=now)
        core.observe_return(returned, slot, False)  # a queued request: no cache yet
        open_until.setdefault(key, []).append((now + 30.0, slot))
    assert core.rehome_window.outcomes == 0 and core.idle_rehome_s == 100.0


def test_a_core_without_learning_reports_no_return() -> None:
    core = RouterCore(["d0", "d1"], seed=1, cold_tail="hash", idle_rehome_s=100.0)
    core.route_index("k", now=0.0)
    assert core.decide("k", now=10.0).returned is None and core.rehome_window is None


def test_closed_loop_the_core_finds_a_fleets_eviction_window() -> None:
    """Keys come back after exponential idle gaps; a destination keeps a key's prefix for
    40 s after its last request there. From 4x too long and 4x too short, the window the core
    learns from its own returns settles within 12 % of 40 s."""
    for start in (160.0, 10.0):
        core = RouterCore([f"d{i}" for i in range(4)], seed=5, cold_tail="hash",
                          idle_rehome_s=start)
        core.learn_idle_rehome(EvictionWindow(start))
        rng = random.Random(11)
        last_at: dict[tuple[str, int], float] = {}  # (key, slot) -> last request there
        now = 0.0
        keys = [f"k{i}" for i in range(300)]
        for _ in range(60_000):
            now += rng.expovariate(10.0)
            key = rng.choice(keys)
            slot, _, returned = core.decide(key, now=now)
            warm = now - last_at.get((key, slot), -math.inf) < 40.0
            last_at[(key, slot)] = now
            core.observe_return(returned, slot, warm)
            core.key_finished(key, slot, now)  # served at once: written when it arrived
        assert core.idle_rehome_s == pytest.approx(40.0, rel=0.12), start


def test_the_bench_finds_the_cliff_where_the_warm_share_crosses_one_half() -> None:
    import numpy as np

    from tests.bench_module import load_bench

    bench = load_bench("rehome_window")
    edges = np.arange(0.0, 2.05, 0.1)
    share = np.where(edges[:-1] < 0.7, 1.0, 0.0)
    share[7] = 0.25  # 0.7-0.8: a quarter warm
    assert bench.cliff(edges, share) == pytest.approx(0.65 + 0.5 / 0.75 * 0.1)
    assert math.isnan(bench.cliff(edges, np.ones(len(edges) - 1)))  # never cold: no cliff
