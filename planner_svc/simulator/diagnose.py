"""A cheap win / tie / lose prediction for CacheRoute (and affinity routing), from a trace alone.

The statistic the paper's notes ask for: the fraction of requests whose key reappears within
the eviction window. The eviction window of an LRU cache of C tokens is its characteristic
time T (Che's approximation): the T at which the keys touched within T fill the cache,
Σ_b s_b·(1 − exp(−λ_b·T)) = C, with λ_b the key's rate *at that cache* and s_b its prompt
size. Under a cache-blind balancer each replica sees every key at λ_b / R; under affinity the
R caches split the keys, so T solves the same equation cluster-wide with capacity R·C.

From the trace (measured gaps, not the model): a request is reusable under affinity if its
key's previous request came within T_affinity; under Flat-LB, with n same-key requests in
the last T_flat, the chance one of them went to the same replica is 1 − (1 − 1/R)^n. Both are
weighted by the request's reusable prefix tokens, giving predicted served hit rates. The
verdict is CacheRoute's as it would run: its top R x W keys recover as under affinity, the
rest as under Flat-LB; win if that recovers ≥ 15 pp more prompt tokens than Flat-LB, lose if
< 5 pp (too little prefix work to pay for the imbalance affinity brings), tie between; and a
tie whenever the product's guard would serve Flat-LB (its floor on the predicted affinity gain,
`planning.affinity.fleet_gain`, the planner's default 10 pp).

How sure: a trace is a sample, and a short one can carry a verdict that a longer one of the
same traffic flips. The gain is re-estimated on bootstrap resamples of the trace's *keys*
(requests of one key are not independent: a key is the unit that repeats), and the verdict
stands only when at least `CONFIDENCE` of the resamples agree with it; otherwise it is
"undecided", with the interval and the advice to record more.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner_svc.control.guard import DEFAULT_AFFINITY_GAIN_MIN
from planner_svc.planning.affinity import characteristic_time, fleet_gain
from planner_svc.simulator.workload import Workload

WIN_GAIN, LOSE_GAIN = 0.15, 0.05
# Where at least this share of a trace's repeat requests come back to a key whose prefix its
# home has evicted by then (idle longer than the affinity window), placing those by load
# instead of sending them home pays: the advice is the gateway's idle re-homing. Wide active
# set 21 %, paper-like, shared system prompts and whales under 1 % (docs/results/diagnose.md).
REHOME_ADVICE_SHARE = 0.10
CONFIDENCE = 0.9  # share of bootstrap resamples that must agree with a verdict
BOOTSTRAP_DRAWS = 400


@dataclass(frozen=True)
class Diagnosis:
    verdict: str  # "win", "tie" or "lose"
    requests: int
    keys: int
    offered_qps: float
    recoverable_share: float  # Σ reusable prefix / Σ prompt tokens
    eviction_window_flat_s: float
    eviction_window_affinity_s: float
    reuse_within_window: float  # request share whose key reappears within T_affinity
    predicted_hit_flat: float
    predicted_hit_affinity: float
    hottest_key_share: float
    gain_interval: tuple[float, float] = (0.0, 0.0)  # 5th and 95th percentile, bootstrap
    confidence: float = 1.0  # share of resamples whose verdict is the point estimate's
    point_verdict: str = ""  # the verdict of the whole trace, before the confidence check
    # CacheRoute as it would run: W warm slots per destination (the top R x W keys admitted,
    # the rest served as by Flat-LB), and the guard's floor on affinity's predicted gain.
    warm_slots_per_destination: int = 0
    admitted_keys: int = 0
    predicted_hit_cacheroute: float = 0.0
    guard_gain: float | None = None  # planning.affinity.fleet_gain on the trace
    falls_back: bool = False  # the guard would serve Flat-LB: CacheRoute ties it
    # Of the requests whose key came before, the share idle longer than the affinity window.
    returns_after_window: float = 0.0

    @property
    def rehome_advice(self) -> str | None:
        """The gateway settings for a trace where many keys come back to an evicted home."""
        if self.falls_back or self.returns_after_window < REHOME_ADVICE_SHARE:
            return None
        return (f"{self.returns_after_window:.0%} of repeat requests come back after their "
                f"home's eviction window: keep the gateway's idle re-homing on (the default; "
                f"--idle-rehome-s {max(1.0, self.eviction_window_affinity_s):.0f} starts its "
                f"learned window here). It pauses while several gateways share a plan: behind "
                f"a front that keeps each key on one gateway, add --idle-rehome-with-peers "
                f"(docs/gateway.md, idle re-homing)")

    @property
    def gain(self) -> float:
        """CacheRoute's predicted gain over Flat-LB (0 where its guard falls back)."""
        return self.predicted_hit_cacheroute - self.predicted_hit_flat

    @property
    def affinity_gain(self) -> float:
        return self.predicted_hit_affinity - self.predicted_hit_flat

    def evidence(self, n_destinations: int) -> list[str]:
        return [
            f"{self.requests} requests over {self.keys} keys at {self.offered_qps:.1f} req/s",
            f"recoverable prefix work: {self.recoverable_share:.1%} of prompt tokens",
            f"eviction window: {self.eviction_window_flat_s:.1f} s per replica under Flat-LB, "
            f"{self.eviction_window_affinity_s:.1f} s under affinity",
            f"requests whose key reappears within the affinity window: "
            f"{self.reuse_within_window:.1%}",
            f"predicted served hit rate: Flat-LB {self.predicted_hit_flat:.1%}, "
            f"affinity on every key {self.predicted_hit_affinity:.1%} "
            f"(gain {self.affinity_gain * 100:+.1f} pp), CacheRoute "
            f"{self.predicted_hit_cacheroute:.1%} (W = {self.warm_slots_per_destination}: "
            f"{self.admitted_keys} keys admitted; gain {self.gain * 100:+.1f} pp)",
            "guard: " + ("no verdict on the gain (prefixes not reported)"
                         if self.guard_gain is None else
                         f"predicted affinity gain {self.guard_gain * 100:.1f} pp, "
                         + ("below the floor: CacheRoute serves Flat-LB (a tie)"
                            if self.falls_back else "above the floor: CacheRoute plans")),
            f"hottest key: {self.hottest_key_share:.2%} of requests "
            f"(one replica's fair share is {1 / n_destinations:.2%})",
            f"confidence: {self.confidence:.0%} of {BOOTSTRAP_DRAWS} resamples of the keys "
            f"give '{self.point_verdict}'; gain 90 % interval "
            f"{self.gain_interval[0] * 100:+.1f} to {self.gain_interval[1] * 100:+.1f} pp"
            + ("" if self.verdict != "undecided" else
               f" (below {CONFIDENCE:.0%}: record a longer trace)"),
            f"repeat requests idle longer than the affinity window: "
            f"{self.returns_after_window:.1%}",
        ] + ([f"advice: {self.rehome_advice}"] if self.rehome_advice else [])


def recent_counts(key: np.ndarray, t: np.ndarray, window_s: float) -> np.ndarray:
    """For each request, how many earlier requests of its key arrived within `window_s`."""
    t_range = float(t.max() - t.min()) if len(t) else 0.0
    window = min(window_s, t_range + 1.0)
    span = t_range + window + 1.0  # keys are spread this far apart on one axis
    code = key.astype(np.float64) * span + (t - t.min())
    order = np.argsort(code, kind="stable")
    sorted_code = code[order]
    first = np.searchsorted(sorted_code, sorted_code - window, side="left")
    counts = np.empty(len(key), np.int64)
    counts[order] = np.arange(len(key)) - first
    return counts


def verdict_of(gain: float | np.ndarray) -> np.ndarray:
    """"win" / "tie" / "lose" per gain."""
    g = np.asarray(gain)
    return np.where(g >= WIN_GAIN, "win", np.where(g < LOSE_GAIN, "lose", "tie"))


def bootstrap_gains(recovered_affinity: np.ndarray, recovered_flat: np.ndarray,
                    prompt: np.ndarray, draws: int = BOOTSTRAP_DRAWS,
                    seed: int = 0) -> np.ndarray:
    """The gain on `draws` resamples of the keys (Poisson weights, one per key and draw):
    per key, the prefix tokens affinity and Flat-LB recover and its prompt tokens."""
    rng = np.random.default_rng(seed)
    diff = (recovered_affinity - recovered_flat).astype(np.float64)
    out = np.empty(draws)
    step = max(1, 4_000_000 // max(1, len(diff)))  # bound the weight matrix to ~16 MB
    for lo in range(0, draws, step):
        n = min(step, draws - lo)
        weights = rng.poisson(1.0, (n, len(diff))).astype(np.float32)
        total = weights @ prompt.astype(np.float32)
        out[lo:lo + n] = np.divide(weights @ diff.astype(np.float32), total,
                                   out=np.zeros(n), where=total > 0)
    return out


def diagnose(w: Workload, n_destinations: int, cache_capacity_tokens: int,
             warm_slots_per_destination: int | None = None,
             affinity_gain_min: float | None = DEFAULT_AFFINITY_GAIN_MIN) -> Diagnosis:
    """Predict whether CacheRoute wins on `w` with R destinations of the given cache size:
    W warm slots per destination (default: the replay's calibration, cache / mean prompt),
    so the top R x W keys are planned and the rest served as Flat-LB serves them, and the
    guard's floor on affinity's predicted gain (below it CacheRoute serves Flat-LB: a tie).
    Affinity on every key is reported beside it."""
    duration = max(float(w.t[-1] - w.t[0]), 1e-9)
    n_keys = len(w.keys)
    counts = np.bincount(w.key, minlength=n_keys).astype(np.float64)
    sizes = np.bincount(w.key, weights=w.prompt, minlength=n_keys) / np.maximum(counts, 1)
    rates = counts / duration
    t_flat = characteristic_time(rates / n_destinations, sizes, cache_capacity_tokens)
    t_aff = characteristic_time(rates, sizes, cache_capacity_tokens * n_destinations)
    prefix, prompt = w.prefix.astype(np.float64), float(w.prompt.sum())
    aff_reuse = recent_counts(w.key, w.t, t_aff) > 0
    repeat = np.ones(len(w.key), bool)  # the key came before: all but each key's first
    repeat[np.unique(w.key, return_index=True)[1]] = False
    n_flat = recent_counts(w.key, w.t, t_flat)
    p_flat = 1.0 - (1.0 - 1.0 / n_destinations) ** n_flat
    hit_aff = float(prefix[aff_reuse].sum() / prompt)
    hit_flat = float(np.dot(prefix, p_flat) / prompt)
    slots = warm_slots_per_destination or max(1, int(cache_capacity_tokens
                                                     / max(1.0, float(w.prompt.mean()))))
    admitted = np.zeros(n_keys, bool)
    admitted[np.argsort(-counts, kind="stable")[:min(int((counts > 0).sum()),
                                                     slots * n_destinations)]] = True
    planned = admitted[w.key]
    # what each key's routing key covers (its system prompt), as a gateway reports it
    shared = (None if w.system is None else np.bincount(
        w.key, weights=np.minimum(np.asarray(w.system, np.float64)[w.key], prefix),
        minlength=n_keys) / np.maximum(counts, 1))
    guard = fleet_gain(rates, np.bincount(w.key, weights=prefix, minlength=n_keys)
                       / np.maximum(counts, 1), sizes, counts, n_destinations, slots,
                       shared_tokens=shared)
    falls_back = (affinity_gain_min is not None and guard is not None
                  and guard.judged_gain < affinity_gain_min)
    recovered_flat = prefix * p_flat
    recovered_cr = (recovered_flat if falls_back
                    else np.where(planned, np.where(aff_reuse, prefix, 0.0), recovered_flat))
    hit_cr = float(recovered_cr.sum() / prompt)
    point = "tie" if falls_back else str(verdict_of(hit_cr - hit_flat))
    gains = bootstrap_gains(
        np.bincount(w.key, weights=recovered_cr, minlength=n_keys),
        np.bincount(w.key, weights=recovered_flat, minlength=n_keys),
        np.bincount(w.key, weights=w.prompt.astype(np.float64), minlength=n_keys))
    # Where the guard falls back the answer is the product's rule, not a sample's estimate.
    confidence = 1.0 if falls_back else float((verdict_of(gains) == point).mean())
    return Diagnosis(
        warm_slots_per_destination=slots,
        admitted_keys=int(admitted.sum()),
        predicted_hit_cacheroute=hit_cr,
        guard_gain=None if guard is None else guard.judged_gain,
        falls_back=falls_back,
        verdict=point if confidence >= CONFIDENCE else "undecided",
        point_verdict=point,
        confidence=confidence,
        gain_interval=(float(np.quantile(gains, 0.05)), float(np.quantile(gains, 0.95))),
        requests=len(w),
        keys=int((counts > 0).sum()),
        offered_qps=len(w) / duration,
        recoverable_share=float(prefix.sum() / prompt),
        eviction_window_flat_s=t_flat,
        eviction_window_affinity_s=t_aff,
        reuse_within_window=float(aff_reuse.mean()),
        returns_after_window=float((repeat & ~aff_reuse).sum() / max(1, int(repeat.sum()))),
        predicted_hit_flat=hit_flat,
        predicted_hit_affinity=hit_aff,
        hottest_key_share=float(counts.max() / len(w)),
    )
