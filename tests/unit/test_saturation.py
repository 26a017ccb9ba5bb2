"""A destination whose engine stays saturated is planned at the capacity it showed
(planner_svc.control.saturation)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cacheroute.v1 import signals_pb2
from planner_svc.control.saturation import (
    Saturation,
    SaturationSettings,
    derated_fleet,
    effective_weight,
    observe,
    saturation_reason,
)
from planner_svc.planning.config import DestinationSpec

S = SaturationSettings(dwell_s=20.0, clear_s=60.0, floor=0.25)


def report(at_s: float, *, running: int = 8, waiting: int = 0, kv: float | None = None,
           preemptions: float | None = None) -> signals_pb2.EngineSignals:
    msg = signals_pb2.EngineSignals(destination="d0", observed_at_ms=int(at_s * 1000),
                                    metrics=True, running=running, waiting=waiting)
    if kv is not None:
        msg.kv_usage = kv
    if preemptions is not None:
        msg.preemptions_per_s = preemptions
    return msg


def run(reports: list[signals_pb2.EngineSignals], arrivals: list[float | None]) -> Saturation:
    rec = Saturation()
    for r, a in zip(reports, arrivals, strict=True):
        rec = observe(rec, r, a, S)
    return rec


def test_a_queue_beside_the_batch_or_a_preempting_full_cache_is_saturation():
    assert saturation_reason(report(0, waiting=5), S) == "waiting 5 beside 8 running"
    assert saturation_reason(report(0, waiting=3), S) == ""  # below half the batch
    assert saturation_reason(report(0, running=0, waiting=1), S) == ""  # a lone arrival
    assert saturation_reason(report(0, kv=0.99, preemptions=0.5), S).startswith("KV 99% full")
    assert saturation_reason(report(0, kv=0.99, preemptions=0.0), S) == ""  # full, coping
    no_metrics = signals_pb2.EngineSignals(destination="d0", kv_events=True, blocks_resident=9)
    assert saturation_reason(no_metrics, S) == ""


def test_derated_only_after_the_dwell_and_restored_only_after_the_longer_clear():
    q = [report(t, waiting=10) for t in range(0, 20, 5)]  # 0..15 s: not yet 20 s
    rec = run(q, [12.0, 9.0, 11.0, 10.0])
    assert not rec.derated and rec.since_ms == 0
    assert rec.knee_per_s == pytest.approx(9.0 * 0.9)  # the least rate it could not serve
    rec = observe(rec, report(20, waiting=20), 30.0, S)  # the queue grew 0.5/s over 20 s
    assert rec.derated and rec.knee_per_s == pytest.approx((9.0 - 0.5) * 0.9)
    rec = observe(rec, report(25, waiting=10), 2.0, S)
    assert rec.knee_per_s == pytest.approx(7.65)  # frozen: the plan's own relief is not news
    rec = observe(rec, report(30), None, S)  # one quiet scrape
    assert rec.derated and rec.clear_since_ms == 30_000
    rec = observe(rec, report(60, waiting=10), None, S)  # saturated again: clock restarts
    assert rec.derated and rec.clear_since_ms is None
    for t in (70, 100, 129):
        rec = observe(rec, report(t), None, S)
    assert rec.derated  # clear for 59 s
    assert observe(rec, report(130), None, S) == Saturation()


def test_a_short_burst_never_derates():
    rec = run([report(0, waiting=10), report(10, waiting=10), report(15)], [5.0, 5.0, 5.0])
    assert rec == Saturation()


def test_the_planned_weight_is_the_measured_knee_within_the_floor():
    d = DestinationSpec("d0", capacity_weight=2.0)
    derated = Saturation(since_ms=0, derated=True, knee_per_s=10.0, reason="x")
    assert effective_weight(d, derated, q_cap=10.0, settings=S) == 1.0  # 10 of 20 req/s
    assert effective_weight(d, Saturation(since_ms=0, derated=True, knee_per_s=1.0), 10.0,
                            S) == 0.5  # the floor: a quarter of 2
    assert effective_weight(d, Saturation(since_ms=0, derated=True), 10.0, S) == 1.0  # no knee
    assert effective_weight(d, Saturation(since_ms=0, knee_per_s=1.0), 10.0, S) == 2.0
    fleet = [d, DestinationSpec("d1")]
    out = derated_fleet(fleet, {"d0": derated}, 10.0, S)
    assert [x.capacity_weight for x in out] == [1.0, 1.0] and out[1] is fleet[1]


@given(weight=st.floats(0.1, 10), knee=st.one_of(st.none(), st.floats(0, 1e4)),
       q_cap=st.floats(0, 1e3), derated=st.booleans())
def test_a_planned_weight_is_never_above_the_configured_nor_below_its_floor(
        weight, knee, q_cap, derated):
    d = DestinationSpec("d0", capacity_weight=weight)
    w = effective_weight(d, Saturation(since_ms=0, derated=derated, knee_per_s=knee), q_cap, S)
    assert S.floor * weight - 1e-12 <= w <= weight


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20),
                          st.one_of(st.none(), st.floats(0, 100))), max_size=40))
def test_any_report_sequence_keeps_a_consistent_record(steps):
    rec = Saturation()
    for i, (running, waiting, arrival) in enumerate(steps):
        rec = observe(rec, report(i * 7.0, running=running, waiting=waiting), arrival, S)
        assert rec.since_ms is None or rec.clear_since_ms is None  # never both
        assert rec.derated or rec.clear_since_ms is None
        assert rec.knee_per_s is None or rec.knee_per_s >= 0


def test_status_says_why_since_when_and_the_weight_planned_with():
    from planner_svc.cli.ops_view import render_saturated

    row = {"destination": "e2", "reason": "waiting 12 beside 8 running", "since_ms": 0,
           "clear_since_ms": None, "derated": True, "knee_per_s": 45.0,
           "configured_weight": 1.0, "planned_weight": 0.45}
    assert render_saturated(row, 25_000) == (
        "e2: saturated for 25s (waiting 12 beside 8 running); planned at weight 0.45 of 1, "
        "measured capacity 45 req/s")
    clearing = {**row, "since_ms": None, "clear_since_ms": 10_000}
    assert render_saturated(clearing, 40_000).startswith("e2: clear for 30s")
    assert render_saturated({**row, "derated": False}, 5_000).endswith(
        "planned as configured until it stays saturated")
