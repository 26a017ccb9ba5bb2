"""The routing-policy interface of the simulator and the cache-blind / hashing baselines.

Every policy (baselines here and in `reactive`, CacheRoute in `cacheroute_policy`) is one
object per edge router that sees only what that router sees:

- `route(i, key, prompt, prefix, output, now) -> destination index` for request `i`
  (key is an index into the workload's key names); the policy counts the request in flight
  at dispatch, synchronously, before the next arrival (baselines.md §1);
- `finished(i, dest, now)` when request `i`, which this router sent to `dest`, completes;
- `control(now, window_keys, window_s)` once per control interval with the keys that
  arrived in the interval (what the stream would have counted); most policies ignore it;
- a policy that matches on content (`ContentPolicy`) is given each request's chain
  through `route_chain` instead of `route`.

Baselines follow `shared/reference/baselines.md`: Flat-LB is power-of-two-choices over two
*distinct* replicas with random ties; Sticky is a 160-vnode md5 ring; CHWBL is KubeAI's
`PrefixHash` (c = 1.25, 256 vnodes, walk the ring, fall back to the hashed endpoint).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from planner_svc.simulator.hashring import HashRing
from planner_svc.simulator.kvcache import Chain
from planner_svc.simulator.replica import ReplicaModel


class Policy(Protocol):
    name: str

    def route(self, i: int, key: int, prompt: int, prefix: int, output: int, now: float) -> int:
        """Destination for request `i`; counts it in flight."""
        ...

    def finished(self, i: int, dest: int, now: float) -> None:
        """Request `i` that this router sent to `dest` completed at `now`."""
        ...

    def control(self, now: float, window_keys: np.ndarray, window_s: float) -> None:
        """Once per control interval: the keys that arrived in the last `window_s` seconds."""
        ...


class ContentPolicy(Policy, Protocol):
    """A policy that matches on content (a prefix tree over what it sent, as SGLang's and
    llm-d's routers keep one): the simulators call `route_chain` instead of `route`, with
    the request's chain (`kvcache.Chain`) and, for a length-only trace, the tokens of it
    the request may share (None: all)."""

    def route_chain(self, i: int, key: int, chain: Chain, prompt: int, output: int,
                    now: float, limit_tokens: int | None = None) -> int:
        ...


@dataclass
class PolicyContext:
    """What a policy may be built from: what a router can know (no engine's true state;
    a policy learns the rest from its own traffic)."""

    n_destinations: int
    keys: Sequence[str]
    model: ReplicaModel
    seed: int
    router: int = 0
    n_routers: int = 1
    extra: dict[str, object] = field(default_factory=dict)


PolicyFactory = Callable[[PolicyContext], Policy]


class _NoControl:
    def control(self, now: float, window_keys: np.ndarray, window_s: float) -> None:
        return None


class FlatP2C(_NoControl):
    """Power of two choices on router-local in-flight counts (Mitzenmacher; Envoy, SGLang)."""

    name = "Flat-LB"

    def __init__(self, ctx: PolicyContext) -> None:
        self.n = ctx.n_destinations
        self.inflight = [0] * self.n
        self._rand = random.Random(ctx.seed).random

    def route(self, i: int, key: int, prompt: int, prefix: int, output: int, now: float) -> int:
        n, rand, inflight = self.n, self._rand, self.inflight
        a = int(rand() * n)
        b = int(rand() * (n - 1))
        if b >= a:  # two distinct replicas, sampled without replacement
            b += 1
        la, lb = inflight[a], inflight[b]
        d = a if la < lb else b if lb < la else (a if rand() < 0.5 else b)
        inflight[d] += 1
        return d

    def finished(self, i: int, dest: int, now: float) -> None:
        self.inflight[dest] -= 1


class _KeyOwners:
    """Lazily memoised ring positions per key index (md5 once per distinct key)."""

    def __init__(self, ring: HashRing, keys: Sequence[str]) -> None:
        self.ring = ring
        self.keys = keys
        self.pos = np.full(len(keys), -1, np.int64).tolist()

    def position(self, key: int) -> int:
        p = self.pos[key]
        if p < 0:
            p = self.pos[key] = self.ring.start_index(self.keys[key])
        return p

    def owner(self, key: int) -> int:
        return self.ring.owners[self.position(key)]


class Sticky(_NoControl):
    """Consistent hashing of the routing key; load-blind by design (Karger et al.; ketama)."""

    name = "Sticky"

    def __init__(self, ctx: PolicyContext, *, vnodes: int = 160) -> None:
        self._owners = _KeyOwners(HashRing(ctx.n_destinations, vnodes=vnodes), ctx.keys)

    def route(self, i: int, key: int, prompt: int, prefix: int, output: int, now: float) -> int:
        return self._owners.owner(key)

    def finished(self, i: int, dest: int, now: float) -> None:
        return None


class CHWBL(_NoControl):
    """KubeAI `PrefixHash`: walk the ring from the key's successor to the first endpoint with
    in-flight <= c·(total+1)/R (OK when total is 0); none passes -> the hashed endpoint."""

    def __init__(self, ctx: PolicyContext, *, c: float = 1.25, vnodes: int = 256) -> None:
        self.name = f"CHWBL c={c:g}"
        ring = HashRing(ctx.n_destinations, vnodes=vnodes, salt="chwbl")
        self._owners = _KeyOwners(ring, ctx.keys)
        self._ring_owners = ring.owners
        self.c = c
        self.n = ctx.n_destinations
        self.inflight = [0] * self.n
        self.total = 0

    def route(self, i: int, key: int, prompt: int, prefix: int, output: int, now: float) -> int:
        start = self._owners.position(key)
        owners, inflight = self._ring_owners, self.inflight
        d = owners[start]
        if self.total:
            bound = self.c * (self.total + 1) / self.n
            size = len(owners)
            for j in range(size):
                r = owners[(start + j) % size]
                if inflight[r] <= bound:
                    d = r
                    break
        inflight[d] += 1
        self.total += 1
        return d

    def finished(self, i: int, dest: int, now: float) -> None:
        self.inflight[dest] -= 1
        self.total -= 1


class RoundRobin(_NoControl):
    """No routing logic at all: each request to the next destination in turn (the SGLang
    gateway's and vllm-router's `round_robin`)."""

    name = "round-robin"

    def __init__(self, ctx: PolicyContext) -> None:
        self.n, self.i = ctx.n_destinations, ctx.router % max(1, ctx.n_destinations)

    def route(self, i: int, key: int, prompt: int, prefix: int, output: int, now: float) -> int:
        self.i = (self.i + 1) % self.n
        return self.i

    def finished(self, i: int, dest: int, now: float) -> None:
        return None


class UniformRandom(_NoControl):
    """Every request to a destination drawn uniformly at random: what the SGLang gateway's
    `power_of_two` (sglang-router 0.3.2) measured as in front of the arena's engines
    (`bench/probe_sglang_p2c.py`: ~half of the requests on an engine holding 780 tokens
    while the other was idle; docs/arena.md), so the simulator's counterpart of it."""

    name = "uniform random"

    def __init__(self, ctx: PolicyContext) -> None:
        self.n = ctx.n_destinations
        self._rand = random.Random(ctx.seed).random

    def route(self, i: int, key: int, prompt: int, prefix: int, output: int, now: float) -> int:
        return int(self._rand() * self.n)

    def finished(self, i: int, dest: int, now: float) -> None:
        return None


def uniform_random(ctx: PolicyContext) -> Policy:
    return UniformRandom(ctx)


def round_robin(ctx: PolicyContext) -> Policy:
    return RoundRobin(ctx)


def flat_lb(ctx: PolicyContext) -> Policy:
    return FlatP2C(ctx)


def sticky(ctx: PolicyContext) -> Policy:
    return Sticky(ctx)


def chwbl(c: float = 1.25) -> PolicyFactory:
    def build(ctx: PolicyContext) -> Policy:
        return CHWBL(ctx, c=c)

    return build
