"""Protobuf <-> core conversions for the gRPC edge. Nothing here decides anything."""

from __future__ import annotations

import math
from typing import Any

from cacheroute.v1 import plan_pb2, planner_pb2
from planner_svc.control.decision import Decision
from planner_svc.control.guard import Mode
from planner_svc.control.loop import Figures
from planner_svc.orchestration.planner import Tunables
from planner_svc.planning import PlanDiff
from router_client.plan import RoutingPlan, Version, destinations_to_pb

MODE_TO_PB = {Mode.PLANNED: planner_pb2.PLANNED, Mode.FALLBACK: planner_pb2.FALLBACK}
MODE_FROM_PB = {planner_pb2.PLANNED: Mode.PLANNED, planner_pb2.FALLBACK: Mode.FALLBACK}


def version_pb(v: Version) -> plan_pb2.PlanVersion:
    return plan_pb2.PlanVersion(epoch=v.epoch, seq=v.seq)


def version_from(pb: plan_pb2.PlanVersion) -> Version:
    return Version(int(pb.epoch), int(pb.seq))


def _finite(x: float | None) -> float:
    return 0.0 if x is None or not math.isfinite(x) else float(x)


def penalties_pb(figures: Figures | None, accumulated: float) -> planner_pb2.Penalties:
    f = figures or Figures()
    return planner_pb2.Penalties(
        staleness_rate_modelled=_finite(f.staleness_rate_modelled),
        staleness_rate_measured=_finite(f.staleness_rate_measured),
        staleness_accumulated=_finite(accumulated),
        rewarm_cost=_finite(f.rewarm_cost),
        measured_used=f.measured_used,
    )


def drift_pb(d: Any) -> planner_pb2.Drift:
    return planner_pb2.Drift(
        total_variation=_finite(d.total_variation),
        admission_churn_share=_finite(d.admission_churn_share),
        imbalance_change=_finite(d.imbalance_change),
    )


def decision_pb(d: Decision) -> planner_pb2.Decision:
    p = d.penalties
    return planner_pb2.Decision(
        installed=version_pb(Version.parse(d.installed)) if d.installed else None,
        request_id=d.request_id,
        id=d.id,
        at_ms=int(d.at_s * 1000),
        action=str(d.action),
        reason=d.reason,
        drift=drift_pb(d.drift),
        penalties=planner_pb2.Penalties(
            staleness_rate_modelled=_finite(p.staleness_rate_modelled),
            staleness_rate_measured=_finite(p.staleness_rate_measured),
            staleness_accumulated=_finite(p.staleness_accumulated),
            rewarm_cost=_finite(p.rewarm_cost),
            measured_used=p.measured_used,
        ),
        moved_traffic_share=_finite(d.moved_traffic_share),
    )


def version_info_pb(plan: RoutingPlan, digest: bytes, current: bool) -> planner_pb2.PlanVersionInfo:
    return planner_pb2.PlanVersionInfo(
        version=version_pb(plan.version),
        digest=digest,
        created_at_ms=plan.created_at_ms,
        admitted_keys=len(plan.table),
        imbalance_max_over_mean=_finite(plan.stats.imbalance_max_over_mean),
        built_by=plan.config.built_by,
        current=current,
    )


def diff_pb(d: PlanDiff) -> planner_pb2.PlanDiff:
    ids = sorted(d.load_change_per_s)
    return planner_pb2.PlanDiff(
        added_keys=len(d.added),
        removed_keys=len(d.removed),
        moved_keys=len(d.moved),
        moved_key_share=_finite(d.moved_key_fraction),
        moved_traffic_share=_finite(d.moved_traffic_share),
        load_change_per_s=[_finite(d.load_change_per_s[i]) for i in ids],
        destinations=ids,
    )


def config_pb(t: Tunables, destinations: list[Any]) -> planner_pb2.PlannerConfig:
    return planner_pb2.PlannerConfig(
        q_cap=t.q_cap,
        warm_slots_per_destination=t.warm_slots_per_destination,
        interval_s=t.interval_s,
        hysteresis=t.hysteresis,
        min_dwell_s=t.min_dwell_s,
        imbalance_tolerance=t.imbalance_tolerance,
        max_plan_age_s=t.max_plan_age_s,
        destinations=destinations_to_pb(destinations),
    )
