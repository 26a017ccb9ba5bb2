"""Planner settings: built once at the entry point from flags and environment.

Every address is configuration (production users bring their own Kafka and Redis).
Environment variables are `CACHEROUTE_<FIELD>` in upper case, e.g.
`CACHEROUTE_REDIS_URL`, `CACHEROUTE_BOOTSTRAP`, `CACHEROUTE_OPERATOR_TOKEN`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any

from planner_svc.control.guard import DEFAULT_AFFINITY_GAIN_MIN, DEFAULT_GAIN_LOW_WINDOWS


@dataclass(frozen=True)
class PlannerSettings:
    bootstrap: str = "127.0.0.1:9092"
    snapshots_topic: str = "cacheroute.snapshots"
    # What a real snapshot looks like (SnapshotLimits): a part per partition of the events
    # topic, windows of the stream's length on its hop grid (0 = not checked).
    events_topic: str = "cacheroute.events"
    stream_window_s: float = 0.0
    stream_hop_s: float = 0.0
    # The stream workers' Ed25519 public keys (PEM files: each worker's
    # snapshot-signing-key.pub.pem). A snapshot part counts only when one of them signed
    # it, so with none configured every snapshot is refused (docs/security-kafka.md).
    snapshot_keys: tuple[str, ...] = ()
    state_topic: str = "cacheroute.planner-state"
    # What engines report themselves (python -m streams engines); "" = not watched.
    engine_signals_topic: str = "cacheroute.engine-signals"
    consumer_group: str = "cacheroute-planner"
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_namespace: str = "cacheroute"
    grpc_host: str = "127.0.0.1"
    grpc_port: int = 50051
    metrics_port: int = 0  # 0 = no metrics endpoint
    signing_key_path: str = ""  # Ed25519 PEM; generated next to data_dir when empty
    data_dir: str = "./var/planner"
    # Planning. Either one pool from `destinations` (and the settings below), or the pools
    # of a TOML pools file (router_client.pools), re-read when it changes.
    destinations: tuple[str, ...] = ()
    pools_file: str = ""
    q_cap: float = 50.0
    warm_slots_per_destination: int = 128
    # How far above a fresh LPT's max/mean load a plan may stay so that keys keep the
    # destinations where they are warm. 0.3, not the paper's 0.03: with one gateway in front
    # of four engines 0.03 pushed exactly the rare, warm tenants off busy engines (a cold
    # first turn each); with warm placement, 0.3 took the simulated one-replica capacity
    # from 6.50x to 7.08x and live put one replica level with the SGLang gateway up to x8
    # (docs/arena.md, "Where the one-replica gap is"); the replay at R = 30 is unchanged.
    imbalance_tolerance: float = 0.3
    rate_column: str = "rate"  # "rate" (hopping window) or "ewma"
    # Control loop.
    interval_s: float = 10.0
    hysteresis: float = 0.1
    min_dwell_s: float = 0.0
    max_plan_age_s: float = 300.0
    # Planning options (all changeable at run time with `cacheroute config set`): admit by
    # value density under a token budget (per-key reusable-prefix sizes from the telemetry);
    # favour installed keys at the admission boundary by this factor; churn vs balance.
    byte_aware: bool = False
    admission_hysteresis: float = 0.0
    # keep a hot key's installed replica count while its rate stays within this fraction of
    # the count's bounds (0 = ⌈λ/q_cap⌉ exactly); PlanningConfig.replica_hysteresis
    replica_hysteresis: float = 0.0
    balance_effort: float = 1.0
    # Hold each key's rate at the installed plan's while the window's count moved by no
    # more than this many Poisson standard errors (0 = plan on the raw window, the paper's).
    rate_noise_z: float = 0.0
    # Plan with W measured from the engines' KV events (python -m streams engines), bounded
    # to [W/2, 2W] of `warm_slots_per_destination`; the configured W while none are fresh.
    learn_warm_slots: bool = False
    # Plan with q_cap measured from the engines' /metrics (saturation knees, served loads),
    # bounded to [q/2, 2q] of `q_cap`; the configured q_cap while nothing was measured.
    learn_q_cap: bool = False
    # With learn_q_cap: the engines' TTFT p99 target (seconds; 0 = none). A load counts as
    # served only within it, and loads that keep breaking it bound q_cap from above
    # (control.capacity): set it to the SLO capacity is judged by.
    q_cap_ttft_slo_s: float = 0.0
    # Model the routers' consistent-hashed cold tail on the shared ring and place keys
    # entering the plan where that tail already sends them (no rewarm on admission). Off by
    # default: in the paper-like replay at the knee it cost capacity (150 against 210 QPS at
    # 3.5 s; docs/replay.md, the hashed-tail ablation); plain LPT balances tighter.
    hashed_tail: bool = False
    # Place a key entering the plan (the first plan's too) on the destination its newest
    # request went to (the stream reports it), while balance allows: its cache is warm
    # there, where a fresh LPT moves each entering key to a cold engine. On by default with
    # imbalance_tolerance 0.3: the live capacity runs and the replay behind that are in
    # docs/arena.md and docs/replay.md ("Entering keys placed where they are warm").
    warm_placement: bool = True
    # The range the plan was validated for (shadow replay / canary, checklist step 5):
    # outside it the guard falls back to Flat-LB, and resumes when telemetry returns.
    # 0 = unchecked.
    validated_active_keys_max: int = 0
    validated_p99_ms_max: float = 0.0
    validated_hit_rate_min: float = 0.0
    # Fall back when the served hit rate stays this far below the plan's prediction.
    validated_hit_gap_max: float = 0.0
    # Serve Flat-LB while affinity's predicted gain over it on the current traffic is below
    # this (a fraction of prompt tokens; planning.affinity; why this default: control.guard).
    # 0 = never.
    validated_affinity_gain_min: float = DEFAULT_AFFINITY_GAIN_MIN
    # The guard's clocks (planner_svc/control/guard.py): out of range this long before
    # falling back; back in range this long (doubling when a resumed plan fails again at
    # once) and at least `guard_min_fallback_s` in fallback before resuming; resuming also
    # needs the p99 below the limit by this margin.
    guard_enter_after_s: float = 0.0
    guard_resume_dwell_s: float = 60.0
    guard_min_fallback_s: float = 0.0
    guard_p99_resume_margin: float = 0.1
    # Windows in a row with the predicted affinity gain below its floor before that alone
    # sends a planned fleet to Flat-LB (planner_svc/control/guard.py).
    guard_gain_low_windows: int = DEFAULT_GAIN_LOW_WINDOWS
    retain_versions: int = 50
    # Replicated planners (orchestration.leadership): > 0 runs leader election over a lease
    # of this many seconds in Redis; the standby takes over within about one lease after
    # the leader dies. 0 = a single planner (no lease). `leader_id`: this replica's name
    # in the lease (default: host-pid).
    leader_lease_s: float = 0.0
    leader_id: str = ""
    # Access control: empty = no auth. Operators may mutate; readers may only read.
    operator_token: str = ""
    reader_token: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    max_request_bytes: int = 4 * 1024 * 1024
    extra: dict[str, Any] = field(default_factory=dict)

    def with_overrides(self, **changes: Any) -> PlannerSettings:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def _coerce(kind: Any, text: str) -> Any:
    if kind in (int, "int"):
        return int(text)
    if kind in (float, "float"):
        return float(text)
    if kind in (bool, "bool"):
        return text.lower() in ("1", "true", "yes", "on")
    if "tuple" in str(kind):
        return tuple(s for s in text.split(",") if s)
    return text


def from_env(
    base: PlannerSettings | None = None, environ: dict[str, str] | None = None
) -> PlannerSettings:
    env = os.environ if environ is None else environ
    base = base or PlannerSettings()
    changes: dict[str, Any] = {}
    for f in fields(PlannerSettings):
        name = f"CACHEROUTE_{f.name.upper()}"
        raw = env.get(name)
        if raw is not None and f.name != "extra":
            try:
                changes[f.name] = _coerce(f.type, raw)
            except ValueError:
                raise SystemExit(f"{name}={raw!r}: not a valid {f.type}") from None
    return replace(base, **changes)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags for every setting; unset flags fall back to the environment, then defaults."""
    for f in fields(PlannerSettings):
        if f.name == "extra":
            continue
        flag = "--" + f.name.replace("_", "-")
        env = f"CACHEROUTE_{f.name.upper()}"
        default = "" if f.default is dataclasses.MISSING else f.default
        shown = ",".join(default) if isinstance(default, tuple) else default
        kind = "comma-separated list; " if "tuple" in str(f.type) else ""
        parser.add_argument(flag, default=None,
                            help=f"{kind}default {shown!r}; env {env}")


def from_args(args: argparse.Namespace, environ: dict[str, str] | None = None) -> PlannerSettings:
    settings = from_env(environ=environ)
    changes: dict[str, Any] = {}
    for f in fields(PlannerSettings):
        value = getattr(args, f.name, None)
        if value is not None and f.name != "extra":
            try:
                changes[f.name] = _coerce(f.type, value) if isinstance(value, str) else value
            except ValueError:
                raise SystemExit(f"--{f.name.replace('_', '-')} {value!r}: not a valid "
                                 f"{f.type}") from None
    return replace(settings, **changes)
