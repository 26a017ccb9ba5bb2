"""A rewarm dip is measured only on windows that begin after the install.

A stream window that straddles the install still mixes in traffic routed by the old
plan; if it counted, two such windows right after an install look "settled" at the old
hit rate and the loop anchors its baseline there (it then never sees staleness).
"""

from __future__ import annotations

import numpy as np

from planner_svc.control import ControlLoop, Telemetry, Traffic
from planner_svc.control.decision import Figures
from planner_svc.planning import PlanningConfig, build_plan


def telemetry(end_s: float, hit: float) -> Telemetry:
    return Telemetry(
        window_end_s=end_s, window_s=10.0, hit_rate=hit, prompt_tokens_per_s=1e5, requests=5000
    )


def test_windows_straddling_the_install_are_not_dip_samples() -> None:
    keys = [f"k{i}" for i in range(40)]
    rates = np.linspace(10.0, 1.0, 40)
    plan = build_plan(keys, rates, PlanningConfig.uniform(4, 100.0, 5))
    traffic = Traffic(keys, rates, window_end_s=100.0)
    loop = ControlLoop()
    loop.record_install(100.0, figures=Figures(rewarm_time_s=1.0))
    for end in (102.0, 104.0, 106.0, 108.0):  # begin before t = 100: old plan's traffic
        loop.step(end, installed=plan, traffic=traffic, telemetry=telemetry(end, 0.12))
    assert loop.settling is not None and loop.settling.samples == ()
    loop.step(111.0, installed=plan, traffic=traffic, telemetry=telemetry(111.0, 0.5))
    # The first window wholly after the install is the first sample; past the longest wait
    # it also ends the dip, and the baseline is the new plan's hit rate, not the old one's.
    assert loop.settling is None
    assert loop.baseline is not None and loop.baseline.hit_rate == 0.5
