"""The simulator's ablations: `cacheroute replay` over every policy the simulator has.

Run from the repo root:  .venv/bin/python bench/ablations.py --policies cacheroute,affinity,...

`cacheroute replay` offers the baselines users know and CacheRoute as shipped and as in the
paper; this runs the same experiment code (planner_svc.simulator.experiment), with the same
options (`--help-all` lists them), on every policy of `POLICY_NAMES`: the paper's DualMap-like
baseline, CacheRoute's variants (known rates, sessions, the control loop, the cold tail, no
guard, re-homing, warm placement) and its parts (affinity alone, replication alone). Without
`--policies` it runs the paper's comparison, DualMap-like included. Writes the replay's tables,
CSV and plots to `--out` (default replay-results/).
"""

from __future__ import annotations

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
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
