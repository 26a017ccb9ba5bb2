"""The simulator checked against the arena: the same conversations, the same engine model,
in virtual time (planner_svc.simulator.session_sim) and live (bench/arena.py).

Every one-replica row of the arena CSVs given (comparison runs and capacity points alike)
is replayed as it ran: its scenario, seed, offered load, time scale, warm-up and measured
stretch (from the row; older CSVs without those columns take the command's flags), so the
simulator plays exactly the arena's conversations. The routers and their simulated
counterparts are `planner_svc.simulator.arena_check`'s, which `cacheroute replay
--arena-csv` runs too; this bench adds the flags for CSVs recorded before the arena wrote
every column.

Per row: served hit rate and TTFT p99, arena and simulated, and whether the simulator is
within the issue's tolerances (3 pp of hit rate, 20 % of p99).

`--transport docs/results/gateway/gateway.json` adds the request path's measured cost to
every simulated TTFT: the emulated engine's own time to a first streamed event and what
the router in front adds to it (bench/gateway.py, instant engines, p50 per router).

    .venv/bin/python bench/sim_vs_arena.py --arena-csv docs/results/arena/arena.csv \\
        docs/results/arena/capacity-seeds/arena-capacity.csv

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner_svc.settings import PlannerSettings  # noqa: E402
from planner_svc.simulator.arena_check import (  # noqa: E402
    POWER_OF_TWO_MODELS,
    GatewaySettings,
    RunDefaults,
    arena_rows,
    check_row,
    load_arena_csvs,
    summary,
    table_lines,
    transport_s,
)
from router_client.ring import DEFAULT_TAIL_SLACK  # noqa: E402
from router_client.routing import DEFAULT_IDLE_REHOME_S, DEFAULT_QUEUE_AWARE  # noqa: E402


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
                    default="on" if DEFAULT_QUEUE_AWARE else "off",
                    help="the gateways' --queue-aware as the rows ran with it (off for rows "
                    "from before 2026-12-06 midday, when it became the default)")
    ap.add_argument("--cumulative-rates", action="store_true",
                    help="the simulated planner plans on cumulative mean rates (before "
                         "2026-12-05) instead of the stream window's, as the planner does")
    ap.add_argument("--power-of-two", choices=POWER_OF_TWO_MODELS, default="random",
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
    transport = transport_s(json.loads(args.transport.read_text())) if args.transport else {}
    if transport:
        print("transport added to simulated TTFT: " + ", ".join(
            f"{n} {v * 1000:.1f} ms" for n, v in transport.items()))
    gw = GatewaySettings(tail_slack=args.tail_slack, balance=args.balance,
                         idle_rehome_s=args.idle_rehome_s or None,
                         warm_placement=args.warm_placement == "on",
                         imbalance_tolerance=args.imbalance_tolerance,
                         queue_aware=args.queue_aware == "on",
                         rate_window=not args.cumulative_rates,
                         power_of_two=args.power_of_two)
    defaults = RunDefaults(time_scale=args.time_scale, warmup_s=args.warmup_s,
                           measure_s=args.measure_s, kv_tokens=args.kv_tokens,
                           engines=args.engines)
    t0 = time.perf_counter()
    checks = [check_row(row, gw, defaults, policy_seeds=args.policy_seeds, transport=transport)
              for row in arena_rows(load_arena_csvs(args.arena_csv))]
    print("\n".join(table_lines(checks, ranges=args.policy_seeds > 1)))
    out: dict[str, Any] = {
        "policy_seeds": args.policy_seeds, "routers": summary(checks),
        "rows": [c.as_json() for c in checks],
        "elapsed_s": round(time.perf_counter() - t0, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
