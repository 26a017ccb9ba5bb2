"""The eviction window measured from the router's own traffic (pure).

Idle re-homing (`RouterCore.idle_rehome_s`) needs the time a key's prefix stays in its home's
cache once the key goes quiet. Computed from a cache model (Che's characteristic time over the
fleet's cache), it comes out too long wherever a key's content is more than one prompt or
re-homed keys leave dead copies behind: on the wide-active-set replay at 80 QPS a key returning
home after 0.5-0.6 x Che's time finds its prefix cached every time, after 0.8-0.9 x 2 % of the
time; the warm share crosses one half at 0.71 x (bench/rehome_window.py). With the window at
Che's time keys go home to recompute (p99 3.07 s); learned, the window settles at 0.69 x and
keys past it are re-homed to the least-busy destination (p99 2.50 s, hit 67.6 against 67.5 %).

The router sees exactly this cliff: a key routed home after an idle gap either finds its
prefix cached (`usage.prompt_tokens_details.cached_tokens`) or not. `EvictionWindow` keeps
those outcomes per gap in log-spaced bins and puts the window at the gap that separates hits
from misses with the fewest errors (each error is a recompute: a miss kept home, or a hit sent
away). Outcomes only exist below the window in use (beyond it keys are re-homed), so a share
of the returns between one and two windows is sent home anyway (`probe_share`), weighted by its
inverse so that both sides count alike; that lets the window grow when the caches do. Old
outcomes fade by halving every `memory` outcomes, so a fleet whose caches shrink or grow moves
the window within a few thousand returns; it moves by at most 25 % per refresh.

The gap is counted from when the key's prefix was last touched at its home (its last request
there finished: `RouterCore.key_finished`), and a return while an earlier request of the key is
still open there teaches nothing: its prefix may not be written yet. Counted from arrivals, an
overloaded fleet's queued requests looked like evictions at short gaps; the window collapsed,
and the bulk re-homing that followed overloaded the fleet further (the wide-active-set replay
lost its capacity past 95 QPS that way; docs/replay.md).
"""

from __future__ import annotations

import math

# Log-spaced gap bins from MIN_GAP_S to MAX_GAP_S: 12 per doubling (6 % apart).
MIN_GAP_S = 0.1
MAX_GAP_S = 100_000.0
BINS_PER_DOUBLING = 12
N_BINS = math.ceil(math.log2(MAX_GAP_S / MIN_GAP_S) * BINS_PER_DOUBLING)
# The most the window moves per refresh, either way, and the least it can be.
MAX_STEP = 1.25
MIN_WINDOW_S = 1.0
# A reusable prefix shorter than this (two 16-token blocks) cannot show whether it was cached.
MIN_PREFIX_TOKENS = 32


def prefix_hit(cached_tokens: int, prefix_tokens: int) -> bool | None:
    """Whether a request found its reusable prefix cached: at least half of it served from
    cache (block rounding and a partly evicted tail still count as found). None when the
    prefix is too short to read (under `MIN_PREFIX_TOKENS`: engines cache whole blocks, so a
    short prefix reads as a miss wherever it is): nothing to learn from."""
    if prefix_tokens < MIN_PREFIX_TOKENS:
        return None
    return cached_tokens * 2 >= prefix_tokens


def _bin(gap_s: float) -> int:
    if not gap_s > MIN_GAP_S:  # also NaN
        return 0
    return min(N_BINS - 1, int(math.log2(gap_s / MIN_GAP_S) * BINS_PER_DOUBLING))


def _edge(index: int) -> float:
    """The lower edge of bin `index` (seconds)."""
    return MIN_GAP_S * 2.0 ** (index / BINS_PER_DOUBLING)


class EvictionWindow:
    """Learns the idle gap after which a returning key's prefix is no longer cached."""

    __slots__ = ("_count", "_hits", "_misses", "_seen", "_since", "memory", "min_outcomes",
                 "probe_share", "refresh_every", "window_s")

    def __init__(self, window_s: float, *, probe_share: float = 0.05,
                 min_outcomes: int = 200, memory: int = 20_000,
                 refresh_every: int = 64) -> None:
        if not window_s > 0 or not math.isfinite(window_s):
            raise ValueError(f"the starting window must be a positive number of seconds, "
                             f"not {window_s!r}")
        if not 0.0 < probe_share < 1.0:
            raise ValueError(f"probe_share must be in (0, 1), not {probe_share!r}")
        self.window_s = float(window_s)  # the window in use
        self.probe_share = probe_share
        self.min_outcomes = max(1, min_outcomes)
        self.memory = max(self.min_outcomes, memory)
        self.refresh_every = max(1, refresh_every)
        self._hits = [0.0] * N_BINS
        self._misses = [0.0] * N_BINS
        self._seen = 0  # outcomes since the last halving
        self._count = 0.0  # outcomes, unweighted (and faded alike): what `min_outcomes` counts
        self._since = 0  # outcomes since the window was last recomputed

    @property
    def outcomes(self) -> float:
        """The (faded, weighted) outcomes the window rests on."""
        return sum(self._hits) + sum(self._misses)

    def weight(self, gap_s: float) -> float:
        """The weight a return after `gap_s` carries: 1 within the window, the probes'
        inverse share beyond it (only a probe goes home from there)."""
        return 1.0 if gap_s <= self.window_s else 1.0 / self.probe_share

    def observe(self, gap_s: float, hit: bool, weight: float = 1.0) -> None:
        """A key routed home after `gap_s` idle found its prefix cached there (`hit`) or
        not. `weight`: `weight(gap_s)` when it was routed (the window may have moved)."""
        if not (gap_s >= 0 and math.isfinite(gap_s) and 0 < weight <= 1e6):
            return  # a caller's bad figure teaches nothing
        (self._hits if hit else self._misses)[_bin(gap_s)] += weight
        self._count += 1.0
        self._seen += 1
        if self._seen >= self.memory:
            self._seen = 0
            self._count *= 0.5
            self._hits = [h * 0.5 for h in self._hits]
            self._misses = [m * 0.5 for m in self._misses]
        self._since += 1
        if self._since >= self.refresh_every:
            self._since = 0
            self._refresh()

    def _refresh(self) -> None:
        hits, misses = self._hits, self._misses
        if self._count < self.min_outcomes or not any(hits):
            # Too little evidence, or no return ever found its prefix: an engine that does
            # not report cached tokens (vLLM without prompt-token details) reads as all
            # misses, and that says nothing about evictions.
            return
        # errors[j]: with the window at bin j's lower edge, the misses below it (kept home,
        # recomputed) plus the hits at or above it (sent away from a warm cache).
        errors = [sum(hits)]
        for j in range(N_BINS):
            errors.append(errors[-1] + misses[j] - hits[j])
        fewest = min(errors)
        tied = [j for j, e in enumerate(errors) if e <= fewest + 1e-9]
        current = min(N_BINS, _bin(self.window_s) + 1)
        if tied[0] <= current <= tied[-1] and errors[current] <= fewest + 1e-9:
            return  # the window in use already errs least: no evidence to move it
        best = tied[len(tied) // 2]  # the middle of cuts that err alike, not the lowest
        if best >= N_BINS or not any(misses[best:]):
            # No miss beyond the cut: every return observed was warm. The window may grow
            # to the longest gap seen warm (the probes reach at most twice the window).
            last = max((j for j in range(N_BINS) if hits[j] > 0), default=-1)
            if last < 0:
                return
            self._move_to(max(self.window_s, _edge(last + 1)))
            return
        self._move_to(_edge(best))

    def _move_to(self, target: float) -> None:
        # A step at a time: the routing this window decides changes the traffic it learns
        # from (a window cut short re-homes keys in bulk, each a cold prefill), so a sudden
        # jump on early, thin evidence could feed on itself.
        self.window_s = max(MIN_WINDOW_S, min(self.window_s * MAX_STEP,
                                              max(self.window_s / MAX_STEP, target)))
