"""W measured from the engines' KV events (planner_svc.control.warm_slots)."""

from __future__ import annotations

from cacheroute.v1 import signals_pb2
from planner_svc.control.warm_slots import measured_warm_slots


def sig(dest: str, blocks: int, at_ms: int, usage: float | None = None,
        kv: bool = True) -> signals_pb2.EngineSignals:
    s = signals_pb2.EngineSignals(destination=dest, observed_at_ms=at_ms, kv_events=kv,
                                  blocks_resident=blocks, block_size=16)
    if usage is not None:
        s.kv_usage = usage
    return s


def test_w_is_resident_tokens_over_the_mean_prefix_median_over_full_caches():
    now = 100_000
    signals = [sig("e0", 800, now - 500, 0.95), sig("e1", 1000, now - 200, 0.97),
               sig("e2", 1200, now - 900, 0.99),
               sig("e3", 100, now - 100, 0.20)]  # still filling: left out while others are full
    m = measured_warm_slots(signals, 128.0, now)
    assert m is not None and m.destinations == 3
    assert m.value == 1000 * 16 / 128  # the median of 100, 125, 150
    assert m.newest_age_s == 0.2


def test_nothing_fresh_or_nothing_to_divide_by_measures_nothing():
    now = 100_000
    assert measured_warm_slots([sig("e0", 800, now - 60_000)], 128.0, now) is None  # stale
    assert measured_warm_slots([sig("e0", 800, now, kv=False)], 128.0, now) is None
    assert measured_warm_slots([sig("e0", 800, now)], 0.0, now) is None
    m = measured_warm_slots([sig("e0", 800, now), sig("e1", 400, now)], 64.0, now)
    assert m is not None and m.value == (200 + 100) / 2  # none known full: all count


def test_the_learned_w_stays_within_half_and_twice_the_configured():
    from planner_svc.control.warm_slots import learned_warm_slots

    assert learned_warm_slots(128, 96.4) == 96
    assert learned_warm_slots(128, 10.0) == 64 and learned_warm_slots(128, 9999.0) == 256
    assert learned_warm_slots(1, 0.2) == 1
