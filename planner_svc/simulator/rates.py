"""Synthetic per-key rate vectors shaped like the paper's workload, and their drift.

The paper's trace: 128,824 keys, Gini 0.756, ~4 % of keys carry ~47 % of requests, no key above
0.3 % of traffic. A lognormal with shape σ has Gini 2Φ(σ/√2) − 1, so σ ≈ 1.65 gives 0.756, and
its top 4 % carry ~46 % of the mass. Capping single keys at `max_share` (water-filling: clip,
renormalise, repeat) lowers the Gini a little, so σ is calibrated by bisection on the capped
sample's Gini. Pure: numpy only, randomness from an explicit seed or Generator.
"""

from __future__ import annotations

import math

import numpy as np

# Calibrating σ on this many draws is accurate to ~1e-3 in Gini and keeps 10 M-key vectors cheap.
_CALIBRATION_SAMPLE = 200_000


def gini(x: np.ndarray) -> float:
    """Gini coefficient of a non-negative vector (0 = all equal, → 1 = one key has everything)."""
    v = np.sort(np.asarray(x, np.float64).ravel())
    n = len(v)
    total = float(v.sum())
    if n == 0 or total <= 0.0:
        return 0.0
    ranks = np.arange(1, n + 1, dtype=np.float64)
    return float(2.0 * np.dot(ranks, v) / (n * total) - (n + 1) / n)


def cap_shares(weights: np.ndarray, max_share: float) -> np.ndarray:
    """Clip so no entry exceeds `max_share` of the (clipped) total; returns shares summing to 1.

    When `max_share · n < 1` the cap is infeasible and every key gets 1/n.
    """
    w = np.asarray(weights, np.float64)
    n = len(w)
    if n == 0:
        return w.copy()
    if max_share * n <= 1.0:
        return np.full(n, 1.0 / n)
    shares = w / w.sum()
    for _ in range(200):  # each round clips at least one more key; converges in a few rounds
        over = shares > max_share
        if not over.any():
            break
        free = ~over
        budget = 1.0 - max_share * over.sum()
        shares = np.where(over, max_share, shares * (budget / shares[free].sum()))
    return shares


def _capped_gini(z: np.ndarray, sigma: float, max_share: float) -> float:
    return gini(cap_shares(np.exp(sigma * z), max_share))


def _calibrate_sigma(z: np.ndarray, target: float, max_share: float) -> float:
    """Bisection on σ so that the capped sample's Gini matches `target` (monotone in σ)."""
    lo, hi = 0.0, 6.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if _capped_gini(z, mid, max_share) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _sample_max_share(n_keys: int, n_sample: int, max_share: float) -> float:
    # The cap binds on the same *fraction* of keys in the sample as in the full vector.
    return max_share * n_keys / n_sample


def paper_like_rates(
    n_keys: int,
    total_rate: float,
    *,
    gini: float = 0.756,
    max_share: float = 0.003,
    seed: int,
) -> np.ndarray:
    """Lognormal per-key rates (req/s) summing to `total_rate`, Gini ≈ `gini`, none > `max_share`.

    Keys are in random order (key 0 is not the hottest). Deterministic for a given seed.
    """
    if n_keys <= 0:
        return np.zeros(0, np.float64)
    if not 0.0 <= gini < 1.0:
        raise ValueError(f"gini must be in [0, 1), got {gini}")
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(n_keys)
    n_sample = min(n_keys, _CALIBRATION_SAMPLE)
    sample_cap = _sample_max_share(n_keys, n_sample, max_share)
    sigma = _calibrate_sigma(z[:n_sample], gini, sample_cap) if gini > 0 else 0.0
    return cap_shares(np.exp(sigma * z), max_share) * float(total_rate)


def lognormal_walk(rates: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """One control interval of drift: each rate times exp(σ·N(0,1) − σ²/2) (mean-preserving)."""
    r = np.asarray(rates, np.float64)
    return r * np.exp(sigma * rng.standard_normal(len(r)) - 0.5 * sigma * sigma)


def paper_like_keys(n: int) -> list[str]:
    """`n` distinct routing keys, `tenant-00000000` style, in index order."""
    width = max(8, len(str(max(n - 1, 0))))
    return [f"tenant-{i:0{width}d}" for i in range(n)]


def lognormal_gini(sigma: float) -> float:
    """Closed-form Gini of an (uncapped) lognormal with shape σ: 2Φ(σ/√2) − 1 = erf(σ/2)."""
    return math.erf(sigma / 2.0)
