"""`cacheroute pool-sync`: keep the planner's destinations equal to a Gateway API Inference
Extension pool's ready pods (planner_svc.orchestration.pool says how).

    cacheroute pool-sync --pool cacheroute-pool --namespace llm --planner 127.0.0.1:50051

Runs beside the planner (the gateway-api overlay's sidecar) with a ServiceAccount that may
get/list pods and inferencepools. Every `--period-s` it reads the pool and its pods, asks
the planner for its destinations, and sends the difference as one UpdateConfig: new ready
pods are added, pods that left or stopped being ready are drained, then removed after
`--remove-after-s`. A pool that selects no ready pod at all changes nothing (draining every
destination would leave routers nowhere to send). Talks to the leader when the planner is
replicated (a standby refuses; the next round tries again).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from cacheroute.v1 import plan_pb2, planner_pb2
from planner_svc.cli.ops_client import OpsError, PlannerConnection, connect
from planner_svc.errors import PlannerError
from planner_svc.orchestration.pool import PoolEdit, pool_destinations, pool_spec, reconcile
from router_client.plan import DestinationSpec

log = logging.getLogger("cacheroute.pool_sync")


class PoolSource(Protocol):
    def read_pool(self) -> dict[str, Any]: ...
    def list_pods(self, label_selector: str) -> list[dict[str, Any]]: ...


class PoolSync:
    """One reconcile round at a time (`once`); `run` repeats it."""

    def __init__(self, source: PoolSource, conn: PlannerConnection, *,
                 remove_after_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source, self.conn = source, conn
        self.remove_after_s = remove_after_s
        self.clock = clock
        self.drained_since: dict[str, float] = {}
        self.rounds = self.edits = 0

    def once(self) -> PoolEdit:
        spec = pool_spec(self.source.read_pool())
        desired = pool_destinations(spec, self.source.list_pods(spec.label_selector))
        status = self.conn.call("GetStatus", planner_pb2.GetStatusRequest())
        current = [DestinationSpec(d.id, d.address, d.capacity_weight or 1.0, d.draining)
                   for d in status.config.destinations]
        now = self.clock()
        draining = {d.id for d in current if d.draining}
        self.drained_since = {i: self.drained_since.get(i, now) for i in draining}
        self.rounds += 1
        if not desired:
            log.warning("pool %s selects no ready pod: keeping the planner's %d destinations",
                        spec.name, len(current))
            return PoolEdit()
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
            log.warning("pool %s: added %s, drained %s, removed %s", spec.name,
                        [d.id for d in edit.add] or "-", edit.drain or "-", edit.remove or "-")
        return edit

    def run(self, period_s: float, stop: Callable[[], bool],
            heartbeat: Path | None = None) -> None:
        while not stop():
            try:
                self.once()
            except (OpsError, PlannerError) as exc:  # retried next round, never fatal
                log.warning("pool sync round failed: %s", exc)
            if heartbeat is not None:  # a liveness probe checks the loop still turns
                heartbeat.touch()
            time.sleep(period_s)


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p = sub.add_parser("pool-sync", parents=[common], description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       help="keep the planner's destinations equal to an InferencePool's pods")
    p.add_argument("--pool", default=env("CACHEROUTE_POOL_SYNC_POOL", ""),
                   help="the InferencePool's name (env CACHEROUTE_POOL_SYNC_POOL)")
    p.add_argument("--namespace", default=env("CACHEROUTE_POOL_SYNC_NAMESPACE", "default"),
                   help="its namespace (env CACHEROUTE_POOL_SYNC_NAMESPACE; default 'default')")
    p.add_argument("--period-s", type=float, default=5.0, help="seconds between rounds")
    p.add_argument("--remove-after-s", type=float, default=60.0,
                   help="remove a destination drained this long ago (default 60)")
    p.add_argument("--once", action="store_true", help="one round, then exit")
    p.add_argument("--heartbeat-file", default=env("CACHEROUTE_POOL_SYNC_HEARTBEAT_FILE", ""),
                   help="touched after every round, for a liveness probe "
                        "(env CACHEROUTE_POOL_SYNC_HEARTBEAT_FILE)")
    p.set_defaults(func=cmd_pool_sync)


def cmd_pool_sync(args: argparse.Namespace) -> int:
    from planner_svc.adapters.kubernetes_pool import KubernetesPool

    if not args.pool:
        raise SystemExit("cacheroute pool-sync: --pool is required (the InferencePool's name)")
    if not (args.period_s > 0 and args.remove_after_s >= 0):
        raise SystemExit("cacheroute pool-sync: --period-s must be > 0, --remove-after-s >= 0")
    conn = connect(args)
    sync = PoolSync(KubernetesPool(args.namespace, args.pool), conn,
                    remove_after_s=args.remove_after_s)
    try:
        if args.once:
            edit = sync.once()
            print(f"added {[d.id for d in edit.add]}, drained {edit.drain}, "
                  f"removed {edit.remove}")
            return 0
        sync.run(args.period_s, lambda: False,
                 Path(args.heartbeat_file) if args.heartbeat_file else None)
    except OpsError as exc:
        raise SystemExit(f"cacheroute: {exc}") from None
    finally:
        conn.close()
    return 0
