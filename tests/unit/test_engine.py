"""The content-level engine model: the block cache (kvcache) and the replica's timing."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_svc.simulator import text as txt
from planner_svc.simulator.kvcache import BlockCache
from planner_svc.simulator.replica import Replica, ReplicaModel

BS = 16
FREE = dict(prefill_overhead_s=0.0, prefill_s_per_token=0.0, decode_s_per_running=0.0,
            decode_s_per_kv_token=0.0)


def model(**kw: object) -> ReplicaModel:
    return ReplicaModel(**{"kv_capacity_tokens": 100 * BS, "block_tokens": BS, **kw})  # type: ignore[arg-type]


# --- the block cache ------------------------------------------------------------------------

def test_a_chain_hits_its_longest_computed_prefix():
    c = BlockCache(100)
    h = c.admit([(1, 10), (2, 5)], 0.0, 0)
    assert h is not None and h.matched_blocks == 0
    c.computed(h, 1.0)
    assert c.match([(1, 10), (2, 5), (3, 4)], 0.5) == 0  # not computed yet: no hit
    assert c.match([(1, 10), (2, 5), (3, 4)], 1.0) == 15
    assert c.match([(1, 10), (9, 5)], 1.0) == 10  # diverges after the shared prefix
    assert c.match([(2, 5)], 1.0) == 0  # the same segment under another parent is other KV


def test_running_requests_hold_shared_blocks_once_and_release_them():
    c = BlockCache(40)
    a = c.admit([(1, 20)], 0.0, 0)
    assert a is not None
    c.computed(a, 0.0)
    b = c.admit([(1, 20), (2, 10)], 0.0, 5)  # shares a's 20 blocks
    assert b is not None and b.matched_blocks == 20
    assert c.used_blocks == 20 + 10 + 5
    assert c.admit([(7, 10)], 0.0, 0) is None  # 35 + 10 > 40 and everything is pinned
    c.release(a, 1.0)
    c.release(b, 1.0)
    assert c.used_blocks == 30  # private blocks freed, the content stays cached
    assert c.admit([(7, 10)], 2.0, 0) is not None  # now it evicts to make room


def test_eviction_takes_least_recently_used_leaves_tail_first():
    c = BlockCache(30)
    for seg, t in ((1, 0.0), (2, 1.0)):
        h = c.admit([(seg, 10)], t, 0)
        assert h is not None
        c.computed(h, t)
        c.release(h, t)
    child = c.admit([(1, 10), (3, 5)], 2.0, 0)  # 1 is used again (most recent now)
    assert child is not None
    c.computed(child, 2.0)
    c.release(child, 2.0)
    h = c.admit([(4, 8)], 3.0, 0)  # needs 3 more blocks: taken from segment 2 (LRU leaf)
    assert h is not None
    assert c.match([(1, 10), (3, 5)], 3.0) == 15
    assert c.match([(2, 10)], 3.0) == 7  # its tail blocks went first


def test_an_answer_joins_the_next_turns_prefix():
    c = BlockCache(100)
    turn0 = c.admit([(1, 10), (2, 3)], 0.0, 4)
    assert turn0 is not None
    c.computed(turn0, 0.5)
    c.release(turn0, 2.0, answer=[(3, 4)])
    assert c.match([(1, 10), (2, 3), (3, 4), (4, 3)], 2.0) == 17


def test_a_limit_caps_the_hit_a_length_only_trace_allows():
    c = BlockCache(100)
    h = c.admit([(1, 20)], 0.0, 0)
    assert h is not None
    c.computed(h, 0.0)
    c.release(h, 0.0)
    h2 = c.admit([(1, 30)], 1.0, 0, limit_blocks=12)
    assert h2 is not None and h2.matched_blocks == 12


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6)),
                                   min_size=1, max_size=4),
                          st.integers(0, 4), st.floats(0, 2)), max_size=40),
       st.integers(5, 60))
def test_memory_accounting_invariants(requests, capacity):
    """Used blocks equal cached blocks plus reservations, never exceed capacity, and a
    pinned prefix is never evicted."""
    c = BlockCache(capacity)
    live = []
    now = 0.0
    for chain, private, dt in requests:
        now += dt
        h = c.admit(chain, now, private)
        if h is not None:
            c.computed(h, now)
            live.append(h)
        if live and (h is None or len(live) > 3):
            c.release(live.pop(0), now)
        reserved = sum(x.private_blocks for x in live)
        assert c.used_blocks == c.cached_blocks + reserved
        assert c.used_blocks <= capacity
        for x in live:
            assert all(n.cached > 0 and n.pins > 0 for n in x.nodes)


# --- the replica --------------------------------------------------------------------------

def test_timing_of_an_unloaded_request():
    m = model(prefill_overhead_s=0.01, prefill_s_per_token=1e-4, decode_s_per_step=0.02,
              decode_s_per_running=0.0, decode_s_per_kv_token=0.0)
    r = Replica(m)
    s = r.admit([(1, 10)], 160, 5, now=1.0)
    assert s.cached_tokens == 0 and s.start_time == 1.0
    assert s.first_token_time == pytest.approx(1.0 + 0.01 + 0.016 + 0.02)
    assert s.finish_time == pytest.approx(1.0 + 0.026 + 5 * 0.02)


def test_cached_prefix_is_reported_and_a_full_hit_recomputes_its_last_block():
    r = Replica(model(**FREE, decode_s_per_step=0.01))
    r.admit([(1, 10)], 160, 1, now=0.0)
    again = r.admit([(1, 10)], 160, 1, now=1.0)
    assert again.cached_tokens == 160 - BS  # vLLM recomputes the last block of a full hit
    longer = r.admit([(1, 10), (2, 5)], 240, 1, now=2.0)
    assert longer.cached_tokens == 160


def test_prefill_queues_and_decode_slows_with_the_batch():
    m = model(prefill_overhead_s=0.0, prefill_s_per_token=1e-3, decode_s_per_step=0.01,
              decode_s_per_running=0.01, decode_s_per_kv_token=0.0)
    r = Replica(m)
    a = r.admit([(1, 10)], 160, 10, now=0.0)
    b = r.admit([(2, 10)], 160, 10, now=0.0)
    assert b.first_token_time > a.first_token_time + 0.15  # waits for a's prefill
    assert (b.finish_time - b.first_token_time) > (a.finish_time - a.first_token_time)


def test_a_full_batch_or_full_memory_makes_requests_wait():
    r = Replica(model(**FREE, decode_s_per_step=1.0, batch_limit=2))
    r.admit([(1, 1)], 16, 10, now=0.0)  # finishes at 10
    r.admit([(2, 1)], 16, 20, now=0.0)  # finishes at 20
    assert r.admit([(3, 1)], 16, 1, now=1.0).start_time == 10.0
    small = Replica(model(**FREE, decode_s_per_step=1.0, kv_capacity_tokens=20 * BS))
    small.admit([(1, 15)], 15 * BS, 10, now=0.0)  # holds 15 blocks + output until 10
    assert small.admit([(2, 8)], 8 * BS, 1, now=1.0).start_time == 10.0


def test_fit_recovers_the_constants_and_reports_its_error():
    truth = model(prefill_overhead_s=0.03, prefill_s_per_token=2e-4, decode_s_per_step=0.025,
                  decode_s_per_running=3e-4, decode_s_per_kv_token=5e-8)
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(200):
        u, out = int(rng.integers(0, 8_000)), int(rng.integers(1, 200))
        running, kv = int(rng.integers(1, 32)), int(rng.integers(0, 200_000))
        rows.append((u, out, running, kv,
                     truth.prefill_seconds(u) + out * truth.tpot(running, kv)))
    got, error = ReplicaModel.fit(rows, kv_capacity_tokens=100 * BS, block_tokens=BS)
    assert got.prefill_s_per_token == pytest.approx(2e-4, rel=1e-6)
    assert got.decode_s_per_kv_token == pytest.approx(5e-8, rel=1e-5)
    assert error < 1e-6
    with pytest.raises(ValueError):
        ReplicaModel.fit([(1, 1, 1, 1, 1.0)])


def test_time_scale_zero_answers_at_once():
    r = Replica(ReplicaModel().time_scaled(0.0))
    s = r.admit([(1, 100)], 1600, 50, now=5.0)
    assert s.finish_time == 5.0


# --- text, as the emulated engines see it ---------------------------------------------------

def test_next_turn_text_hits_the_previous_prompt_and_answer():
    r = Replica(model(**FREE, decode_s_per_step=0.001, kv_capacity_tokens=10_000))
    sys_msg = {"role": "system", "content": txt.answer_text(b"s", 200)}
    turn1 = [sys_msg, {"role": "user", "content": "hello " * 20}]
    p1 = txt.render_chat(turn1).encode()
    ids1 = txt.block_chain(p1, BS)
    answer = txt.answer_text(p1, 40)
    a_ids = txt.answer_chain(p1, answer.encode(), ids1, BS)
    r.admit(txt.as_chain(ids1), txt.token_count(p1), 40, 0.0, txt.as_chain(a_ids))
    turn2 = [*turn1, {"role": "assistant", "content": answer},
             {"role": "user", "content": "and then?"}]
    p2 = txt.render_chat(turn2).encode()
    ids2 = txt.block_chain(p2, BS)
    assert ids2[:len(ids1) + len(a_ids)] == ids1 + a_ids  # the same content, the same blocks
    s = r.admit(txt.as_chain(ids2), txt.token_count(p2), 4, 10.0)
    assert s.cached_tokens >= (len(ids1) + len(a_ids) - 1) * BS


def test_answers_are_deterministic_and_token_exact():
    a = txt.answer_text(b"prompt", 25)
    assert a == txt.answer_text(b"prompt", 25) != txt.answer_text(b"other", 25)
    assert txt.token_count(a.encode()) == 25
    assert random.Random(1).random() == random.Random(1).random()
