"""Build the `RateSnapshot` parts of one partition's window (pure).

A window of many keys is split so that no part exceeds `part_bytes`; the
destination list and the partition-wide scalars ride on part 0 only (the
assembler reads them from there), key rows are spread over the parts in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cacheroute.v1 import snapshot_pb2
from streams.assembly import KEY_COLUMNS
from streams.columns import encode_keys
from streams.windows import WindowResult

# Upper bound of the encoded size of one key row besides the key itself:
# 7 doubles + 2 varints + packed-field overhead, generously rounded.
_ROW_BYTES = 8 * 7 + 10 + 5 + 8
_HEADER_BYTES = 512


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotContext:
    """Where a window came from: partition, worker and its state, counters."""

    source_partition: int
    partition_count: int
    worker_id: str
    recovering: bool
    published_at_ms: int
    dead_letters: int = 0
    duplicates_dropped: int = 0


def build_snapshots(window: WindowResult, ctx: SnapshotContext,
                    part_bytes: int = 900_000) -> list[snapshot_pb2.RateSnapshot]:
    """The parts of `window`, each at most about `part_bytes` when serialized."""
    bounds = _split(window.keys, part_bytes - _HEADER_BYTES - _destination_bytes(window))
    parts = []
    for index, (lo, hi) in enumerate(bounds):
        snap = snapshot_pb2.RateSnapshot(
            window_start_ms=window.window_start_ms,
            window_end_ms=window.window_end_ms,
            source_partition=ctx.source_partition,
            partition_count=ctx.partition_count,
            part_index=index,
            part_count=len(bounds),
            worker_id=ctx.worker_id,
            recovering=ctx.recovering,
            published_at_ms=ctx.published_at_ms,
        )
        _fill_keys(snap.keys, window, lo, hi)
        if index == 0:
            _fill_partition_totals(snap, window, ctx)
        parts.append(snap)
    return parts


def _destination_bytes(window: WindowResult) -> int:
    # (every part carries the names its keys' last destinations index)
    return (sum(len(d.destination.encode()) + 64 for d in window.destinations)
            + sum(len(n.encode()) + 4 for n in window.last_destination_names))


def _split(keys: list[str], budget: int) -> list[tuple[int, int]]:
    """[lo, hi) row ranges whose encoded size stays under `budget` (>= 1 row each)."""
    if not keys:
        return [(0, 0)]
    sizes = np.fromiter((len(k.encode()) + 1 + _ROW_BYTES for k in keys), dtype=np.int64,
                        count=len(keys))
    cum = np.cumsum(sizes)
    bounds = []
    lo = 0
    while lo < len(keys):
        base = cum[lo - 1] if lo else 0
        hi = int(np.searchsorted(cum, base + max(budget, 1), side="right"))
        hi = max(hi, lo + 1)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def _fill_keys(cols: snapshot_pb2.KeyColumns, w: WindowResult, lo: int, hi: int) -> None:
    cols.keys = encode_keys(w.keys[lo:hi])
    for name, _ in KEY_COLUMNS:
        getattr(cols, name).extend(getattr(w, name)[lo:hi].tolist())
    if len(w.last_destination) == len(w.keys):
        cols.last_destination.extend(w.last_destination[lo:hi].tolist())
        cols.last_destination_names.extend(w.last_destination_names)


def _fill_partition_totals(snap: snapshot_pb2.RateSnapshot, w: WindowResult,
                           ctx: SnapshotContext) -> None:
    for d in w.destinations:
        snap.destinations.add(
            destination=d.destination,
            arrival_rate_per_s=d.arrival_rate_per_s,
            prompt_tokens=d.prompt_tokens,
            cached_tokens=d.cached_tokens,
            mean_queue_depth=d.mean_queue_depth,
            p99_e2e_ms=d.p99_e2e_ms,
        )
    snap.overflow_keys = w.overflow_keys
    snap.overflow_rate_per_s = w.overflow_rate_per_s
    snap.active_keys = w.active_keys
    snap.dead_letters = ctx.dead_letters
    snap.duplicates_dropped = ctx.duplicates_dropped
