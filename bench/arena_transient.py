"""Where CacheRoute's one-replica gap to the SGLang gateway comes from, in the simulator that
bench/sim_vs_arena.py checks against the arena: the arena's stretch against a long one.

The arena measures 12 s after a 15-s warm-up (time scale 0.5). CacheRoute's first plan lands
a few seconds in: it moves the hot tenants off the cold-tail ring owners that warmed them to the
destinations LPT gives them, and replicates the hottest over members that have not seen them.
Each (tenant, destination) pair then pays one cold first turn; a later turn is unaffected (it
follows its conversation's history), so the whole gap sits in first turns. The SGLang gateway
never moves a prefix, so it pays nothing of the kind. Over a long stretch each pair pays once
and the gap shrinks. This replays, for paper-like and whale, seeds 1-3, both routers
(simulated as in sim_vs_arena: `gateway_like` and the SGLang-like baseline), over the arena's
stretch and a long one, and prints the served hit rate split into first and later turns.

    .venv/bin/python bench/arena_transient.py            # ~40 s

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner_svc.simulator.cacheroute_policy import gateway_like  # noqa: E402
from planner_svc.simulator.policies import PolicyFactory  # noqa: E402
from planner_svc.simulator.reactive import sglang_cache_aware  # noqa: E402
from planner_svc.simulator.session_sim import SessionRecords, arena_run  # noqa: E402

TIME_SCALE = 0.5
STRETCHES = {"arena (15 s + 12 s)": (15.0, 12.0), "long (120 s + 60 s)": (120.0, 60.0)}


def replay(scenario: str, seed: int, factory: PolicyFactory, warmup_s: float,
           measure_s: float) -> tuple[float, float, float]:
    """(hit, first-turn hit, later-turn hit) over the measured stretch of one arena run in
    the simulator (set up as bench/sim_vs_arena.py replays the arena's rows)."""
    r = arena_run(scenario, seed, factory, time_scale=TIME_SCALE, warmup_s=warmup_s,
             measure_s=measure_s)
    measured = r.sent_s >= warmup_s
    return (_hit(r, measured), _hit(r, measured & (r.turn == 0)),
            _hit(r, measured & (r.turn > 0)))


def _hit(r: SessionRecords, mask: np.ndarray) -> float:
    return float(r.cached_tokens[mask].sum() / max(1, r.prompt_tokens[mask].sum()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--scenarios", default="paper-like,whale")
    args = ap.parse_args()
    t0 = time.perf_counter()
    routers = {"cacheroute": gateway_like(12.0 / TIME_SCALE, 12),
               "sglang-like": sglang_cache_aware()}
    gaps: dict[str, list[float]] = {name: [] for name in STRETCHES}
    first_gaps: dict[str, list[float]] = {name: [] for name in STRETCHES}
    print(f"{'scenario':<11} {'seed':>4} {'stretch':<20} {'router':<12} {'hit':>6} "
          f"{'first turns':>11} {'later turns':>11}")
    for scenario in args.scenarios.split(","):
        for seed in range(1, args.seeds + 1):
            for stretch, (warmup, measure) in STRETCHES.items():
                got = {name: replay(scenario, seed, f, warmup, measure)
                       for name, f in routers.items()}
                for name, (hit, first, later) in got.items():
                    print(f"{scenario:<11} {seed:>4} {stretch:<20} {name:<12} {hit:>6.1%} "
                          f"{first:>11.1%} {later:>11.1%}")
                gaps[stretch].append((got["cacheroute"][0] - got["sglang-like"][0]) * 100)
                first_gaps[stretch].append((got["cacheroute"][1] - got["sglang-like"][1]) * 100)
    print()
    for stretch in STRETCHES:
        print(f"{stretch:<20} CacheRoute - SGLang-like: hit {statistics.mean(gaps[stretch]):+.1f} "
              f"pp (first turns {statistics.mean(first_gaps[stretch]):+.1f} pp), "
              f"range {min(gaps[stretch]):+.1f} to {max(gaps[stretch]):+.1f}")
    arena_key, long_key = STRETCHES
    print(json.dumps({
        "hit_gap_pp_arena_stretch": round(statistics.mean(gaps[arena_key]), 2),
        "hit_gap_pp_long_stretch": round(statistics.mean(gaps[long_key]), 2),
        "first_turn_gap_pp_arena_stretch": round(statistics.mean(first_gaps[arena_key]), 2),
        "first_turn_gap_pp_long_stretch": round(statistics.mean(first_gaps[long_key]), 2),
        "elapsed_s": round(time.perf_counter() - t0, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
