"""Per-key arrival bookkeeping that needs the previous arrival (pure, vectorized).

Both helpers take one batch of request events in processing order and return
per-event values; the state they carry between batches is passed in and
updated in place.

- Inter-arrival gaps: gap = t - previous arrival of the same key; negative gaps
  (out-of-order events) and gaps longer than `max_gap_ms` (the window: the
  previous arrival is outside any window's history, and the key may have been
  forgotten meanwhile) are not counted.
- Reuse: a request reuses when its (key, destination) pair was seen before at
  most `eviction_ms` away in event time - "would the prefix still be warm there".
"""

from __future__ import annotations

from itertools import repeat

import numpy as np

NEVER = -1


def _previous_in_group(
    ids: np.ndarray, ts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort by id (stable), and give each event the time of the previous event of
    its id in the batch; group heads get NEVER. Returns (order, prev, heads)."""
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    sorted_ts = ts[order]
    heads = np.ones(ids.size, dtype=bool)
    heads[1:] = sorted_ids[1:] != sorted_ids[:-1]
    prev = np.empty_like(sorted_ts)
    prev[0:1] = NEVER
    prev[1:] = sorted_ts[:-1]
    prev[heads] = NEVER
    return order, prev, heads


def interarrival_gaps(
    slots: np.ndarray, ts: np.ndarray, last_arrival: np.ndarray, max_gap_ms: int
) -> tuple[np.ndarray, np.ndarray]:
    """Gaps (ms, float) and a validity mask, aligned with the input events.

    `last_arrival[slot]` (0 = none yet) is read for each key's first event in the
    batch and then raised to the key's latest arrival.
    """
    if not slots.size:
        return np.zeros(0), np.zeros(0, dtype=bool)
    order, prev, heads = _previous_in_group(slots, ts)
    sorted_slots = slots[order]
    sorted_ts = ts[order]
    prev[heads] = last_arrival[sorted_slots[heads]]
    gaps_sorted = (sorted_ts - prev).astype(np.float64)
    valid_sorted = (prev > 0) & (gaps_sorted >= 0) & (gaps_sorted <= max_gap_ms)
    np.maximum.at(last_arrival, sorted_slots, sorted_ts)
    gaps = np.empty_like(gaps_sorted)
    valid = np.empty_like(valid_sorted)
    gaps[order] = gaps_sorted
    valid[order] = valid_sorted
    return gaps, valid


def reuse_flags(
    pairs: np.ndarray, ts: np.ndarray, last_seen: dict[int, int], eviction_ms: int
) -> np.ndarray:
    """Whether each event's pair id was seen within `eviction_ms`; updates `last_seen`
    (pair id -> latest event time) with the batch."""
    if not pairs.size:
        return np.zeros(0, dtype=bool)
    order, prev, heads = _previous_in_group(pairs, ts)
    sorted_pairs = pairs[order]
    sorted_ts = ts[order]
    head_ids = sorted_pairs[heads].tolist()
    known = np.fromiter(map(last_seen.get, head_ids, repeat(NEVER, len(head_ids))),
                        dtype=np.int64, count=len(head_ids))
    prev[heads] = known
    reused_sorted = (prev != NEVER) & (np.abs(sorted_ts - prev) <= eviction_ms)
    head_idx = np.flatnonzero(heads)
    latest = np.maximum(np.maximum.reduceat(sorted_ts, head_idx), known)
    last_seen.update(zip(head_ids, latest.tolist(), strict=True))
    reused = np.empty_like(reused_sorted)
    reused[order] = reused_sorted
    return reused
