"""W measured instead of typed in: how many keys' prefixes a destination keeps warm, from
what its engine says it holds (pure).

The planner's W (warm slots per destination) is a count of prefixes. An engine that
publishes KV-cache events says how many blocks it keeps resident (streams/engines), and
the stream says how long the admitted keys' reusable prefixes are. A destination's
measured W is then

    blocks resident x tokens per block / mean reusable prefix tokens (rate-weighted)

read off a full cache (a cache that is not full yet understates it, so destinations whose
KV usage is known to be below `full_usage` are left out when any full one exists). The
fleet's figure is the median over destinations whose report is fresh. It is shown beside
the configured W in `cacheroute status`; with `learn_warm_slots` the planner plans with it,
kept within [W/2, 2W] of the operator's W (`learned_warm_slots`).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class MeasuredWarmSlots:
    value: float  # the median over the destinations below
    destinations: int
    mean_prefix_tokens: float
    newest_age_s: float


def measured_warm_slots(signals: Iterable[Any], mean_prefix_tokens: float, now_ms: int, *,
                        max_age_s: float = 30.0,
                        full_usage: float = 0.9) -> MeasuredWarmSlots | None:
    """`signals`: EngineSignals messages (one per destination). None without a fresh
    report that counts blocks, or without a prefix size to divide by."""
    if not mean_prefix_tokens > 0:
        return None
    fresh = [s for s in signals
             if s.kv_events and s.block_size > 0 and s.blocks_resident > 0
             and 0 <= now_ms - s.observed_at_ms <= max_age_s * 1000]
    if not fresh:
        return None
    full = [s for s in fresh if s.HasField("kv_usage") and s.kv_usage >= full_usage]
    use = full or fresh
    values = [s.blocks_resident * s.block_size / mean_prefix_tokens for s in use]
    newest = min(now_ms - s.observed_at_ms for s in use) / 1000
    return MeasuredWarmSlots(statistics.median(values), len(use), mean_prefix_tokens, newest)


def learned_warm_slots(configured: int, measured: float) -> int:
    """The W to plan with: the measured one, bounded by the operator's to [W/2, 2W] (a
    cold or misreporting fleet moves W by at most a factor of two)."""
    lo, hi = max(1, configured // 2), max(1, configured * 2)
    return int(min(hi, max(lo, round(measured))))
