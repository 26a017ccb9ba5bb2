"""Arrival processes: absolute arrival times for an offered load, from an explicit Generator.

- `poisson`: exponential inter-arrivals (CV = 1).
- `gamma`: gamma inter-arrivals with a chosen coefficient of variation (the paper's bursty
  case is CV = 1.9); shape 1/CV², mean 1/rate.
- `block_bootstrap`: blocks of recorded inter-arrival times drawn with replacement, keeping
  the short-range correlation of the recording, rescaled to the requested mean rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class ArrivalSpec:
    """Which process: `kind` in {"poisson", "gamma", "bootstrap"}."""

    kind: str = "poisson"
    cv: float = 1.0
    recorded_gaps_s: tuple[float, ...] = ()
    block: int = 64

    def times(self, rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` arrival times starting near 0 at mean `rate` per second."""
        if self.kind == "poisson":
            return poisson(rate, n, rng)
        if self.kind == "gamma":
            return gamma(rate, self.cv, n, rng)
        if self.kind == "bootstrap":
            return block_bootstrap(self.recorded_gaps_s, rate, n, rng, block=self.block)
        raise ValueError(f"unknown arrival process {self.kind!r}")

    def label(self) -> str:
        if self.kind == "gamma":
            return f"gamma CV={self.cv:g}"
        if self.kind == "bootstrap":
            return f"bootstrap of {len(self.recorded_gaps_s)} gaps"
        return self.kind


def poisson(rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
    _check(rate, n)
    return np.cumsum(rng.exponential(1.0 / rate, n))


def gamma(rate: float, cv: float, n: int, rng: np.random.Generator) -> np.ndarray:
    _check(rate, n)
    if cv <= 0:
        raise ValueError("cv must be > 0")
    shape = 1.0 / (cv * cv)
    return np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), n))


def block_bootstrap(
    gaps_s: Sequence[float] | np.ndarray,
    rate: float,
    n: int,
    rng: np.random.Generator,
    *,
    block: int = 64,
) -> np.ndarray:
    """Concatenate random blocks of `block` consecutive recorded gaps; rescale to mean 1/rate."""
    _check(rate, n)
    gaps = np.asarray(gaps_s, np.float64)
    gaps = gaps[gaps >= 0]
    if len(gaps) < 2:
        raise ValueError("block bootstrap needs at least two recorded inter-arrival times")
    block = max(1, min(block, len(gaps)))
    starts = rng.integers(0, len(gaps) - block + 1, size=-(-n // block))
    idx = (starts[:, None] + np.arange(block)[None, :]).ravel()[:n]
    drawn = gaps[idx]
    mean = float(drawn.mean()) or 1.0
    return np.cumsum(drawn * (1.0 / (rate * mean)))


def gaps_cv(times: np.ndarray) -> float:
    """Coefficient of variation of the inter-arrival times of sorted `times`."""
    gaps = np.diff(np.asarray(times, np.float64))
    return float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else 0.0


def _check(rate: float, n: int) -> None:
    if rate <= 0:
        raise ValueError("rate must be > 0")
    if n < 0:
        raise ValueError("n must be >= 0")
