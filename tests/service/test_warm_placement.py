"""The planner places keys entering the plan where the stream saw their newest request
(`warm_placement`; the stream's last-destination column, repack's `warm_at`)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from planner_svc.simulator.rates import paper_like_keys, paper_like_rates
from tests.service.harness import DESTS, serving
from tests.service.windows import make_window


def entering_keys_placed_warm(redis_url: str, tmp_path: Path, warm: bool) -> float:
    """The share of keys entering the plan that land where they were last served."""
    keys = paper_like_keys(400)
    rates = paper_like_rates(400, 300.0, seed=1)
    newcomers = [f"new-{i}" for i in range(12)]
    warm_at = {k: DESTS[(i * 5) % len(DESTS)] for i, k in enumerate(newcomers)}
    with serving(redis_url, tmp_path, warm_placement=warm, redis_namespace=f"warm-{warm}") as svc:
        end = int(time.time() * 1000)
        for window_end in (end - 20_000, end - 10_000):
            svc.planner.on_window(make_window(keys, rates, window_end_ms=window_end,
                                              destinations=list(DESTS)))
        svc.planner.replan(fresh=True, force=True, dry_run=False)
        # Twelve keys become hot enough to enter the plan; the stream says where the cold
        # tail (or their history) sent them.
        hot = np.concatenate([rates, np.full(len(newcomers), 1.5 * float(rates.max()))])
        svc.planner.on_window(make_window([*keys, *newcomers], hot, window_end_ms=end,
                                          destinations=list(DESTS),
                                          last_destinations=warm_at))
        svc.planner.replan(fresh=False, force=True, dry_run=False)
        plan = svc.planner.installed.plan  # type: ignore[union-attr]
        sets = {k: {plan.destination_ids[m] for m in s} for k, s in plan.table.as_dict().items()}
    entered = [k for k in newcomers if k in sets]
    assert len(entered) >= 8, "the test needs keys that enter the plan"
    return sum(warm_at[k] in sets[k] for k in entered) / len(entered)


def test_keys_entering_the_plan_go_where_they_are_warm(redis_server, tmp_path: Path) -> None:
    on = entering_keys_placed_warm(redis_server.url, tmp_path / "on", warm=True)
    off = entering_keys_placed_warm(redis_server.url, tmp_path / "off", warm=False)
    print(f"placed where warm: {on:.2f} with warm placement, {off:.2f} without")
    assert on >= 0.75, on
    assert off < on - 0.3, (off, on)  # LPT lands there only by chance
