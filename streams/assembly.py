"""Reassemble per-partition snapshot parts into complete windows (pure).

The stream publishes one `RateSnapshot` per source partition per hop, split
into parts when large. The planner feeds every part it consumes to
`WindowAssembler.add`; a `CompleteWindow` comes back exactly once per window,
when parts for every source partition (and every part of each) are in.

Rules:
- a part that arrives again (a worker republishing after a restart) replaces
  the earlier copy of the same (window, partition, part_index);
- windows not newer than the last completed one are ignored (the planner wants
  the newest rates, and a late duplicate must not complete a window twice);
- at most `max_pending` windows are held; the oldest is dropped first, so a
  partition that never reports cannot grow memory without bound;
- every part is checked against `SnapshotLimits` before it is held (the snapshots
  topic may be written by something hostile or buggy): a window ending far from the
  planner's clock, a window of another length or off the hop grid, a partition count
  that is not the events topic's, too many keys, or rates that are not plausible are
  refused with `SnapshotError`, and cannot complete or displace a real window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cacheroute.v1 import snapshot_pb2
from streams.columns import decode_keys
from streams.errors import SnapshotError

PartKey = tuple[int, int]  # (source_partition, part_index)


@dataclass(frozen=True, slots=True)
class DestinationStats:
    """Per-destination load and cache statistics of one complete window."""

    destination: str
    arrival_rate_per_s: float
    prompt_tokens: float
    cached_tokens: float
    mean_queue_depth: float  # NaN when nothing reported
    p99_e2e_ms: float  # NaN when nothing reported

    @property
    def hit_rate(self) -> float:
        """Token-weighted served KV hit rate; NaN without served tokens."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens > 0 else math.nan


# The per-key columns every window carries, in wire order (snapshot_pb2.KeyColumns), with
# the dtype they are assembled in.
KEY_COLUMNS: tuple[tuple[str, type], ...] = (
    ("rate_per_s", np.float64),
    ("ewma_rate_per_s", np.float64),
    ("prompt_tokens", np.float64),
    ("cached_tokens", np.float64),
    ("reuse_fraction", np.float64),
    ("interarrival_cv", np.float64),
    ("reusable_prefix_tokens", np.float64),
    ("requests", np.uint64),
)


@dataclass(frozen=True)
class KeyWindow:
    """Per-key statistics of window [window_start_ms, window_end_ms): one partition's
    (`streams.windows.WindowResult`) or all partitions' (`CompleteWindow`). Entry i of
    every array belongs to `keys[i]`; the columns are `KEY_COLUMNS`."""

    window_start_ms: int
    window_end_ms: int
    keys: list[str]
    rate_per_s: np.ndarray
    ewma_rate_per_s: np.ndarray
    prompt_tokens: np.ndarray
    cached_tokens: np.ndarray
    reuse_fraction: np.ndarray
    interarrival_cv: np.ndarray
    reusable_prefix_tokens: np.ndarray
    requests: np.ndarray

    @property
    def hit_rate(self) -> np.ndarray:
        """Per-key token-weighted hit rate (NaN where no tokens were served)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.prompt_tokens > 0, self.cached_tokens / self.prompt_tokens, np.nan)

    def key_index(self) -> dict[str, int]:
        """key -> row, for lookups by name."""
        return {k: i for i, k in enumerate(self.keys)}


@dataclass(frozen=True)
class CompleteWindow(KeyWindow):
    """All partitions' statistics of one window: the key columns of every partition, and
    the window-wide figures. `recovering` is True when any partition's worker was
    rebuilding state: do not plan on such a window."""

    destinations: dict[str, DestinationStats]
    recovering: bool
    overflow_keys: int
    overflow_rate_per_s: float
    active_keys: int
    dead_letters: int
    duplicates_dropped: int
    partition_count: int
    published_at_ms: int
    # Per key: where its newest request went, an index into `last_destination_names`
    # (-1: unknown; every key unknown when no worker reported it).
    last_destination: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    last_destination_names: list[str] = field(default_factory=list)


@dataclass
class _Pending:
    partition_count: int
    parts: dict[PartKey, snapshot_pb2.RateSnapshot] = field(default_factory=dict)
    part_counts: dict[int, int] = field(default_factory=dict)

    def add(self, snap: snapshot_pb2.RateSnapshot) -> None:
        if snap.partition_count != self.partition_count:
            raise SnapshotError(
                f"window {snap.window_end_ms}: partition_count {snap.partition_count} "
                f"!= {self.partition_count}"
            )
        known = self.part_counts.get(snap.source_partition)
        if known is not None and known != snap.part_count:
            # A restarted worker may split differently: its parts replace the old set.
            self.parts = {k: v for k, v in self.parts.items() if k[0] != snap.source_partition}
        self.part_counts[snap.source_partition] = snap.part_count
        self.parts[(snap.source_partition, snap.part_index)] = snap

    def complete(self) -> bool:
        if len(self.part_counts) < self.partition_count:
            return False
        return len(self.parts) == sum(self.part_counts.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotLimits:
    """What a real snapshot looks like. Zero means "not checked"."""

    # A worker closes a window only once its clock passed the end, so a real end is behind
    # the worker's clock; beyond the planner's by more than the clock skew the stream
    # tolerates (StreamConfig.max_future_ms) it is forged or the clocks are broken.
    max_ahead_ms: int = 10_000
    max_behind_ms: int = 3_600_000  # older than this: not worth planning on
    window_ms: int = 0  # the stream's window length
    hop_ms: int = 0  # window ends lie on this grid
    partitions: int = 0  # the events topic's partition count
    max_keys: int = 10_000_000  # per part
    max_rate_per_key: float = 1e6  # requests/s

    def check(self, s: snapshot_pb2.RateSnapshot, now_ms: int | None) -> None:
        end = s.window_end_ms
        if now_ms is not None:
            if end > now_ms + self.max_ahead_ms:
                raise SnapshotError(f"window ends {end - now_ms} ms in the future")
            if end < now_ms - self.max_behind_ms:
                raise SnapshotError(f"window ended {now_ms - end} ms ago")
        if self.window_ms and end - s.window_start_ms != self.window_ms:
            raise SnapshotError(f"window of {end - s.window_start_ms} ms, the stream's are "
                                f"{self.window_ms} ms")
        if self.hop_ms and end % self.hop_ms:
            raise SnapshotError(f"window end {end} is off the {self.hop_ms} ms hop grid")
        if self.partitions and s.partition_count != self.partitions:
            raise SnapshotError(f"partition_count {s.partition_count}, the events topic has "
                                f"{self.partitions}")
        rates = np.asarray(s.keys.rate_per_s, dtype=np.float64)
        if len(rates) > self.max_keys:
            raise SnapshotError(f"{len(rates)} keys in one part (at most {self.max_keys})")
        if len(rates) and not (np.isfinite(rates).all() and rates.min() >= 0
                               and rates.max() <= self.max_rate_per_key):
            raise SnapshotError("rates that are negative, not finite or implausibly high")


class WindowAssembler:
    """Collects snapshot parts; returns each window once it is complete."""

    def __init__(self, max_pending: int = 16, limits: SnapshotLimits | None = None) -> None:
        self.limits = limits or SnapshotLimits()
        self.max_pending = max_pending
        self._pending: dict[int, _Pending] = {}
        self.last_completed_ms: int | None = None
        self.dropped_windows = 0

    def add(self, snapshot: snapshot_pb2.RateSnapshot,
            now_ms: int | None = None) -> CompleteWindow | None:
        """Hold one part; return the merged window when it completes it. `now_ms` (the
        planner's clock) enables the time checks of `SnapshotLimits`."""
        _check_part(snapshot)
        self.limits.check(snapshot, now_ms)
        end = snapshot.window_end_ms
        if self.last_completed_ms is not None and end <= self.last_completed_ms:
            return None
        pending = self._pending.get(end)
        if pending is None:
            pending = self._pending[end] = _Pending(snapshot.partition_count)
            self._bound()
        pending.add(snapshot)
        if not pending.complete():
            return None
        del self._pending[end]
        self.last_completed_ms = end
        # Older incomplete windows can never be returned now.
        for stale in [w for w in self._pending if w < end]:
            del self._pending[stale]
            self.dropped_windows += 1
        return merge_parts(list(pending.parts.values()))

    def pending_windows(self) -> list[int]:
        """window_end_ms of windows still waiting for parts, oldest first."""
        return sorted(self._pending)

    def _bound(self) -> None:
        while len(self._pending) > self.max_pending:
            del self._pending[min(self._pending)]
            self.dropped_windows += 1


# A part's last-destination names: at most this many, each at most this long (a stream
# worker tracks at most `StreamConfig.max_destinations` destinations).
MAX_LAST_DESTINATION_NAMES = 65_536
MAX_DESTINATION_NAME_BYTES = 1024


def _check_part(s: snapshot_pb2.RateSnapshot) -> None:
    if s.partition_count <= 0 or not 0 <= s.source_partition < s.partition_count:
        raise SnapshotError(f"bad partition {s.source_partition}/{s.partition_count}")
    if s.part_count <= 0 or not 0 <= s.part_index < s.part_count:
        raise SnapshotError(f"bad part {s.part_index}/{s.part_count}")
    last, names = s.keys.last_destination, s.keys.last_destination_names
    if not last:
        return
    if len(last) != len(s.keys.rate_per_s):
        raise SnapshotError(f"{len(last)} last destinations for {len(s.keys.rate_per_s)} keys")
    if len(names) > MAX_LAST_DESTINATION_NAMES or any(
            not n or len(n) > MAX_DESTINATION_NAME_BYTES for n in names):
        raise SnapshotError("last-destination names: too many, empty or too long")
    index = np.asarray(last, np.int64)
    if index.min() < -1 or index.max() >= len(names):
        raise SnapshotError(f"last destinations outside [-1, {len(names)})")


def merge_parts(parts: list[snapshot_pb2.RateSnapshot]) -> CompleteWindow:
    """Merge the parts of one window (any order) into a `CompleteWindow`."""
    parts = sorted(parts, key=lambda p: (p.source_partition, p.part_index))
    firsts = [p for p in parts if p.part_index == 0]
    keys: list[str] = []
    for p in parts:
        keys.extend(decode_keys(p.keys.keys))
    first = parts[0]
    return CompleteWindow(
        window_start_ms=first.window_start_ms,
        window_end_ms=first.window_end_ms,
        keys=keys,
        **{name: _concat(parts, name, dtype)  # type: ignore[arg-type]
           for name, dtype in KEY_COLUMNS},
        destinations=merge_destinations(firsts),
        recovering=any(p.recovering for p in parts),
        overflow_keys=sum(p.overflow_keys for p in firsts),
        overflow_rate_per_s=sum(p.overflow_rate_per_s for p in firsts),
        active_keys=sum(p.active_keys for p in firsts),
        dead_letters=sum(p.dead_letters for p in firsts),
        duplicates_dropped=sum(p.duplicates_dropped for p in firsts),
        partition_count=first.partition_count,
        published_at_ms=max(p.published_at_ms for p in parts),
        **_merge_last_destinations(parts),
    )


def _merge_last_destinations(parts: list[snapshot_pb2.RateSnapshot]) -> dict[str, Any]:
    """Every part's last destinations re-indexed into one list of names (a part that did
    not report them: -1 for its keys). Nothing reported anywhere: empty."""
    if not any(p.keys.last_destination for p in parts):
        return {}
    names: dict[str, int] = {}
    columns = []
    for p in parts:
        last = np.asarray(p.keys.last_destination, np.int64)
        if not len(last):
            columns.append(np.full(len(p.keys.rate_per_s), -1, np.int32))
            continue
        table = np.array([names.setdefault(n, len(names)) for n in p.keys.last_destination_names]
                         + [-1], np.int32)  # (index -1 reads the trailing -1)
        columns.append(table[last])
    return {"last_destination": np.concatenate(columns),
            "last_destination_names": list(names)}


def _concat(parts: list[snapshot_pb2.RateSnapshot], name: str, dtype: type) -> np.ndarray:
    arrays: list[np.ndarray] = [np.asarray(getattr(p.keys, name), dtype=dtype) for p in parts]
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)


def merge_destinations(firsts: list[snapshot_pb2.RateSnapshot]) -> dict[str, DestinationStats]:
    """Sum rates and tokens across partitions; queue depth is averaged weighted by
    arrival rate, p99 is the maximum over partitions (conservative)."""
    acc: dict[str, list[snapshot_pb2.DestinationStats]] = {}
    for p in firsts:
        for d in p.destinations:
            acc.setdefault(d.destination, []).append(d)
    return {name: _merge_one(name, stats) for name, stats in acc.items()}


def _merge_one(name: str, stats: list[snapshot_pb2.DestinationStats]) -> DestinationStats:
    depths = [(d.mean_queue_depth, d.arrival_rate_per_s) for d in stats
              if not math.isnan(d.mean_queue_depth)]
    weight = sum(w for _, w in depths)
    if not depths:
        depth = math.nan
    elif weight > 0:
        depth = sum(v * w for v, w in depths) / weight
    else:
        depth = sum(v for v, _ in depths) / len(depths)
    p99s = [d.p99_e2e_ms for d in stats if not math.isnan(d.p99_e2e_ms)]
    return DestinationStats(
        destination=name,
        arrival_rate_per_s=sum(d.arrival_rate_per_s for d in stats),
        prompt_tokens=sum(d.prompt_tokens for d in stats),
        cached_tokens=sum(d.cached_tokens for d in stats),
        mean_queue_depth=depth,
        p99_e2e_ms=max(p99s) if p99s else math.nan,
    )
