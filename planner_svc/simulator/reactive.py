"""Reactive cache-aware baselines: SGLang `cache_aware` and a DualMap-like reconstruction.

Prompts in the simulator are described by lengths, not token ids: a request of key b
shares exactly its reusable prefix with the key's earlier prompts and nothing with other
keys. A radix tree over such prompts degenerates into one chain per key, so "the longest
prefix match on tenant d" is min(tokens of b's last prompt inserted for d, this request's
reusable prefix). That is what these policies learn and match on: router-side estimates
from their own traffic, as a real router has (no policy reads an engine's state).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from planner_svc.simulator.hashring import HashRing
from planner_svc.simulator.policies import Policy, PolicyContext, PolicyFactory, _KeyOwners

CHARS_PER_TOKEN = 4


class SGLangCacheAware:
    """sgl-router `cache_aware`: global least-load when imbalanced, else the tenant with the
    longest prefix match if it covers > `cache_threshold` of the prompt, else the tenant with
    the smallest tree. Each router learns only from what it routed; the tree is LRU-trimmed
    per tenant to `max_tree_size` characters every `eviction_interval_s`. CLI defaults."""

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
        self.learned: dict[int, dict[int, int]] = {}  # key -> tenant -> tokens
        self.tenant_lru: list[OrderedDict[int, int]] = [OrderedDict() for _ in range(self.n)]
        self.tenant_tokens = [0] * self.n
        self.threshold = cache_threshold
        self.abs_thr, self.rel_thr = balance_abs_threshold, balance_rel_threshold
        self.evict_every = eviction_interval_s
        self.max_tokens = max_tree_size // CHARS_PER_TOKEN
        self.next_evict = eviction_interval_s

    def route(self, i: int, key: int, prompt: int, prefix: int, output: int, now: float) -> int:
        if now >= self.next_evict:
            self._evict()
            self.next_evict = now + self.evict_every
        loads = self.inflight
        mx, mn = max(loads), min(loads)
        if mx - mn > self.abs_thr and mx > self.rel_thr * mn:
            d = loads.index(mn)
        else:
            d = self._by_prefix(key, prompt, prefix)
        self._insert(key, d, prompt)
        loads[d] += 1
        return d

    def _by_prefix(self, key: int, prompt: int, prefix: int) -> int:
        best, matched = -1, 0
        for tenant, tokens in self.learned.get(key, {}).items():
            m = tokens if tokens < prefix else prefix
            if m > matched:
                best, matched = tenant, m
        if best >= 0 and matched / prompt > self.threshold:
            return best
        sizes = self.tenant_tokens
        return sizes.index(min(sizes))

    def _insert(self, key: int, d: int, prompt: int) -> None:
        per_key = self.learned.setdefault(key, {})
        self.tenant_tokens[d] += prompt - per_key.get(d, 0)
        per_key[d] = prompt
        lru = self.tenant_lru[d]
        lru[key] = prompt
        lru.move_to_end(key)

    def _evict(self) -> None:
        for d, lru in enumerate(self.tenant_lru):
            while self.tenant_tokens[d] > self.max_tokens and lru:
                key, tokens = lru.popitem(last=False)
                self.tenant_tokens[d] -= tokens
                del self.learned[key][d]

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
