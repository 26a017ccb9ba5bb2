"""One-replica SLO capacity on the arena's fleet, in the simulator: CacheRoute as the gateway
and planner run it (with the settings before 2026-12-06 unless told: `--warm-placement 1
--imbalance-tolerance 0.3 --queue-aware 1` are today's defaults, kept opt-in here so the
documented commands keep their figures) against the SGLang-like baseline, over more seeds
and a longer measured stretch than the live arena can afford.

The live arena measures 40 s per load point on four engines slowed 4x, where one point's TTFT
p99 rests on a handful of requests; the simulator tracks its hit rate within 1 pp
(bench/sim_vs_arena.py), so this is where a change to CacheRoute's one-replica capacity is
measured before the arena spends 20 minutes on it. Per seed the capacity is the highest load
multiple (x the scenario's base rate) whose TTFT p99 over the measured stretch meets the SLO,
walking up from the lowest and stopping at the first miss, as the arena's sweep does.

    .venv/bin/python bench/sim_capacity_1r.py                                # ~10 min
    .venv/bin/python bench/sim_capacity_1r.py --replica-hysteresis 0,0.2 --no-baseline
    .venv/bin/python bench/sim_capacity_1r.py --warm-placement 1 --imbalance-tolerance 0.3 \
        --clairvoyant --scales 5,6,7,8,9,10,11,12,13,14      # against the ceiling

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner_svc.planning.config import PAPER_IMBALANCE_TOLERANCE  # noqa: E402
from planner_svc.simulator.arena_check import policies  # noqa: E402
from planner_svc.simulator.cacheroute_policy import PolicyFactory, gateway_like  # noqa: E402
from planner_svc.simulator.clairvoyant import clairvoyant  # noqa: E402
from planner_svc.simulator.session_sim import arena_run  # noqa: E402

TIME_SCALE, WARMUP_S, SLO_S = 4.0, 72.0, 2.0


def _router(name: str) -> PolicyFactory:
    if name == "sglang-like":
        return policies(TIME_SCALE)["sglang cache_aware"]
    if name == "clairvoyant":
        return clairvoyant
    options = dict(part.split("=", 1) for part in name.split()[1:])
    # the arena's planner at this time scale: q_cap 12/4, W 12, a 24-s rate window
    return gateway_like(12.0 / TIME_SCALE, 12, rate_window_s=6.0 * TIME_SCALE,
                        replica_hysteresis=float(options["h"]),
                        warm_placement=options.get("warm", "0") == "1",
                        imbalance_tolerance=float(options.get("tol", PAPER_IMBALANCE_TOLERANCE)),
                        queue_aware=options.get("queue", "0") == "1")


def _point(task: tuple[str, str, int, float, float]) -> tuple[tuple, float, float]:
    name, scenario, seed, scale, measure_s = task
    r = arena_run(scenario, seed, _router(name), rate_scale=scale, time_scale=TIME_SCALE,
                  warmup_s=WARMUP_S, measure_s=measure_s)
    return task, r.hit_rate(WARMUP_S), r.ttft_p99(WARMUP_S)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="paper-like")
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--scales", default="5,5.5,6,6.5,7,7.5,8",
                    help="load multiples of the scenario's base rate")
    ap.add_argument("--measure-s", type=float, default=120.0)
    ap.add_argument("--replica-hysteresis", default="0",
                    help="CacheRoute runs, one per value (PlanningConfig.replica_hysteresis)")
    ap.add_argument("--warm-placement", default="0",
                    help="0, 1 or 0,1: place keys entering the plan where they were last "
                    "served (repack's warm_at)")
    ap.add_argument("--imbalance-tolerance", default=str(PAPER_IMBALANCE_TOLERANCE),
                    help="CacheRoute runs, one per value (PlanningConfig.imbalance_tolerance)")
    ap.add_argument("--queue-aware", default="0",
                    help="0, 1 or 0,1: the gateway's --queue-aware (RouterCore.queue_aware)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the SGLang-like baseline")
    ap.add_argument("--clairvoyant", action="store_true",
                    help="also the ceiling: a greedy router that reads every engine's cache and "
                    "queue (planner_svc.simulator.clairvoyant)")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    t0 = time.monotonic()
    scales = [float(x) for x in args.scales.split(",")]
    names = [f"cacheroute h={float(h):g}" + (" warm=1" if w == "1" else "")
             + (f" tol={float(t):g}" if float(t) != PAPER_IMBALANCE_TOLERANCE else "")
             + (" queue=1" if q == "1" else "")
             for h in args.replica_hysteresis.split(",") for w in args.warm_placement.split(",")
             for t in args.imbalance_tolerance.split(",") for q in args.queue_aware.split(",")]
    if not args.no_baseline:
        names.append("sglang-like")
    if args.clairvoyant:
        names.append("clairvoyant")
    tasks = [(n, args.scenario, s, x, args.measure_s)
             for n in names for s in range(1, args.seeds + 1) for x in scales]
    results: dict[tuple, tuple[float, float]] = {}
    with get_context("fork").Pool(max(1, args.jobs)) as pool:
        for i, (task, hit, p99) in enumerate(pool.imap_unordered(_point, tasks)):
            results[task] = (hit, p99)
            print(f"\r  {i + 1}/{len(tasks)} points", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    print(f"{args.scenario}, one replica, {args.seeds} seeds, {args.measure_s:g} s measured per "
          f"point, TTFT p99 <= {SLO_S:g} s; capacity in x the base rate (first miss stops)")
    print(f"{'router':24s} {'capacity per seed':>40s} {'mean':>6s} {'hit %':>6s}")
    summary: dict[str, float] = {}
    for n in names:
        caps = []
        for s in range(1, args.seeds + 1):
            cap = 0.0
            for x in scales:
                if results[(n, args.scenario, s, x, args.measure_s)][1] > SLO_S:
                    break
                cap = x
            caps.append(cap)
        hit = statistics.mean(results[(n, args.scenario, s, x, args.measure_s)][0]
                              for s in range(1, args.seeds + 1) for x in scales)
        print(f"{n:24s} {caps!s:>40s} {statistics.mean(caps):6.2f} {hit * 100:6.2f}")
        summary[n.replace(" ", "_").replace("=", "_").replace(".", "p").replace("-", "_")
                + "_capacity_x"] = round(statistics.mean(caps), 3)
    summary["elapsed_s"] = round(time.monotonic() - t0, 1)
    summary["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
