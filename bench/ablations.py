"""The simulator's ablations: `cacheroute replay` over every policy the simulator has.

Run from the repo root:  .venv/bin/python bench/ablations.py --policies cacheroute,affinity,...

`cacheroute replay` offers the baselines users know and CacheRoute as shipped and as in the
paper; this runs the same experiment code (planner_svc.simulator.experiment), with the same
options (`--help-all` lists them), on every policy of `POLICY_NAMES`: the paper's DualMap-like
baseline, CacheRoute's variants (known rates, sessions, the control loop, the cold tail, no
guard, re-homing, warm placement) and its parts (affinity alone, replication alone). Without
`--policies` it runs the paper's comparison, DualMap-like included. Writes the replay's tables,
CSV and plots to `--out` (default replay-results/) and prints the main table; last line: one
JSON object (the policies, the output directory, the peak RSS of the bench and its workers).
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner_svc.cli.console import HelpFormatter, Parser
from planner_svc.cli.replay_cmd import add_replay_arguments
from planner_svc.simulator.experiment import PAPER_POLICIES, POLICY_NAMES


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="bench/ablations.py", description=__doc__,
                    formatter_class=HelpFormatter)
    add_replay_arguments(parser, policies=POLICY_NAMES, default=PAPER_POLICIES)
    args = parser.parse_args(argv)
    code = int(args.func(args))
    if code == 0 and args.export_trace is None:
        print(json.dumps({"policies": args.policies.split(","), "out": str(args.out),
                          "peak_rss_mb": round(peak_rss_mb(), 1)}))
    return code


def peak_rss_mb() -> float:
    """The larger peak RSS of this process and of its largest worker (the load points run
    on forked workers)."""
    usage = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return max(u.ru_maxrss for u in usage) / 1024


if __name__ == "__main__":
    sys.exit(main())
