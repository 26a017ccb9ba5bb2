"""A destination's KV cache as its engine's events describe it (pure; time passed in).

    state = CacheState()
    state.apply(decode_batch(payload), now)      # every batch, in sequence order
    state.signals(now)                            # what the planner reads

What it measures, per destination:
- `blocks_resident`: blocks stored and not removed (GPU medium; offloaded copies are
  another tier and are not counted);
- `stored_per_s`, `removed_per_s`: over the last `window_s`;
- `residency_s`: the median time a block stayed resident before it was removed, over the
  last `window_s` of removals: how long a prefix survives on this destination once it
  stops being used, the *eviction window* the planner's W is about (a key whose requests
  come more often than this stays warm);
- `resyncs`, `cleared`: how often the picture was rebuilt (a gap the replay could not
  fill, a restart, AllBlocksCleared).

Memory is bounded: at most `max_blocks` resident hashes are tracked (past that, the oldest
are forgotten and counted in `forgotten`), and the rate and lifetime samples are windows.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass

from streams.engines.vllm_kv import KvBatch

GPU = "GPU"


@dataclass(frozen=True, slots=True)
class CacheSignals:
    blocks_resident: int
    block_size: int  # tokens per block (0 before the first BlockStored)
    stored_per_s: float
    removed_per_s: float
    residency_s: float | None  # None until blocks were removed in the window
    resyncs: int
    cleared: int
    forgotten: int


class CacheState:
    def __init__(self, *, window_s: float = 60.0, max_blocks: int = 1 << 21,
                 max_samples: int = 20_000) -> None:
        if window_s <= 0 or max_blocks < 1 or max_samples < 1:
            raise ValueError("window_s, max_blocks and max_samples must be positive")
        self.window_s = window_s
        self.max_blocks = max_blocks
        self._resident: OrderedDict[bytes, float] = OrderedDict()  # hash -> stored at
        self._stored: deque[tuple[float, int]] = deque()  # (at, blocks)
        self._removed: deque[tuple[float, int]] = deque()
        self._lifetimes: deque[tuple[float, float]] = deque(maxlen=max_samples)
        self.block_size = 0
        self.resyncs = 0
        self.cleared = 0
        self.forgotten = 0

    def apply(self, batch: KvBatch, now: float) -> None:
        if batch.cleared:
            self._resident.clear()
            self.cleared += 1
        resident = self._resident
        for s in batch.stored:
            if s.medium not in (None, GPU):
                continue
            self.block_size = s.block_size
            for h in s.hashes:
                resident[h] = now
                resident.move_to_end(h)
            self._stored.append((now, len(s.hashes)))
        while len(resident) > self.max_blocks:
            resident.popitem(last=False)
            self.forgotten += 1
        for r in batch.removed:
            if r.medium not in (None, GPU):
                continue
            n = 0
            for h in r.hashes:
                at = resident.pop(h, None)
                if at is not None:
                    self._lifetimes.append((now, now - at))
                    n += 1
            self._removed.append((now, n))

    def resync(self) -> None:
        """The event stream has a hole the publisher could not replay: what is resident
        is unknown until blocks are stored again; start over (counted)."""
        self._resident.clear()
        self.resyncs += 1

    def signals(self, now: float) -> CacheSignals:
        horizon = now - self.window_s
        for q in (self._stored, self._removed):
            while q and q[0][0] < horizon:
                q.popleft()
        while self._lifetimes and self._lifetimes[0][0] < horizon:
            self._lifetimes.popleft()
        span = self.window_s
        lifetimes = [life for _, life in self._lifetimes]
        return CacheSignals(
            blocks_resident=len(self._resident),
            block_size=self.block_size,
            stored_per_s=sum(n for _, n in self._stored) / span,
            removed_per_s=sum(n for _, n in self._removed) / span,
            residency_s=statistics.median(lifetimes) if lifetimes else None,
            resyncs=self.resyncs, cleared=self.cleared, forgotten=self.forgotten)
