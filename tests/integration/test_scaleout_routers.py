"""Scale-out on the live stack: 16 router processes serve the demo traffic as well as one.

The local stack (broker, Redis, stream worker, planner) learns the demo fleet's traffic; the
same requests are served by one `RouterClient` process, by 16 of them behind a round-robin
outer balancer (each router sees only its own in-flight requests), and by Flat-LB. The
harness is `bench/routers_live.py` (its full run is the benchmark).
"""

from __future__ import annotations

import pytest

from bench.routers_live import run_live
from planner_svc.devstack.fleet import FleetOptions
from planner_svc.devstack.stack import StackOptions, start_stack

pytestmark = pytest.mark.integration


def test_sixteen_routers_reach_the_single_router_hit_rate(tmp_path):
    # A shorter window and control interval than the demo's, so the first plan comes sooner.
    options = StackOptions(window_s=6.0, hop_s=1.0, interval_s=3.0, workdir=str(tmp_path))
    stack = start_stack(options)
    try:
        res = run_live(stack, FleetOptions(), routers=16, duration_s=40.0, verbose=False)
    finally:
        stack.stop()
    print(res)
    assert res.planned_periods >= 3, res
    assert res.single.requests == res.scaled.requests == res.flat.requests > 0
    assert abs(res.hit_gap_pp) <= 2.0, res
    # The plan is what makes the hit rate: both planned fleets are far above Flat-LB.
    assert res.scaled.hit > res.flat.hit + 0.2, res
    assert res.scaled.imbalance < 1.3, res
