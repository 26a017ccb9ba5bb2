"""The simulator checked against the arena: the same conversations, the same engine model,
in virtual time (planner_svc.simulator.session_sim) and live (bench/arena.py).

Every one-replica row of the arena CSVs given (comparison runs and capacity points alike)
is replayed as it ran: its scenario, seed, offered load, time scale, warm-up and measured
stretch (from the row; older CSVs without those columns take the command's flags), so the
simulator plays exactly the arena's conversations. Routers, next to their arena
counterparts:
- `cacheroute`: the simulator's CacheRoute as the gateway and planner run it
  (`gateway_like`: sessions kept with their history, the hashed cold tail, idle keys
  re-homed, the production control loop and placement);
- `sglang cache_aware`: our SGLang-like baseline (reactive.SGLangCacheAware, its CLI
  defaults, matching on the prompts' content) next to the real SGLang gateway;
- `sglang round_robin`: round robin, the cache-blind reference;
- `sglang power_of_two`: uniform random routing, what it measured as in front of these
  engines (bench/probe_sglang_p2c.py); `--power-of-two polled` for its source's rule
  (reactive.SGLangPowerOfTwo), `flat` for Flat-LB.

Per row: served hit rate and TTFT p99, arena and simulated, and whether the simulator is
within the issue's tolerances (3 pp of hit rate, 20 % of p99).

`--transport docs/results/gateway/gateway.json` adds the request path's measured cost to
every simulated TTFT: the emulated engine's own time to a first streamed event and what
the router in front adds to it (bench/gateway.py, instant engines, p50 per router). The
engine model is compute only; the SGLang gateway holds a streamed response's first event
back by ~40 ms, which at time scale 0.5 is a quarter of the whole TTFT p99.

    .venv/bin/python bench/sim_vs_arena.py --arena-csv docs/results/arena/arena.csv \\
        docs/results/arena/capacity-seeds/arena-capacity.csv

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner_svc.cli.edge_args import ROUTING_FLAGS  # noqa: E402
from planner_svc.settings import PlannerSettings  # noqa: E402
from planner_svc.simulator.cacheroute_policy import gateway_like  # noqa: E402
from planner_svc.simulator.policies import (  # noqa: E402
    PolicyFactory,
    flat_lb,
    round_robin,
    uniform_random,
)
from planner_svc.simulator.reactive import sglang_cache_aware, sglang_power_of_two  # noqa: E402
from planner_svc.simulator.session_sim import arena_run  # noqa: E402
from planner_svc.simulator.sessions import SCENARIOS  # noqa: E402
from router_client.ring import DEFAULT_TAIL_SLACK  # noqa: E402
from router_client.routing import DEFAULT_IDLE_REHOME_S  # noqa: E402

# The gateway's default, as the warm placement's is the planner's (PlannerSettings).
GATEWAY_QUEUE_AWARE = bool(ROUTING_FLAGS["queue-aware"][1])
HIT_TOLERANCE_PP = 3.0
P99_TOLERANCE = 0.20


def policies(time_scale: float, *, tail_slack: float = DEFAULT_TAIL_SLACK,
             balance: str = "first-token", rate_window: bool = True,
             power_of_two: str = "random",
             idle_rehome_s: float | None = DEFAULT_IDLE_REHOME_S,
             warm_placement: bool = PlannerSettings.warm_placement,
             imbalance_tolerance: float = PlannerSettings.imbalance_tolerance,
             queue_aware: bool = GATEWAY_QUEUE_AWARE) -> dict[str, PolicyFactory]:
    """Arena router name -> its simulated counterpart (q_cap and W as the arena sets them;
    the gateway's cold-tail bound, balance, idle re-homing and queue-aware routing, and the
    planner's warm placement and imbalance tolerance, as the arena rows ran with them)."""
    return {
        # the arena's planner: rates of a 6-s stream window (longer on slowed engines, as
        # bench/arena.py sets it), replanned every 4 s (session_sim.arena_run)
        "cacheroute": gateway_like(12.0 / time_scale, 12, tail_slack=tail_slack,
                                   balance=balance, idle_rehome_s=idle_rehome_s,
                                   warm_placement=warm_placement,
                                   imbalance_tolerance=imbalance_tolerance,
                                   queue_aware=queue_aware,
                                   rate_window_s=(6.0 * max(1.0, time_scale)
                                                  if rate_window else None)),
        "sglang cache_aware": sglang_cache_aware(),
        "sglang round_robin": round_robin,
        # what the gateway's power_of_two measured as (uniform random: bench/probe_sglang_p2c.py),
        # its source's rule (polled tokens), or Flat-LB's (live counts)
        "sglang power_of_two": {"random": uniform_random, "polled": sglang_power_of_two(),
                                "flat": flat_lb}[power_of_two],
    }


def arena_rows(paths: list[Path]) -> list[dict[str, str]]:
    """One-replica rows of known scenarios and routers; a later file's row replaces an
    earlier one's for the same (scenario, router, seed, load)."""
    rows: dict[tuple[str, ...], dict[str, str]] = {}
    for path in paths:
        with path.open() as f:
            for row in csv.DictReader(f):
                if row.get("replicas") != "1" or row.get("scenario") not in SCENARIOS:
                    continue
                if row.get("engine_kind", "emulator") != "emulator":
                    continue
                key = (row["scenario"], row["router"], row.get("seed") or "1", row["rate_scale"])
                rows[key] = row
    return list(rows.values())


def transport_s(path: Path | None) -> dict[str, float]:
    """Arena router name -> seconds the request path adds to its first token (engine HTTP
    plus the router), from bench/gateway.py's summary; {} without a file."""
    if path is None:
        return {}
    measured = json.loads(path.read_text())
    engine = float(measured["engine_first_event_ms"]["p50"])
    added = {name: float(v["p50"]) for name, v in measured["first_event_added_ms"].items()}
    out: dict[str, float] = {}
    for name in policies(1.0):
        # a policy bench/gateway.py did not run costs what its gateway's others cost: the
        # streamed path does not depend on the policy
        same = [v for n, v in added.items() if n.split()[0] == name.split()[0]]
        if name in added or same:
            out[name] = (engine + added.get(name, statistics.median(same) if same else 0.0)) / 1000
    return out


def simulate(row: dict[str, str], args: argparse.Namespace
             ) -> tuple[float, float, tuple[float, float], tuple[float, float]]:
    """The row replayed under `args.policy_seeds` draws of the router's own randomness (P2C's
    pairs, tie-breaks; the conversations are the row's): the mean hit rate and the median
    TTFT p99 over the draws, and each one's range. A router that draws at random is a
    random process: one arena run is one draw of it, and so is one simulated run."""
    ts = float(row.get("time_scale") or args.time_scale)
    warmup = float(row.get("warmup_s") or args.warmup_s)
    factory = policies(ts, tail_slack=args.tail_slack, balance=args.balance,
                       rate_window=not args.cumulative_rates,
                       power_of_two=args.power_of_two,
                       idle_rehome_s=args.idle_rehome_s or None,
                       warm_placement=args.warm_placement == "on",
                       imbalance_tolerance=args.imbalance_tolerance,
                       queue_aware=args.queue_aware == "on")[row["router"]]
    hits, p99s = [], []
    for draw in range(1, args.policy_seeds + 1):
        r = arena_run(row["scenario"], int(row.get("seed") or 1), factory,
                      rate_scale=float(row["rate_scale"]), time_scale=ts, warmup_s=warmup,
                      measure_s=float(row.get("measure_s") or args.measure_s),
                      kv_tokens=int(float(row.get("kv_tokens") or args.kv_tokens)),
                      engines=args.engines, policy_seed=draw)
        hits.append(r.hit_rate(warmup))
        p99s.append(r.ttft_p99(warmup) + args.transport_s.get(row["router"], 0.0))
    return (statistics.fmean(hits), statistics.median(p99s), (min(hits), max(hits)),
            (min(p99s), max(p99s)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arena-csv", nargs="+", type=Path, required=True,
                    help="arena result CSVs (later ones win for the same run)")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--time-scale", type=float, default=0.5,
                    help="the arena's --time-scale, for CSVs that do not record it")
    ap.add_argument("--kv-tokens", type=int, default=60_000)
    ap.add_argument("--warmup-s", type=float, default=18.0)
    ap.add_argument("--measure-s", type=float, default=12.0)
    # The gateway's settings changed after some arena rows were recorded, and the CSVs do not
    # record them: replay each row with the gateway it ran (before 2026-12-04 the cold tail's
    # bound was 0.25; before 2026-12-05 the balance was p2c and idle re-homing off).
    ap.add_argument("--tail-slack", type=float, default=DEFAULT_TAIL_SLACK,
                    help="the gateways' --tail-slack when the rows ran")
    ap.add_argument("--balance", default="first-token", choices=("p2c", "first-token"),
                    help="the gateways' --balance when the rows ran")
    ap.add_argument("--idle-rehome-s", type=float, default=DEFAULT_IDLE_REHOME_S,
                    help="the gateways' --idle-rehome-s when the rows ran (the learned "
                         "window's start; 0: off, as before 2026-12-05)")
    ap.add_argument("--warm-placement", choices=("on", "off"),
                    default="on" if PlannerSettings.warm_placement else "off",
                    help="the planner's warm placement as the rows ran with it (off for rows "
                    "from before 2026-12-06, when it became the default)")
    ap.add_argument("--imbalance-tolerance", type=float,
                    default=PlannerSettings.imbalance_tolerance,
                    help="the planner's imbalance tolerance as the rows ran with it (0.03 for "
                    "rows from before 2026-12-06)")
    ap.add_argument("--queue-aware", choices=("on", "off"),
                    default="on" if GATEWAY_QUEUE_AWARE else "off",
                    help="the gateways' --queue-aware as the rows ran with it (off for rows "
                    "from before 2026-12-06 midday, when it became the default)")
    ap.add_argument("--cumulative-rates", action="store_true",
                    help="the simulated planner plans on cumulative mean rates (before "
                         "2026-12-05) instead of the stream window's, as the planner does")
    ap.add_argument("--power-of-two", choices=("random", "polled", "flat"), default="random",
                    help="simulate the SGLang gateway's power_of_two as it measured (uniform "
                         "random), as its source states it (polled /get_load tokens) or as "
                         "Flat-LB (live in-flight counts)")
    ap.add_argument("--policy-seeds", type=int, default=1,
                    help="simulated draws of each router's own randomness per row (the mean "
                         "hit and median p99 are compared; the range is reported)")
    ap.add_argument("--transport", type=Path, default=None,
                    help="bench/gateway.py's JSON summary: add each router's measured "
                         "first-event cost to the simulated TTFT")
    args = ap.parse_args()
    if args.policy_seeds < 1:
        ap.error("--policy-seeds must be >= 1")
    args.transport_s = transport_s(args.transport)
    if args.transport_s:
        print("transport added to simulated TTFT: " + ", ".join(
            f"{n} {v * 1000:.1f} ms" for n, v in args.transport_s.items()))
    t0 = time.perf_counter()
    known = policies(1.0)
    rows = sorted((r for r in arena_rows(args.arena_csv) if r["router"] in known),
                  key=lambda r: (r["scenario"], r["router"], float(r["rate_scale"]),
                                 r.get("seed") or "1"))
    lines = [f"{'scenario':<21} {'router':<20} {'load':>5} {'seed':>4} {'arena hit':>9} "
             f"{'sim hit':>8} {'diff pp':>8} {'arena p99':>9} {'sim p99':>8} {'p99 ratio':>9}"
             f"  within{'  sim p99 range over draws' if args.policy_seeds > 1 else ''}"]
    results: list[dict[str, Any]] = []
    for row in rows:
        hit, p99, hit_range, p99_range = simulate(row, args)
        arena_hit, arena_p99 = float(row["hit"]), float(row["ttft_p99_s"])
        diff = (hit - arena_hit) * 100
        ratio = p99 / arena_p99 if arena_p99 > 0 else float("nan")
        ok_hit, ok_p99 = abs(diff) <= HIT_TOLERANCE_PP, abs(ratio - 1) <= P99_TOLERANCE
        results.append({"scenario": row["scenario"], "router": row["router"],
                        "load": float(row["rate_scale"]), "seed": int(row.get("seed") or 1),
                        "hit_diff_pp": round(diff, 2), "p99_ratio": round(ratio, 3),
                        "hit_ok": ok_hit, "p99_ok": ok_p99,
                        # is the arena's draw one the simulator also makes?
                        "arena_p99_in_sim_range": p99_range[0] <= arena_p99 <= p99_range[1],
                        "arena_hit_in_sim_range": hit_range[0] <= arena_hit <= hit_range[1]})
        lines.append(f"{row['scenario']:<21} {row['router']:<20} {float(row['rate_scale']):>5g} "
                     f"{row.get('seed') or '1':>4} {arena_hit:>9.1%} {hit:>8.1%} {diff:>+8.1f} "
                     f"{arena_p99:>9.3f} {p99:>8.3f} {ratio:>9.2f}  "
                     f"{'hit' if ok_hit else '---'} {'p99' if ok_p99 else '---'}"
                     + (f"  {p99_range[0]:.3f}-{p99_range[1]:.3f}" if args.policy_seeds > 1
                        else ""))
    print("\n".join(lines))
    by_router: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["router"] for r in results):
        mine = [r for r in results if r["router"] == name]
        by_router[name] = {
            "rows": len(mine),
            "worst_abs_hit_diff_pp": max(abs(r["hit_diff_pp"]) for r in mine),
            "median_p99_ratio": round(statistics.median(r["p99_ratio"] for r in mine), 3),
            "hit_within_3pp": sum(r["hit_ok"] for r in mine),
            "p99_within_20pct": sum(r["p99_ok"] for r in mine),
            "arena_p99_in_sim_range": sum(r["arena_p99_in_sim_range"] for r in mine),
        }
        print(f"{name}: {len(mine)} rows; hit within 3 pp on {by_router[name]['hit_within_3pp']}"
              f", p99 within 20 % on {by_router[name]['p99_within_20pct']}; worst hit diff "
              f"{by_router[name]['worst_abs_hit_diff_pp']:.1f} pp, median p99 ratio "
              f"{by_router[name]['median_p99_ratio']:.2f}"
              + (f"; the arena's p99 inside the simulated draws' range on "
                 f"{by_router[name]['arena_p99_in_sim_range']}" if args.policy_seeds > 1 else ""))
    print(json.dumps({
        "policy_seeds": args.policy_seeds, "routers": by_router, "rows": results,
        "elapsed_s": round(time.perf_counter() - t0, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
