"""One LLM-engine model, used twice: the simulator (virtual time) and the demo fleet (real time).

The model (design-notes §4) is a serving replica with
- a prefix KV cache of `cache_capacity_tokens`, LRU over routing keys and counted in
  tokens (`PrefixCache`): a key's cached prefix is what its last request left behind,
  so multi-turn conversations grow it turn by turn. Unfinished requests pin their KV
  (prompt + output tokens) in the same memory, so the cache evicts to make room for them
  (only the at most `batch_limit` requests holding batch slots pin memory);
- continuous batching with at most `batch_limit` requests running; a request that finds
  the batch full waits for the earliest running request to finish (FIFO);
- prefill that costs `prefill_overhead_s + prefill_s_per_token * uncached_tokens` and is
  serialised on the replica (chunked prefill shares one GPU: prefill work queues);
- decode that costs `output_tokens * tpot`, where the time per output token grows with
  the batch: `tpot = decode_s_per_token * (1 + decode_slowdown_per_running * (running - 1))`.

Because requests are admitted in time order, every completion time is known at
admission: the replica keeps only the free time of its prefill stage and a heap of the
finish times of its running requests. That makes `Engine` pure and cheap (no event
loop inside; time is passed in), and it serves both callers naturally:

- Simulator (virtual time): call `engine.admit(key, prompt, prefix, output, now)` in
  arrival order; schedule the returned `finish_time` as a completion event if the
  routing policy needs to see it (in-flight counters), and record the latency.
- Real-time fleet: `cached, finish = engine.submit(key, prompt, prefix, output,
  time.monotonic())`, then sleep until `finish` and emit the completion event. Guard the
  engine with a lock if several threads submit; `in_flight(now)` gives the live load.

`now` must not decrease between calls on one engine (a smaller value is treated as the
latest one seen). Calibrate the constants to your model and hardware with
`EngineModel.fit` from measured (uncached tokens, output tokens, batch, latency) rows.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np


@dataclass(frozen=True, slots=True)
class EngineModel:
    """Constants of one serving replica. Defaults: a 70B fp8 model on 2×H100 (TP2).

    KV for Llama-70B in fp8 is ~160 KB per token; ~70 GB left after the weights gives a few
    hundred thousand tokens of cache. Prefill runs ~10k tokens/s, decode ~30 ms/token.
    """

    cache_capacity_tokens: int = 400_000
    prefill_overhead_s: float = 0.02
    prefill_s_per_token: float = 1.0e-4
    decode_s_per_token: float = 0.03
    decode_slowdown_per_running: float = 0.01
    batch_limit: int = 64
    # Requests in the batch pin their KV (prompt + output tokens) in the block pool the prefix
    # cache shares, as in vLLM: a busy replica has less room for cached prefixes.
    running_requests_pin_kv: bool = True

    def service_seconds(self, uncached_tokens: int, output_tokens: int, running: int = 1) -> float:
        """Unloaded latency of one request (prefill + decode) with `running` in the batch."""
        return self.prefill_seconds(uncached_tokens) + output_tokens * self.tpot(running)

    def prefill_seconds(self, uncached_tokens: int) -> float:
        return self.prefill_overhead_s + self.prefill_s_per_token * uncached_tokens

    def tpot(self, running: int) -> float:
        """Seconds per output token with `running` requests in the batch (itself included)."""
        return self.decode_s_per_token * (1.0 + self.decode_slowdown_per_running * (running - 1))

    @classmethod
    def fit(
        cls,
        measured: Sequence[tuple[float, float, float, float]],
        *,
        cache_capacity_tokens: int = 400_000,
        batch_limit: int = 64,
    ) -> EngineModel:
        """Least-squares calibration from measured, *unqueued* request latencies.

        Each row is `(uncached_tokens, output_tokens, batch, latency_s)`, e.g. from an engine's
        request log with the prefix-cache hit count subtracted from the prompt length, taken at
        low load so queueing is absent. The model is linear in its constants:
        latency = o + p·uncached + d·output + (d·s)·output·(batch − 1).
        Cache capacity and batch limit come from the engine's own configuration.
        """
        rows = np.asarray(measured, dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] != 4 or len(rows) < 4:
            raise ValueError("need at least 4 rows of (uncached, output, batch, latency_s)")
        u, out, batch, lat = rows.T
        design = np.column_stack([np.ones_like(u), u, out, out * (batch - 1.0)])
        (o, p, d, ds), *_ = np.linalg.lstsq(design, lat, rcond=None)
        return cls(
            cache_capacity_tokens=cache_capacity_tokens,
            prefill_overhead_s=max(0.0, float(o)),
            prefill_s_per_token=max(0.0, float(p)),
            decode_s_per_token=max(1e-6, float(d)),
            decode_slowdown_per_running=max(0.0, float(ds) / max(float(d), 1e-6)),
            batch_limit=batch_limit,
        )

    def scaled(self, **changes: float | int) -> EngineModel:
        """A copy with some constants changed (for sweeps)."""
        return replace(self, **changes)  # type: ignore[arg-type]


class PrefixCache:
    """LRU over routing keys, counted in tokens.

    Each key holds the token length of the prompt prefix its last request left in the
    cache. A new request of the key can reuse at most `prefix_tokens` of it (the part of its
    prompt shared with earlier turns); afterwards the key holds the new prompt (the next
    turn's prefix), and least-recently-used keys are evicted until the total fits.
    """

    __slots__ = ("_held", "capacity_tokens", "used_tokens")

    def __init__(self, capacity_tokens: int) -> None:
        if capacity_tokens < 0:
            raise ValueError("capacity_tokens must be >= 0")
        self.capacity_tokens = int(capacity_tokens)
        self.used_tokens = 0
        self._held: OrderedDict[Hashable, int] = OrderedDict()

    def lookup_and_insert(
        self, key: Hashable, prefix_tokens: int, prompt_tokens: int, reserved_tokens: int = 0
    ) -> int:
        """Return the cached tokens this request reuses, then cache its prompt (LRU refresh).

        `reserved_tokens` is KV memory other requests hold right now (running requests pin
        their blocks, as in vLLM's shared block pool): the cache evicts until it fits beside it.
        """
        held = self._held.pop(key, None)
        cached = 0 if held is None else min(held, prefix_tokens)
        limit = self.capacity_tokens - reserved_tokens
        limit = limit if limit > 0 else 0
        keep = prompt_tokens if prompt_tokens < limit else limit
        self.used_tokens += keep - (held or 0)
        self._held[key] = keep
        held_map = self._held
        while self.used_tokens > limit:
            _, tokens = held_map.popitem(last=False)
            self.used_tokens -= tokens
        return cached

    def peek(self, key: Hashable) -> int:
        """Tokens cached for `key` (0 if absent), without touching recency."""
        return self._held.get(key, 0)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._held

    def __len__(self) -> int:
        return len(self._held)

    def keys_lru_first(self) -> list[Hashable]:
        """Cached keys from least to most recently used (for tests and diagnostics)."""
        return list(self._held)


class Served(NamedTuple):
    """What the engine did with one request (all times absolute, in the caller's clock)."""

    cached_tokens: int
    finish_time: float
    first_token_time: float
    start_time: float


class Engine:
    """One replica: prefix cache + continuous batching + prefill/decode cost (see module doc)."""

    __slots__ = ("_finishes", "_last_now", "_pinned", "_prefill_free", "_slots", "cache", "model")

    def __init__(self, model: EngineModel, cache: PrefixCache | None = None) -> None:
        self.model = model
        self.cache = cache if cache is not None else PrefixCache(model.cache_capacity_tokens)
        self._prefill_free = 0.0
        # (finish time, KV tokens) of the requests holding batch slots, and their token sum:
        # at most `batch_limit` requests pin KV at once; queued ones hold none yet.
        self._slots: list[tuple[float, int]] = []
        self._pinned = 0
        self._finishes: list[float] = []  # finish times of every admitted, unfinished request
        self._last_now = float("-inf")

    def submit(
        self, key: Hashable, prompt_tokens: int, prefix_tokens: int, output_tokens: int, now: float
    ) -> tuple[int, float]:
        """Admit a request at `now`; return `(cached_tokens, finish_time)`."""
        served = self.admit(key, prompt_tokens, prefix_tokens, output_tokens, now)
        return served.cached_tokens, served.finish_time

    def admit(
        self, key: Hashable, prompt_tokens: int, prefix_tokens: int, output_tokens: int, now: float
    ) -> Served:
        """Admit a request at `now` (non-decreasing per engine); return its full timing."""
        cached, finish, first, start = self.admit_tuple(
            key, prompt_tokens, prefix_tokens, output_tokens, now
        )
        finishes = self._finishes
        while finishes and finishes[0] <= now:
            heapq.heappop(finishes)
        heapq.heappush(finishes, finish)
        return Served(cached, finish, first, start)

    def admit_tuple(
        self, key: Hashable, prompt_tokens: int, prefix_tokens: int, output_tokens: int, now: float
    ) -> tuple[int, float, float, float]:
        """`admit` as a plain tuple, without the in-flight bookkeeping (the simulator's hot path:
        its routers count in-flight requests themselves)."""
        m = self.model
        now = now if now > self._last_now else self._last_now
        self._last_now = now
        slots = self._slots
        while slots and slots[0][0] <= now:
            self._pinned -= heapq.heappop(slots)[1]
        reserved = self._pinned if m.running_requests_pin_kv else 0
        cached = self.cache.lookup_and_insert(key, prefix_tokens, prompt_tokens, reserved)
        # A full batch makes the request wait for the earliest slot to free (FIFO k-server).
        if len(slots) >= m.batch_limit:
            start, freed = heapq.heappop(slots)
            self._pinned -= freed
        else:
            start = now
        prefill_start = start if start > self._prefill_free else self._prefill_free
        prefill_end = (
            prefill_start + m.prefill_overhead_s + m.prefill_s_per_token * (prompt_tokens - cached)
        )
        self._prefill_free = prefill_end
        tpot = m.decode_s_per_token * (1.0 + m.decode_slowdown_per_running * len(slots))
        finish = prefill_end + output_tokens * tpot
        kv = prompt_tokens + output_tokens
        heapq.heappush(slots, (finish, kv))
        self._pinned += kv
        return cached, finish, prefill_end + tpot, start

    def in_flight(self, now: float) -> int:
        """Requests admitted by `admit`/`submit` and not finished at `now` (queued or running)."""
        finishes = self._finishes
        while finishes and finishes[0] <= now:
            heapq.heappop(finishes)
        return len(finishes)

    @property
    def prefill_backlog_until(self) -> float:
        """Time at which the prefill stage drains, given the requests admitted so far."""
        return self._prefill_free
