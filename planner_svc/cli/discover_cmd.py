"""`cacheroute discover` / `cacheroute pool-sync`: keep the planner's destinations equal to
what a discovery source names (planner_svc.adapters.discovery_sources reads them,
planner_svc.orchestration.reconcile.reconcile says how the planner gets there).

    cacheroute discover --file /etc/cacheroute/destinations.json
    cacheroute discover --dns vllm.llm.svc.cluster.local --port 8000
    cacheroute discover --dns-srv _http._tcp.vllm.llm.svc.cluster.local
    cacheroute discover --k8s-service llm/vllm [--port-name http]
    cacheroute pool-sync --inference-pool cacheroute-pool --namespace llm  # a GIE InferencePool

Runs beside the planner. Every `--period-s` it asks the source and the planner, and sends
the difference as one UpdateConfig: new destinations are added (they join the next plan),
ones that left are drained (routers stop sending new requests there, requests in flight
finish), then removed after `--remove-after-s`. A source that answers nothing at all, or
cannot be read or reached, changes nothing (draining every destination would leave routers
nowhere to send); the round is logged and the next one tries again. Talks to the leader
when the planner is replicated (a standby refuses; the next round tries again).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cacheroute.v1 import plan_pb2, planner_pb2
from planner_svc.adapters.discovery_sources import (
    DestinationSource,
    DnsSource,
    FileSource,
    InferencePoolSource,
    ServiceSource,
)
from planner_svc.cli.console import command
from planner_svc.cli.ops_client import OpsError, PlannerConnection, connect
from planner_svc.errors import PlannerError
from planner_svc.orchestration.reconcile import DestinationEdit, reconcile
from router_client.plan import DestinationSpec

log = logging.getLogger("cacheroute.discover")


class DestinationSync:
    """One reconcile round at a time (`once`); `run` repeats it."""

    def __init__(self, source: DestinationSource, conn: PlannerConnection, *,
                 remove_after_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source, self.conn = source, conn
        self.remove_after_s = remove_after_s
        self.clock = clock
        self.drained_since: dict[str, float] = {}
        self.rounds = self.edits = self.failures = 0

    def once(self) -> DestinationEdit:
        desired = self.source.desired()
        status = self.conn.call("GetStatus", planner_pb2.GetStatusRequest())
        current = [DestinationSpec(d.id, d.address, d.capacity_weight or 1.0, d.draining)
                   for d in status.config.destinations]
        now = self.clock()
        draining = {d.id for d in current if d.draining}
        self.drained_since = {i: self.drained_since.get(i, now) for i in draining}
        self.rounds += 1
        if not desired:
            log.warning("%s names no destination: keeping the planner's %d",
                        self.source.name, len(current))
            return DestinationEdit()
        edit = reconcile(current, desired, drained_since=self.drained_since, now=now,
                         remove_after_s=self.remove_after_s)
        if edit:
            self.conn.call("UpdateConfig", planner_pb2.UpdateConfigRequest(
                add_destinations=[plan_pb2.Destination(id=d.id, address=d.address,
                                                       capacity_weight=d.capacity_weight)
                                  for d in edit.add],
                drain_destinations=edit.drain, remove_destinations=edit.remove,
                request_id=str(uuid.uuid4())), retries=2)
            self.edits += 1
            log.warning("%s: added %s, drained %s, removed %s", self.source.name,
                        [d.id for d in edit.add] or "-", edit.drain or "-", edit.remove or "-")
        return edit

    def run(self, period_s: float, stop: Callable[[], bool],
            heartbeat: Path | None = None) -> None:
        while not stop():
            try:
                self.once()
            except (OpsError, PlannerError) as exc:  # retried next round, never fatal
                self.failures += 1
                log.warning("discovery round failed (%s): %s", self.source.name, exc)
            if heartbeat is not None:  # a liveness probe checks the loop still turns
                heartbeat.touch()
            time.sleep(period_s)


def _sync_options(p: argparse.ArgumentParser, env_prefix: str) -> None:
    env = os.environ.get
    p.add_argument("--period-s", type=float, default=5.0, help="seconds between rounds")
    p.add_argument("--remove-after-s", type=float, default=60.0,
                   help="remove a destination drained this long ago (default 60)")
    p.add_argument("--once", action="store_true", help="one round, then exit")
    p.add_argument("--heartbeat-file", default=env(f"{env_prefix}_HEARTBEAT_FILE", ""),
                   help="touched after every round, for a liveness probe "
                        f"(env {env_prefix}_HEARTBEAT_FILE)")


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    env = os.environ.get
    d = command(sub, "discover", parents=[common], description=__doc__,
                       help="keep the planner's destinations equal to a file, DNS or "
                            "Kubernetes")
    src = d.add_mutually_exclusive_group(required=True)
    src.add_argument("--file", help="a destinations file: JSON [{id, address, weight}] or "
                                    "lines 'id address [weight]'; re-read when it changes")
    src.add_argument("--dns", metavar="NAME", help="a name's A/AAAA records (needs --port)")
    src.add_argument("--dns-srv", metavar="NAME", help="a name's SRV records")
    src.add_argument("--k8s-service", metavar="NAMESPACE/NAME",
                     help="a Kubernetes Service's ready endpoints (EndpointSlices)")
    d.add_argument("--port", type=int, default=0, help="the engines' port (with --dns)")
    d.add_argument("--port-name", default="",
                   help="the Service port to use (with --k8s-service; default: its only one)")
    d.add_argument("--nameserver", default=env("CACHEROUTE_DISCOVER_NAMESERVER", ""),
                   help="ask this DNS server (host[:port]) instead of the system's "
                        "(env CACHEROUTE_DISCOVER_NAMESERVER)")
    _sync_options(d, "CACHEROUTE_DISCOVER")
    d.set_defaults(func=cmd_discover)

    p = command(sub, "pool-sync", parents=[common], description=__doc__,
                       help="keep the planner's destinations equal to an InferencePool's pods")
    # (CACHEROUTE_POOL_SYNC_POOL: the variable's name before pools, still read.)
    p.add_argument("--inference-pool", default=env("CACHEROUTE_POOL_SYNC_INFERENCE_POOL",
                                                   env("CACHEROUTE_POOL_SYNC_POOL", "")),
                   help="the InferencePool's name (env CACHEROUTE_POOL_SYNC_INFERENCE_POOL); "
                        "--pool names the planner's pool it feeds")
    p.add_argument("--namespace", default=env("CACHEROUTE_POOL_SYNC_NAMESPACE", "default"),
                   help="its namespace (env CACHEROUTE_POOL_SYNC_NAMESPACE; default 'default')")
    _sync_options(p, "CACHEROUTE_POOL_SYNC")
    p.set_defaults(func=cmd_pool_sync)


def _source(args: argparse.Namespace) -> DestinationSource:
    if args.file:
        return FileSource(args.file)
    if args.dns or args.dns_srv:
        try:
            return DnsSource(args.dns or args.dns_srv, port=args.port, srv=bool(args.dns_srv),
                             nameserver=args.nameserver)
        except PlannerError as exc:
            raise SystemExit(f"cacheroute discover: {exc}") from None
    namespace, _, service = args.k8s_service.rpartition("/")
    if not service:
        raise SystemExit("cacheroute discover: --k8s-service is NAMESPACE/NAME")
    from planner_svc.adapters.kubernetes_pool import KubernetesService

    api = KubernetesService(namespace or "default", service)
    return ServiceSource(api.list_endpoint_slices, args.k8s_service, args.port_name)


def _run(args: argparse.Namespace, source: DestinationSource) -> int:
    if not (args.period_s > 0 and args.remove_after_s >= 0):
        raise SystemExit(f"cacheroute {args.command}: --period-s must be > 0, "
                         "--remove-after-s >= 0")
    conn = connect(args)
    sync = DestinationSync(source, conn, remove_after_s=args.remove_after_s)
    try:
        if args.once:
            edit = sync.once()
            print(f"added {[d.id for d in edit.add]}, drained {edit.drain}, "
                  f"removed {edit.remove}")
            return 0
        sync.run(args.period_s, lambda: False,
                 Path(args.heartbeat_file) if args.heartbeat_file else None)
    except (OpsError, PlannerError) as exc:
        raise SystemExit(f"cacheroute: {exc}") from None
    finally:
        conn.close()
    return 0


def cmd_discover(args: argparse.Namespace) -> int:
    return _run(args, _source(args))


def cmd_pool_sync(args: argparse.Namespace) -> int:
    from planner_svc.adapters.kubernetes_pool import KubernetesPool

    if not args.inference_pool:
        raise SystemExit("cacheroute pool-sync: --inference-pool is required (the "
                         "InferencePool's name)")
    return _run(args, InferencePoolSource(KubernetesPool(args.namespace, args.inference_pool)))
