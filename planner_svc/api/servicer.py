"""gRPC servicer for `cacheroute.v1.Planner`: validate, convert, delegate to `Planner`.

Handlers stay thin: they check fields (raising `InvalidRequest`), convert protobuf to
core types with `planner_svc.api.convert`, call the planner, and convert back. Domain
errors become status codes in `planner_svc.api.interceptors`, not here.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from cacheroute.v1 import plan_pb2, planner_pb2, planner_pb2_grpc
from planner_svc.api import convert
from planner_svc.errors import Busy, InvalidRequest, NotFound
from planner_svc.orchestration.pools import PoolSet, PoolUnit
from planner_svc.planning import diff
from router_client.plan import MAX_KEY_BYTES, DestinationSpec, RoutingPlan, Version

CHUNK_BYTES = 1024 * 1024
MAX_LIST = 10_000


def _check_finite_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise InvalidRequest(f"{name} must be a positive finite number, got {value}")


def _check_limit(limit: int) -> int:
    if limit > MAX_LIST:
        raise InvalidRequest(f"limit must be at most {MAX_LIST}, got {limit}")
    return limit or 100


def _version_arg(pb: plan_pb2.PlanVersion, name: str, *, required: bool) -> Version | None:
    v = convert.version_from(pb)
    if v == Version():
        if required:
            raise InvalidRequest(f"{name} is required (epoch and seq)")
        return None
    if v.seq == 0:
        raise InvalidRequest(f"{name}.seq must be >= 1")
    return v


class StreamSlots:
    """At most `total` streams of one kind open, `per_peer` from one host: each holds a
    server thread (a reader that stops reading blocks the thread in its next write), and
    the pool must keep threads for unary calls (GetStatus, health)."""

    def __init__(self, total: int, per_peer: int, what: str = "watch streams") -> None:
        self.total, self.per_peer, self.what = total, per_peer, what
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}

    @contextlib.contextmanager
    def slot(self, peer: str) -> Iterator[None]:
        with self._lock:
            if sum(self._open.values()) >= self.total:
                raise Busy(f"{self.total} {self.what} are open: retry later")
            if self._open.get(peer, 0) >= self.per_peer:
                raise Busy(f"{self.per_peer} {self.what} from {peer} are open already")
            self._open[peer] = self._open.get(peer, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._open[peer] -= 1
                if not self._open[peer]:
                    del self._open[peer]

    @property
    def open(self) -> int:
        return sum(self._open.values())


def _peer_host(peer: str) -> str:
    """`ipv4:127.0.0.1:5555` -> `ipv4:127.0.0.1` (one host, whatever its port)."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


class PlannerServicer(planner_pb2_grpc.PlannerServicer):
    """Every call names its pool (`pool`, "" = the default or only one) and is answered by
    that pool's planner and publisher."""

    def __init__(self, pools: PoolSet, *, max_watchers: int = 8,
                 max_watchers_per_peer: int = 0, max_plan_streams: int = 4,
                 plan_stream_deadline_s: float = 60.0,
                 pools_file: Callable[[], tuple[str, str]] = lambda: ("", "")) -> None:
        self._pools = pools
        self._pools_file = pools_file  # () -> (path, last reload error)
        # Per host: all of them by default (operators often share one bastion host).
        self._watchers = StreamSlots(max_watchers, max_watchers_per_peer or max_watchers)
        # Plan downloads are bounded apart from watches (a router fleet watching must not
        # lock operators out of GetPlan), and in time: a client that stops reading holds
        # its thread only until the deadline, whatever the RPC deadline it asked for.
        self._downloads = StreamSlots(max_plan_streams, max_plan_streams, "plan downloads")
        self._plan_deadline_s = plan_stream_deadline_s

    def _unit(self, request: Any) -> PoolUnit:
        name = request.pool
        if len(name) > 63:
            raise InvalidRequest("pool must be at most 63 characters")
        return self._pools.get(name)

    def _decision(self, d: Any) -> planner_pb2.Decision:
        return convert.decision_pb(d)

    # --- reads ---------------------------------------------------------------

    def GetStatus(self, request: Any, context: grpc.ServicerContext) -> planner_pb2.PlannerStatus:
        unit = self._unit(request)
        s = unit.planner.status()
        installed, last = s.installed, s.last_decision
        drift = s.figures.drift if s.figures is not None else None
        w = s.measured_warm_slots
        measured: dict[str, Any] = ({} if w is None else {
            "measured_warm_slots": w.value, "measured_warm_slots_destinations": w.destinations,
            "measured_mean_prefix_tokens": w.mean_prefix_tokens})
        q = s.measured_q_cap
        if q is not None:
            measured.update(measured_q_cap=q.value, measured_q_cap_source=q.source,
                            measured_q_cap_destinations=q.destinations)
            if q.slo_bound is not None:
                measured.update(measured_q_cap_slo_bound=q.slo_bound)
        return planner_pb2.PlannerStatus(
            mode=convert.MODE_TO_PB[s.mode],
            installed=convert.version_pb(installed.plan.version) if installed else None,
            installed_age_s=s.installed_age_s,
            drift=convert.drift_pb(drift) if drift is not None else None,
            penalties=convert.penalties_pb(s.figures, s.accumulated),
            last_decision=self._decision(last) if last is not None else None,
            rates_age_s=s.rates_age_s if math.isfinite(s.rates_age_s) else -1.0,
            rates_recovering=s.rates_recovering,
            config=convert.config_pb(s.tunables, s.decision_settings, s.destinations, s.guard),
            pinned=s.pinned,
            mode_reason=s.mode_reason,
            role=s.role,
            leader_id=s.leader_id,
            engines=list(s.engine_signals),
            saturated=[convert.saturated_pb(*row) for row in s.saturated],
            q_cap_in_use=s.q_cap_in_use,
            warm_slots_in_use=s.warm_slots_in_use,
            **measured,
        )

    def GetCurrentVersion(
        self, request: Any, context: grpc.ServicerContext
    ) -> planner_pb2.CurrentVersion:
        unit = self._unit(request)
        installed = unit.planner.current()
        if installed is None:
            raise NotFound("no plan installed yet")
        return planner_pb2.CurrentVersion(
            version=convert.version_pb(installed.plan.version),
            digest=installed.digest,
            created_at_ms=installed.plan.created_at_ms,
        )

    def GetPlan(
        self, request: planner_pb2.GetPlanRequest, context: grpc.ServicerContext
    ) -> Iterator[planner_pb2.PlanChunk]:
        unit = self._unit(request)
        version = _version_arg(request.version, "version", required=False)
        with self._downloads.slot(_peer_host(context.peer())):
            plan = unit.planner.plan(version)
            blob = unit.publisher.signed_plan(plan.version)
            count = max(1, -(-len(blob) // CHUNK_BYTES))
            timer = threading.Timer(self._plan_deadline_s, context.cancel)
            timer.daemon = True
            timer.start()
            try:
                for i in range(count):
                    yield planner_pb2.PlanChunk(
                        payload=blob[i * CHUNK_BYTES : (i + 1) * CHUNK_BYTES], index=i,
                        count=count)
            finally:
                timer.cancel()

    def ListPlanVersions(
        self, request: planner_pb2.ListPlanVersionsRequest, context: grpc.ServicerContext
    ) -> planner_pb2.ListPlanVersionsResponse:
        unit = self._unit(request)
        limit = _check_limit(request.limit)
        current = unit.planner.current()
        infos = []
        for plan in unit.planner.list_versions(limit):
            is_current = current is not None and current.plan.version == plan.version
            digest = current.digest if is_current and current else b""
            infos.append(convert.version_info_pb(plan, digest, is_current))
        return planner_pb2.ListPlanVersionsResponse(versions=infos)

    def DiffPlans(
        self, request: planner_pb2.DiffPlansRequest, context: grpc.ServicerContext
    ) -> planner_pb2.PlanDiff:
        unit = self._unit(request)
        a = unit.planner.plan(_version_arg(request.a, "a", required=True))
        b = unit.planner.plan(_version_arg(request.b, "b", required=True))
        return convert.diff_pb(diff(a, b))

    def WatchPlans(
        self, request: Any, context: grpc.ServicerContext
    ) -> Iterator[planner_pb2.PlannerEvent]:
        unit = self._unit(request)
        peer = _peer_host(context.peer())
        with self._watchers.slot(peer):
            yield from self._watch(unit, context)

    def _watch(self, unit: PoolUnit,
               context: grpc.ServicerContext) -> Iterator[planner_pb2.PlannerEvent]:
        for kind, payload in unit.planner.events.watch(active=context.is_active):
            if kind == "decision":
                yield planner_pb2.PlannerEvent(decision=self._decision(payload))
            else:
                plan: RoutingPlan = payload["plan"]
                info = convert.version_info_pb(plan, payload["digest"], payload["current"])
                yield planner_pb2.PlannerEvent(installed=info)

    def ListDecisions(
        self, request: planner_pb2.ListDecisionsRequest, context: grpc.ServicerContext
    ) -> planner_pb2.ListDecisionsResponse:
        unit = self._unit(request)
        limit = _check_limit(request.limit)
        decisions = list(unit.planner.decisions)[-limit:]
        return planner_pb2.ListDecisionsResponse(
            decisions=[self._decision(d) for d in reversed(decisions)]
        )

    def ExplainKey(
        self, request: planner_pb2.ExplainKeyRequest, context: grpc.ServicerContext
    ) -> planner_pb2.KeyExplanation:
        unit = self._unit(request)
        if not request.key or len(request.key.encode()) > MAX_KEY_BYTES:
            raise InvalidRequest(f"key must be 1 to {MAX_KEY_BYTES} bytes")
        history = request.history or 5
        if history > 50:
            raise InvalidRequest(f"history must be at most 50, got {history}")
        e = unit.planner.explain(request.key, history)
        installed = unit.planner.current()
        return convert.explanation_pb(e, installed.plan.version if installed else None)

    def GetPlanReport(
        self, request: planner_pb2.GetPlanReportRequest, context: grpc.ServicerContext
    ) -> planner_pb2.PlanReport:
        unit = self._unit(request)
        version = _version_arg(request.version, "version", required=False)
        r = unit.planner.delivery(version)
        return convert.plan_report_pb(r)

    def ListRouters(
        self, request: Any, context: grpc.ServicerContext
    ) -> planner_pb2.ListRoutersResponse:
        unit = self._unit(request)
        current = unit.planner.current()
        routers = []
        for status in unit.publisher.router_statuses():
            routers.append(
                planner_pb2.RouterSync(status=status, state=_sync_state(status, current))
            )
        return planner_pb2.ListRoutersResponse(routers=routers)

    def ListPools(
        self, request: Any, context: grpc.ServicerContext
    ) -> planner_pb2.ListPoolsResponse:
        infos = []
        running = {u.spec.name: u for u in self._pools.units()}
        for spec in self._pools.specs:
            unit = running.get(spec.name)
            if unit is None:
                infos.append(planner_pb2.PoolInfo(
                    name=spec.name, models=list(spec.models), running=False,
                    error=self._pools.failed.get(spec.name, "not started")))
                continue
            planner = unit.planner
            installed = planner.current()
            infos.append(planner_pb2.PoolInfo(
                name=spec.name, models=list(spec.models),
                destinations=[d.id for d in planner.destinations],
                namespace=unit.publisher.layout.namespace, running=True,
                error=unit.last_error, failures=unit.failures,
                installed=convert.version_pb(installed.plan.version) if installed else None,
                mode=convert.MODE_TO_PB[planner.mode], role=planner.role))
        path, error = self._pools_file()
        return planner_pb2.ListPoolsResponse(pools=infos, unclaimed_keys=self._pools.unclaimed_keys,
                                             stranded_keys=self._pools.stranded_keys,
                                             pools_file=path, pools_file_error=error)

    # --- mutations (the auth interceptor requires the operator role) ----------------

    def Replan(
        self, request: planner_pb2.ReplanRequest, context: grpc.ServicerContext
    ) -> planner_pb2.ReplanResponse:
        unit = self._unit(request)
        result = unit.planner.replan(
            fresh=request.fresh,
            force=request.force,
            dry_run=request.dry_run,
            request_id=request.request_id,
        )
        current = result.installed
        return planner_pb2.ReplanResponse(
            candidate=convert.version_info_pb(
                current.plan if current else result.candidate,
                current.digest if current else b"",
                current is not None,
            ),
            diff=convert.diff_pb(result.diff) if result.diff is not None else None,
            penalties=convert.penalties_pb(result.figures, unit.planner.loop.accumulated),
            installed=current is not None,
            decision=self._decision(result.decision) if result.decision else None,
        )

    def Rollback(
        self, request: planner_pb2.RollbackRequest, context: grpc.ServicerContext
    ) -> planner_pb2.RollbackResponse:
        unit = self._unit(request)
        if request.release:
            unit.planner.release_pin()
            return planner_pb2.RollbackResponse(pinned=False)
        version = _version_arg(request.version, "version", required=True)
        assert version is not None
        installed = unit.planner.rollback(version, request_id=request.request_id)
        return planner_pb2.RollbackResponse(
            installed=convert.version_info_pb(installed.plan, installed.digest, True), pinned=True
        )

    def SetMode(
        self, request: planner_pb2.SetModeRequest, context: grpc.ServicerContext
    ) -> planner_pb2.SetModeResponse:
        unit = self._unit(request)
        if request.mode not in (
            planner_pb2.PLANNED,
            planner_pb2.FALLBACK,
            planner_pb2.MODE_UNSPECIFIED,
        ):
            raise InvalidRequest(f"unknown mode {request.mode}")
        if len(request.reason) > 1000:
            raise InvalidRequest("reason must be at most 1000 characters")
        mode = convert.MODE_FROM_PB.get(request.mode)  # UNSPECIFIED releases the override
        new_mode = unit.planner.set_mode(mode, request.reason)
        return planner_pb2.SetModeResponse(mode=convert.MODE_TO_PB[new_mode])

    def UpdateConfig(
        self, request: planner_pb2.UpdateConfigRequest, context: grpc.ServicerContext
    ) -> planner_pb2.UpdateConfigResponse:
        unit = self._unit(request)
        tunables = _tunable_changes(request)
        add = [_destination(d) for d in request.add_destinations]
        guard = None
        if request.HasField("guard"):
            try:
                guard = convert.guard_from_pb(request.guard)
            except ValueError as exc:
                raise InvalidRequest(str(exc)) from None
        tun = unit.planner.update_config(
            tunables=tunables,
            add=add,
            drain=list(request.drain_destinations),
            remove=list(request.remove_destinations),
            request_id=request.request_id,
            guard=guard,
            weights=dict(request.set_weights),
        )
        return planner_pb2.UpdateConfigResponse(
            config=convert.config_pb(tun, unit.planner.decision_settings,
                                     unit.planner.destinations, unit.planner.guard)
        )


# Plausible ranges: outside them a value is a typo or an attack, never a configuration.
TUNABLE_RANGES = {"q_cap": (1e-3, 1e7), "interval_s": (0.1, 86_400.0)}


def _tunable_changes(request: planner_pb2.UpdateConfigRequest) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for name in ("q_cap", "interval_s"):
        if request.HasField(name):
            value = getattr(request, name)
            _check_finite_positive(name, value)
            lo, hi = TUNABLE_RANGES[name]
            if not lo <= value <= hi:
                raise InvalidRequest(f"{name} must be in [{lo:g}, {hi:g}], got {value:g}")
            changes[name] = value
    if request.HasField("byte_aware"):
        changes["byte_aware"] = request.byte_aware
    if request.HasField("learn_warm_slots"):
        changes["learn_warm_slots"] = request.learn_warm_slots
    if request.HasField("learn_q_cap"):
        changes["learn_q_cap"] = request.learn_q_cap
    if request.HasField("hashed_tail"):
        changes["hashed_tail"] = request.hashed_tail
    if request.HasField("warm_placement"):
        changes["warm_placement"] = request.warm_placement
    if request.HasField("rate_noise_z"):
        if not (math.isfinite(request.rate_noise_z) and 0.0 <= request.rate_noise_z <= 10.0):
            raise InvalidRequest(f"rate_noise_z must be in [0, 10], got {request.rate_noise_z}")
        changes["rate_noise_z"] = request.rate_noise_z
    if request.HasField("replica_hysteresis"):
        if not (math.isfinite(request.replica_hysteresis)
                and 0.0 <= request.replica_hysteresis <= 0.99):
            raise InvalidRequest(f"replica_hysteresis must be in [0, 0.99], got "
                                 f"{request.replica_hysteresis}")
        changes["replica_hysteresis"] = request.replica_hysteresis
    if request.HasField("balance_effort"):
        if not 0.0 <= request.balance_effort <= 1.0:
            raise InvalidRequest(f"balance_effort must be in [0, 1], got {request.balance_effort}")
        changes["balance_effort"] = request.balance_effort
    for name in ("hysteresis", "min_dwell_s", "imbalance_tolerance", "admission_hysteresis"):
        if request.HasField(name):
            value = getattr(request, name)
            if not (math.isfinite(value) and value >= 0):
                raise InvalidRequest(f"{name} must be >= 0, got {value}")
            changes[name] = value
    if request.HasField("warm_slots_per_destination"):
        if not 1 <= request.warm_slots_per_destination <= 1_000_000:
            raise InvalidRequest("warm_slots_per_destination must be in [1, 1000000]")
        changes["warm_slots_per_destination"] = request.warm_slots_per_destination
    return changes


def _destination(pb: plan_pb2.Destination) -> DestinationSpec:
    if not pb.id or len(pb.id) > 256 or "\0" in pb.id:
        raise InvalidRequest("destination id must be 1-256 characters without NUL")
    weight = pb.capacity_weight or 1.0
    _check_finite_positive("capacity_weight", weight)
    return DestinationSpec(pb.id, pb.address, weight, pb.draining)


def _sync_state(status: plan_pb2.RouterStatus, current: Any) -> str:
    if (
        status.last_rejection
        and current is not None
        and (convert.version_from(status.last_rejected) == current.plan.version)
    ):
        return "rejected"
    if current is not None and convert.version_from(status.applied) == current.plan.version:
        return "in_sync"
    return "stale"
