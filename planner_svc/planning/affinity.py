"""How much affinity can win on this traffic: the served hit rate it predicts against Flat-LB's,
from per-key rates and sizes alone (pure).

The eviction window of an LRU cache of C tokens is its characteristic time T (Che's
approximation): the T at which the keys touched within T fill the cache,
Σ_b s_b·(1 − exp(−λ_b·T)) = C, with λ_b the key's rate *at that cache* and s_b its prompt
size. Under a cache-blind balancer each of the R replicas sees every key at λ_b / R; under
affinity the R caches split the keys, so T solves the same equation fleet-wide with R·C.
A key's request finds its prefix warm with probability 1 − exp(−λ·T) (its rate at that
cache), and what it can find is its reusable prefix P_b, so the predicted served hit rate is

    h = Σ_b λ_b·P_b·(1 − exp(−λ'_b·T)) / Σ_b λ_b·s_b.

A key can hold more than one piece of content: a tenant's system prompt is shared by all its
conversations, but each conversation's history is cached only where its last turn went.
Under Flat-LB the next turn lands there one time in R, so of a prefix P_b = S_b + H_b
(shared part, history) Flat-LB recovers S_b and H_b / R at the key's warm probability.
Without that split, a tenant looked as warm under Flat-LB as under affinity, and the arena's
whale run (one tenant a third of the traffic) was predicted 9.5 pp, fell back below the
10-pp floor and served 69-71 % where planning serves 87-90 % (round robin: 75 %).

The gain (affinity − Flat-LB, a fraction of prompt tokens) does not depend on how traffic is
routed now, so the guard can read it in either mode. Where it is small, pinning keys costs
more balance than the prefill it saves (the low-reuse replay: a 5.7-point gain, and planned
routing 22 % below Flat-LB's capacity; docs/replay.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike


def characteristic_time(rates: np.ndarray, sizes: np.ndarray, capacity: float) -> float:
    """Che's T for an LRU of `capacity` tokens; inf if every key fits."""
    if float(sizes.sum()) <= capacity:
        return float("inf")
    lo, hi = 0.0, 1.0
    while float(np.dot(sizes, -np.expm1(-rates * hi))) < capacity and hi < 1e12:
        hi *= 2.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if float(np.dot(sizes, -np.expm1(-rates * mid))) < capacity:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


# The share of requests whose keys must have a reported reusable prefix before the fleet's
# gain is judged at all.
KNOWN_SHARE_MIN = 0.5


# Where Flat-LB is predicted to keep at least this share of what affinity would, the
# prediction rests on the one thing the model cannot see: it sizes a key's content as one
# prompt, warm everywhere once it is cached everywhere. A tenant's conversations are many
# pieces of content, each warm only where its last turn went, which Flat-LB scatters. On the
# arena's 48 tenants the model predicted 0.0-0.7 pp where affinity served 85 % against round
# robin's 73 %; the replayed scenarios it judges keep at most 71 % (whales: 0.62-0.68 of
# 0.95, their conversations' histories counted apart: `shared_tokens`).
FLAT_BLIND_SHARE = 0.9


@dataclass(frozen=True, slots=True)
class AffinityGain:
    """Predicted served hit rates (fractions of prompt tokens) and their inputs' summary."""

    hit_flat: float
    hit_affinity: float
    reusable_share: float  # Σ λ·P / Σ λ·s: what affinity could recover at best
    # Every active key's prompt fits one cache: Flat-LB evicts nothing in the model
    flat_fits: bool = False

    @property
    def gain(self) -> float:
        return self.hit_affinity - self.hit_flat

    @property
    def blind(self) -> bool:
        """The model cannot tell Flat-LB from affinity here (`FLAT_BLIND_SHARE`)."""
        return self.flat_fits or (self.hit_affinity > 0
                                  and self.hit_flat >= FLAT_BLIND_SHARE * self.hit_affinity)

    @property
    def judged_gain(self) -> float:
        """What the guard compares with its floor: the gain, or where the model is blind its
        bound (affinity's own predicted hit rate, as if Flat-LB recovered nothing), so that
        only traffic with too little reuse for any routing to win falls back there."""
        return self.hit_affinity if self.blind else self.gain


def predicted_gain(rates: np.ndarray, prefix_tokens: np.ndarray, prompt_tokens: np.ndarray,
                   n_destinations: int, cache_tokens_per_destination: float,
                   known: np.ndarray | None = None,
                   shared_tokens: np.ndarray | None = None) -> AffinityGain:
    """The module's prediction for keys at `rates` (req/s) with mean reusable prefixes and mean
    prompts (tokens) on `n_destinations` caches of the given size. Prefixes are clipped to
    their prompts; keys with no rate or no prompt count for nothing. `known` (default: all)
    marks the keys whose prefix was measured: the others fill the caches but are left out of
    the hit rates, since 0 tokens there means "not reported", not "nothing to reuse".

    `shared_tokens` (default: the whole prefix) is the part of each key's mean prefix that
    every request of the key shares (the system prompt its routing key covers); the rest is
    a conversation's own history, cached only where its previous turn went. Affinity keeps a
    conversation on its key's destination; Flat-LB sends the next turn there one time in R,
    so it finds the history with 1/R of the key's warm probability."""
    lam = np.asarray(rates, np.float64)
    size = np.asarray(prompt_tokens, np.float64)
    ok = (lam > 0) & (size > 0) & np.isfinite(lam) & np.isfinite(size)
    lam, size = lam[ok], size[ok]
    prefix = np.clip(np.nan_to_num(np.asarray(prefix_tokens, np.float64)[ok]), 0.0, size)
    seen = np.ones(len(lam), bool) if known is None else np.asarray(known, bool)[ok]
    # Every key takes cache space; only keys whose prefix is known count in the hit rates.
    work = float(np.dot(lam[seen], size[seen]))
    flat_fits = float(size.sum()) <= cache_tokens_per_destination  # Che's T is infinite
    if work <= 0 or n_destinations < 1 or not cache_tokens_per_destination > 0:
        return AffinityGain(0.0, 0.0, 0.0, flat_fits)
    r = float(n_destinations)
    t_flat = characteristic_time(lam / r, size, cache_tokens_per_destination)
    t_aff = characteristic_time(lam, size, cache_tokens_per_destination * r)
    warm_flat = 1.0 if np.isinf(t_flat) else -np.expm1(-lam / r * t_flat)
    warm_aff = 1.0 if np.isinf(t_aff) else -np.expm1(-lam * t_aff)
    saved = np.where(seen, lam * prefix, 0.0)
    if shared_tokens is None:
        saved_flat = saved
    else:
        shared = np.minimum(np.clip(np.nan_to_num(
            np.asarray(shared_tokens, np.float64)[ok]), 0.0, None), prefix)
        saved_flat = np.where(seen, lam * (shared + (prefix - shared) / r), 0.0)
    return AffinityGain(
        hit_flat=float(np.sum(saved_flat * warm_flat)) / work,
        hit_affinity=float(np.sum(saved * warm_aff)) / work,
        reusable_share=float(saved.sum()) / work,
        flat_fits=flat_fits,
    )


def reusable_prefix(reported_tokens: ArrayLike, cached_tokens: ArrayLike,
                    requests: ArrayLike) -> np.ndarray:
    """Per key, the reusable prefix the guard judges: what the routers reported (the part of
    the prompt its key covers) or, where more, what the engines served each of its
    `requests` from cache (`cached_tokens` is their sum: a conversation's history, a key
    named by a header). `fleet_gain` takes the reported part as the shared one: the rest is
    history Flat-LB finds one time in R."""
    n = np.asarray(requests, np.float64)
    cached = np.zeros(len(n))
    np.divide(np.asarray(cached_tokens, np.float64), n, out=cached, where=n > 0)
    return np.maximum(np.nan_to_num(np.asarray(reported_tokens, np.float64)),
                      np.nan_to_num(cached))


def fleet_gain(rates: np.ndarray, prefix_tokens: np.ndarray, prompt_tokens: np.ndarray,
               requests: np.ndarray, n_destinations: int,
               warm_slots_per_destination: int,
               shared_tokens: np.ndarray | None = None) -> AffinityGain | None:
    """`predicted_gain` for a fleet planned with W warm slots per destination: each cache
    holds W x the mean prompt (W is how many keys' prompts one destination holds; the replay
    calibrates W as cache tokens / mean prompt). Per key: its rate, mean reusable prefix and
    mean prompt, and its requests (the weights of the mean); `shared_tokens` as for
    `predicted_gain`.

    A prefix of 0 is "not reported" (a key named by a header, a router that does not derive
    prefixes): such keys fill the caches but are not judged. None (no verdict: the guard
    lets the plan stand) with no prompt measured, or when the keys with a reported prefix
    carry less than `KNOWN_SHARE_MIN` of the requests: the guard does not judge traffic it
    cannot see. Where the model predicts Flat-LB nearly as warm as affinity it is blind
    rather than pessimistic (`AffinityGain.blind`); the guard judges `judged_gain` there.
    Before that rule the guard served Flat-LB on the arena's 48 tenants (0.0-0.7 pp
    predicted) at 66-74 % hit against round robin's 73 % and SGLang cache_aware's 89 %."""
    n = np.asarray(requests, np.float64)
    prompt = np.asarray(prompt_tokens, np.float64)
    prefix = np.nan_to_num(np.asarray(prefix_tokens, np.float64))
    total = float(n.sum())
    if total <= 0 or n_destinations < 1 or warm_slots_per_destination < 1:
        return None
    mean_prompt = float(np.dot(n, np.nan_to_num(prompt))) / total
    known = prefix > 0
    if not mean_prompt > 0 or float(n[known].sum()) < KNOWN_SHARE_MIN * total:
        return None
    return predicted_gain(rates, prefix, prompt, n_destinations,
                          warm_slots_per_destination * mean_prompt, known, shared_tokens)
