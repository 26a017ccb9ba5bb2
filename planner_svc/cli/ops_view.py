"""What the operator commands print: planner replies as plain dicts, and dicts as text (pure).

Every command builds one JSON-safe dict from the planner's reply (`--json` prints it as
is) and renders the same dict for people, so scripts and eyes read the same figures.
Versions are strings `"EPOCH.SEQ"`; times are seconds; rates are requests/s; penalties
are lost prefill tokens (rates: tokens/s). No I/O, no gRPC: protobuf messages in, text out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner_svc.api.convert import MODE_TO_PB
from planner_svc.planning.stats import imbalance
from router_client.plan import RoutingPlan

# The planner's modes by their wire value; "auto" (unspecified) clears an operator's override.
MODE_NAMES = {0: "auto", **{int(pb): mode.value for mode, pb in MODE_TO_PB.items()}}
BAR_WIDTH = 40
_RANGE = {"active_keys_max", "p99_ms_max", "hit_rate_min", "hit_gap_max",
          "affinity_gain_min"}  # 0 = not checked
_EIGHTHS = " ▏▎▍▌▋▊▉"


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    right: bool = False  # numbers align right


@dataclass(frozen=True, slots=True)
class TextTable:
    """Rows of cells, rendered as a table on a terminal and as aligned text elsewhere."""

    columns: tuple[Column, ...]
    rows: tuple[tuple[str, ...], ...]


def plain_table(table: TextTable) -> str:
    """Aligned columns, two spaces apart, no trailing blanks."""
    cells = [tuple(c.name for c in table.columns), *table.rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(table.columns))]
    return "\n".join(
        "  ".join(cell.rjust(w) if col.right else cell.ljust(w)
                  for cell, w, col in zip(row, widths, table.columns, strict=True)).rstrip()
        for row in cells)


def version_text(pb: Any) -> str | None:
    """`PlanVersion` -> "1.3", or None when unset (nothing installed)."""
    return f"{pb.epoch}.{pb.seq}" if pb.seq or pb.epoch else None


# --- replies as dicts ---------------------------------------------------------------


def drift_dict(pb: Any) -> dict[str, float]:
    return {
        "total_variation": pb.total_variation,
        "admission_churn_share": pb.admission_churn_share,
        "imbalance_change": pb.imbalance_change,
    }


def penalties_dict(pb: Any) -> dict[str, Any]:
    rate = pb.staleness_rate_measured if pb.measured_used else pb.staleness_rate_modelled
    return {
        "staleness_rate_modelled_tokens_per_s": pb.staleness_rate_modelled,
        "staleness_rate_measured_tokens_per_s": pb.staleness_rate_measured
        if pb.measured_used
        else None,
        "staleness_rate_tokens_per_s": rate,
        "staleness_accumulated_tokens": pb.staleness_accumulated,
        "rewarm_cost_tokens": pb.rewarm_cost,
        "staleness_over_rewarm": pb.staleness_accumulated / pb.rewarm_cost
        if pb.rewarm_cost > 0
        else None,
        "measured_used": pb.measured_used,
    }


def decision_dict(pb: Any) -> dict[str, Any]:
    return {
        "id": pb.id,
        "at_ms": pb.at_ms,
        "action": pb.action,
        "reason": pb.reason,
        "moved_traffic_share": pb.moved_traffic_share,
        "drift": drift_dict(pb.drift),
        "penalties": penalties_dict(pb.penalties),
        "installed": version_text(pb.installed),
    }


def version_info_dict(pb: Any) -> dict[str, Any]:
    return {
        "version": version_text(pb.version),
        "created_at_ms": pb.created_at_ms,
        "admitted_keys": pb.admitted_keys,
        "imbalance_max_over_mean": pb.imbalance_max_over_mean,
        "built_by": pb.built_by,
        "current": pb.current,
        "digest": pb.digest.hex(),
    }


def diff_dict(pb: Any) -> dict[str, Any]:
    return {
        "added_keys": pb.added_keys,
        "removed_keys": pb.removed_keys,
        "moved_keys": pb.moved_keys,
        "moved_key_share": pb.moved_key_share,
        "moved_traffic_share": pb.moved_traffic_share,
        "load_change_per_s": dict(zip(pb.destinations, pb.load_change_per_s, strict=False)),
    }


def config_dict(pb: Any) -> dict[str, Any]:
    return {
        "q_cap": pb.q_cap,
        "warm_slots_per_destination": pb.warm_slots_per_destination,
        "interval_s": pb.interval_s,
        "hysteresis": pb.hysteresis,
        "min_dwell_s": pb.min_dwell_s,
        "imbalance_tolerance": pb.imbalance_tolerance,
        "max_plan_age_s": pb.max_plan_age_s,
        "byte_aware": pb.byte_aware,
        "admission_hysteresis": pb.admission_hysteresis,
        "balance_effort": pb.balance_effort,
        "rate_noise_z": pb.rate_noise_z,
        "learn_warm_slots": pb.learn_warm_slots,
        "learn_q_cap": pb.learn_q_cap,
        "hashed_tail": pb.hashed_tail,
        "replica_hysteresis": pb.replica_hysteresis,
        "warm_placement": pb.warm_placement,
        "guard": {name: getattr(pb.guard, name) for name in (
            "active_keys_min", "active_keys_max", "p99_ms_max", "hit_rate_min",
            "hit_gap_max", "affinity_gain_min", "enter_after_s", "resume_dwell_s", "min_fallback_s",
            "p99_resume_margin", "gain_low_windows")},
        "destinations": [
            {
                "id": d.id,
                "address": d.address,
                "capacity_weight": d.capacity_weight,
                "draining": d.draining,
            }
            for d in pb.destinations
        ],
    }


def status_dict(pb: Any, planner: str) -> dict[str, Any]:
    """`PlannerStatus` -> dict; `stream_fresh` means the newest window is within 2 intervals."""
    rates_age = pb.rates_age_s if pb.rates_age_s >= 0 else None
    interval = pb.config.interval_s or 0.0
    return {
        "planner": planner,
        "mode": MODE_NAMES.get(pb.mode, str(pb.mode)),
        "mode_reason": pb.mode_reason,
        "pinned": pb.pinned,
        "role": pb.role or "single",
        "leader_id": pb.leader_id,
        "engines": [engine_dict(e) for e in pb.engines],
        "q_cap": {"configured": pb.config.q_cap, "in_use": pb.q_cap_in_use or pb.config.q_cap,
                  "learning": pb.config.learn_q_cap,
                  "measured": pb.measured_q_cap if pb.HasField("measured_q_cap") else None,
                  "source": pb.measured_q_cap_source,
                  "destinations": pb.measured_q_cap_destinations,
                  "slo_bound": (pb.measured_q_cap_slo_bound
                                if pb.HasField("measured_q_cap_slo_bound") else None)},
        "saturated": [{"destination": x.destination, "reason": x.reason,
                       "since_ms": x.since_ms or None,
                       "clear_since_ms": x.clear_since_ms or None, "derated": x.derated,
                       "knee_per_s": x.knee_per_s if x.HasField("knee_per_s") else None,
                       "configured_weight": x.configured_weight,
                       "planned_weight": x.planned_weight} for x in pb.saturated],
        "warm_slots": {"configured": pb.config.warm_slots_per_destination,
                       "measured": (pb.measured_warm_slots
                                    if pb.HasField("measured_warm_slots") else None),
                       "measured_destinations": pb.measured_warm_slots_destinations,
                       "mean_prefix_tokens": pb.measured_mean_prefix_tokens},
        "version": version_text(pb.installed),
        "version_age_s": pb.installed_age_s if pb.HasField("installed") else None,
        "drift": drift_dict(pb.drift),
        "penalties": penalties_dict(pb.penalties),
        "last_decision": decision_dict(pb.last_decision) if pb.HasField("last_decision") else None,
        "rates_age_s": rates_age,
        "rates_recovering": pb.rates_recovering,
        "stream_fresh": rates_age is not None and rates_age <= 2 * interval,
        "config": config_dict(pb.config),
    }


def plan_dict(plan: RoutingPlan, loads: np.ndarray, top: int) -> dict[str, Any]:
    """A decoded plan: per-destination expected load and key counts, and the hottest keys."""
    ids = plan.destination_ids
    table = plan.table
    keys_on = np.bincount(table.members.astype(np.int64), minlength=len(ids))
    live = np.array([not d.draining for d in plan.destinations], bool)
    weights = np.array([d.capacity_weight for d in plan.destinations], np.float64)
    if not live.any():
        live[:] = True
    order = np.argsort(-np.asarray(table.rates, np.float64), kind="stable")[:top]
    return {
        "version": str(plan.version),
        "built_by": plan.config.built_by,
        "created_at_ms": plan.created_at_ms,
        "rates_window_end_ms": plan.rates_window_end_ms,
        "q_cap": plan.config.q_cap,
        "warm_slots": plan.config.warm_slots,
        "admitted_keys": len(table),
        "admitted_rate_share": plan.stats.admitted_rate_share,
        "cold_tail_rate_per_s": plan.stats.cold_tail_rate_per_s,
        # the one definition (planning.stats): max(load/w) / (Σ load / Σ w), live destinations
        "imbalance_max_over_mean": imbalance(np.asarray(loads, np.float64)[live],
                                             weights[live]) if len(loads) else 1.0,
        "destinations": [
            {
                "id": d.id,
                "draining": d.draining,
                "expected_load_per_s": float(loads[i]),
                "admitted_keys": int(keys_on[i]),
            }
            for i, d in enumerate(plan.destinations)
        ],
        "top_keys": [
            {
                "key": table.keys[i],
                "rate_per_s": float(table.rates[i]),
                "destinations": [ids[m] for m in table.set_of(int(i))],
            }
            for i in order
        ],
    }


# --- dicts as text --------------------------------------------------------------------


def _num(x: float | None, unit: str = "", digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{digits}g}{unit}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def age_text(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def bar(value: float, scale: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of `value / scale` of `width` cells, in eighths of a cell."""
    if scale <= 0 or value <= 0:
        return ""
    eighths = round(min(1.0, value / scale) * width * 8)
    full, part = divmod(eighths, 8)
    return "█" * full + (_EIGHTHS[part] if part else "")


def render_penalties(p: Mapping[str, Any]) -> str:
    source = "measured" if p["measured_used"] else "modelled"
    ratio = p["staleness_over_rewarm"]
    return (
        f"staleness {_num(p['staleness_accumulated_tokens'])} tok "
        f"(rate {_num(p['staleness_rate_tokens_per_s'])} tok/s, {source}) "
        f"vs rewarm {_num(p['rewarm_cost_tokens'])} tok"
        + (f" = {_pct(ratio)} of rewarm" if ratio is not None else "")
    )


def render_drift(d: Mapping[str, float]) -> str:
    return (
        f"TV {d['total_variation']:.3f}, admission churn {_pct(d['admission_churn_share'])}, "
        f"imbalance change {d['imbalance_change']:+.3f}"
    )


def render_decision(d: Mapping[str, Any], now_ms: int | None = None) -> str:
    when = f" {age_text((now_ms - d['at_ms']) / 1000)} ago" if now_ms else ""
    installed = f" -> {d['installed']}" if d.get("installed") else ""
    moved = d["moved_traffic_share"]
    verb = "moved" if d["action"] == "install" else "candidate would move"
    churn = f", {verb} {_pct(moved)} of traffic" if moved else ""
    return f"#{d['id']} {d['action']}{installed}{when}{churn}: {d['reason']}"


def engine_dict(e: Any) -> dict[str, Any]:
    """An `EngineSignals` message -> dict (absent optional figures are None)."""
    def opt(name: str) -> Any:
        return getattr(e, name) if e.HasField(name) else None
    out: dict[str, Any] = {"destination": e.destination, "observed_at_ms": e.observed_at_ms,
                           "engine": e.engine}
    if e.kv_events:
        out["kv_events"] = {"blocks_resident": e.blocks_resident, "block_size": e.block_size,
                            "stored_per_s": e.blocks_stored_per_s,
                            "removed_per_s": e.blocks_removed_per_s,
                            "residency_s": opt("residency_s"), "gaps": e.kv_gaps,
                            "resyncs": e.kv_resyncs, "garbage": e.kv_garbage}
    if e.metrics:
        out["metrics"] = {"running": e.running, "waiting": e.waiting,
                          "kv_usage": opt("kv_usage"), "prefix_hit_rate": opt("prefix_hit_rate"),
                          "ttft_p50_s": opt("ttft_p50_s"), "ttft_p99_s": opt("ttft_p99_s"),
                          "preemptions_per_s": opt("preemptions_per_s")}
    if e.metrics_error:
        out["metrics_error"] = e.metrics_error
    return out


def render_engine(e: Mapping[str, Any], now_ms: int) -> str:
    age = max(0.0, (now_ms - e["observed_at_ms"]) / 1000)
    parts = []
    m = e.get("metrics")
    if m:
        line = f"running {m['running']:g}, waiting {m['waiting']:g}"
        if m["kv_usage"] is not None:
            line += f", KV {_pct(m['kv_usage'])}"
        if m["prefix_hit_rate"] is not None:
            line += f", prefix hit {_pct(m['prefix_hit_rate'])}"
        if m["ttft_p99_s"] is not None:
            line += f", TTFT p99 <= {m['ttft_p99_s']:g} s"
        parts.append(line + " (/metrics)")
    if e.get("metrics_error"):
        parts.append(f"metrics failing: {e['metrics_error']}")
    kv = e.get("kv_events")
    if kv:
        line = f"{kv['blocks_resident']:,} blocks resident"
        if kv["residency_s"] is not None:
            line += f", a block stays {kv['residency_s']:.1f} s"
        if kv["resyncs"]:
            line += f", {kv['resyncs']} resyncs"
        parts.append(line + " (KV events)")
    kind = f"{e['engine']}, " if e["engine"] else ""
    return f"{e['destination']} ({kind}{age:.1f} s ago): " + "; ".join(parts)


def render_q_cap(q: Mapping[str, Any]) -> str:
    """The configured q_cap, what the engines measured and what plans use."""
    how = {"knee": "the median capacity of {n} saturated destination(s)",
           "slo": "the median load at which {n} destination(s) kept breaking the TTFT target"
           }.get(q["source"], "the most {n} unsaturated destination(s) carried: a lower bound")
    line = (f"configured {q['configured']:g}/s; measured {q['measured']:.3g}/s per unit of "
            f"weight, {how.format(n=q['destinations'])}")
    bound = q.get("slo_bound")
    if bound is not None and q["source"] != "slo":
        line += f"; at most {bound:.3g}/s (loads that kept breaking the TTFT target)"
    if q["learning"]:
        line += f"; planning with {q['in_use']:.3g}/s (within [q/2, 2q])"
    return line


def render_saturated(x: Mapping[str, Any], now_ms: int) -> str:
    """One saturated destination: why, since when, and the weight it is planned with."""
    if x["since_ms"] is not None:
        state = f"saturated for {age_text(max(0.0, (now_ms - x['since_ms']) / 1000))}"
    else:
        state = f"clear for {age_text(max(0.0, (now_ms - x['clear_since_ms']) / 1000))}"
    line = f"{x['destination']}: {state} ({x['reason']})"
    if not x["derated"]:
        return line + "; planned as configured until it stays saturated"
    knee = (f", measured capacity {x['knee_per_s']:.3g} req/s"
            if x["knee_per_s"] is not None else "")
    return (line + f"; planned at weight {x['planned_weight']:.2g} of "
            f"{x['configured_weight']:.2g}{knee}")


def render_status(s: Mapping[str, Any], now_ms: int) -> str:
    mode = s["mode"] + (f" ({s['mode_reason']})" if s["mode_reason"] else "")
    plan = "none installed"
    if s["version"]:
        plan = f"{s['version']}, age {age_text(s['version_age_s'])}"
        plan += ", pinned by rollback" if s["pinned"] else ""
    last = s["last_decision"]
    stream = "no complete window yet"
    if s["rates_age_s"] is not None:
        stream = f"newest window {age_text(s['rates_age_s'])} old, "
        stream += "fresh" if s["stream_fresh"] else "STALE"
        stream += ", recovering" if s["rates_recovering"] else ""
    planner = s["planner"]
    if s.get("role") == "leader":
        planner += f" (leader {s['leader_id']})"
    elif s.get("role") == "standby":
        planner += f" (standby; leader: {s['leader_id'] or 'none yet'})"
    rows = [
        ("planner", planner),
        ("mode", mode),
        ("plan", plan),
        ("drift", render_drift(s["drift"])),
        ("penalties", render_penalties(s["penalties"])),
        ("decision", render_decision(last, now_ms) if last else "none yet"),
        ("stream", stream),
    ]
    w = s.get("warm_slots")
    if w and w["measured"] is not None:
        rows.append(("W", f"configured {w['configured']}; measured {w['measured']:.0f} from "
                          f"the KV events of {w['measured_destinations']} destination(s) "
                          f"(mean reusable prefix {w['mean_prefix_tokens']:.0f} tokens)"))
    q = s.get("q_cap")
    if q and q["measured"] is not None:
        rows.append(("q_cap", render_q_cap(q)))
    for i, e in enumerate(s.get("engines", [])):
        rows.append(("engines" if i == 0 else "", render_engine(e, now_ms)))
    for i, x in enumerate(s.get("saturated", [])):
        rows.append(("saturated" if i == 0 else "", render_saturated(x, now_ms)))
    return "\n".join(f"{k:<10} {v}" for k, v in rows)


def render_plan(p: Mapping[str, Any]) -> str:
    dests = p["destinations"]
    scale = max((d["expected_load_per_s"] for d in dests), default=0.0)
    width = max((len(d["id"]) for d in dests), default=4)
    lines = [
        f"plan {p['version']} ({p['built_by']}): {p['admitted_keys']} admitted keys carrying "
        f"{_pct(p['admitted_rate_share'])} of traffic, cold tail "
        f"{_num(p['cold_tail_rate_per_s'], '/s')}, q_cap {_num(p['q_cap'])}, "
        f"{p['warm_slots']} warm slots",
        f"imbalance (max/mean expected load) {p['imbalance_max_over_mean']:.3f}",
        "",
        f"{'destination':<{width}}  {'expected req/s':>14}  {'keys':>6}",
    ]
    for d in dests:
        flag = "  (draining)" if d["draining"] else ""
        lines.append(
            f"{d['id']:<{width}}  {d['expected_load_per_s']:>14.2f}  {d['admitted_keys']:>6}  "
            f"{bar(d['expected_load_per_s'], scale)}{flag}"
        )
    if p["top_keys"]:
        lines += ["", "hottest admitted keys:"]
        lines += [
            f"  {k['key']}  {k['rate_per_s']:.2f}/s -> {', '.join(k['destinations'])}"
            for k in p["top_keys"]
        ]
    return "\n".join(lines)


def render_versions(versions: Sequence[Mapping[str, Any]], now_ms: int) -> TextTable:
    rows = []
    for v in versions:
        age = age_text((now_ms - v["created_at_ms"]) / 1000) if v["created_at_ms"] else "?"
        current = "*" if v["current"] else " "  # the installed one
        rows.append((f"{current} {v['version']}", age, str(v["admitted_keys"]),
                     f"{v['imbalance_max_over_mean']:.3f}", v["built_by"]))
    return TextTable((Column("  version"), Column("age", True),
                      Column("keys", True), Column("imbalance", True), Column("built by")),
                     tuple(rows))


def render_diff(d: Mapping[str, Any], a: str, b: str) -> str:
    lines = [
        f"{a} -> {b}: {d['added_keys']} keys added, {d['removed_keys']} removed, "
        f"{d['moved_keys']} moved ({_pct(d['moved_key_share'])} of keys, "
        f"{_pct(d['moved_traffic_share'])} of admitted traffic)",
    ]
    changes = d["load_change_per_s"]
    width = max((len(k) for k in changes), default=4)
    lines += [f"  {k:<{width}}  {v:+.2f} req/s expected load" for k, v in changes.items()]
    return "\n".join(lines)


def render_config(c: Mapping[str, Any]) -> str:
    lines = [f"{k:<27} {str(v).lower() if isinstance(v, bool) else format(v, 'g')}"
             for k, v in c.items() if k not in ("destinations", "guard")]
    lines += [f"{'guard.' + k:<27} {v:g}" + ("  (unchecked)" if k in _RANGE and not v else "")
              for k, v in c.get("guard", {}).items()]
    lines.append(f"{'destinations':<27} {len(c['destinations'])}")
    return "\n".join(lines)


def render_destinations(dests: Sequence[Mapping[str, Any]]) -> TextTable:
    rows = tuple((d["id"], f"{d['capacity_weight']:g}", d["address"] or "-",
                  "draining" if d["draining"] else "serving") for d in dests)
    return TextTable((Column("destination"), Column("weight", True), Column("address"),
                      Column("state")), rows)


def render_replan(r: Mapping[str, Any]) -> str:
    cand = r["candidate"]
    if r["dry_run"]:
        head = f"dry run: candidate of {cand['admitted_keys']} keys, not installed"
    elif r["installed"]:
        head = f"installed plan {cand['version']} ({cand['built_by']}, "
        head += f"{cand['admitted_keys']} keys)"
    else:
        head = "not installed"
    lines = [head, "penalties: " + render_penalties(r["penalties"])]
    if r["diff"] is not None:
        d = r["diff"]
        lines.append(
            # (the control loop's "would move" share counts the entering and leaving keys'
            # traffic too: a new user read the two figures as contradicting each other)
            f"vs serving plan: {d['added_keys']} keys enter admission, {d['removed_keys']} "
            f"leave; of the keys in both, {d['moved_keys']} change destinations "
            f"({_pct(d['moved_traffic_share'])} of the candidate's admitted traffic)"
        )
    if r["decision"] is not None:
        lines.append("decision: " + render_decision(r["decision"]))
    return "\n".join(lines)


def render_event(e: Mapping[str, Any]) -> str:
    """One line of `watch`."""
    if e["event"] == "installed":
        v = e["installed"]
        return (
            f"installed {v['version']} ({v['built_by']}, {v['admitted_keys']} keys, "
            f"imbalance {v['imbalance_max_over_mean']:.3f})"
        )
    d = e["decision"]
    return f"decision {render_decision(d)} | {render_penalties(d['penalties'])}"


def router_dict(sync: Any, newest: Any | None) -> dict[str, Any]:
    """One router of `ListRouters`, with how many versions it is behind the planner's."""
    st = sync.status
    applied = f"{st.applied.epoch}.{st.applied.seq}" if st.applied.seq or st.applied.epoch else ""
    behind = None
    if newest is not None and applied:
        behind = (newest.seq - st.applied.seq if newest.epoch == st.applied.epoch else None)
    rejected = (f"{st.last_rejected.epoch}.{st.last_rejected.seq}"
                if st.last_rejected.seq or st.last_rejected.epoch else "")
    return {
        "router_id": st.router_id,
        "state": sync.state,  # in_sync | stale | rejected
        "applied": applied,
        "versions_behind": behind,
        "mode": st.mode,
        "applied_at_ms": st.applied_at_ms,
        "reported_at_ms": st.reported_at_ms,
        "last_rejected": rejected,
        "last_rejection": st.last_rejection,
        "unhealthy_destinations": list(st.unhealthy_destinations),
        "decisions_planned": st.decisions_planned,
        "decisions_fallback": st.decisions_fallback,
    }


def render_routers(routers: Sequence[Mapping[str, Any]], now_ms: int) -> TextTable:
    rows = []
    for r in routers:
        behind = "?" if r["versions_behind"] is None else str(r["versions_behind"])
        age = f"{max(0, now_ms - r['reported_at_ms']) / 1000:.0f} s ago" if r["reported_at_ms"] \
            else "never"
        notes = []
        if r["last_rejected"]:
            notes.append(f"rejected {r['last_rejected']}: {r['last_rejection']}")
        if r["unhealthy_destinations"]:
            notes.append("unhealthy: " + ", ".join(r["unhealthy_destinations"]))
        rows.append((r["router_id"], r["state"], r["applied"] or "-", behind, r["mode"] or "-",
                     age, "; ".join(notes)))
    return TextTable((Column("router"), Column("state"), Column("applied", True),
                      Column("behind", True), Column("mode"), Column("reported", True),
                      Column("notes")), tuple(rows))


def pools_dict(pb: Any) -> dict[str, Any]:
    pools = [{
        "name": p.name, "models": list(p.models), "destinations": list(p.destinations),
        "namespace": p.namespace, "running": p.running, "error": p.error,
        "failures": p.failures, "role": p.role,
        "installed": version_text(p.installed) if p.HasField("installed") else None,
        "mode": MODE_NAMES.get(p.mode, "?") if p.running else None,
    } for p in pb.pools]
    return {"pools": pools, "unclaimed_keys": pb.unclaimed_keys,
            "stranded_keys": pb.stranded_keys, "pools_file": pb.pools_file,
            "pools_file_error": pb.pools_file_error}


def render_pools(data: Mapping[str, Any]) -> list[str | TextTable]:
    rows = []
    for p in data["pools"]:
        state = (p["mode"] or "?") if p["running"] else "not running"
        rows.append((p["name"], ", ".join(p["models"]), str(len(p["destinations"])),
                     p["installed"] or "-", state, str(p["failures"]), p["namespace"] or "-",
                     p["error"]))
    parts: list[str | TextTable] = [TextTable(
        (Column("pool"), Column("models"), Column("destinations", True),
         Column("installed", True), Column("state"), Column("failures", True),
         Column("namespace"), Column("error")), tuple(rows))]
    source = data["pools_file"] or "flags (one pool)"
    parts.append(f"pools from {source}; window keys no pool claims: {data['unclaimed_keys']}; "
                 f"of pools not running: {data['stranded_keys']}")
    if data["pools_file_error"]:
        parts.append(f"the pools file's last change was not applied: {data['pools_file_error']}")
    return parts


def explanation_dict(pb: Any) -> dict[str, Any]:
    return {
        "key": pb.key, "version": f"{pb.version.epoch}.{pb.version.seq}", "seen": pb.seen,
        "rate_per_s": pb.rate_per_s, "rank": pb.rank, "keys_with_traffic": pb.keys_with_traffic,
        "replicas": pb.replicas, "replicas_why": pb.replicas_why, "admitted": pb.admitted,
        "reason": pb.reason, "destinations": list(pb.destinations),
        "destination_loads_per_s": list(pb.destination_loads_per_s),
        "planned_rate_per_s": pb.planned_rate_per_s, "cutoff_rate_per_s": pb.cutoff_rate_per_s,
        "slots_used": pb.slots_used, "slots": pb.slots,
        "next_destinations": list(pb.next_destinations) if pb.admitted_next else None,
        "history": [{"version": h.version, "destinations": list(h.destinations)}
                    for h in pb.history],
    }


def render_explanation(e: Mapping[str, Any]) -> str:
    lines = [f"{e['key']} in plan {e['version']}: {e['reason']}"]
    if e["seen"]:
        ranked = (f"rank {e['rank']} of {e['keys_with_traffic']} keys with traffic"
                  if e["rank"] else f"none of the {e['keys_with_traffic']} keys with traffic")
        lines.append(f"  rate          {e['rate_per_s']:.4g} req/s ({ranked})")
        lines.append(f"  replicas      {e['replicas_why']}")
    lines.append(f"  admission     cut-off {e['cutoff_rate_per_s']:.4g} req/s; "
                 f"{e['slots_used']} of {e['slots']} slots used")
    if e["destinations"]:
        placed = ", ".join(f"{d} (load {load:.3g} req/s)" for d, load in
                           zip(e["destinations"], e["destination_loads_per_s"], strict=True))
        lines.append(f"  destinations  {placed}; planned at {e['planned_rate_per_s']:.4g} req/s")
    nxt = e["next_destinations"]
    if nxt is None:
        lines.append("  next repack   not admitted")
    else:
        same = " (unchanged)" if nxt == e["destinations"] else ""
        lines.append(f"  next repack   {', '.join(nxt)}{same}")
    for h in e["history"]:
        lines.append(f"  {h['version']:<12}  {', '.join(h['destinations']) or 'not admitted'}")
    return "\n".join(lines)


def plan_report_dict(pb: Any) -> dict[str, Any]:
    def opt(name: str) -> float | None:
        return getattr(pb, name) if pb.HasField(name) else None

    return {
        "version": f"{pb.version.epoch}.{pb.version.seq}", "windows": pb.windows,
        "dip_windows": pb.dip_windows, "predicted_hit_rate": opt("predicted_hit_rate"),
        "hit_rate": opt("hit_rate"), "hit_gap": opt("hit_gap"),
        "hit_rate_since_install": opt("hit_rate_since_install"),
        "predicted_imbalance": pb.predicted_imbalance, "imbalance": opt("imbalance"),
        "destinations": list(pb.destinations),
        "predicted_loads_per_s": list(pb.predicted_loads_per_s),
        "loads_per_s": list(pb.loads_per_s),
        "q_cap": pb.q_cap,
        "predicted_utilisation": [_finite(x) for x in pb.predicted_utilisation],
        "utilisation": [_finite(x) for x in pb.utilisation],
        "p99_ms": [_finite(x) for x in pb.p99_ms],
        "p99_target_ms": opt("p99_target_ms"),
        "capacity_verdict": pb.capacity_verdict or "unchecked",
        "capacity_reason": pb.capacity_reason,
    }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def render_plan_report(r: Mapping[str, Any]) -> str:
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.1%}"

    gap = r["hit_gap"]
    lines = [f"plan {r['version']}: {r['windows']} windows measured after the install "
             f"({r['dip_windows']} of rewarm dip not counted)",
             f"  hit rate    predicted {pct(r['predicted_hit_rate'])}  realized "
             f"{pct(r['hit_rate'])}  gap {'-' if gap is None else f'{gap * 100:+.1f} pp'}"
             f"  (since the install, dip included: {pct(r['hit_rate_since_install'])})",
             f"  imbalance   predicted {r['predicted_imbalance']:.2f}  realized "
             + ("-" if r["imbalance"] is None else f"{r['imbalance']:.2f}")]
    verdict = r.get("capacity_verdict", "unchecked")
    lines.append(f"  capacity    {verdict.replace('_', ' ')}: {r.get('capacity_reason', '')}")
    if r["loads_per_s"]:
        width = max(len(d) for d in r["destinations"])
        util = r.get("utilisation") or [None] * len(r["loads_per_s"])
        p99 = r.get("p99_ms") or [None] * len(r["loads_per_s"])
        for d, p, m, u, lat in zip(r["destinations"], r["predicted_loads_per_s"],
                                   r["loads_per_s"], util, p99, strict=True):
            lines.append(f"  {d:<{width}}  predicted {p:8.2f} req/s  realized {m:8.2f} req/s"
                         + ("" if u is None else f"  {u:5.0%} of q_cap")
                         + ("" if lat is None else f"  p99 {lat:,.0f} ms"))
    return "\n".join(lines)
