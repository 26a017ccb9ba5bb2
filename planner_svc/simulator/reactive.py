"""Reactive cache-aware baselines: SGLang `cache_aware` and a DualMap-like reconstruction.

SGLang's `cache_aware` matches on content: the simulators hand it each request's chain
(`route_chain`; the arena's text as blocks in `session_sim`), so a prefix shared across keys
(a platform preamble, a document) is matched as the real router's text tree matches it.
DualMap-like still matches by key and prefix length: a request of key b shares exactly its
reusable prefix with the key's earlier prompts and nothing with other keys, so "the longest
prefix match on d" is min(tokens of b's last prompt sent to d, this request's reusable
prefix). Both learn only from their own traffic, as a real router does (no policy reads an
engine's state, except where DualMap-like says so).
"""

from __future__ import annotations

import random
from collections import OrderedDict

import numpy as np

from planner_svc.simulator.hashring import HashRing
from planner_svc.simulator.kvcache import Chain
from planner_svc.simulator.policies import (
    Policy,
    PolicyContext,
    PolicyFactory,
    _KeyOwners,
    _NoControl,
)
from planner_svc.simulator.prefix_index import PrefixIndex, key_chain

CHARS_PER_TOKEN = 4


class SGLangCacheAware:
    """sgl-router `cache_aware`: global least-load when imbalanced, else the tenant with the
    longest prefix match if it covers > `cache_threshold` of the prompt, else the tenant with
    the smallest tree. Each router learns only from what it routed (a `PrefixIndex` over the
    content it sent, as SGLang's tree holds the text it sent); the tree is LRU-trimmed per
    tenant to `max_tree_size` characters every `eviction_interval_s`. CLI defaults."""

    def __init__(
        self,
        ctx: PolicyContext,
        *,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        eviction_interval_s: float = 120.0,
        max_tree_size: int = 2**26,
        label: str = "SGLang cache_aware",
    ) -> None:
        self.name = label
        self.n = ctx.n_destinations
        self.inflight = [0] * self.n
        self.bs = ctx.model.block_tokens
        self.tree = PrefixIndex(self.n)
        self.threshold = cache_threshold
        self.abs_thr, self.rel_thr = balance_abs_threshold, balance_rel_threshold
        self.evict_every = eviction_interval_s
        self.max_blocks = max(1, max_tree_size // CHARS_PER_TOKEN // self.bs)
        self.next_evict = eviction_interval_s

    def route(self, i: int, key: int, prompt: int, prefix: int, output: int, now: float) -> int:
        """A length-only request: its key's stream, sharing `prefix` tokens."""
        return self._route(key_chain(key, prompt, self.bs), prompt, now, prefix // self.bs)

    def route_chain(self, i: int, key: int, chain: Chain, prompt: int, output: int,
                    now: float, limit_tokens: int | None = None) -> int:
        return self._route(chain, prompt, now,
                           None if limit_tokens is None else limit_tokens // self.bs)

    def _route(self, chain: Chain, prompt: int, now: float, limit: int | None) -> int:
        if now >= self.next_evict:
            self.tree.trim(self.max_blocks)
            self.next_evict = now + self.evict_every
        loads = self.inflight
        mx, mn = max(loads), min(loads)
        if mx - mn > self.abs_thr and mx > self.rel_thr * mn:
            d = loads.index(mn)
        else:
            matched = self.tree.match(chain, limit)
            best = max(range(self.n), key=matched.__getitem__)
            if matched[best] * self.bs / max(prompt, 1) > self.threshold:
                d = best
            else:
                sizes = self.tree.blocks
                d = sizes.index(min(sizes))
        self.tree.insert(chain, d)
        loads[d] += 1
        return d

    def finished(self, i: int, dest: int, now: float) -> None:
        self.inflight[dest] -= 1

    def control(self, now: float, window_keys: np.ndarray, window_s: float) -> None:
        return None


def sglang_cache_aware(rust_defaults: bool = False) -> PolicyFactory:
    """CLI defaults (0.3 / 64 / 1.5 / 120 s / 2^26), or the Rust `CacheAwareConfig::default()`
    (0.5 / 32 / 1.1 / 30 s / 10000) that baselines.md asks to run as well."""

    def build(ctx: PolicyContext) -> Policy:
        if rust_defaults:
            return SGLangCacheAware(
                ctx,
                cache_threshold=0.5,
                balance_abs_threshold=32,
                balance_rel_threshold=1.1,
                eviction_interval_s=30.0,
                max_tree_size=10_000,
                label="SGLang cache_aware (Rust defaults)",
            )
        return SGLangCacheAware(ctx)

    return build


class SGLangPowerOfTwo(_NoControl):
    """The SGLang model gateway's `power_of_two` as its source states it (smg
    `policies/power_of_two.rs`): two distinct workers at random, the one with the lower
    *polled* load, ties to the first drawn. (A probe of sglang-router 0.3.2 did not show it
    following the polled tokens: `bench/probe_sglang_p2c.py`, docs/arena.md.) Its load
    monitor polls each worker's `/get_load` every `poll_interval_s` (5 s, fixed in the
    gateway) and compares the tokens the workers reported (`num_tokens`); until both of a
    pair have reported, the router's own in-flight counts. Between polls the loads do not
    move, so every pair goes the same way: this is not Flat-LB (P2C on live counts,
    baselines.md §1). `bench/sim_vs_arena.py --power-of-two polled` checks the arena's real
    `power_of_two` against it (its default is `policies.UniformRandom`, what that router
    measured as). The simulators feed the polls through `poll_loads` (session_sim)."""

    name = "SGLang power_of_two"

    def __init__(self, ctx: PolicyContext, *, poll_interval_s: float = 5.0) -> None:
        if not poll_interval_s > 0:
            raise ValueError("poll_interval_s must be > 0")
        self.n = ctx.n_destinations
        self.poll_interval_s = poll_interval_s
        self.inflight = [0] * self.n
        self.polled: list[int] | None = None
        self._rand = random.Random(ctx.seed).random

    def poll_loads(self, now: float, tokens: list[int]) -> None:
        """The workers' `/get_load` tokens at `now`, one per destination."""
        if len(tokens) != self.n:
            raise ValueError(f"expected {self.n} loads, got {len(tokens)}")
        self.polled = list(tokens)

    def route(self, i: int, key: int, prompt: int, prefix: int, output: int, now: float) -> int:
        n, rand = self.n, self._rand
        a = int(rand() * n)
        b = (a + 1 + int(rand() * (n - 1))) % n  # distinct, as the gateway draws them
        loads = self.polled if self.polled is not None else self.inflight
        d = a if loads[a] <= loads[b] else b
        self.inflight[d] += 1
        return d

    def finished(self, i: int, dest: int, now: float) -> None:
        self.inflight[dest] -= 1


def sglang_power_of_two(poll_interval_s: float = 5.0) -> PolicyFactory:
    def build(ctx: PolicyContext) -> Policy:
        return SGLangPowerOfTwo(ctx, poll_interval_s=poll_interval_s)

    return build


class DualMapLike:
    """A reconstruction of DualMap (arXiv 2602.06502; no public code, thresholds unknown).

    Two independent md5 rings map the routing key to two distinct candidates. For each,
    hit = the tokens of this request's reusable prefix this router last sent the candidate
    for the key (its own record, LRU-bounded by the engine's cache size), and the estimated
    TTFT = the prefill backlog this router has itself sent the candidate + prefill of the
    uncached tokens. Prefer the larger hit (ties: lower TTFT); if its TTFT estimate exceeds
    `ttft_slo_s`, take the lower TTFT. (An earlier version read the engines' true caches
    and backlogs: an oracle no router has.) Hotspot migration and ring scaling are not
    modelled.
    """

    name = "DualMap-like"

    def __init__(self, ctx: PolicyContext, *, ttft_slo_s: float = 2.0, vnodes: int = 160) -> None:
        self._one = _KeyOwners(HashRing(ctx.n_destinations, vnodes=vnodes, salt="dm1"), ctx.keys)
        self._ring2 = HashRing(ctx.n_destinations, vnodes=vnodes, salt="dm2")
        self._two = _KeyOwners(self._ring2, ctx.keys)
        self.model = ctx.model
        self.slo = ttft_slo_s
        self.inflight = [0] * ctx.n_destinations
        n = ctx.n_destinations
        self.sent: list[OrderedDict[int, int]] = [OrderedDict() for _ in range(n)]
        self.sent_tokens = [0] * n
        self.capacity = ctx.model.kv_capacity_tokens
        self.backlog_until = [0.0] * n

    def _candidates(self, key: int) -> tuple[int, int]:
        c1 = self._one.owner(key)
        c2 = self._two.owner(key)
        if c2 == c1:
            c2 = self._ring2.next_distinct(self._two.position(key), c1)
        return c1, c2

    def _estimate(
        self, c: int, key: int, prompt: int, prefix: int, now: float
    ) -> tuple[int, float]:
        held = self.sent[c].get(key, 0)
        hit = held if held < prefix else prefix
        backlog = self.backlog_until[c] - now
        m = self.model
        ttft = (
            (backlog if backlog > 0 else 0.0)
            + m.prefill_overhead_s
            + m.prefill_s_per_token * (prompt - hit)
        )
        return hit, ttft

    def route(self, i: int, key: int, prompt: int, prefix: int, output: int, now: float) -> int:
        c1, c2 = self._candidates(key)
        h1, t1 = self._estimate(c1, key, prompt, prefix, now)
        h2, t2 = self._estimate(c2, key, prompt, prefix, now)
        first = h1 > h2 or (h1 == h2 and t1 <= t2)
        a, ta, b, tb = (c1, t1, c2, t2) if first else (c2, t2, c1, t1)
        d = a if ta <= self.slo or ta <= tb else b
        self.inflight[d] += 1
        self._remember(d, key, prompt, (h1 if d == c1 else h2), now)
        return d

    def _remember(self, d: int, key: int, prompt: int, hit: int, now: float) -> None:
        m = self.model
        self.backlog_until[d] = max(self.backlog_until[d], now) + m.prefill_seconds(prompt - hit)
        lru = self.sent[d]
        self.sent_tokens[d] += prompt - lru.pop(key, 0)
        lru[key] = prompt
        while self.sent_tokens[d] > self.capacity and lru:
            self.sent_tokens[d] -= lru.popitem(last=False)[1]

    def finished(self, i: int, dest: int, now: float) -> None:
        self.inflight[dest] -= 1

    def control(self, now: float, window_keys: np.ndarray, window_s: float) -> None:
        return None


def dualmap_like(ttft_slo_s: float = 2.0) -> PolicyFactory:
    def build(ctx: PolicyContext) -> Policy:
        return DualMapLike(ctx, ttft_slo_s=ttft_slo_s)

    return build
