"""One serving replica: the content-level engine model shared by every part that needs one
(the simulator in virtual time; the emulated engines and the demo fleet in real time).

A request arrives with its prompt as a content chain (`kvcache.Chain`), its token
counts, and the chain its answer adds (so the next turn of the same conversation can hit
it). The replica
- caches KV in a `kvcache.BlockCache` (vLLM's block pool: full blocks, cached once
  computed, shared blocks held once, LRU leaves evicted tail first);
- runs at most `batch_limit` requests; admits a request only when its prompt and whole
  output fit in KV memory beside what running requests hold, else it waits for the
  earliest to finish (FIFO);
- prefills on one stage per replica, `prefill_overhead_s + prefill_s_per_token ×
  uncached tokens` (chunked prefill shares the GPU, so prefill work queues);
- decodes at a time per output token that grows with the batch and with the KV the batch
  reads each step (decode is memory-bound):
  `tpot = decode_s_per_step + decode_s_per_running × running + decode_s_per_kv_token ×
  KV tokens held by the batch`.

Requests are admitted in time order and every completion time is known at admission, so
the replica keeps only a heap of running requests and its prefill stage's free time: no
event loop inside, time passed in, cheap enough for millions of requests.

The default constants are a Llama-3-70B-class model in fp8 on 2×H100 (TP2), derived from
published figures (see `ReplicaModel`); `ReplicaModel.fit` calibrates them from measured
rows and reports the fit error.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from planner_svc.simulator.kvcache import BlockCache, Chain, Holding


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaModel:
    """Constants of one replica. Defaults and where they come from:

    - KV per token, Llama-3-70B (80 layers × 8 KV heads × 128 dims × K and V) in fp8:
      160 KiB. 2×H100 80 GB at vLLM's default gpu_memory_utilization 0.9 leave ~64 GB
      after 70 GB of fp8 weights and activations: **~400k tokens** of KV;
    - prefill: 2 × 70e9 FLOP per token, 2 × 989 dense fp8 TFLOP/s (H100 SXM datasheet) at
      ~40 % utilisation: ~11k tokens/s, **1e-4 s per token**, plus a 20 ms step overhead;
    - decode: each step reads the 35 GB of weights per GPU at ~60 % of 3.35 TB/s:
      **~18 ms**, plus 80 KiB of KV per context token per GPU at ~2 TB/s:
      **4e-8 s per KV token**, plus ~0.2 ms of compute per running sequence;
    - vLLM's defaults: 16-token blocks, at most 256 running sequences (`max_num_seqs`).
    """

    kv_capacity_tokens: int = 400_000
    block_tokens: int = 16
    prefill_overhead_s: float = 0.02
    prefill_s_per_token: float = 1.0e-4
    decode_s_per_step: float = 0.018
    decode_s_per_running: float = 2.0e-4
    decode_s_per_kv_token: float = 4.0e-8
    batch_limit: int = 256

    def __post_init__(self) -> None:
        if self.kv_capacity_tokens < self.block_tokens or self.block_tokens < 1:
            raise ValueError("need block_tokens >= 1 and kv_capacity_tokens >= block_tokens")
        if self.batch_limit < 1:
            raise ValueError("batch_limit must be >= 1")

    @property
    def capacity_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_tokens

    def tpot(self, running: int, kv_tokens: int) -> float:
        """Seconds per output token with `running` sequences holding `kv_tokens` of KV."""
        return (self.decode_s_per_step + self.decode_s_per_running * running
                + self.decode_s_per_kv_token * kv_tokens)

    def prefill_seconds(self, uncached_tokens: int) -> float:
        return self.prefill_overhead_s + self.prefill_s_per_token * uncached_tokens

    def service_seconds(self, uncached_tokens: int, output_tokens: int, running: int = 1,
                        kv_tokens: int = 0) -> float:
        """Unqueued latency of one request."""
        return (self.prefill_seconds(uncached_tokens)
                + output_tokens * self.tpot(running, kv_tokens))

    def time_scaled(self, factor: float) -> ReplicaModel:
        """The same replica `factor` times slower (the emulator's time scale; 0 = instant)."""
        return replace(
            self,
            prefill_overhead_s=self.prefill_overhead_s * factor,
            prefill_s_per_token=self.prefill_s_per_token * factor,
            decode_s_per_step=self.decode_s_per_step * factor,
            decode_s_per_running=self.decode_s_per_running * factor,
            decode_s_per_kv_token=self.decode_s_per_kv_token * factor,
        )

    @classmethod
    def fit(cls, rows: Sequence[tuple[float, float, float, float, float]],
            **fixed: int) -> tuple[ReplicaModel, float]:
        """Least-squares constants from measured, unqueued requests, and the fit's median
        relative error. Each row: `(uncached tokens, output tokens, running sequences, KV
        tokens held by the batch, latency s)`; take them at low load from an engine's
        request log (prompt tokens minus cached tokens). Capacity, block size and batch
        limit come from the engine's configuration (`fixed`)."""
        a = np.asarray(rows, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] != 5 or len(a) < 6:
            raise ValueError("need at least 6 rows of (uncached, output, running, kv, latency)")
        u, out, running, kv, lat = a.T
        design = np.column_stack([np.ones_like(u), u, out, out * running, out * kv])
        coef, *_ = np.linalg.lstsq(design, lat, rcond=None)
        o, p, d, dr, dk = (max(0.0, float(c)) for c in coef)
        model = cls(prefill_overhead_s=o, prefill_s_per_token=p, decode_s_per_step=max(d, 1e-9),
                    decode_s_per_running=dr, decode_s_per_kv_token=dk, **fixed)
        predicted = design @ np.array([o, p, model.decode_s_per_step, dr, dk])
        error = float(np.median(np.abs(predicted - lat) / np.maximum(lat, 1e-9)))
        return model, error


@dataclass(slots=True)
class Served:
    """What the replica did with one request (times in the caller's clock). Not a
    NamedTuple: compiled, a dataclass's fields are read without a lookup (one per request)."""

    cached_tokens: int
    start_time: float  # admitted to the batch
    first_token_time: float
    finish_time: float
    # When its prefill began: before it, the request waits (vLLM's "waiting" queue): for a
    # batch slot, for KV blocks, or behind other prefills.
    prefill_start_time: float = 0.0


class Replica:
    """See the module doc."""

    __slots__ = ("_by_finish", "_finish", "_last_now", "_prefill_free", "cache", "kv_held",
                 "model")

    def __init__(self, model: ReplicaModel) -> None:
        self.model = model
        self.cache = BlockCache(model.capacity_blocks)
        self._prefill_free = 0.0
        # Running requests: a heap of their finish times, and what each holds by finish time
        # (several with one finish time in admission order). Floats compare several times
        # faster than (finish, seq, ...) tuples, and the heap is sifted twice per request.
        self._finish: list[float] = []
        self._by_finish: dict[float, list[tuple[int, Holding | None, Chain]]] = {}
        self.kv_held = 0  # KV tokens of the running requests
        self._last_now = float("-inf")

    def admit(self, chain: Chain, prompt_tokens: int, output_tokens: int, now: float,
              answer: Chain = (), reuse_limit_tokens: int | None = None) -> Served:
        """Admit a request at `now` (non-decreasing per replica). `reuse_limit_tokens`: at
        most this much of the prompt can be a hit (what a length-only trace says it shares
        with earlier requests)."""
        m = self.model
        now = max(now, self._last_now)
        self._last_now = now
        self._release_until(now)
        start = now
        if len(self._finish) >= m.batch_limit:
            start = self._release_earliest(start)
        private = -(-(output_tokens + prompt_tokens % m.block_tokens) // m.block_tokens)
        limit = (None if reuse_limit_tokens is None
                 else reuse_limit_tokens // m.block_tokens)
        holding = self.cache.admit(chain, start, private, limit)
        while holding is None and self._finish:
            start = self._release_earliest(start)
            holding = self.cache.admit(chain, start, private, limit)
        # A request larger than the whole cache is served without caching (an engine would
        # refuse it; the workload should not contain one).
        matched = holding.matched_blocks if holding is not None else 0
        cached = matched * m.block_tokens
        if cached >= prompt_tokens > 0:  # a full hit still computes its last block
            cached = max(0, cached - m.block_tokens)
        prefill_start = start if start > self._prefill_free else self._prefill_free
        prefill_end = prefill_start + m.prefill_seconds(prompt_tokens - cached)
        self._prefill_free = prefill_end
        if holding is not None:
            self.cache.computed(holding, prefill_end)
        kv = prompt_tokens + output_tokens
        tpot = m.tpot(len(self._finish) + 1, self.kv_held + kv)
        finish = prefill_end + output_tokens * tpot
        heapq.heappush(self._finish, finish)
        same = self._by_finish.get(finish)
        if same is None:
            self._by_finish[finish] = [(kv, holding, answer)]
        else:
            same.append((kv, holding, answer))
        self.kv_held += kv
        return Served(cached, start, prefill_end + tpot, finish, prefill_start)

    def in_flight(self, now: float) -> int:
        """Requests admitted and not finished at `now`."""
        self._release_until(now)
        return len(self._finish)

    @property
    def prefill_backlog_until(self) -> float:
        return self._prefill_free

    def _release_until(self, now: float) -> None:
        finish = self._finish
        while finish and finish[0] <= now:
            self._release_earliest(now)

    def _release_earliest(self, start: float) -> float:
        """Finish the running request that ends first; the later of `start` and its end."""
        finish = heapq.heappop(self._finish)
        same = self._by_finish[finish]
        if len(same) == 1:
            del self._by_finish[finish]
            kv, holding, answer = same[0]
        else:
            kv, holding, answer = same.pop(0)
        self.kv_held -= kv
        if holding is not None:
            self.cache.release(holding, finish, answer)
        return start if start > finish else finish
