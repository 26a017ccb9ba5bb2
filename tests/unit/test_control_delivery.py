"""Predicted vs realized (planner_svc.control.delivery), pure."""

from __future__ import annotations

import json

import pytest

from planner_svc.control.delivery import (
    CapacityVerdict,
    DeliveryReport,
    Realized,
    delivery_from_dict,
    delivery_to_dict,
    predict,
    report,
)
from planner_svc.control.telemetry import Telemetry

DESTS = ("a", "b")


def window(t: float, hit: float, loads: tuple[float, float]) -> Telemetry:
    return Telemetry(window_end_s=t, hit_rate=hit, prompt_tokens_per_s=1000.0, requests=100,
                     destination_loads_per_s=dict(zip(DESTS, loads, strict=True)), window_s=5.0,
                     planned_hit_rate=hit, fallback_hit_rate=0.1)


def test_the_prediction_mixes_planned_and_cold_hit_rates_by_the_admitted_share():
    p = predict(DESTS, (1.0, 1.0), (30.0, 10.0), 0.75, window(0, 0.8, (1, 1)))
    assert p.hit_rate == pytest.approx(0.75 * 0.8 + 0.25 * 0.1)
    assert p.imbalance == pytest.approx(30.0 / 20.0)
    assert predict(DESTS, (1.0, 1.0), (1.0, 1.0), 0.75, None).hit_rate is None


def test_realized_figures_exclude_the_dip_and_the_since_install_rate_keeps_it():
    p = predict(DESTS, (1.0, 1.0), (20.0, 20.0), 1.0, window(0, 0.8, (1, 1)))
    r = Realized()
    r = r.add(window(5, 0.2, (40.0, 0.0)), DESTS, in_dip=True)
    for t in (10, 15):
        r = r.add(window(t, 0.6, (30.0, 10.0)), DESTS, in_dip=False)
    out = report("1.2", p, r)
    assert (out.windows, out.dip_windows) == (2, 1)
    assert out.hit_rate == pytest.approx(0.6) and out.hit_gap == pytest.approx(-0.2)
    assert out.hit_rate_since_install == pytest.approx((0.2 + 0.6 + 0.6) / 3)
    assert out.loads_per_s == (30.0, 10.0) and out.imbalance == pytest.approx(1.5)
    assert out.imbalance_gap == pytest.approx(0.5)
    empty = report("1.3", p, Realized())
    assert empty.hit_rate is None and empty.hit_gap is None and empty.windows == 0


def timed(t: float, loads: tuple[float, float], p99s: dict[str, float]) -> Telemetry:
    return Telemetry(window_end_s=t, hit_rate=0.5, prompt_tokens_per_s=1000.0, requests=100,
                     destination_loads_per_s=dict(zip(DESTS, loads, strict=True)), window_s=5.0,
                     destination_p99_ms=p99s, p99_ms=max(p99s.values(), default=None))


def measured(q_cap: float, loads: tuple[float, float], p99s: list[dict[str, float]],
             target: float | None) -> DeliveryReport:
    p = predict(DESTS, (1.0, 2.0), loads, 1.0, None, q_cap)
    r = Realized()
    for i, lat in enumerate(p99s):
        r = r.add(timed(5.0 * i, loads, lat), DESTS, in_dip=False)
    return report("1.2", p, r, target)


def test_a_q_cap_the_engines_cannot_carry_is_reported_overstated():
    # b carries 40 req/s against a capacity of 2 x 60: a third of q_cap, yet 9 s of p99
    out = measured(60.0, (30.0, 40.0), [{"a": 200.0, "b": 9000.0}] * 3, 3500.0)
    assert out.predicted.utilisation == pytest.approx((0.5, 40.0 / 120.0))
    assert out.utilisation == pytest.approx((0.5, 40.0 / 120.0))
    assert out.p99_ms == pytest.approx((200.0, 9000.0))
    assert out.capacity.verdict is CapacityVerdict.OVERSTATED and out.capacity.misfit
    assert "b ran at 33% of q_cap 60" in out.capacity.reason
    assert out.to_dict()["capacity_verdict"] == "q_cap_overstated"


def test_a_fleet_far_above_q_cap_with_latency_to_spare_is_reported_understated():
    out = measured(5.0, (25.0, 50.0), [{"a": 150.0, "b": 300.0}] * 3, 3500.0)
    assert out.utilisation == pytest.approx((5.0, 5.0))
    assert out.capacity.verdict is CapacityVerdict.UNDERSTATED
    assert "500% of q_cap 5" in out.capacity.reason
    # the same loads near the target are an overloaded fleet, not a wrong q_cap
    busy = measured(5.0, (25.0, 50.0), [{"a": 150.0, "b": 3000.0}] * 3, 3500.0)
    assert busy.capacity.verdict is CapacityVerdict.CONSISTENT


def test_a_q_cap_that_fits_the_measured_latency_is_consistent():
    out = measured(60.0, (30.0, 60.0), [{"a": 400.0, "b": 600.0}, {"a": 600.0}], 3500.0)
    assert out.p99_ms == pytest.approx((500.0, 600.0))  # each one's windows that reported
    assert out.capacity.verdict is CapacityVerdict.CONSISTENT and not out.capacity.misfit


def test_the_capacity_check_needs_a_target_a_q_cap_and_a_measured_latency():
    assert measured(60.0, (30.0, 40.0), [{"b": 9e3}], None).capacity.verdict is (
        CapacityVerdict.UNCHECKED)
    assert measured(0.0, (30.0, 40.0), [{"b": 9e3}], 3500.0).capacity.verdict is (
        CapacityVerdict.UNCHECKED)
    silent = measured(60.0, (30.0, 40.0), [{}], 3500.0)
    assert silent.capacity.verdict is CapacityVerdict.UNCHECKED and silent.p99_ms != ()
    assert "no latency" in silent.capacity.reason


def test_records_from_before_the_capacity_check_still_load():
    p = predict(DESTS, (1.0, 1.0), (1.0, 1.0), 1.0, None, 12.0)
    record = delivery_to_dict(p, Realized().add(timed(5, (1.0, 1.0), {"a": 5.0}), DESTS,
                                                in_dip=False), 0.0)
    for key in ("p99_sums_ms", "p99_windows"):
        del record["realized"][key]
    del record["predicted"]["q_cap"]
    old_p, old_r, _ = delivery_from_dict(record)
    out = report("1.1", old_p, old_r, 3500.0)
    assert out.capacity.verdict is CapacityVerdict.UNCHECKED and out.p99_ms == (
        pytest.approx(float("nan"), nan_ok=True),) * 2
    new_p, new_r, _ = delivery_from_dict(json.loads(json.dumps(delivery_to_dict(
        p, Realized().add(timed(5, (1.0, 1.0), {"a": 5.0}), DESTS, in_dip=False), 0.0))))
    assert report("1.1", new_p, new_r, 3500.0).p99_ms[0] == 5.0
