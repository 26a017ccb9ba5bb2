"""Closed-loop sessions in the simulator: the arena's conversations in virtual time, cut into
blocks exactly as the emulated engines cut the text."""

from __future__ import annotations

import itertools

import numpy as np

from planner_svc.simulator.cacheroute_policy import gateway_like
from planner_svc.simulator.policies import round_robin
from planner_svc.simulator.replica import ReplicaModel
from planner_svc.simulator.session_sim import simulate_sessions
from planner_svc.simulator.sessions import SCENARIOS, population, sessions

MODEL = ReplicaModel(kv_capacity_tokens=200_000).time_scaled(0.5)


def _run(factory, destinations: int, until_s: float = 20.0, seed: int = 1):
    pop = population(SCENARIOS["paper-like"].scaled(sessions_per_s=3.0), seed)
    return pop, simulate_sessions(pop, sessions(pop, until_s), factory, model=MODEL,
                                  n_destinations=destinations, until_s=until_s,
                                  control_interval_s=4.0)


def test_turns_are_sent_after_their_answer_and_think_time_and_meet_their_history():
    _, r = _run(round_robin, 1)  # one engine: every turn lands where its history is
    assert len(r.sent_s) > 50 and set(r.dest.tolist()) == {0}
    for sid in set(r.session.tolist()):
        mine = np.flatnonzero(r.session == sid)
        assert r.turn[mine].tolist() == list(range(len(mine)))
        sent = r.sent_s[mine]
        ends = sent + r.e2e_s[mine]
        assert (sent[1:] >= ends[:-1]).all()  # closed loop: after the previous answer
        for a, b in itertools.pairwise(mine):
            # the whole previous prompt (but its partial last block) is served from cache
            assert r.cached_tokens[b] >= (r.prompt_tokens[a] // 16 - 1) * 16
    assert r.hit_rate() > 0.5


def test_the_same_inputs_give_the_same_records():
    _, a = _run(gateway_like(24.0, 12), 4)
    _, b = _run(gateway_like(24.0, 12), 4)
    assert (a.dest == b.dest).all() and (a.cached_tokens == b.cached_tokens).all()


def test_cacheroute_keeps_conversations_and_tenants_warm_where_round_robin_cannot():
    _, cr = _run(gateway_like(24.0, 12), 4, until_s=40.0)
    _, rr = _run(round_robin, 4, until_s=40.0)
    assert cr.hit_rate(10.0) > rr.hit_rate(10.0) + 0.05
