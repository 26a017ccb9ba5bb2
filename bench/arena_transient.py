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
    .venv/bin/python bench/arena_transient.py --tail-slacks 0.25,1,2,3 --seeds 6 \
        --stretches arena                                # the cold tail's bound, ~1.5 min

With `--tail-slacks`, CacheRoute runs once per value of the gateway's cold-tail bound
(`--tail-slack`, router_client.ring.DEFAULT_TAIL_SLACK): at light load an owner holding two
requests was already over the old 0.25, and each move off it is a cold first turn (the
bound's story: docs/arena.md, "The cold tail's bound").

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
from router_client.ring import DEFAULT_TAIL_SLACK  # noqa: E402

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
    ap.add_argument("--tail-slacks", default=f"{DEFAULT_TAIL_SLACK:g}",
                    help="CacheRoute once per value of the gateway's --tail-slack")
    ap.add_argument("--stretches", default=",".join(s.split()[0] for s in STRETCHES),
                    help="of: arena, long")
    args = ap.parse_args()
    t0 = time.perf_counter()
    slacks = [float(v) for v in args.tail_slacks.split(",")]
    stretches = {name: v for name, v in STRETCHES.items()
                 if name.split()[0] in args.stretches.split(",")}
    names = {x: _name(x) for x in slacks}
    routers = {names[x]: gateway_like(12.0 / TIME_SCALE, 12, tail_slack=x) for x in slacks}
    routers["sglang-like"] = sglang_cache_aware()
    gaps: dict[tuple[str, str], list[float]] = {
        (r, st): [] for r in routers if r != "sglang-like" for st in stretches}
    first_gaps: dict[tuple[str, str], list[float]] = {k: [] for k in gaps}
    print(f"{'scenario':<11} {'seed':>4} {'stretch':<20} {'router':<22} {'hit':>6} "
          f"{'first turns':>11} {'later turns':>11}")
    for scenario in args.scenarios.split(","):
        for seed in range(1, args.seeds + 1):
            for stretch, (warmup, measure) in stretches.items():
                got = {name: replay(scenario, seed, f, warmup, measure)
                       for name, f in routers.items()}
                for name, (hit, first, later) in got.items():
                    print(f"{scenario:<11} {seed:>4} {stretch:<20} {name:<22} {hit:>6.1%} "
                          f"{first:>11.1%} {later:>11.1%}")
                peer = got["sglang-like"]
                for name in routers:
                    if name != "sglang-like":
                        gaps[name, stretch].append((got[name][0] - peer[0]) * 100)
                        first_gaps[name, stretch].append((got[name][1] - peer[1]) * 100)
    print()
    for (name, stretch), g in gaps.items():
        print(f"{stretch:<20} {name} - SGLang-like: hit {statistics.mean(g):+.1f} pp (first "
              f"turns {statistics.mean(first_gaps[name, stretch]):+.1f} pp), range "
              f"{min(g):+.1f} to {max(g):+.1f}")
    figures: dict[str, float] = {}
    for x, name in names.items():
        suffix = "" if x == DEFAULT_TAIL_SLACK else f"_tail_slack_{x:g}".replace(".", "_")
        for stretch in stretches:
            tag = stretch.split()[0] + "_stretch"
            figures[f"hit_gap_pp_{tag}{suffix}"] = round(statistics.mean(gaps[name, stretch]), 2)
            figures[f"first_turn_gap_pp_{tag}{suffix}"] = round(
                statistics.mean(first_gaps[name, stretch]), 2)
    print(json.dumps({
        **figures,
        "elapsed_s": round(time.perf_counter() - t0, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
    return 0


def _name(tail_slack: float) -> str:
    return "cacheroute" if tail_slack == DEFAULT_TAIL_SLACK else f"cacheroute slack {tail_slack:g}"


if __name__ == "__main__":
    raise SystemExit(main())
