"""One destination's engine signals as the `EngineSignals` message (pure)."""

from __future__ import annotations

from cacheroute.engine_metrics import EngineLoad
from cacheroute.v1 import signals_pb2
from streams.engines.kv_state import CacheSignals


def engine_signals(destination: str, observed_at_ms: int, *, cache: CacheSignals | None,
                   kv_counts: tuple[int, int, int] = (0, 0, 0), engine: str = "",
                   load: EngineLoad | None = None,
                   metrics_error: str = "") -> signals_pb2.EngineSignals:
    """`kv_counts`: (gaps, resyncs, garbage) of the destination's KV-event bridge."""
    msg = signals_pb2.EngineSignals(destination=destination, observed_at_ms=observed_at_ms,
                                    engine=engine, metrics_error=metrics_error[:200])
    if cache is not None:
        msg.kv_events = True
        msg.blocks_resident = cache.blocks_resident
        msg.block_size = cache.block_size
        msg.blocks_stored_per_s = cache.stored_per_s
        msg.blocks_removed_per_s = cache.removed_per_s
        if cache.residency_s is not None:
            msg.residency_s = cache.residency_s
        msg.kv_gaps, msg.kv_resyncs, msg.kv_garbage = kv_counts
    if load is not None:
        msg.metrics = True
        msg.running, msg.waiting = load.running, load.waiting
        for name in ("kv_usage", "prefix_hit_rate", "ttft_p50_s", "ttft_p99_s",
                     "preemptions_per_s"):
            value = getattr(load, name)
            if value is not None and value == value and abs(value) != float("inf"):
                setattr(msg, name, value)
    return msg
