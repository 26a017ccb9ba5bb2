"""What the planner reads from a complete stream window: the rates to plan on and the
measurements the control loop decides with. Pure conversions, no I/O."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from planner_svc.control.telemetry import Telemetry
from planner_svc.control.traffic import Traffic
from planner_svc.planning.affinity import fleet_gain, reusable_prefix
from streams.assembly import KEY_COLUMNS


def traffic_from_window(window: Any, rate_column: str = "rate") -> Traffic:
    """Per-key rates of a streams.assembly.CompleteWindow ("rate" or its "ewma")."""
    rates = window.ewma_rate_per_s if rate_column == "ewma" else window.rate_per_s
    return Traffic(
        keys=list(window.keys),
        rates=np.asarray(rates, np.float64),
        prefix_tokens=np.asarray(window.reusable_prefix_tokens, np.float64),
        window_end_s=window.window_end_ms / 1000.0,
        last_destination=(np.asarray(window.last_destination, np.int32)
                          if len(window.last_destination) else None),
        last_destination_names=tuple(window.last_destination_names),
    )


def telemetry_from_window(window: Any, admitted: set[str], n_destinations: int = 0,
                          warm_slots_per_destination: int = 0) -> Telemetry:
    """The control loop's view of a stream window (see planner_svc.control.telemetry).
    With the serving destinations' count and W it also predicts affinity's gain over
    Flat-LB on the window's keys (`planning.affinity.fleet_gain`)."""
    span_s = max(1e-9, (window.window_end_ms - window.window_start_ms) / 1000.0)
    prompt = np.asarray(window.prompt_tokens, np.float64)
    cached = np.asarray(window.cached_tokens, np.float64)
    mask = np.fromiter((k in admitted for k in window.keys), bool, count=len(window.keys))
    p99s = {d: s.p99_e2e_ms for d, s in window.destinations.items()
            if not math.isnan(s.p99_e2e_ms)}
    return Telemetry(
        window_end_s=window.window_end_ms / 1000.0,
        window_s=span_s,
        hit_rate=_ratio(cached.sum(), prompt.sum()),
        prompt_tokens_per_s=float(prompt.sum()) / span_s,
        requests=int(np.sum(window.requests)),
        destination_loads_per_s={d: s.arrival_rate_per_s for d, s in window.destinations.items()},
        planned_hit_rate=_ratio(cached[mask].sum(), prompt[mask].sum()) if mask.any() else None,
        fallback_hit_rate=_ratio(cached[~mask].sum(), prompt[~mask].sum())
        if (~mask).any()
        else None,
        p99_ms=max(p99s.values()) if p99s else None,
        destination_p99_ms=p99s,
        active_keys=int(window.active_keys),
        recovering=bool(window.recovering),
        affinity_gain=window_affinity_gain(window, n_destinations, warm_slots_per_destination),
    )


def window_affinity_gain(window: Any, n_destinations: int,
                         warm_slots_per_destination: int) -> float | None:
    """`planning.affinity.fleet_gain` on a window's keys; None without prompt tokens.

    A key's reusable prefix is the larger of what the routers reported (the part of the
    prompt its key covers) and what the engines served it from cache per request: history a
    conversation reuses beyond its key's prefix, and keys named by a header (no prefix
    reported), count as far as they were measured. The reported part is what every request
    of the key shares; the rest is conversation history (`planning.affinity`: Flat-LB finds
    it one time in R). A header key reports none, so all it reuses counts as history: the
    guard leans towards planning there, never towards a fallback it cannot justify."""
    requests = np.asarray(window.requests, np.float64)
    per_request = np.zeros(len(requests))
    prompt = np.divide(np.asarray(window.prompt_tokens, np.float64), requests,
                       out=per_request, where=requests > 0)
    reported = np.nan_to_num(np.asarray(window.reusable_prefix_tokens, np.float64))
    prefix = reusable_prefix(reported, window.cached_tokens, requests)
    gain = fleet_gain(np.asarray(window.rate_per_s, np.float64), prefix, prompt, requests,
                      n_destinations, warm_slots_per_destination, shared_tokens=reported)
    return None if gain is None else gain.judged_gain


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den > 0 else 0.0


def split_by_pool(window: Any, pools: Sequence[str], pool_of_scope: Callable[[str], str | None],
                  pool_of_destination: Mapping[str, str]) -> tuple[dict[str, Any], int]:
    """One stream window cut into each pool's (router_client.pools), and the number of keys
    no pool claims.

    A key goes to the pool of its scope (the model part of the key); a destination's
    statistics to the pool that holds it. The keys the stream folded into its overflow
    (no names) are shared out by each pool's share of the named keys' rate: a pool's cold
    tail is in proportion to its traffic. Stream-wide counts (dead letters, duplicates,
    partitions, recovery) stay whole in every part.
    """
    keys = window.keys
    index = {p: i for i, p in enumerate(pools)}
    codes = np.empty(len(keys), np.int64)
    by_scope: dict[str, int] = {}
    for row, key in enumerate(keys):
        scope = key.partition("/")[0]
        code = by_scope.get(scope)
        if code is None:
            owner = pool_of_scope(scope)
            code = by_scope[scope] = index.get(owner, -1) if owner is not None else -1
        codes[row] = code
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(-1, len(pools) + 1))
    rates = np.asarray(window.rate_per_s, np.float64)
    total_rate = float(rates.sum())
    parts: dict[str, Any] = {}
    for i, pool in enumerate(pools):
        rows = order[bounds[i + 1]:bounds[i + 2]]
        share = float(rates[rows].sum()) / total_rate if total_rate > 0 else (
            1.0 / len(pools))
        overflow_keys = round(window.overflow_keys * share)
        columns = {name: np.asarray(getattr(window, name))[rows] for name, _ in KEY_COLUMNS}
        if len(window.last_destination):  # (a per-key column too; the names stay whole)
            columns["last_destination"] = np.asarray(window.last_destination)[rows]
        parts[pool] = dataclasses.replace(
            window, keys=[keys[j] for j in rows], **columns,
            destinations={d: s for d, s in window.destinations.items()
                          if pool_of_destination.get(d) == pool},
            overflow_keys=overflow_keys,
            overflow_rate_per_s=window.overflow_rate_per_s * share,
            active_keys=len(rows) + overflow_keys)
    return parts, int(bounds[1] - bounds[0])
