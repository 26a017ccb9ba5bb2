"""Predicted vs realized (planner_svc.control.delivery), pure."""

from __future__ import annotations

import pytest

from planner_svc.control.delivery import Realized, predict, report
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
