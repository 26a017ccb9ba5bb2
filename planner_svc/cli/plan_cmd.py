"""`cacheroute plan build` and `cacheroute plan diff`: the planning core offline, on files.

    cacheroute plan build --rates rates.csv --destinations 30 --q-cap 6 \
        --warm-slots-per-destination 128 [--previous old.plan] [--out new.plan] [--json]
    cacheroute plan diff old.plan new.plan [--json]

Rates files: CSV rows `key,rate[,tokens]` (a header row is allowed), or JSON: a list of
`{"key", "rate"[, "tokens"]}` objects, a `{key: rate}` object, or `{"keys": [...], "rates":
[...][, "tokens": [...]]}`. Plan files hold `encode_plan` bytes. Exit status 0 on success, 2 when
an input is unusable (the message says which).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from planner_svc.cli.console import command
from planner_svc.planning import PlanDiff, PlanningConfig, PlanningError, build_plan, diff, repack
from planner_svc.planning.config import PAPER_IMBALANCE_TOLERANCE
from router_client.errors import PlanRejected
from router_client.plan import DestinationSpec, RoutingPlan, decode_plan, encode_plan


class RatesFile:
    """Keys, rates and optional reusable-prefix sizes read from a file."""

    def __init__(self, keys: list[str], rates: np.ndarray, tokens: np.ndarray | None) -> None:
        self.keys, self.rates, self.tokens = keys, rates, tokens


def add_offline_commands(plan_subparsers: Any, connection: argparse.ArgumentParser) -> None:
    """Add `build` and `diff` to the `plan` command group's subparsers. `diff` also takes
    the planner's connection options: `ops` teaches it to diff retained versions."""
    build = command(plan_subparsers, "build", help="build (or repack) a plan from a rates file")
    build.add_argument("--rates", required=True, type=Path, help="CSV or JSON of key,rate[,tokens]")
    where = build.add_mutually_exclusive_group(required=True)
    where.add_argument("--destinations", type=int, help="N equal destinations d000..")
    where.add_argument("--destination", action="append", metavar="ID[=WEIGHT]",
                       help="a destination and its capacity weight (repeat)")
    build.add_argument("--draining", action="append", default=[], metavar="ID",
                       help="mark a destination as draining (repeat)")
    build.add_argument("--q-cap", type=float, required=True, help="per-destination knee, req/s")
    build.add_argument("--warm-slots-per-destination", type=int, default=128, metavar="W",
                       help="prefixes a destination's cache keeps warm (W)")
    build.add_argument("--warm-slots", type=int, metavar="C", help="override C = R·W")
    build.add_argument("--byte-aware", action="store_true", help="token budget, value density")
    build.add_argument("--token-budget", type=float, help="warm budget in tokens (byte-aware)")
    build.add_argument("--imbalance-tolerance", type=float,
                       default=PAPER_IMBALANCE_TOLERANCE,
                       help="max/mean load above 1 that repacking accepts")
    build.add_argument("--balance-effort", type=float, default=1.0,
                       help="repack: 0 = least churn .. 1 = best balance")
    build.add_argument("--admission-hysteresis", type=float, default=0.0, metavar="H",
                       help="repack: installed keys rank at rate x (1 + H)")
    build.add_argument("--previous", type=Path, metavar="PLAN", help="repack this installed plan")
    build.add_argument("--out", type=Path, metavar="PLAN", help="write the encoded plan here")
    build.add_argument("--json", action="store_true", help="print a JSON summary")
    build.set_defaults(func=run_build)
    compare = command(plan_subparsers, "diff", parents=[connection],
                      help="compare two plans: files, or versions the planner retains")
    compare.add_argument("a", type=Path, metavar="A", help="the older plan (file or EPOCH.SEQ)")
    compare.add_argument("b", type=Path, metavar="B", help="the newer plan (file or EPOCH.SEQ)")
    compare.set_defaults(func=run_diff)


# --- build -----------------------------------------------------------------------


def run_build(args: argparse.Namespace) -> int:
    """`plan build`: read rates, build or repack, print a summary, optionally write the plan."""
    try:
        rates = read_rates(args.rates)
        config = config_from_args(args)
        previous = read_plan(args.previous) if args.previous else None
        tokens = rates.tokens if args.byte_aware else None
        if previous is None:
            plan = build_plan(rates.keys, rates.rates, config, prefix_tokens=tokens)
        else:
            plan = repack(previous, rates.keys, rates.rates, config, prefix_tokens=tokens)
    except (PlanningError, PlanRejected, OSError) as exc:
        return _fail(str(exc))
    if args.out:
        args.out.write_bytes(encode_plan(plan))
    change = diff(previous, plan) if previous is not None else None
    if args.json:
        print(json.dumps(plan_summary(plan) | ({"diff": diff_summary(change)} if change else {})))
    else:
        print(format_plan(plan))
        if change is not None:
            print(format_diff(change))
    return 0


def config_from_args(args: argparse.Namespace) -> PlanningConfig:
    """The PlanningConfig the flags describe (PlanningError when they are inconsistent)."""
    if args.destinations is not None:
        width = max(3, len(str(max(args.destinations - 1, 0))))
        specs = [(f"d{i:0{width}d}", 1.0) for i in range(args.destinations)]
    else:
        specs = [parse_destination(text) for text in args.destination]
    unknown = set(args.draining) - {ident for ident, _ in specs}
    if unknown:
        raise PlanningError(f"--draining names unknown destinations: {sorted(unknown)}")
    dests = tuple(DestinationSpec(i, capacity_weight=w, draining=i in args.draining)
                  for i, w in specs)
    return PlanningConfig(
        dests,
        q_cap=args.q_cap,
        warm_slots_per_destination=args.warm_slots_per_destination,
        warm_slots=args.warm_slots,
        imbalance_tolerance=args.imbalance_tolerance,
        balance_effort=args.balance_effort,
        byte_aware=args.byte_aware,
        token_budget=args.token_budget,
        admission_hysteresis=args.admission_hysteresis,
    )


def parse_destination(text: str) -> tuple[str, float]:
    """`"gpu-a=2"` -> ("gpu-a", 2.0); `"gpu-b"` -> ("gpu-b", 1.0)."""
    ident, sep, weight = text.partition("=")
    if not sep:
        return ident, 1.0
    try:
        return ident, float(weight)
    except ValueError:
        raise PlanningError(f"--destination {text!r}: weight must be a number") from None


# --- files -----------------------------------------------------------------------


def read_plan(path: Path) -> RoutingPlan:
    """Decode a plan file (PlanRejected when it is not a sound plan)."""
    return decode_plan(path.read_bytes())


def read_rates(path: Path) -> RatesFile:
    """Read a CSV or JSON rates file (JSON when the name ends in .json or the text starts so)."""
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if path.suffix.lower() == ".json" or stripped[:1] in ("[", "{"):
        rows = _json_rows(text, path)
    else:
        rows = _csv_rows(text, path)
    return _rates_from_rows(rows, path)


def _json_rows(text: str, path: Path) -> list[tuple[str, float, float | None]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanningError(f"{path}: not valid JSON: {exc}") from exc
    try:
        if isinstance(data, list):
            return [(str(r["key"]), float(r["rate"]), _opt(r.get("tokens"))) for r in data]
        if isinstance(data, dict) and "keys" in data:
            tokens = data.get("tokens") or [None] * len(data["keys"])
            return [(str(k), float(r), _opt(t))
                    for k, r, t in zip(data["keys"], data["rates"], tokens, strict=True)]
        if isinstance(data, dict):
            return [(str(k), float(v), None) for k, v in data.items()]
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanningError(f"{path}: unexpected JSON rates layout ({exc})") from exc
    raise PlanningError(f"{path}: JSON rates must be a list or an object")


def _csv_rows(text: str, path: Path) -> list[tuple[str, float, float | None]]:
    rows: list[tuple[str, float, float | None]] = []
    first = True
    for number, row in enumerate(csv.reader(text.splitlines()), start=1):
        if not row or row[0].startswith("#"):
            continue
        if len(row) < 2:
            raise PlanningError(f"{path}:{number}: need key,rate[,tokens]")
        try:
            rows.append((row[0].strip(), float(row[1]), _opt(row[2]) if len(row) > 2 else None))
            first = False
        except ValueError:
            if first:
                first = False
                continue  # a header row
            raise PlanningError(f"{path}:{number}: rate and tokens must be numbers") from None
    return rows


def _opt(value: object) -> float | None:
    if value is None or value == "":
        return None
    return float(value)  # type: ignore[arg-type]


def _rates_from_rows(rows: list[tuple[str, float, float | None]], path: Path) -> RatesFile:
    keys = [k for k, _, _ in rows]
    if len(set(keys)) != len(keys):
        raise PlanningError(f"{path}: a key appears twice")
    if any(not k for k in keys):
        raise PlanningError(f"{path}: empty key")
    rates = np.array([r for _, r, _ in rows], np.float64)
    sizes = [t for _, _, t in rows]
    tokens = None if all(t is None for t in sizes) else np.array(
        [0.0 if t is None else t for t in sizes], np.float64
    )
    return RatesFile(keys, rates, tokens)


# --- diff ------------------------------------------------------------------------


def run_diff(args: argparse.Namespace) -> int:
    """`plan diff A B`: added, removed and moved keys and the per-destination load change."""
    try:
        a, b = read_plan(args.a), read_plan(args.b)
    except (PlanRejected, OSError) as exc:
        return _fail(str(exc))
    change = diff(a, b)
    print(json.dumps(diff_summary(change)) if args.json else format_diff(change))
    return 0


# --- summaries -------------------------------------------------------------------


def plan_summary(plan: RoutingPlan) -> dict[str, Any]:
    """JSON-ready summary of a plan (config, stats, per-destination expected load)."""
    stats = asdict(plan.stats)
    stats["expected_load_per_s"] = dict(
        zip(plan.destination_ids, plan.stats.expected_load_per_s, strict=False)
    )
    return {"version": str(plan.version), "config": asdict(plan.config), "stats": stats,
            "destinations": [asdict(d) for d in plan.destinations]}


def diff_summary(change: PlanDiff) -> dict[str, Any]:
    """JSON-ready summary of a diff: counts and shares, plus the key lists."""
    out = asdict(change)
    out |= {"added_keys": len(change.added), "removed_keys": len(change.removed),
            "moved_keys": len(change.moved)}
    return out


def format_plan(plan: RoutingPlan) -> str:
    s, c = plan.stats, plan.config
    lines = [
        f"plan ({c.built_by}): {s.admitted_keys} keys admitted, {s.used_slots}/{c.warm_slots} "
        f"warm slots, admitted share {s.admitted_rate_share:.3f}, cold tail "
        f"{s.cold_tail_rate_per_s:.3f}/s, imbalance max/mean {s.imbalance_max_over_mean:.4f}",
        f"{'destination':<16} {'weight':>7} {'load/s':>10} {'load/knee':>10}",
    ]
    for d, load in zip(plan.destinations, s.expected_load_per_s, strict=False):
        knee = c.q_cap * d.capacity_weight
        flag = "  draining" if d.draining else ""
        lines.append(f"{d.id:<16} {d.capacity_weight:>7.2f} {load:>10.3f} "
                     f"{(load / knee if knee > 0 else math.inf):>10.3f}{flag}")
    return "\n".join(lines)


def format_diff(change: PlanDiff) -> str:
    lines = [
        f"added {len(change.added)}, removed {len(change.removed)}, moved {len(change.moved)} "
        f"of {change.kept_keys} kept keys ({change.moved_key_fraction:.3f})",
        f"traffic share: moved {change.moved_traffic_share:.4f}, entering "
        f"{change.added_traffic_share:.4f}, leaving {change.removed_traffic_share:.4f}; "
        f"rewarm traffic {change.rewarm_traffic_per_s:.3f}/s",
        f"{'destination':<16} {'load change/s':>14}",
    ]
    lines += [f"{d:<16} {v:>+14.3f}" for d, v in change.load_change_per_s.items()]
    return "\n".join(lines)


def _fail(message: str) -> int:
    print(f"cacheroute plan: error: {message}", file=sys.stderr)
    return 2
