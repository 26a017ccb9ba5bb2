"""The simulator checked against the arena: the same conversations, the same engine model,
in virtual time (planner_svc.simulator.session_sim) and live (bench/arena.py).

For every scenario an arena CSV holds, this replays the arena's workload (its scenario,
seed, rate, warm-up and measured stretch) through the simulator's CacheRoute as the gateway
and planner run it (`gateway_like`: sessions kept with their history, the hashed cold
tail, the production control loop) and through round robin (the cache-blind reference the
arena runs as `sglang round_robin`), and prints the served hit rate and TTFT p99 of both
sides with their difference. Simulated seeds 1-3 give the simulator's own spread.

    .venv/bin/python bench/sim_vs_arena.py --arena-csv docs/results/arena/arena.csv \\
        docs/results/arena/history-on/arena.csv docs/results/arena/history-on-2/arena.csv

A later CSV's row replaces an earlier one's for the same scenario and router (the arena
re-run with conversations kept with their history). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner_svc.simulator.cacheroute_policy import gateway_like  # noqa: E402
from planner_svc.simulator.policies import round_robin  # noqa: E402
from planner_svc.simulator.replica import ReplicaModel  # noqa: E402
from planner_svc.simulator.session_sim import simulate_sessions  # noqa: E402
from planner_svc.simulator.sessions import SCENARIOS, population, sessions  # noqa: E402

ARENA_NAMES = {"cacheroute": "cacheroute", "round_robin": "sglang round_robin"}


def arena_rows(paths: list[Path]) -> dict[tuple[str, str], dict[str, str]]:
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for path in paths:
        with path.open() as f:
            for row in csv.DictReader(f):
                if row["replicas"] == "1" and row["scenario"] in SCENARIOS:
                    rows[(row["scenario"], row["router"])] = row
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arena-csv", nargs="+", type=Path, required=True,
                    help="arena result CSVs (later ones win)")
    ap.add_argument("--time-scale", type=float, default=0.5, help="the arena's --time-scale")
    ap.add_argument("--kv-tokens", type=int, default=60_000, help="the arena's --kv-tokens")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--warmup-s", type=float, default=18.0, help="the arena's warm-up")
    ap.add_argument("--measure-s", type=float, default=12.0, help="the arena's measured time")
    ap.add_argument("--seeds", default="1,2,3", help="simulated seeds (the first is the "
                    "arena's)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    ts = args.time_scale
    model = ReplicaModel(kv_capacity_tokens=args.kv_tokens).time_scaled(ts)
    seeds = [int(s) for s in args.seeds.split(",")]
    measured = arena_rows(args.arena_csv)
    policies = {"cacheroute": gateway_like(12.0 / ts, 12), "round_robin": round_robin}
    lines = [f"{'scenario':<22} {'router':<12} {'arena hit':>9} {'sim hit':>8} {'diff pp':>8} "
             f"{'sim seeds':>15} {'arena TTFT p99':>14} {'sim TTFT p99':>12}"]
    diffs: dict[str, float] = {}
    for scenario in sorted({s for s, _ in measured}):
        for label, factory in policies.items():
            row = measured.get((scenario, ARENA_NAMES[label]))
            if row is None:
                continue
            hits, p99s = [], []
            for seed in seeds:
                base = SCENARIOS[scenario]
                sc = base.scaled(sessions_per_s=base.sessions_per_s
                                 * float(row["rate_scale"]) / ts)
                pop = population(sc, seed)
                total = args.warmup_s + args.measure_s
                r = simulate_sessions(pop, sessions(pop, total), factory, model=model,
                                      n_destinations=args.engines, until_s=total,
                                      control_interval_s=4.0 * max(1.0, ts))
                hits.append(r.hit_rate(args.warmup_s))
                p99s.append(r.ttft_p99(args.warmup_s))
            arena_hit = float(row["hit"])
            diff = (hits[0] - arena_hit) * 100
            diffs[f"{scenario}/{label}"] = round(diff, 2)
            lines.append(f"{scenario:<22} {label:<12} {arena_hit:>9.1%} {hits[0]:>8.1%} "
                         f"{diff:>+8.1f} {min(hits):>7.1%}-{max(hits):<7.1%}"
                         f"{float(row['ttft_p99_s']):>14.3f} {p99s[0]:>12.3f}")
    print("\n".join(lines))
    worst = max((abs(d) for d in diffs.values()), default=float("nan"))
    print(json.dumps({
        "hit_diff_pp": diffs, "worst_abs_hit_diff_pp": round(worst, 2),
        "elapsed_s": round(time.perf_counter() - t0, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
