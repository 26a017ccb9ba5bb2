"""Operator commands: the `cacheroute` CLI talking to a running planner over gRPC.

    cacheroute status                       mode, plan version and age, drift, penalties, stream
    cacheroute plan show [VERSION] [--top N]  admitted keys, expected load per destination (bars)
    cacheroute plan versions [--limit N]
    cacheroute plan diff A B                online when A and B look like versions (1.3) and are
                                            not files; `--online` forces it; else the offline diff
    cacheroute plan rollback VERSION | --release
    cacheroute replan [--dry-run] [--fresh] [--force]
    cacheroute mode planned|fallback|auto [--reason TEXT]
    cacheroute config get | set KEY=VALUE...
    cacheroute destinations list | add ID [--address A] [--weight W] | drain ID | remove ID
    cacheroute decisions [--limit N]
    cacheroute watch [--count N]            one line per install and decision, until Ctrl-C

Connection: `--planner HOST:PORT` (env `CACHEROUTE_PLANNER`, default 127.0.0.1:50051), `--token`
(env `CACHEROUTE_TOKEN`, sent as `authorization: Bearer`), `--tls-ca PEM` (env
`CACHEROUTE_TLS_CA`; TLS is off without it). Every command takes `--json`.

Exit status: 0 ok; 1 the planner refused or failed (not found, wrong state, internal);
2 an invalid value (ours or the planner's verdict); 3 the planner is unreachable or not ready;
4 unauthenticated or not allowed. Errors are one line on stderr.
Mutations carry a request id (a fresh uuid, or `--request-id`) and are retried on
UNAVAILABLE with the same id, so a retry acts once.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cacheroute.v1 import plan_pb2, planner_pb2
from planner_svc.cli import ops_view as view
from planner_svc.cli.console import command, show
from planner_svc.cli.ops_client import DEFAULT_PLANNER, OpsError, PlannerConnection, connect
from router_client.plan import RoutingPlan, Version, decode_plan

MODES = {name: value for value, name in view.MODE_NAMES.items()}  # `mode set` choices
def _boolean(text: str) -> bool:
    value = {"true": True, "on": True, "1": True, "false": False, "off": False, "0": False}.get(
        text.lower())
    if value is None:
        raise ValueError(text)
    return value


SETTABLE: dict[str, Callable[[str], Any]] = {  # `config set` keys and how values parse
    "q_cap": float,
    "warm_slots_per_destination": int,
    "interval_s": float,
    "hysteresis": float,
    "min_dwell_s": float,
    "imbalance_tolerance": float,
    "byte_aware": _boolean,
    "admission_hysteresis": float,
    "balance_effort": float,
    "rate_noise_z": float,
    "learn_warm_slots": _boolean,
    "learn_q_cap": _boolean,
    "hashed_tail": _boolean,
    "replica_hysteresis": float,
    "warm_placement": _boolean,
    # the fallback guard (0 = unchecked for the range); sent as one GuardConfig
    "guard.active_keys_min": int,
    "guard.active_keys_max": int,
    "guard.p99_ms_max": float,
    "guard.hit_rate_min": float,
    "guard.hit_gap_max": float,
    "guard.affinity_gain_min": float,
    "guard.enter_after_s": float,
    "guard.resume_dwell_s": float,
    "guard.min_fallback_s": float,
    "guard.p99_resume_margin": float,
    "guard.gain_low_windows": int,
}
_VERSION = re.compile(r"^\d+(\.\d+)?$")


# --- output ---------------------------------------------------------------------------


def now_ms() -> int:
    return int(time.time() * 1000)


def emit(args: argparse.Namespace, data: Any,
         text: Callable[[], str | view.TextTable | Sequence[str | view.TextTable]]) -> None:
    """Print `data` as JSON with --json, else the human rendering (tables as tables on a
    terminal only)."""
    if args.json:
        print(json.dumps(data, sort_keys=False), flush=True)
        return
    output = text()
    for part in [output] if isinstance(output, str | view.TextTable) else output:
        show(part)


def parse_version(text: str) -> plan_pb2.PlanVersion:
    try:
        v = Version.parse(text)
    except ValueError:
        message = f"invalid value: version must look like EPOCH.SEQ, got {text!r}"
        raise OpsError(message, 2) from None
    return plan_pb2.PlanVersion(epoch=v.epoch, seq=v.seq)


def request_id(args: argparse.Namespace) -> str:
    return str(getattr(args, "request_id", None) or uuid.uuid4())


# --- reads ----------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace, conn: PlannerConnection) -> None:
    status = conn.call("GetStatus", planner_pb2.GetStatusRequest())
    data = view.status_dict(status, conn.target)
    emit(args, data, lambda: view.render_status(data, now_ms()))


def fetch_plan(conn: PlannerConnection, version: str | None) -> RoutingPlan:
    """GetPlan, chunks joined; the SignedBlob is unwrapped but not verified (routers verify)."""
    request = planner_pb2.GetPlanRequest(version=parse_version(version) if version else None)
    blob = b"".join(chunk.payload for chunk in conn.stream("GetPlan", request, conn.timeout_s))
    signed = plan_pb2.SignedBlob()
    signed.ParseFromString(blob)
    return decode_plan(signed.payload)


def expected_loads(plan: RoutingPlan) -> np.ndarray:
    """Requests/s per destination under the rates the plan was built on."""
    from planner_svc.control.traffic import planned_loads

    return planned_loads(plan)


def cmd_plan_show(args: argparse.Namespace, conn: PlannerConnection) -> None:
    plan = fetch_plan(conn, args.version)
    data = view.plan_dict(plan, expected_loads(plan), args.top)
    emit(args, data, lambda: view.render_plan(data))


def cmd_plan_versions(args: argparse.Namespace, conn: PlannerConnection) -> None:
    reply = conn.call("ListPlanVersions", planner_pb2.ListPlanVersionsRequest(limit=args.limit))
    data = [view.version_info_dict(v) for v in reply.versions]
    emit(args, {"versions": data}, lambda: view.render_versions(data, now_ms()))


def cmd_plan_explain(args: argparse.Namespace, conn: PlannerConnection) -> None:
    reply = conn.call("ExplainKey", planner_pb2.ExplainKeyRequest(key=args.key,
                                                                  history=args.history))
    data = view.explanation_dict(reply)
    emit(args, data, lambda: view.render_explanation(data))


def cmd_plan_report(args: argparse.Namespace, conn: PlannerConnection) -> None:
    request = planner_pb2.GetPlanReportRequest()
    if args.version:
        request.version.CopyFrom(parse_version(str(args.version)))
    data = view.plan_report_dict(conn.call("GetPlanReport", request))
    emit(args, data, lambda: view.render_plan_report(data))


def cmd_plan_diff_online(args: argparse.Namespace, conn: PlannerConnection) -> None:
    a, b = str(args.a), str(args.b)
    request = planner_pb2.DiffPlansRequest(a=parse_version(a), b=parse_version(b))
    data = {"a": a, "b": b, **view.diff_dict(conn.call("DiffPlans", request))}
    emit(args, data, lambda: view.render_diff(data, a, b))


def cmd_decisions(args: argparse.Namespace, conn: PlannerConnection) -> None:
    reply = conn.call("ListDecisions", planner_pb2.ListDecisionsRequest(limit=args.limit))
    data = [view.decision_dict(d) for d in reply.decisions]
    now = now_ms()
    emit(args, {"decisions": data},
         lambda: "\n".join(view.render_decision(d, now) for d in data) or "no decisions yet")


def cmd_routers(args: argparse.Namespace, conn: PlannerConnection) -> None:
    reply = conn.call("ListRouters", planner_pb2.ListRoutersRequest())
    status = conn.call("GetStatus", planner_pb2.GetStatusRequest())
    newest = status.installed if status.HasField("installed") else None
    data = [view.router_dict(r, newest) for r in reply.routers]
    now = now_ms()
    emit(args, {"routers": data},
         lambda: view.render_routers(data, now) if data else "no router has reported yet")


def cmd_pools(args: argparse.Namespace, conn: PlannerConnection) -> None:
    reply = conn.call("ListPools", planner_pb2.ListPoolsRequest())
    data = view.pools_dict(reply)
    emit(args, data, lambda: view.render_pools(data))


def cmd_config_get(args: argparse.Namespace, conn: PlannerConnection) -> None:
    data = view.config_dict(conn.call("GetStatus", planner_pb2.GetStatusRequest()).config)
    emit(args, data, lambda: view.render_config(data))


def cmd_destinations_list(args: argparse.Namespace, conn: PlannerConnection) -> None:
    config = view.config_dict(conn.call("GetStatus", planner_pb2.GetStatusRequest()).config)
    data = config["destinations"]
    emit(args, {"destinations": data}, lambda: view.render_destinations(data))


def cmd_watch(args: argparse.Namespace, conn: PlannerConnection) -> None:
    """Print the status once, then one line per planner event (install or decision)."""
    if not args.json:
        cmd_status(args, conn)
        print("-- watching; Ctrl-C to stop", flush=True)
    events = conn.stream(
        "WatchPlans", planner_pb2.WatchPlansRequest(), args.duration, until=True
    )
    for seen, event in enumerate(events, start=1):
        data = _event_dict(event)
        line = f"{time.strftime('%H:%M:%S')} " + view.render_event(data)
        emit(args, data, lambda line=line: line)  # type: ignore[misc]
        if args.count and seen >= args.count:
            return


def _event_dict(event: Any) -> dict[str, Any]:
    if event.WhichOneof("event") == "installed":
        return {"event": "installed", "installed": view.version_info_dict(event.installed)}
    return {"event": "decision", "decision": view.decision_dict(event.decision)}


# --- mutations ------------------------------------------------------------------------


def cmd_plan_rollback(args: argparse.Namespace, conn: PlannerConnection) -> None:
    if args.release == bool(args.version):
        raise OpsError("invalid value: give a VERSION to roll back to, or --release", 2)
    request = planner_pb2.RollbackRequest(
        version=parse_version(args.version) if args.version else None,
        request_id=request_id(args),
        release=args.release,
    )
    reply = conn.call("Rollback", request, retries=args.retries)
    if args.release:
        data: dict[str, Any] = {"released": True, "pinned": reply.pinned}
        emit(args, data, lambda: "rollback pin released: the control loop decides again")
        return
    data = {"installed": view.version_info_dict(reply.installed), "pinned": reply.pinned}
    emit(args, data, lambda: (
        f"rolled back to {args.version}: installed as {data['installed']['version']}, "
        "pinned (the loop will not replace it; `plan rollback --release` to unpin)"))


def cmd_replan(args: argparse.Namespace, conn: PlannerConnection) -> None:
    request = planner_pb2.ReplanRequest(
        dry_run=args.dry_run, fresh=args.fresh, force=args.force, request_id=request_id(args)
    )
    reply = conn.call("Replan", request, retries=args.retries)
    data = {
        "dry_run": args.dry_run,
        "installed": reply.installed,
        "candidate": view.version_info_dict(reply.candidate),
        "diff": view.diff_dict(reply.diff) if reply.HasField("diff") else None,
        "penalties": view.penalties_dict(reply.penalties),
        "decision": view.decision_dict(reply.decision) if reply.HasField("decision") else None,
    }
    emit(args, data, lambda: view.render_replan(data))


def cmd_mode(args: argparse.Namespace, conn: PlannerConnection) -> None:
    request = planner_pb2.SetModeRequest(mode=MODES[args.mode], reason=args.reason)
    reply = conn.call("SetMode", request, retries=args.retries)  # setting a mode is idempotent
    data = {"requested": args.mode, "mode": view.MODE_NAMES.get(reply.mode, str(reply.mode))}
    emit(args, data, lambda: f"mode is now {data['mode']}" + (
        " (override released: the guard decides)" if args.mode == "auto" else ""))


def parse_assignments(pairs: list[str]) -> dict[str, Any]:
    """`["q_cap=40", "interval-s=5"]` -> {"q_cap": 40.0, "interval_s": 5.0}; OpsError if bad."""
    changes: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in SETTABLE:
            raise OpsError(
                f"invalid value: {pair!r}: expected KEY=VALUE with KEY one of "
                + ", ".join(SETTABLE), 2)
        try:
            changes[key] = SETTABLE[key](raw.strip())
        except ValueError:
            kind = "true or false" if SETTABLE[key] is _boolean else "a number"
            raise OpsError(f"invalid value: {key} must be {kind}, got {raw!r}", 2) from None
    return changes


def _update_config(args: argparse.Namespace, conn: PlannerConnection, **fields: Any) -> Any:
    request = planner_pb2.UpdateConfigRequest(request_id=request_id(args), **fields)
    return conn.call("UpdateConfig", request, retries=args.retries).config


def cmd_config_set(args: argparse.Namespace, conn: PlannerConnection) -> None:
    changes = parse_assignments(args.assignments)
    fields: dict[str, Any] = {k: v for k, v in changes.items() if not k.startswith("guard.")}
    guard_changes = {k[len("guard."):]: v for k, v in changes.items() if k.startswith("guard.")}
    if guard_changes:  # the guard is replaced as a whole: start from the planner's
        status = conn.call("GetStatus", planner_pb2.GetStatusRequest(), retries=args.retries)
        guard = planner_pb2.GuardConfig()
        guard.CopyFrom(status.config.guard)
        for name, value in guard_changes.items():
            setattr(guard, name, value)
        fields["guard"] = guard
    data = view.config_dict(_update_config(args, conn, **fields))
    emit(args, data, lambda: "updated " + ", ".join(changes) + "\n" + view.render_config(data))


def cmd_destinations_edit(args: argparse.Namespace, conn: PlannerConnection) -> None:
    action = args.destinations_command
    if action == "add":
        spec = plan_pb2.Destination(id=args.id, address=args.address, capacity_weight=args.weight)
        config = _update_config(args, conn, add_destinations=[spec])
    elif action == "weight":
        config = _update_config(args, conn, set_weights={args.id: args.weight})
    else:
        config = _update_config(args, conn, **{f"{action}_destinations": [args.id]})
    data = view.config_dict(config)["destinations"]
    past = {"add": "added", "drain": "draining", "remove": "removed",
            "weight": f"weighted {getattr(args, 'weight', 0):g} (from the next plan)"}[action]
    emit(args, {"destinations": data},
         lambda: [f"{args.id} {past}", view.render_destinations(data)])


# --- the parser -------------------------------------------------------------------------


def connection_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    env = os.environ.get
    common.add_argument("--planner", default=env("CACHEROUTE_PLANNER", DEFAULT_PLANNER),
                        metavar="HOST:PORT", help="planner gRPC address (env CACHEROUTE_PLANNER)")
    common.add_argument("--token", default=env("CACHEROUTE_TOKEN", ""),
                        help="bearer token (env CACHEROUTE_TOKEN)")
    common.add_argument("--tls-ca", default=env("CACHEROUTE_TLS_CA", ""), metavar="PEM",
                        help="CA bundle: connect with TLS (env CACHEROUTE_TLS_CA)")
    common.add_argument("--pool", default=env("CACHEROUTE_POOL", ""),
                        help="the model pool (`cacheroute pools` lists them; default: the "
                             "default pool, or the only one) (env CACHEROUTE_POOL)")
    common.add_argument("--timeout", type=float, default=10.0, help="seconds per call")
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    return common


def _mutation_options() -> argparse.ArgumentParser:
    m = argparse.ArgumentParser(add_help=False)
    m.add_argument("--request-id", help="idempotency key (default: a fresh uuid)")
    m.add_argument("--retries", type=int, default=2, help="retries on UNAVAILABLE (same id)")
    return m


def _online(parser: argparse.ArgumentParser, fn: Callable[..., None]) -> None:
    parser.set_defaults(func=lambda args: run(fn, args))


Command = Callable[[argparse.Namespace, PlannerConnection], None]


def run(fn: Command, args: argparse.Namespace) -> int:
    """Run one command: connect, call, print; errors become one line and an exit status."""
    conn: PlannerConnection | None = None
    try:
        conn = connect(args)
        fn(args, conn)
        return 0
    except OpsError as exc:
        print(f"cacheroute: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 0
    finally:
        if conn is not None:
            conn.close()


def add_commands(sub: Any, plan_sub: Any, common: argparse.ArgumentParser) -> None:
    """Register the online commands on the top-level and `plan` sub-parsers; `common` is
    the connection options every online command takes."""
    mutation = _mutation_options()
    both = [common, mutation]
    _online(command(sub, "status", parents=[common], help="what plan is live, and why"),
            cmd_status)
    _add_plan_commands(plan_sub, common, both)
    replan = command(sub, "replan", parents=both, help="build a candidate now")
    replan.add_argument("--dry-run", action="store_true", help="price it, install nothing")
    replan.add_argument("--fresh", action="store_true", help="from-scratch LPT, not repack")
    replan.add_argument("--force", action="store_true", help="install regardless of penalties")
    _online(replan, cmd_replan)
    mode = command(sub, "mode", parents=both, help="force planned or fallback, or auto")
    mode.add_argument("mode", choices=sorted(MODES),
                      help="planned or fallback pins the mode; auto hands it back to the guard")
    mode.add_argument("--reason", default="", help="recorded with the decision")
    _online(mode, cmd_mode)
    _add_config_commands(sub, common, both)
    decisions = command(sub, "decisions", parents=[common], help="the decision log, newest first")
    decisions.add_argument("--limit", type=int, default=20, help="decisions to list")
    _online(decisions, cmd_decisions)
    routers = command(sub, "routers", parents=[common],
                             help="the fleet: each router's version, lag, mode, rejections")
    _online(routers, cmd_routers)
    pools = command(sub, "pools", parents=[common],
                    help="the model pools this planner plans, and each one's state")
    _online(pools, cmd_pools)
    watch = command(sub, "watch", parents=[common], help="live: installs and decisions")
    watch.add_argument("--count", type=int, default=0, help="stop after N events (0: never)")
    watch.add_argument("--duration", type=float, default=None, help="stop after N seconds")
    _online(watch, cmd_watch)


def _add_plan_commands(plan_sub: Any, common: Any, both: list[Any]) -> None:
    show_cmd = command(plan_sub, "show", parents=[common], help="a plan: load bars, keys")
    show_cmd.add_argument("version", nargs="?", help="EPOCH.SEQ (default: the current plan)")
    show_cmd.add_argument("--top", type=int, default=10, help="hottest keys to list")
    _online(show_cmd, cmd_plan_show)
    explain = command(plan_sub, "explain", parents=[common],
                                  help="why a key is (or is not) where the plan puts it")
    explain.add_argument("key", help="the routing key")
    explain.add_argument("--history", type=int, default=5, help="retained versions to list")
    _online(explain, cmd_plan_explain)
    report = command(plan_sub, "report", parents=[common],
                                 help="did the plan deliver: predicted vs realized")
    report.add_argument("version", nargs="?", help="EPOCH.SEQ (default: the current plan)")
    _online(report, cmd_plan_report)
    versions = command(plan_sub, "versions", parents=[common], help="retained plan versions")
    versions.add_argument("--limit", type=int, default=20, help="versions to list")
    _online(versions, cmd_plan_versions)
    rollback = command(plan_sub, "rollback", parents=both, help="reinstall VERSION and pin it")
    rollback.add_argument("version", nargs="?", help="EPOCH.SEQ")
    rollback.add_argument("--release", action="store_true", help="release the rollback pin")
    _online(rollback, cmd_plan_rollback)
    _extend_offline_diff(plan_sub.choices.get("diff"))


def _extend_offline_diff(diff: argparse.ArgumentParser | None) -> None:
    """Teach the offline `plan diff A B` (files) to diff retained versions on the planner."""
    if diff is None:
        return
    offline = diff.get_default("func")
    diff.add_argument("--online", action="store_true",
                      help="A and B are plan versions on the planner (implied for EPOCH.SEQ)")

    def dispatch(args: argparse.Namespace) -> int:
        if args.online or (_looks_online(args.a) and _looks_online(args.b)):
            return run(cmd_plan_diff_online, args)
        return int(offline(args) or 0)

    diff.set_defaults(func=dispatch)


def _looks_online(arg: Any) -> bool:
    text = str(arg)
    return bool(_VERSION.match(text)) and not Path(text).exists()


def _add_config_commands(sub: Any, common: Any, both: list[Any]) -> None:
    config = command(sub, "config", help="the planner's run-time settings")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    _online(command(config_sub, "get", parents=[common], help="show the settings"),
            cmd_config_get)
    setter = command(config_sub, "set", parents=both, help="change KEY=VALUE settings")
    setter.add_argument("assignments", nargs="+", metavar="KEY=VALUE",
                        help="keys: " + ", ".join(SETTABLE))
    _online(setter, cmd_config_set)
    dests = command(sub, "destinations",
                           help="list, add, drain, remove or reweight destinations")
    dests_sub = dests.add_subparsers(dest="destinations_command", required=True)
    _online(command(dests_sub, "list", parents=[common], help="the configured destinations"),
            cmd_destinations_list)
    for action, text in (("add", "add a destination"), ("drain", "stop placing keys on it"),
                         ("remove", "remove it from the plan"),
                         ("weight", "change its capacity weight")):
        p = command(dests_sub, action, parents=both, help=text)
        p.add_argument("id", help="the destination's id")
        if action == "add":
            p.add_argument("--address", default="", help="engine address routers dial")
            p.add_argument("--weight", type=float, default=1.0, help="capacity weight")
        if action == "weight":
            p.add_argument("weight", type=float, help="capacity weight (1.0 = a reference replica)")
        _online(p, cmd_destinations_edit)
