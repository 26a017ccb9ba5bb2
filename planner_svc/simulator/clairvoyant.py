"""A reference, not a router: the greedy router that knows every engine's true state.

No router can know what each engine holds in its KV cache and how long its prefill queue
is at the instant a request arrives; this one does (the simulator hands it the engines,
`watch_engines`). Each request goes where its first token would come soonest: the engine
whose queue ends earliest once its own uncached part is prefilled there
(`max(now, prefill free) + prefill(uncached) − now`, the engine model's own rule). It
sees the cache's exact content, so it never misses a prefix any engine holds unless
waiting for it costs more than recomputing it elsewhere, and it balances on the queue
itself rather than on request counts.

What it is for: a ceiling to measure the routers against on the same conversations and
engines. Greedy is not optimal (a request placed for its own first token may evict what a
later one needed), so it is not a proof of what no router can beat, but it is what the
routers that read engines' KV events and load (llm-d's precise prefix scorer, Dynamo's KV
router) try to approximate, with perfect and instant information. If a one-replica target
is above what it carries, the target asks for more than information can buy on that fleet
(`bench/sim_capacity_1r.py --routers clairvoyant`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from planner_svc.simulator.kvcache import Chain
from planner_svc.simulator.policies import PolicyContext
from planner_svc.simulator.replica import Replica


class Clairvoyant:
    """See the module doc. `route_chain` only: it needs the content."""

    name = "clairvoyant"

    def __init__(self, ctx: PolicyContext) -> None:
        self._model = ctx.model
        self._engines: Sequence[Replica] = ()

    def watch_engines(self, engines: Sequence[Replica]) -> None:
        """The simulator's engines, read (never changed) at every decision."""
        self._engines = engines

    def route(self, i: int, key: int, prompt: int, prefix: int, output: int, now: float) -> int:
        raise TypeError("the clairvoyant reference needs the prompt's content (route_chain)")

    def route_chain(self, i: int, key: int, chain: Chain, prompt: int, output: int,
                    now: float, limit_tokens: int | None = None) -> int:
        if not self._engines:
            raise RuntimeError("the clairvoyant reference was not shown the engines")
        waits = first_token_waits(self._engines, chain, prompt, now, self._model.block_tokens,
                                  limit_tokens)
        return int(np.argmin(waits))  # ties: the lowest index, deterministic

    def finished(self, i: int, dest: int, now: float) -> None:
        return None

    def control(self, now: float, window_keys: np.ndarray, window_s: float) -> None:
        return None


def first_token_waits(engines: Sequence[Replica], chain: Chain, prompt_tokens: int,
                      now: float, block_tokens: int,
                      limit_tokens: int | None = None) -> np.ndarray:
    """Per engine, how long a request arriving at `now` would wait for its prefill to end
    there: its queue ahead of it, then its uncached tokens (as `Replica.admit` computes
    them: a full hit still computes its last block)."""
    out = np.empty(len(engines))
    for d, engine in enumerate(engines):
        cached = engine.cache.match(chain, now) * block_tokens
        if limit_tokens is not None:
            cached = min(cached, limit_tokens // block_tokens * block_tokens)
        if cached >= prompt_tokens > 0:
            cached = max(0, cached - block_tokens)
        start = max(now, engine.prefill_backlog_until)
        out[d] = start + engine.model.prefill_seconds(prompt_tokens - cached) - now
    return out


def clairvoyant(ctx: PolicyContext) -> Clairvoyant:
    return Clairvoyant(ctx)
