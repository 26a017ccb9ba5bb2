"""Following the rewarm dip of an install, to learn what rewarm really costs.

After an install (or a resume from fallback) the served hit rate dips while new
destinations warm. The loop feeds each new telemetry window into a `Settling`
until the dip is over, then integrates the deficit

    measured dip = Σ_windows max(0, reference − hit) × prompt tokens/s × window gap,

with `reference` the hit rate expected without a dip (the last window before
the install plus the candidate's modelled gain), or, when there was no window
before, the settled window's own hit rate. measured / predicted is what
`RewarmFactor` learns.

A dip is over once it lasted at least its expected duration and the hit rate
stopped moving (two windows within a tolerance), or at the latest after
`max_settle_s`: drift keeps moving the hit rate, and the loop must not wait for
ever before acting again.

Pure data; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class InstallRecord:
    """One install and, once its dip settled, what the dip measured."""

    at_s: float
    predicted_tokens: float  # the rewarm formula, before the learned factor
    rewarm_cost: float  # what the loop priced it at (formula × factor)
    moved_traffic_share: float
    forced: bool = False
    measured_dip_tokens: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Settling:
    """A dip being followed: since when, what was predicted, the windows seen."""

    since_s: float
    predicted_tokens: float
    min_settle_s: float
    max_settle_s: float
    reference_hit: float | None = None
    samples: tuple[tuple[float, float, float], ...] = ()  # (window_end_s, hit, tokens/s)

    @property
    def measurable(self) -> bool:
        """Whether the samples can say how deep the dip was."""
        return self.reference_hit is not None or len(self.samples) >= 2

    def with_sample(self, window_end_s: float, hit: float, tokens_per_s: float) -> Settling:
        return replace(self, samples=(*self.samples, (window_end_s, hit, tokens_per_s)))

    def settled(self, tolerance: float) -> bool:
        """Long enough and flat (or past the longest wait)."""
        if not self.samples:
            return False
        elapsed = self.samples[-1][0] - self.since_s
        if elapsed >= self.max_settle_s:
            return True
        if len(self.samples) < 2 or elapsed < self.min_settle_s:
            return False
        return abs(self.samples[-1][1] - self.samples[-2][1]) <= tolerance

    def dip_tokens(self) -> float:
        """∫ (reference hit − hit) × prompt tokens/s dt over the windows of the dip."""
        reference = self.reference_hit
        if reference is None:
            reference = self.samples[-1][1]
        total, previous = 0.0, self.since_s
        for end_s, hit, tokens_per_s in self.samples:
            total += max(0.0, reference - hit) * tokens_per_s * max(0.0, end_s - previous)
            previous = end_s
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "since_s": self.since_s,
            "predicted_tokens": self.predicted_tokens,
            "min_settle_s": self.min_settle_s,
            "max_settle_s": self.max_settle_s,
            "reference_hit": self.reference_hit,
            "samples": [list(x) for x in self.samples],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Settling:
        samples = tuple((float(a), float(b), float(c)) for a, b, c in data["samples"])
        return cls(**{**data, "samples": samples})
