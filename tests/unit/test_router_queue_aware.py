"""Queue-aware routing (`RouterCore.queue_aware`, the gateway's --queue-aware): a request
leaves the slot its plan, home or conversation picks only when a recompute on the
least-owed slot would prefill it clearly sooner; the prefill work each slot is owed is
counted from `started` to the first token (or the end)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router_client.keys import prompt_chars
from router_client.plan import DestinationSpec
from router_client.routing import (
    PREFILL_STEP_TOKENS,
    QUEUE_SPILL_MARGIN,
    RouterCore,
    RoutingTable,
)
from tests.unit.test_router_routing import plan_of

PROMPT, HISTORY = 4_000, 3_600  # a later turn: most of it is the conversation so far


def _core(**kw: object) -> RouterCore:
    core = RouterCore(["d0", "d1", "d2", "d3"], seed=3, cold_tail="hash", history_slack=1.0,
                      balance="first-token", **kw)  # type: ignore[arg-type]
    core.install(RoutingTable.from_plan(plan_of({"app": (2,), "hot": (0, 1)})))
    core.queue_aware = True
    return core


def _send(core: RouterCore, key: str = "app", affinity: str | None = None,
          prompt: int = PROMPT, cacheable: int = HISTORY) -> tuple[int, float]:
    slot, owed, _ = core.decide(key, affinity, None, prompt, cacheable)
    core.started(slot, owed)
    return slot, owed


def test_off_by_default_nothing_is_counted_and_the_plan_decides() -> None:
    core = RouterCore(["d0", "d1"], seed=1)
    core.install(RoutingTable.from_plan(plan_of({"app": (1,)}, 2)))
    for _ in range(10):
        slot = core.route_index("app", None, None, PROMPT, 0)
        core.started(slot)
        assert slot == 1
    assert core.owed == [0.0, 0.0] and core.counters()["queue_spilled"] == 0


def test_a_warm_slot_keeps_requests_until_waiting_costs_more_than_a_recompute_elsewhere() -> None:
    core = _core()
    warm = PROMPT - HISTORY + PREFILL_STEP_TOKENS
    cold = PROMPT + PREFILL_STEP_TOKENS
    kept = 0
    # Each warm request adds `warm` to the plan's slot; the idle slots each cost `cold`.
    while (kept * warm + warm) <= QUEUE_SPILL_MARGIN * cold:
        slot, owed = _send(core)
        assert (slot, owed) == (2, warm)
        kept += 1
    assert kept >= 2
    slot, owed = _send(core)
    assert slot != 2 and owed == cold
    assert core.counters()["queue_spilled"] == 1
    assert core.owed[2] == pytest.approx(kept * warm) and core.owed[slot] == cold


def test_the_spilled_request_leaves_its_key_planned_where_it_was() -> None:
    core = _core()
    held = [_send(core) for _ in range(12)]
    assert {s for s, _ in held} != {2}  # some spilled
    for slot, owed in held:
        core.first_token(slot, owed)
    assert core.owed == [0.0, 0.0, 0.0, 0.0]
    assert _send(core)[0] == 2  # the queue is gone: back to the plan's slot


def test_a_conversation_follows_its_spilled_turn_where_its_newest_history_is() -> None:
    core = _core()
    first, _ = _send(core, affinity="conv-1")
    assert first == 2
    for _ in range(10):
        _send(core, affinity=None)  # other requests of the key queue at the plan's slot
    moved, _ = _send(core, affinity="conv-1")
    assert moved != 2
    # its queue gone elsewhere, the conversation's next turn goes where its last one went
    core.owed[:] = [0.0] * 4
    assert core.route_index("app", "conv-1", None, PROMPT, HISTORY) == moved


def test_a_short_history_spills_sooner_than_a_long_one() -> None:
    """What the warm slot saves is the cached part: a first turn whose prompt is mostly new
    is worth a shorter queue than a late turn whose prompt is mostly history."""
    def kept_before_spill(cacheable: int) -> int:
        core = _core()
        for n in range(50):
            if _send(core, prompt=PROMPT, cacheable=cacheable)[0] != 2:
                return n
        return 50
    assert kept_before_spill(400) < kept_before_spill(3_900)


def test_capacity_weights_scale_the_owed_work() -> None:
    core = RouterCore(["big", "small"], seed=1, history_slack=1.0)
    plan = plan_of({"app": (1,)}, 2, order=["big", "small"])
    plan = dataclasses.replace(plan, destinations=(DestinationSpec("big", capacity_weight=4.0),
                                                   DestinationSpec("small")))
    core.install(RoutingTable.from_plan(plan))
    core.queue_aware = True
    # the small slot's queue counts four times: it spills sooner than an equal one would
    spilled_at = next(n for n in range(50) if _send(core)[0] != 1)
    even = _core()
    assert spilled_at <= next(n for n in range(50) if _send(even)[0] != 2)


def test_nothing_to_weigh_without_a_prompt_size_or_in_fallback() -> None:
    core = _core()
    for _ in range(20):
        assert _send(core, prompt=0, cacheable=0)[0] == 2
    core.set_fallback(True)
    _, owed = _send(core)
    assert owed == PROMPT + PREFILL_STEP_TOKENS and core.counters()["queue_spilled"] == 0


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 20_000), st.integers(0, 20_000),
                          st.sampled_from(["first", "end", "lost"])), max_size=60))
def test_owed_work_is_never_negative_and_returns_to_zero(ops) -> None:
    core = _core()
    open_ = []
    for _, prompt, cacheable, how in ops:
        slot, owed = _send(core, key="app", prompt=prompt, cacheable=cacheable)
        assert owed >= PREFILL_STEP_TOKENS
        open_.append((slot, owed, how))
        assert min(core.owed) >= 0.0
    for slot, owed, how in open_:
        if how == "first":
            core.first_token(slot, owed)
            core.finished(slot, answered=True, owed=owed)  # not repaid twice
        else:
            core.finished(slot, answered=False, owed=owed)
        assert min(core.owed) >= 0.0
    assert core.owed == [0.0, 0.0, 0.0, 0.0]
    assert core.inflight == [0, 0, 0, 0] and core.awaiting == [0, 0, 0, 0]


def test_prompt_chars_count_the_prompt_and_what_precedes_its_last_message() -> None:
    body = {"messages": [{"role": "system", "content": "s" * 100},
                         {"role": "user", "content": "u" * 20},
                         {"role": "assistant", "content": [{"type": "text", "text": "a" * 30},
                                                           {"type": "image_url"}]},
                         {"role": "user", "content": "q" * 7}]}
    assert prompt_chars(body) == (157, 150)
    assert prompt_chars({"messages": [{"role": "user", "content": "hi"}]}) == (2, 0)
    assert prompt_chars({"prompt": "x" * 40}) == (40, 0)
    assert prompt_chars({"prompt": [1, 2, 3]}) == (12, 0)
    assert prompt_chars({"prompt": ["first", "second prompt"]}) == (5, 0)
    # hostile shapes count as nothing, never raise
    assert prompt_chars({"messages": ["not a message", 3, None]}) == (0, 0)
    assert prompt_chars({"messages": [{"content": {"nested": 1}}]}) == (0, 0)
    assert prompt_chars({}) == (0, 0)


def test_a_replicated_key_moves_only_among_its_replicas() -> None:
    """The plan replicates "hot" on d0 and d1: its requests weigh each member's queue (the
    less-owed member takes them) but never leave for d2 or d3, however idle; the plan sized
    its members for its load and each holds its prefix. A one-member key still spills."""
    core = _core()
    sent = [_send(core, "hot", cacheable=0)[0] for _ in range(40)]
    assert set(sent) == {0, 1}
    assert abs(sent.count(0) - sent.count(1)) <= 1  # by owed work, as the rule weighs it
    assert core.owed[2] == core.owed[3] == 0.0
    assert core.counters()["queue_spilled"] == 0
    single = [_send(core, "app")[0] for _ in range(12)]
    assert {s for s in single} - {2}  # "app" (planned on d2 alone) left it once queued
