"""Routers share where their conversations went (router_client.shared_history: the core's
outbox and learning, and the wire format every replica reads)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router_client.keys import KeyRule, derive_key
from router_client.routing import HISTORY_OUTBOX_CAPACITY, RouterCore, RoutingTable
from router_client.shared_history import (
    MAX_ID_CHARS,
    MAX_MESSAGE_BYTES,
    MAX_MOVES_PER_MESSAGE,
    SharedHistoryError,
    decode_moves,
    encode_moves,
)
from tests.unit.test_router_history import _busy, _history_core
from tests.unit.test_router_routing import plan_of

ids = st.text(st.characters(codec="utf-8"), min_size=1, max_size=MAX_ID_CHARS)


@given(st.lists(st.tuples(ids, ids), max_size=3 * MAX_MOVES_PER_MESSAGE // 2), ids)
def test_moves_survive_the_wire_in_bounded_messages(moves, router):
    messages = encode_moves(router, moves)
    got = []
    for raw in messages:
        assert len(raw) <= MAX_MESSAGE_BYTES
        sender, part = decode_moves(raw)
        assert sender == router
        got += part
    assert got == moves


@pytest.mark.parametrize("raw, why", [
    (b"\xff\xfe", "not JSON"),
    (b"[1, 2]", "version-1"),
    (b'{"v": 2, "router": "r", "moves": []}', "version-1"),
    (b'{"v": 1, "moves": []}', "router id"),
    (b'{"v": 1, "router": "r", "moves": {"a": "b"}}', "list"),
    (b'{"v": 1, "router": "r", "moves": [["a"]]}', "affinity, destination"),
    (b'{"v": 1, "router": "r", "moves": [["a", 3]]}', "affinity, destination"),
    (b'{"v": 1, "router": "r", "moves": [["", "d0"]]}', "affinity, destination"),
    (json.dumps({"v": 1, "router": "r", "moves": [["a" * (MAX_ID_CHARS + 1), "d0"]]}).encode(),
     "affinity, destination"),
    (json.dumps({"v": 1, "router": "r",
                 "moves": [["a", "d0"]] * (MAX_MOVES_PER_MESSAGE + 1)}).encode(), "at most"),
    (b" " * (MAX_MESSAGE_BYTES + 1), "limit"),
])
def test_anything_else_on_the_channel_is_refused_with_a_reason(raw, why):
    with pytest.raises(SharedHistoryError, match=why):
        decode_moves(raw)


def test_only_new_placements_are_shared_each_once_with_the_latest_slot():
    core = _history_core()
    core.share_history()
    first = core.route_index("tenant", "conv-1")
    core.route_index("tenant", "conv-2")
    core.route_index("tenant", "conv-1")  # kept with its history: nothing new to tell
    moves = core.drain_history()
    assert [a for a, _ in moves] == ["conv-1", "conv-2"]
    assert dict(moves)["conv-1"] == core.destination_ids[first]
    assert core.drain_history() == []
    elsewhere = (first + 1) % 4
    core.remember("conv-1", elsewhere)  # a retry moved it
    assert core.drain_history() == [("conv-1", core.destination_ids[elsewhere])]
    assert _history_core().drain_history() == []  # not shared: nothing kept


def test_a_learned_placement_is_followed_by_the_load_rule_of_the_routers_own_memory():
    a, b = _history_core(), _history_core()
    a.share_history()
    b.share_history()
    natural = b.route_index("tenant", "probe")  # where the cold tail sends this key
    elsewhere = (natural + 2) % 4
    assert b.learn_history([("conv-9", b.destination_ids[elsewhere]), ("conv-x", "nowhere")]) == 1
    assert b.route_index("tenant", "conv-9") == elsewhere
    assert b.counters()["history_kept"] == 1
    _busy(b, 2)
    for _ in range(12):  # far above the mean: the turn leaves its history, as its own would
        b.started(elsewhere)
    assert b.route_index("tenant", "conv-9") != elsewhere
    assert b.history_learned == 1


def test_learning_is_bounded_and_off_without_history():
    core = _history_core(capacity=3)
    core.learn_history([(f"c{i}", "d1") for i in range(10)])
    assert list(core._history) == ["c7", "c8", "c9"]
    assert _history_core(slack=None).learn_history([("c", "d1")]) == 0
    full = _history_core()
    full.share_history()
    for i in range(HISTORY_OUTBOX_CAPACITY + 5):
        full.route_index("tenant", f"c{i}")
    assert len(full.drain_history()) == HISTORY_OUTBOX_CAPACITY
    assert full.history_unshared == 5


def _replicas(n: int, shared: bool) -> list[RouterCore]:
    cores = []
    for i in range(n):
        core = RouterCore(["d0", "d1", "d2", "d3"], seed=i, cold_tail="p2c", history_slack=1.0)
        core.install(RoutingTable.from_plan(plan_of({"hot": (0, 1)})))
        if shared:
            core.share_history()
        cores.append(core)
    return cores


@pytest.mark.parametrize("shared", [False, True])
def test_turns_spread_over_four_replicas_stay_with_their_history_only_when_shared(shared):
    """Round-robin over four routers: each turn of a conversation reaches the next replica.
    The key is the cold tail (P2C), so a replica that never saw the conversation places it
    anywhere; sharing (the exchange's job, here done by hand between turns) keeps it."""
    cores, rng = _replicas(4, shared), random.Random(5)
    turns, stayed = 0, 0
    last: dict[str, int] = {}
    for turn in range(6):
        for c in range(50):
            conv = f"conv-{c}"
            core = cores[(turn * 50 + c) % 4]
            for s in range(4):  # other traffic in flight, different on every replica
                core.load[s] = core.inflight[s] = rng.randrange(3)
            slot = core.route_index("tenant", conv)
            if conv in last:
                turns += 1
                stayed += slot == last[conv]
            last[conv] = slot
        if shared:  # every replica hears every other's placements before the next turn
            for sender in cores:
                moves = sender.drain_history()
                for receiver in cores:
                    if receiver is not sender:
                        receiver.learn_history(moves)
    share = stayed / turns
    if shared:
        assert share > 0.95
    else:
        assert share < 0.5


def test_the_gateways_affinity_is_a_digest_scoped_by_the_key():
    rule = KeyRule()
    body = {"model": "m", "messages": [{"role": "system", "content": "You are A."},
                                       {"role": "user", "content": "hello there"}]}
    other_app = {"model": "m", "messages": [{"role": "system", "content": "You are B."},
                                            {"role": "user", "content": "hello there"}]}
    a, b = derive_key(body, {}, rule), derive_key(other_app, {}, rule)
    assert a.affinity is not None and len(a.affinity) == 16 and "hello" not in a.affinity
    assert a.affinity != b.affinity  # the same opening words, two applications
    assert derive_key(body, {}, rule).affinity == a.affinity
    session = derive_key(body, {"x-session-id": "s-1"}, rule)
    assert session.affinity not in (None, a.affinity)
    assert derive_key({"model": "m", "messages": [{"role": "user", "content": "x"}]},
                      {}, rule).affinity is None  # the key is the conversation
