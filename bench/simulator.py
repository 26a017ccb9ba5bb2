"""Simulator speed: simulated requests per second per core, paper-like workload.

Runs 1 M requests (200 k with --quick) of the paper-like workload through the simulator
under Flat-LB and CacheRoute (production planner + RouterCore), and, as the same-run
baseline, under round robin (the loop, the engines and the completion heap without any
routing logic). Single process. Each policy runs `--repeat` times, interleaved, and the
figure is the best run's (as `timeit` reports): on a shared VM the same CPU work takes up to
~1.5x longer from one second to the next, and only the fastest run measures the code
rather than the neighbours. The median is printed beside it.
Prints a table, then one JSON line of figures.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

from planner_svc.simulator.experiment import ReplayConfig, make_workload, policy_factory
from planner_svc.simulator.metrics import run_metrics
from planner_svc.simulator.policies import round_robin
from planner_svc.simulator.simulator import ClusterSpec, simulate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="200 k requests instead of 1 M")
    ap.add_argument("--load", type=float, default=200.0)
    ap.add_argument("--repeat", type=int, default=3, help="runs per policy (best reported)")
    args = ap.parse_args()
    n = 200_000 if args.quick else 1_000_000
    cfg = ReplayConfig(n_requests=n)
    t0 = time.perf_counter()
    w = make_workload(cfg, args.load, 1)
    gen_s = time.perf_counter() - t0
    cluster = ClusterSpec(cfg.n_destinations, cfg.model)
    policies = (
        ("baseline", round_robin),
        ("flat", policy_factory("flat", cfg, w)),
        ("cacheroute", policy_factory("cacheroute", cfg, w)),
    )
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in policies}
    labels, hits = {}, {}
    for rep in range(max(1, args.repeat)):
        for name, factory in policies:
            print(f"run {rep + 1}/{args.repeat}: {name} ...", file=sys.stderr, flush=True)
            t0, c0 = time.perf_counter(), time.process_time()
            result = simulate(w, factory, cluster, seed=1)
            runs[name].append((time.perf_counter() - t0, time.process_time() - c0))
            labels[name] = result.policy
            hits[name] = run_metrics(result, args.load, 1).hit_rate
    rows = []
    for name, _ in policies:
        best = min(runs[name], key=lambda r: r[1])
        cpus = sorted(c for _, c in runs[name])
        rows.append((name, labels[name], best[0], best[1], cpus[len(cpus) // 2], hits[name]))
    print(
        f"paper-like, {n} requests, {cfg.n_keys} keys, R = {cfg.n_destinations}, "
        f"{args.load:g} QPS; workload generation {gen_s:.2f} s"
    )
    print(
        f"{'policy':28s} {'wall s':>7s} {'cpu s':>7s} {'req/s wall':>11s} "
        f"{'req/cpu-s':>10s} {'median':>10s} {'hit rate':>9s}"
    )
    for _, label, elapsed, cpu, median, hit in rows:
        print(
            f"{label:28s} {elapsed:7.2f} {cpu:7.2f} {n / elapsed:11,.0f} {n / cpu:10,.0f} "
            f"{n / median:10,.0f} {hit:9.3f}"
        )
    print(
        f"(best of {args.repeat} interleaved runs; req/cpu-s = simulated requests per second "
        "of this process's CPU time: the per-core figure on a shared machine; median = the "
        "median run's)"
    )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    figures = {
        "requests": n,
        "workload_gen_s": round(gen_s, 3),
        "repeat": args.repeat,
        **{f"{name}_wall_s": round(el, 3) for name, _, el, _, _, _ in rows},
        **{f"{name}_requests_per_s": round(n / el) for name, _, el, _, _, _ in rows},
        **{f"{name}_requests_per_cpu_s": round(n / cpu) for name, _, _, cpu, _, _ in rows},
        **{f"{name}_median_requests_per_cpu_s": round(n / med)
           for name, _, _, _, med, _ in rows},
        "peak_rss_mb": round(rss, 1),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
