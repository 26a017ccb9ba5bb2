"""Hopping event-time windows over per-key and per-destination statistics (pure).

Time is cut into hops: bucket b covers event times [b*hop, (b+1)*hop). The
window ending at E (a multiple of hop) is the sum of the N = window/hop buckets
before E. Buckets live in a ring of `config.ring_slots` slots:

    buckets   ... | b-N | b-N+1 | ... | b-1 | b | b+1 (grace) |
                        ^ first open bucket    ^ next_end / hop

Window E is published once the partition's event clock (the newest event time,
or the wall clock when the partition is idle) reaches E + grace. Its oldest
bucket is then cleared; every other bucket stays in the ring for the next
windows, so an event later than the grace period still counts in every later
window that covers its hop. Only events older than the first open bucket are
too late for any window (`late`).

Per key, each bucket holds request count, reused requests, served prompt and
cached tokens (cache-hit events), reusable-prefix sums and inter-arrival gap
moments; per destination, arrivals, tokens, queue depth and an e2e histogram.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from streams.arrivals import interarrival_gaps, reuse_flags
from streams.assembly import DestinationStats, KeyWindow
from streams.config import StreamConfig
from streams.decoding import KIND_CACHE_HIT, KIND_REQUEST, EventColumns
from streams.keyspace import SlotMap
from streams.ring import DestinationRing, KeyRing, OverflowRing


@dataclass(frozen=True)
class WindowResult(KeyWindow):
    """One partition's statistics for one window: its key columns and its destinations."""

    destinations: list[DestinationStats] = field(default_factory=list)
    overflow_keys: int = 0
    overflow_rate_per_s: float = 0.0
    active_keys: int = 0
    # Per key: where its newest request went, an index into `last_destination_names`
    # (-1: none seen since its slot was assigned). Empty: not reported.
    last_destination: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    last_destination_names: list[str] = field(default_factory=list)


class PartitionWindows:
    """All window state of one source partition. Feed it valid, new events in
    offset order with `ingest`; it returns the windows that closed."""

    def __init__(self, config: StreamConfig) -> None:
        self.config = config
        self.keys = SlotMap(config.max_tracked_keys)
        self.destinations = SlotMap(config.max_destinations)
        self.key_ring = KeyRing(config.ring_slots)
        self.dest_ring = DestinationRing(config.ring_slots)
        self.overflow = OverflowRing(config.ring_slots)
        self.pair_last_seen: dict[int, int] = {}
        self.watermark_ms: int | None = None
        self.next_end_ms: int | None = None
        self.first_bucket: int | None = None
        self.last_bucket: int | None = None
        self.overflow_events = 0
        self.released_keys = 0
        self._closes = 0

    # -- clock -------------------------------------------------------------------

    def first_open_bucket(self) -> int | None:
        """Oldest bucket an event may still land in (None before the first event)."""
        if self.next_end_ms is None:
            return None
        return self.next_end_ms // self.config.hop_ms - self.config.buckets_per_window

    def advance_idle(self, now_ms: int) -> list[WindowResult]:
        """Move an idle partition's event clock to the wall clock; close windows.

        A partition that never saw an event starts its clock here, at the newest window
        due: it has counted nothing because there was nothing (the caller knows its log
        is read to the end). Otherwise one silent partition would hold back every complete
        window until a key happens to hash onto it: at a cold start with a handful of
        tenants, the first plan came 20-30 s late."""
        cfg = self.config
        clock = now_ms - cfg.idle_ms
        if self.next_end_ms is None:
            self.next_end_ms = (clock - cfg.grace_ms) // cfg.hop_ms * cfg.hop_ms
        self.watermark_ms = max(self.watermark_ms or clock, clock)
        return self._close_due()

    # -- ingest ------------------------------------------------------------------

    def ingest(self, cols: EventColumns) -> tuple[np.ndarray, list[WindowResult]]:
        """Count events; returns (late mask over the events, windows closed)."""
        hop = self.config.hop_ms
        buckets = cols.timestamp_ms // hop
        late = np.zeros(len(cols), dtype=bool)
        if not len(cols):
            return late, []
        if self.next_end_ms is None:
            self.next_end_ms = (int(buckets.min()) + 1) * hop
        closed: list[WindowResult] = []
        i, n = 0, len(cols)
        while i < n:
            first_open = self.first_open_bucket()
            assert first_open is not None
            beyond = np.flatnonzero(buckets[i:] >= first_open + self.config.ring_slots)
            j = i + int(beyond[0]) if beyond.size else n
            late[i:j] = buckets[i:j] < first_open
            self._count(cols, np.arange(i, j)[~late[i:j]], buckets)
            if j < n:
                # Event j lies beyond the ring: move the clock to it first.
                self._raise_watermark(int(cols.timestamp_ms[j]))
                closed.extend(self._close_due())
            i = j
        closed.extend(self._close_due())
        return late, closed

    def _raise_watermark(self, ts_ms: int) -> None:
        self.watermark_ms = ts_ms if self.watermark_ms is None else max(self.watermark_ms, ts_ms)

    def _count(self, cols: EventColumns, idx: np.ndarray, buckets: np.ndarray) -> None:
        if not idx.size:
            return
        ts = cols.timestamp_ms[idx]
        b = buckets[idx]
        self._raise_watermark(int(ts.max()))
        lo, hi = int(b.min()), int(b.max())
        self.first_bucket = lo if self.first_bucket is None else min(self.first_bucket, lo)
        self.last_bucket = hi if self.last_bucket is None else max(self.last_bucket, hi)
        slot = b % self.config.ring_slots
        # One slot lookup per distinct name, in order of first use (slots are
        # handed out in event order while capacity lasts).
        knames, kpos = cols.key.take(idx).used()
        dnames, dpos = cols.destination.take(idx).used()
        kslot = self.keys.lookup(knames)[kpos]
        dslot = self.destinations.lookup(dnames)[dpos]
        self.key_ring.ensure(self.keys.high_water)
        self.dest_ring.ensure(self.destinations.high_water)
        kind = cols.kind[idx]
        self._count_keys(cols, idx, kind, kslot, dslot, slot, ts, knames, kpos)
        self.dest_ring.add(kind, dslot, slot, cols.prompt_tokens[idx], cols.cached_tokens[idx],
                           cols.depth[idx], cols.e2e_ms[idx])

    def _count_keys(self, cols: EventColumns, idx: np.ndarray, kind: np.ndarray,
                    kslot: np.ndarray, dslot: np.ndarray, slot: np.ndarray,
                    ts: np.ndarray, knames: list[str], kpos: np.ndarray) -> None:
        tracked = kslot >= 0
        req = (kind == KIND_REQUEST) & tracked
        hit = (kind == KIND_CACHE_HIT) & tracked
        r_slot, r_key, r_ts = slot[req], kslot[req], ts[req]
        gaps, gap_ok = interarrival_gaps(r_key, r_ts, self.key_ring.last_arrival,
                                         self.config.window_ms)
        pairable = dslot[req] >= 0
        reused = np.zeros(r_key.size, dtype=bool)
        pair_ids = r_key[pairable] * self.config.max_destinations + dslot[req][pairable]
        reused[pairable] = reuse_flags(pair_ids, r_ts[pairable], self.pair_last_seen,
                                       self.config.eviction_ms)
        self.key_ring.add_requests(r_slot, r_key, cols.prefix_tokens[idx][req], gaps, gap_ok,
                                   reused)
        self.key_ring.note_destinations(r_key[pairable], dslot[req][pairable], r_ts[pairable])
        self.key_ring.add_hits(slot[hit], kslot[hit], cols.prompt_tokens[idx][hit],
                               cols.cached_tokens[idx][hit])
        self.key_ring.touch(kslot[tracked], ts[tracked])
        over = (kind == KIND_REQUEST) & ~tracked
        if over.any():
            over_names = [knames[i] for i in kpos[over].tolist()]
            self.overflow.add(slot[over], over_names)
        self.overflow_events += int(np.count_nonzero(~tracked))

    # -- closing -----------------------------------------------------------------

    def _close_due(self) -> list[WindowResult]:
        closed: list[WindowResult] = []
        cfg = self.config
        while (self.next_end_ms is not None and self.watermark_ms is not None
               and self.next_end_ms + cfg.grace_ms <= self.watermark_ms):
            self._skip_empty_windows()
            closed.append(self._close_one())
        return closed

    def _skip_empty_windows(self) -> None:
        """After a long silence, jump to the newest due window instead of publishing
        every empty one in between."""
        cfg = self.config
        assert self.next_end_ms is not None and self.watermark_ms is not None
        newest_due = (self.watermark_ms - cfg.grace_ms) // cfg.hop_ms * cfg.hop_ms
        last = self.last_bucket if self.last_bucket is not None else -1
        if self.next_end_ms // cfg.hop_ms - cfg.buckets_per_window > last + 1 and (
            newest_due > self.next_end_ms
        ):
            self.next_end_ms = newest_due
            self.key_ring.clear_all()
            self.dest_ring.clear_all()
            self.overflow.clear_all()

    def _window_slots(self, end_ms: int) -> list[int]:
        cfg = self.config
        last = end_ms // cfg.hop_ms
        return [b % cfg.ring_slots for b in range(last - cfg.buckets_per_window, last)]

    def _close_one(self) -> WindowResult:
        cfg = self.config
        assert self.next_end_ms is not None
        end = self.next_end_ms
        slots = self._window_slots(end)
        first = self.first_bucket if self.first_bucket is not None else end // cfg.hop_ms
        # Until a full window of data exists, divide by the time actually covered.
        span_s = max(min(cfg.window_ms, end - first * cfg.hop_ms), cfg.hop_ms) / 1000.0
        result = self._result(end, slots, span_s)
        oldest = end // cfg.hop_ms - cfg.buckets_per_window
        self.key_ring.clear(oldest % cfg.ring_slots)
        self.dest_ring.clear(oldest % cfg.ring_slots)
        self.overflow.clear(oldest % cfg.ring_slots)
        self.next_end_ms = end + cfg.hop_ms
        self._closes += 1
        # Pruning walks every pair: once per window length is enough to bound memory.
        if self._closes % cfg.buckets_per_window == 0:
            self._forget_quiet_keys()
        return result

    def _result(self, end: int, slots: list[int], span_s: float) -> WindowResult:
        cfg = self.config
        hi = self.keys.high_water
        live = self.keys.live()
        sums = self.key_ring.window_sums(slots, hi)
        requests = sums["requests"]
        rate = requests / span_s
        ewma = self.key_ring.update_ewma(rate, live, cfg.ewma_alpha)
        shown = live & ((requests > 0) | (sums["prompt"] > 0)
                        | (ewma >= cfg.min_published_rate_per_s))
        idx = np.flatnonzero(shown)
        overflow_keys = self.overflow.distinct(slots)
        last, last_names = self._last_destinations(idx)
        return WindowResult(
            window_start_ms=end - cfg.window_ms,
            window_end_ms=end,
            keys=self.keys.names(idx),
            rate_per_s=rate[idx],
            ewma_rate_per_s=ewma[idx],
            prompt_tokens=sums["prompt"][idx].astype(np.float64),
            cached_tokens=sums["cached"][idx].astype(np.float64),
            reuse_fraction=_ratio(sums["reused"][idx], requests[idx], 0.0),
            interarrival_cv=_cv(sums["gap_n"][idx], sums["gap_sum"][idx], sums["gap_sq"][idx]),
            reusable_prefix_tokens=_ratio(sums["prefix_sum"][idx], sums["prefix_n"][idx], 0.0),
            requests=requests[idx].astype(np.uint64),
            destinations=self.dest_ring.stats(slots, self.destinations, span_s),
            overflow_keys=overflow_keys,
            overflow_rate_per_s=self.overflow.requests(slots) / span_s,
            active_keys=int(np.count_nonzero(requests[live] > 0)) + overflow_keys,
            last_destination=last,
            last_destination_names=last_names,
        )

    def _last_destinations(self, idx: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """Key slots `idx`'s newest destinations as indices into the names they use."""
        dslots = self.key_ring.last_destination[idx]
        used, inverse = np.unique(dslots, return_inverse=True)
        names = self.destinations.names(used[used >= 0])
        index = np.arange(len(used), dtype=np.int32) - int(np.count_nonzero(used < 0))
        return index[inverse].astype(np.int32), names

    def _forget_quiet_keys(self) -> None:
        """Prune reuse pairs older than the eviction window, then release key slots
        with nothing left in the ring and no pair (so a slot is never reused while
        anything still refers to it)."""
        cfg = self.config
        assert self.watermark_ms is not None and self.next_end_ms is not None
        pair_cutoff = self.watermark_ms - cfg.eviction_ms
        self.pair_last_seen = {p: t for p, t in self.pair_last_seen.items() if t >= pair_cutoff}
        window_start = self.next_end_ms - cfg.window_ms
        cutoff = min(pair_cutoff, window_start) - cfg.hop_ms
        quiet = self.key_ring.quiet(self.keys.live(), cutoff)
        if quiet.size:
            self.keys.release(quiet)
            self.key_ring.reset_keys(quiet)
            self.released_keys += int(quiet.size)


def _ratio(num: np.ndarray, den: np.ndarray, empty: float) -> np.ndarray:
    out = np.full(num.shape, empty, dtype=np.float64)
    np.divide(num, den, out=out, where=den > 0)
    return out


def _cv(n: np.ndarray, s: np.ndarray, sq: np.ndarray) -> np.ndarray:
    """Coefficient of variation of gaps from their moments; NaN under 2 gaps."""
    out = np.full(n.shape, math.nan)
    ok = (n >= 2) & (s > 0)
    mean = s[ok] / n[ok]
    var = np.maximum(sq[ok] / n[ok] - mean * mean, 0.0)
    out[ok] = np.sqrt(var) / mean
    return out
