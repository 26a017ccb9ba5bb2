"""Many model pools on one planner: per-pool plan cost against a single-pool planner, and
the figures of a large multi-pool planner.

Both planners are the production service (`build_service` with a pools file, gRPC bound,
the timer off so the bench drives the steps) against a real redis-server on loopback.

1. Eight pools of different sizes (4-128 destinations, 1k-40k keys) on one planner, and
   the same eight each alone on a single-pool planner. For every pool, interleaved
   (single, multi, single, multi, ...) so machine noise hits both sides alike: the time
   to build a candidate (`replan --dry-run --fresh`: LPT, pricing, diff) and to build and
   install one (`replan --fresh --force`: plus sign, delta, the Redis install script), and
   the window's cost (one window of every pool's keys cut by pool, against that pool's
   keys alone). Target: multi within 10 % of single per pool (median of `--reps`).
2. Isolation: a ninth pool whose Redis namespace holds junk (a hash where its pointer
   goes) does not start; the eight keep planning and installing.
3. 100 pools x 100 destinations x 10,000 keys (1 M keys a window): the window split, every
   pool's first plan installed, and peak RSS.

Last line: one JSON object of figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner_svc.devstack.processes import start_redis
from planner_svc.server import PlannerService, build_service
from planner_svc.settings import PlannerSettings
from planner_svc.simulator.rates import paper_like_rates
from router_client.layout import Layout
from streams.assembly import CompleteWindow, DestinationStats

# (pool, destinations, keys): different sizes, as a platform's models differ.
EIGHT = [("p0", 4, 1_000), ("p1", 8, 2_000), ("p2", 16, 5_000), ("p3", 32, 10_000),
         ("p4", 8, 20_000), ("p5", 16, 40_000), ("p6", 64, 10_000), ("p7", 128, 20_000)]
Q_CAP, W = 20.0, 64
LOAD_PER_DESTINATION = 12.0  # req/s: 60 % of q_cap


def pools_toml(pools: list[tuple[str, int, int]]) -> str:
    out = []
    for name, dests, _keys in pools:
        ids = ", ".join(f'"{name}-d{i}"' for i in range(dests))
        out.append(f'[pools.{name}]\nmodels = ["{name}-model"]\ndestinations = [{ids}]\n')
    return "\n".join(out)


def pool_keys(name: str, n: int) -> list[str]:
    return [f"{name}-model/h:tenant-{i:06d}" for i in range(n)]


def window(pools: list[tuple[str, int, int]], end_ms: int, seed: int) -> CompleteWindow:
    keys: list[str] = []
    rates = []
    dests: dict[str, DestinationStats] = {}
    for i, (name, n_dest, n_keys) in enumerate(pools):
        keys += pool_keys(name, n_keys)
        rates.append(paper_like_rates(n_keys, LOAD_PER_DESTINATION * n_dest, seed=seed + i))
        for d in range(n_dest):
            ident = f"{name}-d{d}"
            dests[ident] = DestinationStats(ident, LOAD_PER_DESTINATION, 0.0, 0.0,
                                            float("nan"), float("nan"))
    rate = np.concatenate(rates) if rates else np.zeros(0)
    requests = np.round(rate * 10).astype(np.uint64)
    prompt = requests * 1000.0
    return CompleteWindow(
        window_start_ms=end_ms - 10_000, window_end_ms=end_ms, keys=keys, rate_per_s=rate,
        ewma_rate_per_s=rate, prompt_tokens=prompt, cached_tokens=prompt * 0.5,
        reuse_fraction=np.full(len(keys), 0.5), interarrival_cv=np.ones(len(keys)),
        reusable_prefix_tokens=np.full(len(keys), 800.0), requests=requests,
        destinations=dests, recovering=False, overflow_keys=0, overflow_rate_per_s=0.0,
        active_keys=len(keys), dead_letters=0, duplicates_dropped=0, partition_count=1,
        published_at_ms=end_ms)


def service(redis_url: str, workdir: Path, name: str, toml: str) -> PlannerService:
    path = workdir / f"{name}.toml"
    path.write_text(toml)
    settings = PlannerSettings(
        redis_url=redis_url, grpc_port=0, data_dir=str(workdir / "planner"),
        redis_namespace=f"bench-{name}", pools_file=str(path), q_cap=Q_CAP,
        warm_slots_per_destination=W, interval_s=3600.0, retain_versions=4)
    return build_service(settings, consume=False)


def feed(svc: PlannerService, pools: list[tuple[str, int, int]], seed: int = 1) -> float:
    """Two windows a window apart (the planner waits for a full one); ms of the second."""
    now = int(time.time() * 1000)
    svc.pools.on_window(window(pools, now - 10_000, seed))
    w = window(pools, now, seed)
    t0 = time.perf_counter()
    svc.pools.on_window(w)
    return (time.perf_counter() - t0) * 1000


def replan(planner: Any, *, dry_run: bool) -> Callable[[], object]:
    """A fresh build (`dry_run`), or a fresh build installed regardless of penalties."""
    return lambda: planner.replan(fresh=True, force=not dry_run, dry_run=dry_run)


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def eight_pools(redis_url: str, workdir: Path, reps: int) -> dict[str, Any]:
    multi = service(redis_url, workdir, "multi", pools_toml(EIGHT))
    singles = {p[0]: service(redis_url, workdir, f"single-{p[0]}", pools_toml([p]))
               for p in EIGHT}
    samples: dict[str, dict[str, list[float]]] = {
        p[0]: {k: [] for k in ("build_single", "build_multi", "install_single",
                               "install_multi", "window_single", "window_multi")}
        for p in EIGHT}
    for rep in range(reps):
        window_multi_ms = feed(multi, EIGHT, seed=rep)
        keys_total = sum(p[2] for p in EIGHT)
        for name, _dests, n_keys in EIGHT:
            single = singles[name]
            s = samples[name]
            s["window_single"].append(feed(single, [p for p in EIGHT if p[0] == name], rep))
            # The multi-pool window is cut once for all pools: each pool's share by keys.
            s["window_multi"].append(window_multi_ms * n_keys / keys_total)
            for side, svc in (("single", single), ("multi", multi)):
                planner = svc.pools.get(name).planner
                s[f"build_{side}"].append(timed(replan(planner, dry_run=True)))
                s[f"install_{side}"].append(timed(replan(planner, dry_run=False)))
        print(f"  round {rep + 1}/{reps}", file=sys.stderr, flush=True)
    rows, worst_build, worst_install = [], 0.0, 0.0
    print(f"\n{'pool':>5} {'dests':>6} {'keys':>7} {'build ms single':>16} {'multi':>7} "
          f"{'ratio':>6} {'build+install ms single':>24} {'multi':>7} {'ratio':>6} "
          f"{'window ms single':>17} {'multi':>7}")
    for name, dests, n_keys in EIGHT:
        med = {k: statistics.median(v) for k, v in samples[name].items()}
        build_ratio = med["build_multi"] / med["build_single"]
        install_ratio = med["install_multi"] / med["install_single"]
        worst_build, worst_install = max(worst_build, build_ratio), max(worst_install,
                                                                        install_ratio)
        rows.append((name, dests, n_keys, med, build_ratio, install_ratio))
        print(f"{name:>5} {dests:>6} {n_keys:>7,} {med['build_single']:>16.2f} "
              f"{med['build_multi']:>7.2f} {build_ratio:>6.3f} {med['install_single']:>24.2f} "
              f"{med['install_multi']:>7.2f} {install_ratio:>6.3f} "
              f"{med['window_single']:>17.2f} {med['window_multi']:>7.2f}")
    isolation = isolation_case(multi, redis_url, workdir)
    for svc in (multi, *singles.values()):
        svc.stop(0)
    return {"eight_pools_worst_build_ratio": round(worst_build, 3),
            "eight_pools_worst_build_install_ratio": round(worst_install, 3),
            "eight_pools_build_ms_multi": {r[0]: round(r[3]["build_multi"], 2) for r in rows},
            "eight_pools_build_install_ms_multi": {r[0]: round(r[3]["install_multi"], 2)
                                                   for r in rows},
            **isolation}


def isolation_case(multi: PlannerService, redis_url: str, workdir: Path) -> dict[str, Any]:
    import redis

    r = redis.Redis.from_url(redis_url)
    r.hset(Layout("bench-multi:junk").current, "not", "a pointer")  # a hostile writer
    assert multi.pools_file is not None
    multi.pools_file.path.write_text(
        pools_toml(EIGHT) + '\n[pools.junk]\nmodels = ["junk-model"]\ndestinations = ["j0"]\n')
    multi.pools_file.reload_if_changed(multi.pools)
    feed(multi, EIGHT, seed=99)
    def version(unit: Any) -> Any:
        installed = unit.planner.current()
        return installed.plan.version if installed is not None else None

    before = {u.spec.name: version(u) for u in multi.pools.units()}
    multi.pools.each("bench step", lambda u: replan(u.planner, dry_run=False)())
    moved = sum(1 for u in multi.pools.units() if version(u) is not None
                and (before[u.spec.name] is None or version(u) > before[u.spec.name]))
    failed = dict(multi.pools.failed)
    print(f"\nisolation: pool 'junk' (its namespace holds junk) not started: "
          f"{failed.get('junk', 'STARTED?')[:70]}; the other {moved} of {len(EIGHT)} pools "
          "installed a new plan")
    return {"isolation_failed_pools": len(failed), "isolation_pools_installed": moved}


def hundred_pools(redis_url: str, workdir: Path, n_pools: int, n_dests: int,
                  n_keys: int) -> dict[str, Any]:
    pools = [(f"m{i:03d}", n_dests, n_keys) for i in range(n_pools)]
    t0 = time.perf_counter()
    svc = service(redis_url, workdir, "hundred", pools_toml(pools))
    start_s = time.perf_counter() - t0
    now = int(time.time() * 1000)
    svc.pools.on_window(window(pools, now - 10_000, 1))
    second = [window(pools, now, 1)]  # held in a list so the window can be let go after
    split_ms = timed(lambda: svc.pools.on_window(second[0]))
    second.clear()
    per_pool: list[float] = []
    t0 = time.perf_counter()
    for i, unit in enumerate(svc.pools.units()):
        t1 = time.perf_counter()  # no forced collection here: 1 M keys make each one slow
        unit.planner.tick()
        per_pool.append((time.perf_counter() - t1) * 1000)
        if (i + 1) % 20 == 0:
            print(f"  {i + 1}/{n_pools} pools installed", file=sys.stderr, flush=True)
    all_s = time.perf_counter() - t0
    installed = sum(1 for u in svc.pools.units() if u.planner.current() is not None)
    svc.stop(0)
    print(f"\n{n_pools} pools x {n_dests} destinations x {n_keys:,} keys: start "
          f"{start_s:.2f} s; window of {n_pools * n_keys:,} keys cut by pool and taken in "
          f"{split_ms:.0f} ms; first plans of all pools {all_s:.2f} s (per pool median "
          f"{statistics.median(per_pool):.1f} ms, max {max(per_pool):.1f} ms); "
          f"{installed} installed")
    return {"hundred_pools_start_s": round(start_s, 2),
            "hundred_pools_window_ms": round(split_ms, 1),
            "hundred_pools_first_plans_s": round(all_s, 2),
            "hundred_pools_plan_ms_median": round(statistics.median(per_pool), 2),
            "hundred_pools_plan_ms_max": round(max(per_pool), 2),
            "hundred_pools_installed": installed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7, help="interleaved rounds per pool")
    ap.add_argument("--pools", type=int, default=100, help="pools in the large case")
    ap.add_argument("--destinations", type=int, default=100, help="per pool, large case")
    ap.add_argument("--keys", type=int, default=10_000, help="per pool, large case")
    ap.add_argument("--quick", action="store_true", help="3 rounds, a 10-pool large case")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.pools = 3, 10
    with tempfile.TemporaryDirectory(prefix="bench-pools-") as tmp:
        workdir = Path(tmp)
        redis_server = start_redis(workdir)
        try:
            figures = eight_pools(redis_server.url, workdir, args.reps)
            figures.update(hundred_pools(redis_server.url, workdir, args.pools,
                                         args.destinations, args.keys))
        finally:
            redis_server.process.stop()
    figures["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
