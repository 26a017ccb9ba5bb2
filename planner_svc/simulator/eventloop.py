"""The simulator's inner loop: one pass over the arrivals (pure; virtual time).

Kept apart from `simulator` so that mypyc compiles it with the engine model (setup.py):
it runs once per request, and typed locals over plain lists are what make a compiled loop
fast. `simulator.simulate` owns the meaning (see its module doc); this is only the pass.
"""

from __future__ import annotations

import heapq

import numpy as np

from planner_svc.simulator.chains import ChainBuilder
from planner_svc.simulator.policies import Policy
from planner_svc.simulator.replica import Replica
from planner_svc.simulator.workload import Workload


def run(w: Workload, routers: list[Policy], engines: list[Replica], block_tokens: int,
        controls: list[float], router_of: list[int]
        ) -> tuple[list[int], list[int], list[float], list[float]]:
    """Route and serve every request of `w` in arrival order: each request's destination,
    cached tokens, finish and first-token times. Before each arrival, the completions due
    by then reach the router that sent them, and the control intervals that ended reach
    every router with the keys that arrived in them."""
    n = len(w)
    ts: list[float] = w.t.tolist()
    keys: list[int] = w.key.tolist()
    prompts: list[int] = w.prompt.tolist()
    prefixes: list[int] = w.prefix.tolist()
    outputs: list[int] = w.output.tolist()
    window_of: np.ndarray = w.key
    dest = [0] * n
    cached = [0] * n
    finish = [0.0] * n
    first = [0.0] * n
    # Requests in flight: a heap of distinct finish times and, per time, the requests that
    # finish then in arrival order (what (finish, i) tuples would pop, without a tuple
    # comparison per sift: compiled, those were the loop's largest cost after the engines).
    pending: list[float] = []
    finishing: dict[float, list[int]] = {}
    controls = list(controls)
    controls.reverse()  # popped from the end
    next_control = controls.pop() if controls else float("inf")
    window_start_i = 0
    window_start_t = 0.0
    single = len(routers) == 1
    builder = ChainBuilder(w, block_tokens)
    # Policies that match on content (policies.ContentPolicy) get each request's chain.
    by_content = [getattr(r, "route_chain", None) for r in routers]
    # Policies that balance on requests awaiting a first token (the gateway tells its core
    # when a stream's first event arrives) hear of each first token before its finish.
    on_first = [getattr(r, "first_token", None) for r in routers]
    tell_first = any(f is not None for f in on_first)
    firsts: list[tuple[float, int]] = []
    # Policies that learn from what was served from cache (the gateway reads a response's
    # usage) hear each request's cached tokens before its finish.
    on_served = [getattr(r, "served", None) for r in routers]
    for i in range(n):
        now = ts[i]
        while firsts and firsts[0][0] <= now:
            t, j = heapq.heappop(firsts)
            told = on_first[0 if single else router_of[j]]
            if told is not None:
                told(j, dest[j], t)
        while pending and pending[0] <= now:
            f = heapq.heappop(pending)
            for j in finishing.pop(f):
                which = 0 if single else router_of[j]
                told_served = on_served[which]
                if told_served is not None:
                    told_served(j, dest[j], cached[j])
                routers[which].finished(j, dest[j], f)
        if now >= next_control:
            window = window_of[window_start_i:i]
            for r in routers:
                r.control(next_control, window, next_control - window_start_t)
            window_start_i = i
            window_start_t = next_control
            next_control = controls.pop() if controls else float("inf")
        k = keys[i]
        chain, answer, limit = builder.chain(i)
        which = 0 if single else router_of[i]
        on_content = by_content[which]
        if on_content is not None:
            d: int = on_content(i, k, chain, prompts[i], outputs[i], now, limit)
        else:
            d = routers[which].route(i, k, prompts[i], prefixes[i], outputs[i], now)
        served = engines[d].admit(chain, prompts[i], outputs[i], now, answer, limit)
        dest[i] = d
        cached[i] = served.cached_tokens
        finish[i] = served.finish_time
        first[i] = served.first_token_time
        if tell_first:
            heapq.heappush(firsts, (served.first_token_time, i))
        f = served.finish_time
        same = finishing.get(f)
        if same is None:
            finishing[f] = [i]
            heapq.heappush(pending, f)
        else:
            same.append(i)
    return dest, cached, finish, first
