"""A router remembers where each conversation went, so its next turn meets its history."""

from __future__ import annotations

from router_client.routing import RouterCore, RoutingTable
from tests.unit.test_router_routing import plan_of


def _history_core(slack: float | None = 1.0, capacity: int = 1000) -> RouterCore:
    # A tight tail bound (the default is 2.0), so that load moves a tail key within the
    # few requests these tests put in flight and only the history rule keeps it.
    core = RouterCore(["d0", "d1", "d2", "d3"], seed=3, cold_tail="hash", tail_slack=0.25,
                      history_slack=slack, history_capacity=capacity)
    core.install(RoutingTable.from_plan(plan_of({"hot": (0, 1)})))  # "tenant": the cold tail
    return core


def _busy(core: RouterCore, per_slot: int) -> None:
    for slot in range(len(core.destination_ids)):
        for _ in range(per_slot):
            core.started(slot)


def test_a_conversation_returns_to_its_history_when_load_would_move_it():
    core, without = _history_core(), _history_core(None)
    first = core.route_index("tenant", "conv-1")
    assert without.route_index("tenant", "conv-1") == first
    for c in (core, without):
        _busy(c, 4)
        for _ in range(3):  # a burst of other keys on the same owner: 7 against 4, 4, 4
            c.started(first)
    assert without.route_index("tenant", "conv-1") != first  # the bounded hash moves it
    assert core.route_index("tenant", "conv-1") == first  # its history is kept
    assert core.counters()["history_kept"] == 1


def test_a_conversation_leaves_its_history_only_when_far_above_the_mean():
    core = _history_core(slack=1.0)
    first = core.route_index("tenant", "conv-1")
    _busy(core, 4)
    for _ in range(12):  # 16 in flight there, 4 elsewhere: more than twice the mean
        core.started(first)
    moved = core.route_index("tenant", "conv-1")
    assert moved != first
    assert core.route_index("tenant", "conv-1") == moved  # and stays with the new history


def test_history_is_forgotten_least_recently_used_first_and_ignores_unusable_slots():
    core = _history_core(capacity=2)
    slots = {c: core.route_index("tenant", c) for c in ("a", "b", "c")}
    assert "a" not in core._history and set(core._history) == {"b", "c"}
    core.mark_down(core.destination_ids[slots["c"]])
    assert core.route_index("tenant", "c") != slots["c"]
    elsewhere = next(s for s in range(4) if s not in (slots["b"], slots["c"]))
    core.remember("b", elsewhere)  # a retry moved it: its history is there now
    assert core.route_index("other-key", "b") == elsewhere


def test_history_is_not_kept_in_fallback_mode():
    core = _history_core()
    first = core.route_index("tenant", "conv")
    core.set_fallback(True)  # the guard's Flat-LB: P2C for every request, history or not
    picks = {core.route_index("tenant", "conv") for _ in range(200)}
    assert len(picks) == 4 and core.history_kept == 0 and first in picks


def test_history_is_off_by_default_and_without_an_affinity():
    core = RouterCore(["d0", "d1"], seed=1)
    core.route_index("k", "conv")
    core.route_index("k")
    assert core.history_kept == 0 and not core._history
