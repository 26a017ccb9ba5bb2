"""Build stream windows (streams.assembly.CompleteWindow) from plain rates, for planner tests."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from streams.assembly import CompleteWindow, DestinationStats


def make_window(
    keys: list[str],
    rates: np.ndarray,
    *,
    window_end_ms: int,
    window_s: float = 10.0,
    destinations: list[str] = (),  # type: ignore[assignment]
    hit_rate: float | np.ndarray = 0.5,
    recovering: bool = False,
    p99_ms: Mapping[str, float] | None = None,
    prefix_tokens: float = 800.0,
    last_destinations: Mapping[str, str] | None = None,  # key -> where its newest went
) -> CompleteWindow:
    rates = np.asarray(rates, np.float64)
    names = sorted(set((last_destinations or {}).values()))
    last = (np.array([names.index(last_destinations[k]) if k in last_destinations else -1
                      for k in keys], np.int32)
            if last_destinations is not None else np.zeros(0, np.int32))
    requests = np.maximum(0, np.round(rates * window_s)).astype(np.int64)
    prompt = requests * 1000.0
    per_dest = float(rates.sum()) / max(1, len(destinations))
    return CompleteWindow(
        window_start_ms=window_end_ms - int(window_s * 1000),
        window_end_ms=window_end_ms,
        keys=list(keys),
        rate_per_s=rates,
        ewma_rate_per_s=rates,
        prompt_tokens=prompt,
        cached_tokens=prompt * np.asarray(hit_rate, np.float64),
        reuse_fraction=np.full(len(keys), 0.5),
        interarrival_cv=np.ones(len(keys)),
        reusable_prefix_tokens=np.full(len(keys), prefix_tokens),
        requests=requests,
        destinations={
            d: DestinationStats(d, per_dest, 0.0, 0.0, float("nan"),
                                (p99_ms or {}).get(d, float("nan")))
            for d in destinations
        },
        recovering=recovering,
        overflow_keys=0,
        overflow_rate_per_s=0.0,
        active_keys=len(keys),
        dead_letters=0,
        duplicates_dropped=0,
        partition_count=1,
        published_at_ms=window_end_ms,
        last_destination=last,
        last_destination_names=names,
    )
