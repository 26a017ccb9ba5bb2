"""`cacheroute up` and `cacheroute demo`: the local stack, alone or under the demo fleet."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

from cacheroute.v1 import planner_pb2
from planner_svc.cli.ops_client import OpsError, PlannerConnection
from planner_svc.cli.ops_view import plan_report_dict, render_plan_report
from planner_svc.devstack.fleet import (
    FleetOptions,
    ModelFleet,
    Tally,
    Workload,
    make_engines,
    run_fleets,
)
from planner_svc.devstack.stack import LocalStack, StackOptions, Supervisor, start_stack
from router_client import RouterClient, RouterCore, signing
from router_client.redis_source import RedisPlanSource
from streams.emitter import EventEmitter


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def add_stack_arguments(p: argparse.ArgumentParser, p99_ms_max: float = 0.0) -> None:
    p.add_argument("--destinations", type=int, default=8, help="engines / destinations (R)")
    p.add_argument("--partitions", type=int, default=4, help="partitions of the events topic")
    p.add_argument("--workers", type=int, default=1, help="stream worker processes")
    p.add_argument("--window-s", type=float, default=10.0,
                   help="length of the stream's rate windows, seconds")
    p.add_argument("--hop-s", type=float, default=2.0,
                   help="seconds between window results (the windows slide by this)")
    p.add_argument("--interval-s", type=float, default=5.0, help="planner control interval")
    p.add_argument("--q-cap", type=float, default=60.0,
                   help="requests/s a destination serves before it queues (the knee)")
    p.add_argument("--warm-slots-per-destination", type=int, default=64, metavar="W",
                   help="prefixes a destination's cache keeps warm (W)")
    p.add_argument("--p99-ms-max", type=float, default=p99_ms_max,
                   help="the guard's validated p99 in ms, which `plan report` also checks "
                   "q_cap against (0: no latency target)")
    p.add_argument("--workdir", default="", help="keep logs and keys here (default: temporary)")
    p.add_argument("--operator-token", default=os.environ.get("CACHEROUTE_OPERATOR_TOKEN", ""),
                   help="the planner's operator token (env CACHEROUTE_OPERATOR_TOKEN; "
                   "default: none, auth off)")
    p.add_argument("--reader-token", default=os.environ.get("CACHEROUTE_READER_TOKEN", ""),
                   help="the planner's reader token (env CACHEROUTE_READER_TOKEN)")


def stack_options(args: argparse.Namespace) -> StackOptions:
    return StackOptions(
        destinations=args.destinations,
        event_partitions=args.partitions,
        workers=args.workers,
        window_s=args.window_s,
        hop_s=args.hop_s,
        interval_s=args.interval_s,
        q_cap=args.q_cap,
        warm_slots_per_destination=args.warm_slots_per_destination,
        p99_ms_max=args.p99_ms_max,
        workdir=args.workdir,
        operator_token=args.operator_token,
        reader_token=args.reader_token,
    )


def describe(stack: LocalStack) -> str:
    return "\n".join(
        [
            f"  Kafka (Tansu)  {stack.bootstrap}",
            f"  Redis          {stack.redis_url}",
            f"  planner gRPC   {stack.grpc_target}   (CACHEROUTE_PLANNER={stack.grpc_target})",
            f"  metrics        http://127.0.0.1:{stack.metrics_port}/metrics",
            f"  routers pin    {stack.public_key_path}",
            f"  logs           {stack.workdir}",
        ]
    )


def _stop_on_signals() -> None:
    # SIGINT explicitly too: a process started by a parent that ignores SIGINT (nohup, some
    # CI runners and test harnesses) inherits the ignore, and Python then installs no
    # KeyboardInterrupt handler, so Ctrl-C would not stop the stack.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)


def cmd_up(args: argparse.Namespace) -> int:
    _stop_on_signals()
    stack = start_stack(stack_options(args))
    supervisor = Supervisor(stack)
    try:
        print("CacheRoute stack is up (Ctrl-C stops everything):\n" + describe(stack), flush=True)
        while True:  # a component that dies is restarted; the others keep running
            for name in supervisor.check():
                print(f"supervisor: restarted {name} (restart {supervisor.restarted[name]}; "
                      "see its log)", file=sys.stderr, flush=True)
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 0
    finally:
        stack.stop()


@dataclass
class DemoResult:
    versions_seen: list[str]
    planned_hit: float
    flat_hit: float
    planned_imbalance: float
    flat_imbalance: float
    first_plan_at_s: float | None
    # The installed plan's prediction against what the stream measured (`plan report`).
    plan_report: dict[str, Any] | None = None


def cmd_demo(args: argparse.Namespace) -> int:
    _stop_on_signals()
    stack = start_stack(stack_options(args))
    try:
        print("CacheRoute demo: stack up\n" + describe(stack), flush=True)
        options = FleetOptions(
            keys=args.keys,
            total_rate=args.rate,
            seed=args.seed,
            drift_every_s=args.drift_every_s,
            drift_sigma=args.drift_sigma,
            shift_at_s=args.shift_at_s,
            shift_share=args.shift_share,
        )
        result = run_demo(stack, options, args.duration)
    except KeyboardInterrupt:
        print("interrupted: stopping the stack", file=sys.stderr)
        return 130
    finally:
        stack.stop()
    print_summary(result)
    if args.json:
        print(json.dumps(result.__dict__))
    return 0


def run_demo(stack: LocalStack, options: FleetOptions, duration_s: float) -> DemoResult:
    ids = stack.options.destination_ids
    keys = signing.pin([signing.load_public_key(stack.public_key_path)])
    router = RouterClient(
        RedisPlanSource(stack.redis_url),
        router_id="demo-edge",
        public_keys=keys,
        destination_ids=ids,
    ).start()
    flat = RouterCore(ids, seed=options.seed + 1)
    emitter = EventEmitter(stack.bootstrap, stack.options.events_topic, producer_id="demo-fleet")
    planned = ModelFleet(
        "cacheroute",
        make_engines(ids, options),
        router.route,
        router.started,
        router.finished,
        on_dispatch=lambda k, d, p, pre: emitter.emit_request(
            k, d, prompt_tokens=p, reusable_prefix_tokens=pre, router_id="demo-edge"
        ),
        on_complete=lambda k, d, p, c, o, ms: emitter.emit_cache_hit(
            k, d, prompt_tokens=p, cached_tokens=c, output_tokens=o, e2e_ms=ms
        ),
    )
    baseline = ModelFleet(
        "flat-lb",
        make_engines(ids, options),
        flat.route,
        lambda d: flat.started(flat.slot_of(d)),
        lambda d: flat.finished(flat.slot_of(d)),
    )
    progress = _Progress(router)
    print(
        f"{'t':>5}  {'plan':>8} {'keys':>5}  {'CacheRoute hit':>14} {'imb':>5}  "
        f"{'Flat-LB hit':>11} {'imb':>5}",
        flush=True,
    )
    try:
        run_fleets(Workload(options), [planned, baseline], duration_s, 5.0, progress.report)
    finally:
        emitter.close()
        router.stop()
    return dataclasses.replace(progress.result(), plan_report=delivered_plan_report(stack))


def delivered_plan_report(stack: LocalStack, since_ms: int = 0) -> dict[str, Any] | None:
    """`plan report` of the installed plan or, when it has not left its rewarm dip yet (the
    demo's traffic drifts, so the newest plan is often still warming up), of the newest
    retained plan that was measured past its dip; None if no plan (created at or after
    `since_ms`) predicted anything."""
    conn = PlannerConnection(stack.grpc_target, stack.options.operator_token)
    try:
        listed = conn.call("ListPlanVersions", planner_pb2.ListPlanVersionsRequest(limit=50))
        newest = None
        for info in sorted(listed.versions, key=lambda v: (v.version.epoch, v.version.seq),
                           reverse=True):
            if info.created_at_ms < since_ms:
                continue
            try:
                r = plan_report_dict(conn.call(
                    "GetPlanReport", planner_pb2.GetPlanReportRequest(version=info.version)))
            except OpsError:
                continue  # a fallback table: it predicts nothing
            if r["windows"] and r["predicted_hit_rate"] is not None:
                return r  # the newest measured one: no need to ask about older versions
            newest = newest or r
        return newest
    finally:
        conn.close()


class _Progress:
    """Prints one line per period; totals count only periods with a plan applied."""

    def __init__(self, router: RouterClient) -> None:
        self.router = router
        self.versions: list[str] = []
        self.first_plan_at: float | None = None
        self.planned, self.flat = Tally(), Tally()

    def report(self, elapsed: float, period: list[Tally]) -> None:
        version = self.router.version
        table = self.router.table
        planned_now = table is not None and self.router.mode == "planned"
        if planned_now and str(version) not in self.versions:
            self.versions.append(str(version))
            self.first_plan_at = self.first_plan_at or elapsed
        cr, fl = period
        if planned_now:
            self.planned.add(cr)
            self.flat.add(fl)
        label = str(version) if table is not None else "none"
        n = len(table) if table is not None else 0
        print(
            f"{elapsed:5.0f}  {label:>8} {n:5d}  {cr.hit_rate:13.1%} {cr.imbalance():5.2f}  "
            f"{fl.hit_rate:10.1%} {fl.imbalance():5.2f}",
            flush=True,
        )

    def result(self) -> DemoResult:
        return DemoResult(
            self.versions,
            self.planned.hit_rate,
            self.flat.hit_rate,
            self.planned.imbalance(),
            self.flat.imbalance(),
            self.first_plan_at,
        )


def print_summary(r: DemoResult) -> None:
    print()
    print(
        f"plan versions applied by the router: {len(r.versions_seen)} "
        f"({', '.join(r.versions_seen)})"
    )
    if r.first_plan_at_s is None:
        print("no plan was applied during the run: try a longer --duration")
        return
    print(f"after the first plan (from t={r.first_plan_at_s:.0f} s), same traffic on both fleets:")
    print(
        f"  CacheRoute  served hit rate {r.planned_hit:6.1%}   imbalance {r.planned_imbalance:.2f}"
    )
    print(f"  Flat-LB     served hit rate {r.flat_hit:6.1%}   imbalance {r.flat_imbalance:.2f}")
    if r.plan_report is not None:
        print("did the installed plan deliver (cacheroute plan report):")
        print(render_plan_report(r.plan_report))
