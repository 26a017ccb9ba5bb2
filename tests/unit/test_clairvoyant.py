"""The clairvoyant reference (planner_svc.simulator.clairvoyant): the engine whose first
token would come soonest, from the engines' true caches and prefill queues."""

from __future__ import annotations

import numpy as np
import pytest

from planner_svc.simulator import text as txt
from planner_svc.simulator.clairvoyant import Clairvoyant, first_token_waits
from planner_svc.simulator.policies import PolicyContext
from planner_svc.simulator.replica import Replica, ReplicaModel
from planner_svc.simulator.session_sim import arena_run

MODEL = ReplicaModel(kv_capacity_tokens=60_000)
PROMPT = ("You are a helpful assistant for the billing team. " * 40).encode()


def _chain(data: bytes):
    return txt.as_chain(txt.block_chain(data, MODEL.block_tokens))


def _engines(n: int) -> list[Replica]:
    return [Replica(MODEL) for _ in range(n)]


def _policy(engines: list[Replica]) -> Clairvoyant:
    policy = Clairvoyant(PolicyContext(len(engines), ["t"], MODEL, seed=1))
    policy.watch_engines(engines)
    return policy


def test_an_idle_fleet_sends_a_prompt_where_its_prefix_is_cached() -> None:
    engines = _engines(3)
    chain, tokens = _chain(PROMPT), txt.token_count(PROMPT)
    engines[2].admit(chain, tokens, 4, 0.0)
    policy = _policy(engines)
    assert policy.route_chain(0, 0, chain, tokens, 4, 10.0) == 2
    waits = first_token_waits(engines, chain, tokens, 10.0, MODEL.block_tokens)
    # warm: only what is past the last full cached block (a whole block on a full hit)
    cached = tokens // MODEL.block_tokens * MODEL.block_tokens
    if cached >= tokens:
        cached -= MODEL.block_tokens
    assert waits[2] == pytest.approx(MODEL.prefill_seconds(tokens - cached))
    # and that is the replica's own figure when the request is admitted there
    served = engines[2].admit(chain, tokens, 4, 10.0)
    assert served.cached_tokens == cached
    assert waits[0] == pytest.approx(MODEL.prefill_seconds(tokens))


def test_a_long_enough_queue_at_the_warm_engine_sends_the_prompt_elsewhere_cold() -> None:
    engines = _engines(2)
    chain, tokens = _chain(PROMPT), txt.token_count(PROMPT)
    engines[0].admit(chain, tokens, 4, 0.0)
    policy = _policy(engines)
    # queue unrelated prefills at the warm engine until waiting costs more than recomputing
    other = b"an unrelated document " * 400
    now = 10.0
    queued = 0
    while engines[0].prefill_backlog_until - now < MODEL.prefill_seconds(tokens):
        engines[0].admit(_chain(other + bytes([queued % 250])), txt.token_count(other), 4, now)
        queued += 1
    assert policy.route_chain(0, 0, chain, tokens, 4, now) == 1
    assert queued >= 1


def test_it_refuses_to_route_blind() -> None:
    policy = Clairvoyant(PolicyContext(2, ["t"], MODEL, seed=1))
    with pytest.raises(RuntimeError, match="engines"):
        policy.route_chain(0, 0, _chain(PROMPT), 10, 4, 0.0)
    with pytest.raises(TypeError, match="content"):
        policy.route(0, 0, 10, 0, 4, 0.0)


def test_in_the_arena_simulator_it_is_shown_the_engines_and_serves_from_cache() -> None:
    records = arena_run("paper-like", 1, Clairvoyant, rate_scale=2.0, time_scale=4.0,
                        warmup_s=20.0, measure_s=20.0)
    assert len(records.dest) > 50
    assert len(np.unique(records.dest)) >= 2  # spread only as queues form (ties: the first)
    assert records.hit_rate(20.0) > 0.8
