"""Where does a key's prefix stop being cached at its home, and does the learned window find it?

Replays one scenario (wide-active-set by default: equally hot keys, a working set larger than
the fleet's cache) twice through the simulator with CacheRoute as the gateway runs it with idle
re-homing and `--history-slack 0`:

1. with the window fixed at Che's characteristic time over the fleet's cache
   (`experiment.eviction_window_s`, what an operator would compute), recording for every
   request that went back to the destination its key last used how long the key had been idle
   there (from that request's finish) and whether its reusable prefix was served from cache.
   The table gives the warm share by idle time as a fraction of Che's time; the *cliff* is
   where it crosses one half.
2. with the window learned (`router_client.eviction_window`, the gateway's
   `--idle-rehome-learn`), starting from Che's time: where the window settles, against the
   cliff measured in run 1, and what each run's p99 and hit rate are.

Prints both tables and, last, one JSON line; `--plot` writes the warm share against idle time
with Che's time, the cliff and the learned window marked.

    .venv/bin/python bench/rehome_window.py [--load 80] [--seeds 1,2,3] [--plot out.png]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from typing import Any

import numpy as np

from planner_svc.simulator.experiment import (
    ReplayConfig,
    cluster_for,
    eviction_window_s,
    make_workload,
    policy_factory,
    scenario_model,
)
from planner_svc.simulator.metrics import run_metrics
from planner_svc.simulator.policies import Policy, PolicyContext
from planner_svc.simulator.simulator import ClusterSpec, RunResult, simulate

BIN = 0.1  # of Che's time
MAX_RATIO = 2.0


def returns_by_idle(result: RunResult, window_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Per request that went where its key's previous request went (and after that one
    finished): idle time / `window_s`, and whether at least half its reusable prefix was
    served from cache."""
    w = result.workload
    order = np.argsort(w.t, kind="stable")
    last_dest: dict[int, int] = {}
    last_finish: dict[int, float] = {}
    ratios, warm = [], []
    for i in order.tolist():
        k = int(w.key[i])
        d = int(result.dest[i])
        t = float(w.t[i])
        if last_dest.get(k) == d and last_finish[k] <= t and w.prefix[i] > 0:
            ratios.append((t - last_finish[k]) / window_s)
            warm.append(result.cached[i] * 2 >= w.prefix[i])
        last_dest[k], last_finish[k] = d, float(result.finish[i])
    return np.asarray(ratios), np.asarray(warm, bool)


def cliff(edges: np.ndarray, share: np.ndarray) -> float:
    """The first idle ratio where the warm share falls below one half (interpolated)."""
    for j in range(1, len(share)):
        if share[j - 1] >= 0.5 > share[j]:
            x0, x1 = (edges[j - 1] + edges[j]) / 2, (edges[j] + edges[j + 1]) / 2
            return float(x0 + (share[j - 1] - 0.5) / (share[j - 1] - share[j]) * (x1 - x0))
    return float("nan")


def _learned(cfg: ReplayConfig, w: Any, cluster: ClusterSpec, seed: int
             ) -> tuple[RunResult, list[Policy]]:
    made: list[Policy] = []
    factory = policy_factory("cacheroute-rehome-learned", cfg, w)

    def keep(ctx: PolicyContext) -> Policy:
        policy = factory(ctx)
        made.append(policy)
        return policy

    return simulate(w, keep, cluster_for("cacheroute-rehome-learned", cfg, cluster),
                    seed=seed), made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="wide-active-set")
    ap.add_argument("--load", type=float, default=80.0)
    ap.add_argument("--seeds", default="1", help="comma-separated")
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--plot", default="", help="write the warm share by idle time here (PNG)")
    args = ap.parse_args()
    started = time.perf_counter()
    cfg = ReplayConfig(scenario=args.scenario, model=scenario_model(args.scenario),
                       n_requests=args.requests, history_slack=0.0)
    cluster = ClusterSpec(cfg.n_destinations, cfg.model, cfg.n_routers, cfg.warmup_fraction)
    edges = np.arange(0.0, MAX_RATIO + BIN / 2, BIN)
    rows: list[dict[str, Any]] = []
    shares: list[np.ndarray] = []
    for seed in (int(s) for s in args.seeds.split(",")):
        w = make_workload(cfg, args.load, seed)
        che = eviction_window_s(w, cfg.model, cfg.warmup_fraction, cfg.n_destinations)
        fixed = simulate(w, policy_factory("cacheroute-rehome", cfg, w),
                         cluster_for("cacheroute-rehome", cfg, cluster), seed=seed)
        ratio, warm = returns_by_idle(fixed, che)
        idx = np.minimum((ratio / BIN).astype(int), len(edges) - 2)
        counts = np.bincount(idx, minlength=len(edges) - 1)
        hot = np.bincount(idx, weights=warm, minlength=len(edges) - 1)
        share = np.divide(hot, counts, out=np.full(len(counts), np.nan), where=counts > 0)
        shares.append(share)
        learned, policies = _learned(cfg, w, cluster, seed)
        windows = [p.core.idle_rehome_s for p in policies  # type: ignore[attr-defined]
                   if getattr(p, "core", None) is not None]
        m_fixed, m_learned = run_metrics(fixed, args.load, seed), run_metrics(learned,
                                                                               args.load, seed)
        rows.append({"seed": seed, "che_s": che, "cliff": cliff(edges, share),
                     "learned": float(np.median(windows)) / che,
                     "p99_fixed_s": m_fixed.p99_s, "p99_learned_s": m_learned.p99_s,
                     "hit_fixed": m_fixed.hit_rate, "hit_learned": m_learned.hit_rate})
        print(f"seed {seed}: done ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    mean_share = np.nanmean(np.vstack(shares), axis=0)
    print(f"{args.scenario} at {args.load:g} QPS, {args.requests} requests, seeds {args.seeds}")
    print("\nwarm share of returns home by idle time (x Che's time), window fixed at Che's:")
    print(f"{'idle / T':>10} {'warm share':>11}")
    for j, s in enumerate(mean_share):
        if not np.isnan(s):
            print(f"{edges[j]:>4.1f}-{edges[j + 1]:<4.1f} {s:>11.2f}")
    print(f"\n{'seed':>4} {'Che T (s)':>9} {'cliff/T':>8} {'learned/T':>10} {'p99 fixed':>10} "
          f"{'p99 learned':>12} {'hit fixed':>10} {'hit learned':>12}")
    for r in rows:
        print(f"{r['seed']:>4} {r['che_s']:>9.1f} {r['cliff']:>8.2f} {r['learned']:>10.2f} "
              f"{r['p99_fixed_s']:>10.2f} {r['p99_learned_s']:>12.2f} {r['hit_fixed']:>10.1%} "
              f"{r['hit_learned']:>12.1%}")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        mids = (edges[:-1] + edges[1:]) / 2
        ax.plot(mids, mean_share, marker="o", label="warm share of returns home")
        ax.axvline(1.0, color="grey", linestyle="--", label="Che's time (fixed window)")
        ax.axvline(float(np.mean([r["cliff"] for r in rows])), color="red", linestyle=":",
                   label="measured cliff")
        ax.axvline(float(np.mean([r["learned"] for r in rows])), color="green",
                   label="learned window")
        ax.set_xlabel("idle time at home / Che's characteristic time")
        ax.set_ylabel("share of returns with the prefix cached")
        ax.set_title(f"{args.scenario}, {args.load:g} QPS")
        ax.legend(loc="upper right", fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    figures = {
        "scenario": args.scenario, "load_qps": args.load,
        "che_window_s": round(float(np.mean([r["che_s"] for r in rows])), 1),
        "cliff_over_che": round(float(np.mean([r["cliff"] for r in rows])), 3),
        "learned_over_che": round(float(np.mean([r["learned"] for r in rows])), 3),
        "p99_fixed_s": round(float(np.mean([r["p99_fixed_s"] for r in rows])), 3),
        "p99_learned_s": round(float(np.mean([r["p99_learned_s"] for r in rows])), 3),
        "hit_fixed": round(float(np.mean([r["hit_fixed"] for r in rows])), 4),
        "hit_learned": round(float(np.mean([r["hit_learned"] for r in rows])), 4),
        "elapsed_s": round(time.perf_counter() - started, 1),
        "peak_rss_mb": round(rss, 1),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
