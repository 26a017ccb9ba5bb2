"""Protobuf <-> core conversions for the gRPC edge. Nothing here decides anything."""

from __future__ import annotations

import math
from typing import Any

from cacheroute.v1 import plan_pb2, planner_pb2
from planner_svc.control.decision import Decision, DecisionSettings
from planner_svc.control.delivery import DeliveryReport
from planner_svc.control.guard import DEFAULT_GAIN_LOW_WINDOWS, GuardSettings, Mode, ValidatedRange
from planner_svc.control.loop import Figures
from planner_svc.control.saturation import Saturation
from planner_svc.orchestration.planner import Guard, Tunables
from planner_svc.planning import PlanDiff
from planner_svc.planning.explain import KeyExplanation
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


def guard_pb(g: Guard) -> planner_pb2.GuardConfig:
    v, s = g.validated, g.settings
    return planner_pb2.GuardConfig(
        active_keys_min=v.active_keys_min, active_keys_max=v.active_keys_max or 0,
        p99_ms_max=v.p99_ms_max or 0.0, hit_rate_min=v.hit_rate_min or 0.0,
        hit_gap_max=v.hit_gap_max or 0.0, affinity_gain_min=v.affinity_gain_min or 0.0,
        enter_after_s=s.enter_after_s, resume_dwell_s=s.resume_dwell_s,
        min_fallback_s=s.min_fallback_s, p99_resume_margin=s.p99_resume_margin,
        # 0 stands for the default (as a client that never set it sends it): a config read
        # back compares equal to the one written
        gain_low_windows=(0 if s.gain_low_windows == DEFAULT_GAIN_LOW_WINDOWS
                          else s.gain_low_windows))


def guard_from_pb(pb: planner_pb2.GuardConfig) -> Guard:
    """ValueError (with the field's name) for a value no guard can use."""
    for name in ("p99_ms_max", "hit_rate_min", "hit_gap_max", "affinity_gain_min",
                 "enter_after_s", "resume_dwell_s", "min_fallback_s", "p99_resume_margin"):
        value = getattr(pb, name)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"guard {name} must be a finite number >= 0, got {value}")
    for name in ("hit_rate_min", "hit_gap_max", "affinity_gain_min"):
        if getattr(pb, name) > 1:
            raise ValueError(f"guard {name} must be in [0, 1], got {getattr(pb, name)}")
    if pb.active_keys_max and pb.active_keys_max < pb.active_keys_min:
        raise ValueError("guard active_keys_max must be 0 (unchecked) or >= active_keys_min")
    validated = ValidatedRange(
        active_keys_min=pb.active_keys_min, active_keys_max=pb.active_keys_max or None,
        p99_ms_max=pb.p99_ms_max or None, hit_rate_min=pb.hit_rate_min or None,
        hit_gap_max=pb.hit_gap_max or None, affinity_gain_min=pb.affinity_gain_min or None)
    settings = GuardSettings(enter_after_s=pb.enter_after_s, resume_dwell_s=pb.resume_dwell_s,
                             min_fallback_s=pb.min_fallback_s,
                             p99_resume_margin=pb.p99_resume_margin,
                             gain_low_windows=pb.gain_low_windows or DEFAULT_GAIN_LOW_WINDOWS)
    return Guard(validated, settings)


def config_pb(t: Tunables, decision: DecisionSettings, destinations: list[Any],
              guard: Guard) -> planner_pb2.PlannerConfig:
    return planner_pb2.PlannerConfig(
        guard=guard_pb(guard),
        q_cap=t.q_cap,
        warm_slots_per_destination=t.warm_slots_per_destination,
        interval_s=t.interval_s,
        hysteresis=decision.hysteresis,
        min_dwell_s=decision.min_dwell_s,
        imbalance_tolerance=t.imbalance_tolerance,
        max_plan_age_s=t.max_plan_age_s,
        byte_aware=t.byte_aware,
        admission_hysteresis=t.admission_hysteresis,
        balance_effort=t.balance_effort,
        rate_noise_z=t.rate_noise_z,
        learn_warm_slots=t.learn_warm_slots,
        learn_q_cap=t.learn_q_cap,
        hashed_tail=t.hashed_tail,
        replica_hysteresis=t.replica_hysteresis,
        warm_placement=t.warm_placement,
        destinations=destinations_to_pb(destinations),
    )


def explanation_pb(e: KeyExplanation, version: Version | None) -> planner_pb2.KeyExplanation:
    return planner_pb2.KeyExplanation(
        key=e.key, seen=e.seen, rate_per_s=e.rate_per_s, rank=e.rank,
        keys_with_traffic=e.keys_with_traffic, replicas=e.replicas, replicas_why=e.replicas_why,
        admitted=e.admitted, reason=e.reason, destinations=list(e.destinations),
        destination_loads_per_s=list(e.destination_loads_per_s),
        planned_rate_per_s=e.planned_rate_per_s, cutoff_rate_per_s=e.cutoff_rate_per_s,
        slots_used=e.slots_used, slots=e.slots,
        admitted_next=e.next_destinations is not None,
        next_destinations=list(e.next_destinations or ()),
        history=[planner_pb2.KeyPlacement(version=v, destinations=list(d)) for v, d in e.history],
        version=version_pb(version) if version is not None else None,
    )


def plan_report_pb(r: DeliveryReport) -> planner_pb2.PlanReport:
    pb = planner_pb2.PlanReport(
        version=version_pb(Version.parse(r.version)), windows=r.windows,
        dip_windows=r.dip_windows, predicted_imbalance=r.predicted.imbalance,
        destinations=list(r.predicted.destinations),
        predicted_loads_per_s=list(r.predicted.loads_per_s), loads_per_s=list(r.loads_per_s),
        q_cap=r.predicted.q_cap, predicted_utilisation=list(r.predicted.utilisation),
        utilisation=list(r.utilisation), p99_ms=list(r.p99_ms),
        capacity_verdict=r.capacity.verdict.value, capacity_reason=r.capacity.reason)
    for name, value in (("predicted_hit_rate", r.predicted.hit_rate), ("hit_rate", r.hit_rate),
                        ("hit_gap", r.hit_gap), ("imbalance", r.imbalance),
                        ("hit_rate_since_install", r.hit_rate_since_install),
                        ("p99_target_ms", r.capacity.p99_target_ms)):
        if value is not None:
            setattr(pb, name, value)
    return pb


def saturated_pb(destination: str, record: Saturation, configured: float,
                 planned: float) -> planner_pb2.SaturatedDestination:
    pb = planner_pb2.SaturatedDestination(
        destination=destination, reason=record.reason, since_ms=record.since_ms or 0,
        clear_since_ms=record.clear_since_ms or 0, derated=record.derated,
        configured_weight=configured, planned_weight=planned)
    if record.knee_per_s is not None:
        pb.knee_per_s = record.knee_per_s
    return pb
