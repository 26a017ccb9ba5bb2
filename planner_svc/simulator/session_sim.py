"""Closed-loop sessions in virtual time: the arena's traffic through the simulator (pure).

The arena (bench/arena.py) plays `planner_svc.simulator.sessions` conversations through real
routers onto emulated engines: a turn is sent when the previous answer has arrived plus a
think time, and carries the whole history as chat text. This plays the same conversations
through the simulator's policies onto the same engine model, in virtual time, with the same
text: each prompt is rendered and cut into blocks exactly as the emulated engine does
(`planner_svc.simulator.text`), so a turn hits precisely what the engine it lands on has
computed. Comparing the two (`bench/sim_vs_arena.py`) checks the simulator against
measurement: same workload, same engine model, the only difference is real routers, real
processes and real time.

A policy sees request `i` (its session's first turn index plus the turn number), the
tenant as its key and the conversation as its session (the gateway's affinity key).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from planner_svc.simulator import text as txt
from planner_svc.simulator.policies import Policy, PolicyContext, PolicyFactory
from planner_svc.simulator.replica import Replica, ReplicaModel
from planner_svc.simulator.sessions import (
    SCENARIOS,
    Population,
    Session,
    Transcript,
    population,
    sessions,
)
from router_client.keys import KeyRule, derive_key, prompt_chars


@dataclass(frozen=True)
class SessionRecords:
    """Per request sent (in send order): what the arena's driver records."""

    session: np.ndarray
    turn: np.ndarray
    tenant: np.ndarray
    sent_s: np.ndarray
    dest: np.ndarray
    prompt_tokens: np.ndarray
    cached_tokens: np.ndarray
    ttft_s: np.ndarray
    e2e_s: np.ndarray

    def hit_rate(self, since_s: float = 0.0) -> float:
        m = self.sent_s >= since_s
        return float(self.cached_tokens[m].sum() / max(1, self.prompt_tokens[m].sum()))

    def ttft_p99(self, since_s: float = 0.0) -> float:
        m = self.sent_s >= since_s
        return float(np.percentile(self.ttft_s[m], 99)) if m.any() else float("nan")

    def finished_by(self, until_s: float) -> SessionRecords:
        """Only the requests answered by `until_s`: what the arena's driver records (it
        cancels the requests still in flight when it stops, and records none of them)."""
        m = self.sent_s + self.e2e_s <= until_s
        return SessionRecords(*(getattr(self, f.name)[m] for f in fields(self)))


def simulate_sessions(pop: Population, plan: Sequence[Session], factory: PolicyFactory, *,
                      model: ReplicaModel, n_destinations: int, until_s: float,
                      control_interval_s: float = 0.0, seed: int = 1) -> SessionRecords:
    """Play the conversations of `plan` that start before `until_s`; turns not sent by
    then are not sent (the arena's driver stops the same way)."""
    sessions = [s for s in plan if s.start_s < until_s]
    first = np.cumsum([0] + [len(s.turns) for s in sessions]).tolist()
    keys = [pop.tenant_key(t) for t in range(pop.scenario.tenants)]
    conversations = np.zeros(first[-1], np.int64)
    for k, s in enumerate(sessions):
        conversations[first[k]:first[k + 1]] = s.sid
    policy: Policy = factory(PolicyContext(n_destinations, keys, model, seed=seed,
                                           extra={"conversations": conversations,
                                                  "system_tokens": np.asarray(
                                                      pop.system_tokens, np.float64)}))
    on_content = getattr(policy, "route_chain", None)  # policies.ContentPolicy
    engines = [Replica(model) for _ in range(n_destinations)]
    watch = getattr(policy, "watch_engines", None)  # a reference that reads the engines
    if watch is not None:
        watch(engines)
    transcripts = [Transcript(pop, s) for s in sessions]
    arrivals = [(s.start_s, k, 0) for k, s in enumerate(sessions)]
    heapq.heapify(arrivals)
    # (finish, request, destination, cached tokens)
    running: list[tuple[float, int, int, int]] = []
    # First tokens, for a policy that balances on requests awaiting one (eventloop.run).
    on_first = getattr(policy, "first_token", None)
    # What each request was served from cache, for a policy that learns from it (eventloop).
    on_served = getattr(policy, "served", None)
    firsts: list[tuple[float, int, int]] = []
    # A router that polls the engines' load (the SGLang gateway's power_of_two reads
    # `/get_load` every few seconds): what each engine reports at each poll.
    # A router that weighs queues against recomputes (the gateway's --queue-aware) reads
    # each request's size and its history's from the body, as the gateway does.
    on_shape = getattr(policy, "prompt_shape", None)
    on_poll = getattr(policy, "poll_loads", None)
    poll_every = float(getattr(policy, "poll_interval_s", 0.0)) if on_poll else 0.0
    next_poll = 0.0 if poll_every > 0 else float("inf")
    window: list[int] = []
    next_control = control_interval_s if control_interval_s > 0 else float("inf")
    rows: list[tuple[int, int, int, float, int, int, int, float, float]] = []
    while arrivals:
        now, k, j = heapq.heappop(arrivals)
        if now >= until_s:
            continue
        while firsts and firsts[0][0] <= now:
            f, i, d = heapq.heappop(firsts)
            on_first(i, d, f)  # type: ignore[misc]
        while running and running[0][0] <= now:
            f, i, d, c = heapq.heappop(running)
            if on_served is not None:
                on_served(i, d, c)
            policy.finished(i, d, f)
        while now >= next_poll:
            for engine in engines:
                engine.in_flight(next_poll)  # (releases what finished by the poll)
            on_poll(next_poll, [engine.kv_held for engine in engines])  # type: ignore[misc]
            next_poll += poll_every
        while now >= next_control:
            policy.control(next_control, np.asarray(window, np.int64), control_interval_s)
            window = []
            next_control += control_interval_s
        s = sessions[k]
        turn = s.turns[j]
        messages = transcripts[k].ask(j)
        prompt = txt.render_chat(messages).encode()
        ids = txt.block_chain(prompt, model.block_tokens)
        answer = txt.answer_text(prompt, turn.output_tokens)
        answer_ids = txt.answer_chain(prompt, answer.encode(), ids, model.block_tokens)
        prompt_tokens = txt.token_count(prompt)
        i = first[k] + j
        chain = txt.as_chain(ids)
        if on_shape is not None:
            total, before_last = prompt_chars({"messages": messages})
            on_shape(i, total // 4, before_last // 4)
        d = (on_content(i, s.tenant, chain, prompt_tokens, turn.output_tokens, now)
             if on_content else policy.route(i, s.tenant, prompt_tokens,
                                             _reported_prefix(messages), turn.output_tokens,
                                             now))
        served = engines[d].admit(chain, prompt_tokens, turn.output_tokens, now,
                                  txt.as_chain(answer_ids))
        window.append(s.tenant)
        heapq.heappush(running, (served.finish_time, i, d, served.cached_tokens))
        if on_first is not None:
            heapq.heappush(firsts, (served.first_token_time, i, d))
        rows.append((s.sid, j, s.tenant, now, d, prompt_tokens, served.cached_tokens,
                     served.first_token_time - now, served.finish_time - now))
        transcripts[k].answered(answer)
        if j + 1 < len(s.turns):
            heapq.heappush(arrivals, (served.finish_time + s.turns[j + 1].think_s, k, j + 1))
    cols = list(zip(*rows, strict=True)) if rows else [()] * 9
    return SessionRecords(*(np.asarray(c) for c in cols))


_KEY_RULE = KeyRule()  # the gateway's defaults


def _reported_prefix(messages: list[dict[str, str]]) -> int:
    """The reusable prefix a gateway reports for the request (its events' prefix tokens:
    the characters its key covers / 4), which the planner's guard judges affinity on."""
    return derive_key({"messages": messages}, {}, _KEY_RULE).prefix_chars // 4


def arena_run(scenario: str, seed: int, factory: PolicyFactory, *, rate_scale: float = 1.0,
         time_scale: float = 0.5, warmup_s: float = 15.0, measure_s: float = 12.0,
         kv_tokens: int = 60_000, engines: int = 4, policy_seed: int = 1) -> SessionRecords:
    """One run of bench/arena.py in virtual time: the arena's conversations for `scenario`
    and `seed` at its offered load, its engines and control interval, the requests recorded
    as the arena's driver records them: those answered by the end of the run
    (bench/sim_vs_arena.py, bench/arena_transient.py). At overload the requests still
    queued at the end are the slowest ones, and the arena's p99 does not see them either.
    `policy_seed`: the router's own random draws (P2C's pairs, tie-breaks), apart from the
    conversations' `seed`."""
    base = SCENARIOS[scenario]
    sc = base.offered(rate_scale, time_scale)
    pop = population(sc, seed)
    total = warmup_s + measure_s
    return simulate_sessions(
        pop, sessions(pop, total), factory,
        model=ReplicaModel(kv_capacity_tokens=kv_tokens).time_scaled(time_scale),
        n_destinations=engines, until_s=total,
        control_interval_s=4.0 * max(1.0, time_scale), seed=policy_seed).finished_by(total)
