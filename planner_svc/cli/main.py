"""The `cacheroute` console script: one entry point, a sub-command per job.

Commands are registered by their own modules; this file only assembles the parser.
Heavy dependencies (Kafka, gRPC stubs, the simulator) load inside the commands.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from planner_svc.cli import discover_cmd, epp_cmd, gateway_cmd, ops, replay_cmd


def _add_stack_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from planner_svc.cli import demo

    up = sub.add_parser("up", help="start the local stack on loopback until Ctrl-C")
    demo.add_stack_arguments(up)
    up.set_defaults(func=demo.cmd_up)
    d = sub.add_parser("demo", help="the stack plus a synthetic fleet, CacheRoute vs Flat-LB")
    # The demo fleet's p99 is tens of ms: a 2-s target lets its report check q_cap.
    demo.add_stack_arguments(d, p99_ms_max=2000.0)
    d.add_argument("--duration", type=float, default=60.0, help="seconds to run the fleet")
    d.add_argument("--keys", type=int, default=3000, help="routing keys (paper: 128,824)")
    d.add_argument("--rate", type=float, default=300.0, help="requests/s offered")
    d.add_argument("--seed", type=int, default=7)
    d.add_argument(
        "--drift-every-s",
        type=float,
        default=10.0,
        help="seconds between lognormal random-walk steps of the key rates",
    )
    d.add_argument("--drift-sigma", type=float, default=0.3, help="σ of each drift step")
    d.add_argument(
        "--shift-at-s",
        type=float,
        default=25.0,
        help="when the popularity shift happens (0: never)",
    )
    d.add_argument(
        "--shift-share",
        type=float,
        default=0.5,
        help="traffic share of the hot keys that trade places with cold keys",
    )
    d.add_argument("--json", action="store_true", help="also print the summary as JSON")
    d.set_defaults(func=demo.cmd_demo)


def _add_plan_commands(sub: argparse._SubParsersAction) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    plan = sub.add_parser("plan", help="build, diff and inspect plans")
    plan_sub = plan.add_subparsers(dest="plan_command", required=True)
    from planner_svc.cli import plan_cmd

    plan_cmd.add_offline_commands(plan_sub)
    return plan_sub


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cacheroute", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_stack_commands(sub)
    plan_sub = _add_plan_commands(sub)
    replay_cmd.add_commands(sub)  # replay, diagnose
    gateway_cmd.add_commands(sub)
    epp_cmd.add_commands(sub)
    ops.add_commands(sub, plan_sub)  # status, watch, replan, mode, ... and online plan commands
    discover_cmd.add_commands(sub, ops.connection_options())
    return parser


def main(argv: list[str] | None = None) -> int:
    # `cacheroute plan show | head`: a closed pipe ends the command quietly, as for any
    # Unix tool, instead of a BrokenPipeError traceback.
    if hasattr(signal, "SIGPIPE") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
