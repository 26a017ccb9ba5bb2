"""q_cap found by trying: plan a step away from the value in use, keep the step if the
fleet's TTFT got better (pure).

Passive evidence (control.capacity) sees only what the traffic happens to show: a knee where
an engine saturates, served loads, loads that broke the TTFT target. On the arena's fleet it
does not find the q_cap that maximises SLO capacity: from twice that value the breaks stepped
the bound down to the [q/2, 2q] floor, which only lands on the optimum because the floor is
there (docs/engine-setup.md). Where capacity depends on q_cap at all, it does so through the
TTFT the fleet shows at the load it is offered: a q_cap too high leaves a hot key on one
engine and its queue breaks the target; one too low replicates keys into cold caches and
every turn pays for the prefill. The probe compares the two directly, as a hill climb on
the fleet's score:

- **base**: measure the score at the value in use for `measure_s` (after `settle_s`, so the
  plan built with it is installed and the caches it moved are warm again);
- **trial**: plan at `step` x the value (down) or its inverse (up), measure the same way;
  keep it if its score beats the base's by `margin` (and go on in that direction), else go
  back and try the other direction next;
- when both directions lost in a row, hold for `rest_s` and start over (traffic changes);
- a fleet well inside the target (score below `quiet`) has nothing to gain: no trials.

The score is the mean, over the destinations that served requests, of each one's TTFT p99 as
a share of the target, capped at `SCORE_CAP` (an engine past its histogram reports an
infinite p99; one engine's tail should not outweigh the fleet). Each phase re-measures its
base right before its trial, so a load that drifts between phases moves both.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

SCORE_CAP = 3.0  # a destination's TTFT p99 counts at most this many times the target


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    low: float  # the q_cap range the probe stays in (the operator's bounds)
    high: float
    step: float = 0.85  # a trial plans at step x the base (down) or base / step (up)
    settle_s: float = 16.0  # after a change, before its samples count
    measure_s: float = 32.0  # how long each phase samples
    margin: float = 0.1  # a trial must beat its base's score by this share
    quiet: float = 0.5  # a base scoring below this is left alone
    rest_s: float = 120.0  # after both directions lost

    def __post_init__(self) -> None:
        if not 0 < self.low <= self.high or not math.isfinite(self.high):
            raise ValueError(f"probe range must satisfy 0 < low <= high, got "
                             f"[{self.low}, {self.high}]")
        if not 0 < self.step < 1:
            raise ValueError(f"probe step must be in (0, 1), got {self.step}")
        if self.settle_s < 0 or self.measure_s <= 0 or self.rest_s < 0:
            raise ValueError("probe settle_s and rest_s must be >= 0, measure_s > 0")
        if not 0 <= self.margin < 1 or self.quiet < 0:
            raise ValueError("probe margin must be in [0, 1), quiet >= 0")


@dataclass(frozen=True, slots=True)
class Probe:
    base: float  # the value kept so far
    trial: float | None = None  # the value being tried (None: measuring the base)
    direction: int = -1  # -1: the next trial goes down; +1: up
    phase_start_s: float = 0.0
    samples: tuple[float, ...] = ()
    base_score: float | None = None
    losses: int = 0  # trials lost in a row
    rest_until_s: float = -math.inf
    # The last finished phase, for status and logs: "trial 2.55 kept (0.81 -> 0.62)".
    last: str = ""

    @property
    def value(self) -> float:
        """The q_cap to plan with now."""
        return self.base if self.trial is None else self.trial


def start_probe(q_cap: float, now_s: float, settings: ProbeSettings) -> Probe:
    return Probe(base=min(settings.high, max(settings.low, q_cap)), phase_start_s=now_s)


def fleet_score(ttft_p99_s: Iterable[float], slo_s: float) -> float | None:
    """The mean of each destination's TTFT p99 / `slo_s`, each capped at `SCORE_CAP`
    (NaN skipped; None without any)."""
    if not slo_s > 0:
        raise ValueError("fleet_score needs a TTFT target > 0")
    shares = [min(SCORE_CAP, p / slo_s) for p in ttft_p99_s if p == p]
    return statistics.fmean(shares) if shares else None


def probe_step(probe: Probe, now_s: float, score: float | None,
               settings: ProbeSettings) -> Probe:
    """One fleet score (None: nothing measured) at `now_s`; the probe, moved on if its
    phase is over."""
    elapsed = now_s - probe.phase_start_s
    samples = probe.samples
    if score is not None and math.isfinite(score) and elapsed >= settings.settle_s:
        samples = (*samples, score)
    if elapsed < settings.settle_s + settings.measure_s or not samples:
        return dataclasses.replace(probe, samples=samples)
    measured = statistics.fmean(samples)
    if probe.trial is None:
        return _after_base(probe, measured, now_s, settings)
    assert probe.base_score is not None  # a trial always follows a measured base
    if measured <= probe.base_score * (1 - settings.margin):
        kept = Probe(base=probe.trial, direction=probe.direction, base_score=measured,
                     phase_start_s=now_s, rest_until_s=probe.rest_until_s,
                     last=f"trial {probe.trial:.3g} kept ({probe.base_score:.2f} -> "
                          f"{measured:.2f})")
        return _after_base(kept, measured, now_s, settings)
    losses = probe.losses + 1
    rest = now_s + settings.rest_s if losses >= 2 else probe.rest_until_s
    return Probe(base=probe.base, direction=-probe.direction, phase_start_s=now_s,
                 losses=0 if losses >= 2 else losses, rest_until_s=rest,
                 last=f"trial {probe.trial:.3g} lost ({probe.base_score:.2f} -> "
                      f"{measured:.2f})")


def _after_base(probe: Probe, score: float, now_s: float, settings: ProbeSettings) -> Probe:
    """The base scored `score`: try the next step, or measure the base again."""
    again = Probe(base=probe.base, direction=probe.direction, phase_start_s=now_s,
                  base_score=score, losses=probe.losses, rest_until_s=probe.rest_until_s,
                  last=probe.last)
    if now_s < probe.rest_until_s or score < settings.quiet:
        return again
    for direction in (probe.direction, -probe.direction):
        factor = settings.step if direction < 0 else 1 / settings.step
        trial = min(settings.high, max(settings.low, probe.base * factor))
        if not math.isclose(trial, probe.base):
            return dataclasses.replace(again, trial=trial, direction=direction,
                            losses=probe.losses if direction == probe.direction
                            else probe.losses + 1)
    return again  # low == high: nothing to try


