"""The scenario grid in the simulator: every cell (planner_svc.simulator.sessions.grid_cells),
the arena's conversations and engine model in virtual time (session_sim), one gateway.

Per cell: CacheRoute as shipped, CacheRoute without queue-aware moves and without idle
re-homing (what each default costs or earns on that cell), and the baselines: the SGLang
gateway's `cache_aware` as its source states it (reactive.SGLangCacheAware, CLI defaults,
on the prompts' text), Flat-LB (power of two choices on in-flight counts) and round robin.
The best peer of a cell is the baseline with the highest hit rate there. Runs as the
live grid does (bench/arena.py --grid): time scale 2, 4 engines of 60,000 KV tokens,
15 s of warm-up then 12 s measured, a 6-s stream window, replans every 4 s.

`--live-csv` adds the live grid's one-gateway rows beside the simulator's (the issue's
check: every live cell's hit within 2 pp of its prediction).

    .venv/bin/python bench/sim_grid.py --out docs/results/grid-2026-12-08

Writes grid-sim.md, grid-sim.csv, grid-sim-deltas.csv, grid-sim-heatmap.png (and
grid-sim-vs-live.md with --live-csv); last line one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import grid_report  # noqa: E402

from planner_svc.simulator.cacheroute_policy import gateway_like  # noqa: E402
from planner_svc.simulator.policies import PolicyFactory, flat_lb, round_robin  # noqa: E402
from planner_svc.simulator.reactive import sglang_cache_aware  # noqa: E402
from planner_svc.simulator.replica import ReplicaModel  # noqa: E402
from planner_svc.simulator.session_sim import simulate_sessions  # noqa: E402
from planner_svc.simulator.sessions import (  # noqa: E402
    GridCell,
    grid_cells,
    grid_sample,
    population,
    sessions,
)

# the live grid's setup (bench/arena.py --grid)
TIME_SCALE = 2.0
WARMUP_S = 15.0
MEASURE_S = 12.0
KV_TOKENS = 60_000
ENGINES = 4
WINDOW_S = 6.0
CONTROL_S = 4.0
VARIANTS = ("cacheroute", "cacheroute no-queue-aware", "cacheroute no-rehome")
PEERS = ("sglang cache_aware", "flat-lb", "round robin")


def factories(time_scale: float) -> dict[str, PolicyFactory]:
    """Router name -> its simulated policy, as the live grid runs them."""
    q_cap = 12.0 / time_scale
    return {
        "cacheroute": gateway_like(q_cap, 12, rate_window_s=WINDOW_S),
        "cacheroute no-queue-aware": gateway_like(q_cap, 12, rate_window_s=WINDOW_S,
                                                  queue_aware=False),
        "cacheroute no-rehome": gateway_like(q_cap, 12, rate_window_s=WINDOW_S,
                                             idle_rehome_s=None),
        "sglang cache_aware": sglang_cache_aware(),
        "flat-lb": flat_lb,
        "round robin": round_robin,
    }


def run_cell(cell: GridCell, time_scale: float = TIME_SCALE, seed: int = 1) -> list[dict[str, Any]]:
    """Every router on one cell: one row each, as the arena records a run."""
    sc = cell.scenario(ENGINES).offered(1.0, time_scale)
    pop = population(sc, seed)
    total = WARMUP_S + MEASURE_S
    plan = sessions(pop, total)
    model = ReplicaModel(kv_capacity_tokens=KV_TOKENS).time_scaled(time_scale)
    rows = []
    for name, factory in factories(time_scale).items():
        t0 = time.perf_counter()
        r = simulate_sessions(pop, plan, factory, model=model, n_destinations=ENGINES,
                              until_s=total, control_interval_s=CONTROL_S,
                              seed=1).finished_by(total)
        measured = r.sent_s >= WARMUP_S
        rows.append({"scenario": cell.name, "router": name, "replicas": 1, "seed": seed,
                     "requests": int(measured.sum()), "errors": 0,
                     "hit": r.hit_rate(WARMUP_S), "ttft_p99_s": r.ttft_p99(WARMUP_S),
                     "time_scale": time_scale, "warmup_s": WARMUP_S, "measure_s": MEASURE_S,
                     "rate_scale": 1.0, "sim_s": time.perf_counter() - t0})
    return rows


def _variant_lines(rows: list[dict[str, Any]]) -> list[str]:
    """What queue-aware moves and idle re-homing cost or earn per cell (hit pp, p99)."""
    lines = ["| cell | as shipped hit | no queue-aware: Δ hit pp | p99 ratio | "
             "no re-homing: Δ hit pp | p99 ratio |", "|---|---|---|---|---|---|"]
    for cell in dict.fromkeys(r["scenario"] for r in rows):
        at = {r["router"]: r for r in rows if r["scenario"] == cell}
        base = at["cacheroute"]
        parts = [f"| {cell} | {base['hit']:.1%}"]
        for v in VARIANTS[1:]:
            parts.append(f"{(at[v]['hit'] - base['hit']) * 100:+.1f} | "
                         f"{at[v]['ttft_p99_s'] / base['ttft_p99_s']:.2f}")
        lines.append(" | ".join(parts) + " |")
    return lines


def variant_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Cells where turning a default off raises the hit rate by more than 1 pp."""
    out: dict[str, Any] = {}
    for v, key in ((VARIANTS[1], "queue_aware"), (VARIANTS[2], "idle_rehome")):
        gains = []
        for cell in dict.fromkeys(r["scenario"] for r in rows):
            at = {r["router"]: r for r in rows if r["scenario"] == cell}
            gains.append((at[v]["hit"] - at["cacheroute"]["hit"]) * 100)
        out[f"cells_where_{key}_off_gains_1pp"] = sum(g > 1.0 for g in gains)
        out[f"max_gain_{key}_off_pp"] = round(max(gains), 2) if gains else None
    return out


def live_lines(sim: list[dict[str, Any]], live_csv: Path) -> tuple[list[str], dict[str, Any]]:
    """The live grid's one-gateway rows against the simulator's of the same cell and router
    (CacheRoute as `cacheroute`, the SGLang gateways as `sglang cache_aware`)."""
    with live_csv.open(newline="") as f:
        live = [r for r in csv.DictReader(f) if r["replicas"] == "1"]
    same = {"cacheroute": "cacheroute", "smg cache_aware": "sglang cache_aware",
            "sglang cache_aware": "sglang cache_aware", "vllm cache_aware": "sglang cache_aware"}
    simmed = {(r["scenario"], r["router"]): r for r in sim}
    lines = ["| cell | live router | live hit | simulated (as) | sim hit | Δ pp | live p99 s | "
             "sim p99 s |", "|---|---|---|---|---|---|---|---|"]
    diffs = []
    for r in live:
        s = simmed.get((r["scenario"], same.get(r["router"].removesuffix(" tuned"), "")))
        if s is None:
            continue
        d = (s["hit"] - float(r["hit"])) * 100
        if r["router"] == "cacheroute":
            diffs.append(d)
        lines.append(f"| {r['scenario']} | {r['router']} | {float(r['hit']):.1%} | "
                     f"{s['router']} | {s['hit']:.1%} | {d:+.1f} | "
                     f"{float(r['ttft_p99_s']):.3f} | {s['ttft_p99_s']:.3f} |")
    return lines, {"live_cacheroute_cells": len(diffs),
                   "live_cacheroute_hit_within_2pp": sum(abs(d) <= 2.0 for d in diffs),
                   "live_cacheroute_worst_abs_hit_diff_pp":
                       round(max((abs(d) for d in diffs), default=math.nan), 2)}


def simulate(cells: list[GridCell], time_scale: float, jobs: int) -> list[dict[str, Any]]:
    """Every cell, `jobs` at a time, in the cells' order."""
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max(1, jobs)) as pool:
        for i, cell_rows in enumerate(pool.map(run_cell, cells, [time_scale] * len(cells))):
            rows += cell_rows
            print(f"\r{i + 1}/{len(cells)} cells", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return rows


def load_rows(path: Path) -> list[dict[str, Any]]:
    """grid-sim.csv's rows, numbers as numbers."""
    with path.open(newline="") as f:
        rows: list[dict[str, Any]] = list(csv.DictReader(f))
    for r in rows:
        for k in ("hit", "ttft_p99_s", "sim_s", "time_scale", "warmup_s", "measure_s",
                  "rate_scale"):
            r[k] = float(r[k])
        for k in ("replicas", "seed", "requests", "errors"):
            r[k] = int(r[k])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cells", choices=("all", "sample"), default="all",
                    help="every cell of the grid, or the live arena's sample")
    ap.add_argument("--time-scale", type=float, default=TIME_SCALE)
    ap.add_argument("--jobs", type=int, default=1, help="cells simulated at once")
    ap.add_argument("--live-csv", type=Path, default=None,
                    help="bench/arena.py --grid's grid-live.csv, compared cell by cell")
    ap.add_argument("--from-csv", type=Path, default=None,
                    help="an earlier run's grid-sim.csv: its figures again, nothing simulated")
    args = ap.parse_args()
    cells = grid_cells() if args.cells == "all" else grid_sample()
    t0 = time.perf_counter()
    if args.from_csv is not None:
        wanted = {c.name for c in cells}
        rows = [r for r in load_rows(args.from_csv) if r["scenario"] in wanted]
        names = {r["scenario"] for r in rows}
        cells = [c for c in cells if c.name in names]
        elapsed = sum(r["sim_s"] for r in rows) / max(1, args.jobs)
    else:
        rows = simulate(cells, args.time_scale, args.jobs)
        elapsed = time.perf_counter() - t0
    peers_only = [r for r in rows if r["router"] == "cacheroute" or r["router"] in PEERS]
    deltas = grid_report.cell_deltas(peers_only)
    args.out.mkdir(parents=True, exist_ok=True)
    grid_report.write_rows_csv(rows, args.out / "grid-sim.csv",
                               (*grid_report.ROW_KEYS, "sim_s"))
    grid_report.write_deltas_csv(deltas, args.out / "grid-sim-deltas.csv")
    grid_report.plot_grid(deltas, cells, args.out / "grid-sim-heatmap.png",
                          "simulator, 1 gateway")
    # the same with CacheRoute's queue-aware moves off: where that default costs hit rate
    no_moves = [r for r in rows if r["router"] == VARIANTS[1] or r["router"] in PEERS]
    grid_report.plot_grid(grid_report.cell_deltas(no_moves, ours=VARIANTS[1]), cells,
                          args.out / "grid-sim-no-queue-aware-heatmap.png",
                          "simulator, 1 gateway, queue-aware off")
    summary = {k: None if isinstance(v, float) and math.isnan(v) else v
               for k, v in grid_report.grid_summary(deltas).items()}
    summary.update(variant_summary(rows))
    lines = ["# The scenario grid in the simulator (1 gateway)", "",
             "Command: `" + " ".join([".venv/bin/python bench/sim_grid.py", *sys.argv[1:]])
             + f"`; {len(cells)} cells, time scale {args.time_scale:g}, {ENGINES} engines of "
             f"{KV_TOKENS:,} KV tokens, warm-up {WARMUP_S:.0f} s, {MEASURE_S:.0f} s measured; "
             f"best peer of {', '.join(PEERS)}; {elapsed:.0f} s of simulation.", "",
             "Heat maps: grid-sim-heatmap.png (as shipped), grid-sim-no-queue-aware-heatmap.png "
             "(queue-aware moves off).", "",
             "CacheRoute against the best baseline, worst cell first:", "",
             *grid_report.delta_lines(deltas), "",
             "What the gateway's defaults cost or earn per cell (CacheRoute with one of them "
             "off, against as shipped):", "", *_variant_lines(rows)]
    if args.live_csv is not None:
        extra, live = live_lines(rows, args.live_csv)
        summary.update(live)
        (args.out / "grid-sim-vs-live.md").write_text(
            "# The live grid's one-gateway cells against the simulator\n\n"
            + "\n".join(extra) + "\n")
    (args.out / "grid-sim.md").write_text("\n".join(lines) + "\n")
    grid_report.print_table(deltas)
    summary.update(elapsed_s=round(elapsed, 1),
                   peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                     / 1024, 1))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
