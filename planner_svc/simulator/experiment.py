"""A replay experiment: scenario × policies × load sweep × seeds, on worker processes.

Each (load, seed) point draws one workload and runs every policy on the same requests (paired
comparison, separate fixed RNG seeds per policy and router). Points run in parallel on
`workers` forked processes; a progress bar goes to stderr.

CacheRoute's inputs are calibrated per workload the way the paper's checklist says: the
warm-slot budget W from the measured cache capacity (capacity tokens / mean prompt tokens
of the warm-up window, i.e. how many keys' prefixes one destination holds), and q_cap from the
engine model (the load at which one destination serving warm traffic reaches 70 %
utilisation of its prefill stage or its batch slots). Both can be overridden.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np

from planner_svc.control.guard import DEFAULT_AFFINITY_GAIN_MIN
from planner_svc.planning.affinity import characteristic_time
from planner_svc.planning.config import PAPER_IMBALANCE_TOLERANCE
from planner_svc.settings import PlannerSettings
from planner_svc.simulator.arrivals import ArrivalSpec
from planner_svc.simulator.cacheroute_policy import CacheRouteSettings, cacheroute
from planner_svc.simulator.chains import ChainBuilder, affine_uncached_tokens
from planner_svc.simulator.metrics import RunMetrics, run_metrics
from planner_svc.simulator.policies import PolicyFactory, chwbl, flat_lb, sticky
from planner_svc.simulator.preble import preble_like
from planner_svc.simulator.reactive import dualmap_like, sglang_cache_aware
from planner_svc.simulator.replica import Replica, ReplicaModel
from planner_svc.simulator.simulator import ClusterSpec, simulate
from planner_svc.simulator.workload import SCENARIOS, ScenarioSpec, Workload, whales
from router_client.ring import DEFAULT_TAIL_SLACK
from router_client.routing import (
    DEFAULT_HISTORY_SLACK,
    DEFAULT_IDLE_REHOME_S,
    DEFAULT_QUEUE_AWARE,
)

_T = TypeVar("_T")

# The simulator's calibration (70B fp8 on a TP2 H100 pair, scaled; see docs/replay.md).
SIM_MODEL = ReplicaModel(
    kv_capacity_tokens=1_000_000,
    prefill_overhead_s=0.02,
    prefill_s_per_token=1.5e-4,
    decode_s_per_step=0.02,
    decode_s_per_running=2e-4,
    decode_s_per_kv_token=4e-8,
    batch_limit=64,
)
# 8B-class engine (Llama-3-8B on one H100 per destination) for the whale ablation, which the
# paper ran on an 8B model: prefill ~25 k tokens/s, decode 8 ms/token. Cache: fp8 KV of an 8B
# model is ~64 KB/token, ~0.94 M tokens in the ~60 GB an H100 has left; 2 M is the same 2x
# allowance SIM_MODEL takes over its physical figure, and it puts Flat-LB near the paper's
# 56 % hit on the whale workload (docs/replay.md, "Calibrating the whale ablation").
MODEL_8B = ReplicaModel(
    kv_capacity_tokens=2_000_000,
    prefill_overhead_s=0.01,
    prefill_s_per_token=4.0e-5,
    decode_s_per_step=0.008,
    decode_s_per_running=8e-5,
    decode_s_per_kv_token=1e-8,
    batch_limit=64,
)
ENGINES = {"70b": SIM_MODEL, "8b": MODEL_8B}
# The engine each scenario runs on unless told otherwise (`cacheroute replay --engine`).
SCENARIO_ENGINES = {"whales": "8b"}


def scenario_model(scenario: str) -> ReplicaModel:
    """The engine model `scenario` runs on by default (70B-class unless listed)."""
    return ENGINES[SCENARIO_ENGINES.get(scenario, "70b")]


# 128,824 paper keys scaled by 1/8 so that 200 k-request runs see every hot key many times.
SIM_KEYS = 16_103
KNEE_UTILISATION = 0.7

PAPER_POLICIES = ("flat", "sticky", "chwbl", "dualmap", "preble", "cacheroute")
# The baselines users know, and CacheRoute as shipped (routed as `cacheroute gateway` with
# the planner's defaults) and as in the paper: what `cacheroute replay` offers. The other
# names of `POLICY_NAMES` are ablations, which bench/ablations.py runs.
BASELINE_POLICIES = ("flat", "sticky", "chwbl", "preble", "sglang")
USER_POLICIES = (*BASELINE_POLICIES, "cacheroute-gateway", "cacheroute")


@dataclass(frozen=True)
class ReplayConfig:
    """One replay experiment. `model` is not derived from `scenario` here: pass
    `scenario_model(scenario)` for a scenario's default engine (the CLI does)."""

    scenario: str = "paper-like"
    policies: tuple[str, ...] = PAPER_POLICIES
    loads: tuple[float, ...] = (100.0, 200.0, 300.0)
    seeds: tuple[int, ...] = (1, 2, 3)
    n_requests: int = 200_000
    n_keys: int = SIM_KEYS
    n_destinations: int = 30
    n_routers: int = 1
    model: ReplicaModel = field(default_factory=lambda: SIM_MODEL)
    arrivals: ArrivalSpec = field(default_factory=ArrivalSpec)
    warmup_fraction: float = 0.3
    cacheroute_rates: str = "measured"
    replan: str = "repack"
    rate_window_s: float | None = None  # replan "repack-window": None = one interval
    q_cap: float | None = None
    warm_slots_per_destination: int | None = None
    trace: Workload | None = None
    workers: int = 2
    # The whales scenario's whale count and per-whale share (None: `workload.whales` defaults).
    n_whales: int | None = None
    whale_share: float | None = None
    # Policies with sessions: the gateway's `--history-slack`.
    history_slack: float = DEFAULT_HISTORY_SLACK
    # Policies with the hashed cold tail: the gateway's `--tail-slack`.
    tail_slack: float = DEFAULT_TAIL_SLACK
    # CacheRoute's planner: PlanningConfig.imbalance_tolerance. None: as shipped for the
    # policies run as the gateway (`PlannerSettings`, 0.3 since 2026-12-06), the paper's
    # 0.03 for the paper's policies.
    imbalance_tolerance: float | None = None
    # The planner's warm placement (keys entering the plan go where they were last served).
    # None: as shipped for the policies run as the gateway (on since 2026-12-06), off for
    # the paper's; the `-warm` policies always place warm.
    warm_placement: bool | None = None
    # The gateway's --queue-aware (RouterCore.queue_aware). None: as shipped for the
    # policies run as the gateway (on since 2026-12-06), off for the others, which route as
    # the paper's routers do.
    queue_aware: bool | None = None
    # Policies run as the gateway (cacheroute-gateway, -rehome): the gateway's `--balance`
    # (the others keep the paper's P2C).
    balance: str = "first-token"
    # `cacheroute-loop`: seconds from the planner's install decision to the routers' use
    # (publish to Redis, notify, apply).
    publish_delay_s: float = 1.0
    # The gateway's `--idle-rehome-s` (0 = off), where the learned window starts: None is
    # the gateway's default for `cacheroute-gateway`, the fleet's eviction window from a
    # cache model (`eviction_window_s`) for `cacheroute-rehome(-learned)`.
    idle_rehome_s: float | None = None
    # The gateway's `--idle-rehome-with-peers` (with `n_routers` > 1).
    rehome_with_peers: bool = False
    # Policies run as the gateway replan as the shipped planner does: every
    # `SHIPPED_INTERVAL_S` on the rates of the stream's last `SHIPPED_WINDOW_S`. True: on
    # the scenario's control interval with `replan` instead (before 2026-12-05; with 300-s
    # intervals on stationary traffic that idealised the rate estimate).
    paper_cadence: bool = False


# The shipped planner's cadence: its interval (planner_svc.settings) and the stream's window
# (streams.settings `window_s`; not imported: the bench scripts run with bench/ first on the
# path, where bench/streams.py would shadow the package; a test keeps the two equal).
SHIPPED_INTERVAL_S = PlannerSettings().interval_s
SHIPPED_WINDOW_S = 60.0


# The measured knee (`knee_rate`): the hottest key's warm-up requests replayed alone on one
# engine, time-compressed to rising rates (x KNEE_STEP from KNEE_BASE_RATE req/s); the knee is
# the highest rate whose p99 stays within KNEE_TAIL_GROWTH x the p99 at KNEE_BASE_RATE.
KNEE_BASE_RATE = 0.5
KNEE_STEP = 1.25
KNEE_TAIL_GROWTH = 2.0
KNEE_MIN_REQUESTS = 50


def knee_rate(w: Workload, model: ReplicaModel, warmup_fraction: float) -> float | None:
    """The request rate one engine carries of the warm-up window's hottest key before its
    tail latency doubles: q_cap measured on the engine model, the load sweep an operator
    would run on one replica. None when that key has under KNEE_MIN_REQUESTS requests."""
    n = max(1, int(len(w) * warmup_fraction))
    keys = w.key[:n]
    idx = np.flatnonzero(keys == int(np.bincount(keys).argmax()))
    span = float(w.t[idx[-1]] - w.t[idx[0]]) if len(idx) > 1 else 0.0
    if len(idx) < KNEE_MIN_REQUESTS or span <= 0:
        return None
    native = len(idx) / span
    builder = ChainBuilder(w, model.block_tokens)
    requests = [(float(w.t[i]) - float(w.t[idx[0]]), *builder.chain(int(i)),
                 int(w.prompt[i]), int(w.output[i])) for i in idx]

    def p99_at(rate: float) -> float:
        engine, scale, e2e = Replica(model), native / rate, []
        for t, chain, answer, limit, prompt, output in requests:
            now = t * scale
            e2e.append(engine.admit(chain, prompt, output, now, answer, limit).finish_time - now)
        return float(np.quantile(e2e[len(e2e) // 5:], 0.99))  # past the cold start

    limit = KNEE_TAIL_GROWTH * p99_at(KNEE_BASE_RATE)
    rate = KNEE_BASE_RATE
    while rate * KNEE_STEP < 1e4 and p99_at(rate * KNEE_STEP) <= limit:
        rate *= KNEE_STEP
    return rate


def calibrate(w: Workload, model: ReplicaModel, warmup_fraction: float) -> tuple[float, int]:
    """(q_cap, W) for CacheRoute from the workload's warm-up window and the engine model:
    q_cap is the measured knee (`knee_rate`) where the hottest key has enough requests, else
    the formula below (70 % of a warm destination's throughput)."""
    n = max(1, int(len(w) * warmup_fraction))
    prompt = float(w.prompt[:n].mean())
    slots = max(1, int(model.kv_capacity_tokens / prompt))
    knee = knee_rate(w, model, warmup_fraction)
    if knee is not None:
        return knee, slots
    # What a warm destination recomputes: the content its key's earlier requests did not
    # compute (a trace's `prefix` column claims more where conversations share only the
    # system prompt: 150 of a whale's 3,000 tokens claimed, 630 measured, so q_cap came out
    # 2.2x the engine's knee and every whale's owner queued; docs/replay.md).
    uncached_warm = float(np.mean(affine_uncached_tokens(w, model.block_tokens, n)))
    service = model.prefill_seconds(int(uncached_warm))
    decode = float(w.output[:n].mean()) * model.tpot(model.batch_limit,
                                                     int(model.batch_limit * prompt))
    q_cap = KNEE_UTILISATION * min(1.0 / service, model.batch_limit / decode)
    return q_cap, slots


def eviction_window_s(w: Workload, model: ReplicaModel, warmup_fraction: float,
                      n_destinations: int) -> float:
    """How long a key's prefix stays in its home's cache under affinity (Che's characteristic
    time of the fleet's caches on the warm-up window's per-key rates and mean prompts): what
    an operator sets `--idle-rehome-s` to."""
    n = max(1, int(len(w) * warmup_fraction))
    span = max(1e-9, float(w.t[n - 1] - w.t[0]))
    keys = w.key[:n]
    counts = np.bincount(keys, minlength=len(w.keys)).astype(np.float64)
    sizes = np.bincount(keys, weights=w.prompt[:n], minlength=len(w.keys))
    seen = counts > 0
    t = characteristic_time(counts[seen] / span, sizes[seen] / counts[seen],
                            float(model.kv_capacity_tokens) * n_destinations)
    return t if np.isfinite(t) else span


# The variants that route as `cacheroute gateway` does with the planner's defaults: sessions,
# the production control loop, the cold tail consistent-hashed (`-rehome` adds re-homing).
_AS_GATEWAY = ("cacheroute-gateway", "cacheroute-rehome", "cacheroute-rehome-learned",
               "cacheroute-gateway-warm", "cacheroute-rehome-learned-warm")
# `-warm`: the same, the planner placing keys entering the plan where they were last served
# (repack's `warm_at`: the planner's opt-in `--warm-placement`).
_WARM = ("cacheroute-gateway-warm", "cacheroute-rehome-learned-warm")


def policy_factory(name: str, cfg: ReplayConfig, w: Workload) -> PolicyFactory:
    """The policy called `name` (see `POLICY_NAMES`), calibrated for workload `w`."""
    simple: dict[str, Callable[[], PolicyFactory]] = {
        "flat": lambda: flat_lb,
        "sticky": lambda: sticky,
        "chwbl": lambda: chwbl(1.25),
        "chwbl-1.5": lambda: chwbl(1.5),
        "dualmap": dualmap_like,
        "preble": lambda: preble_like,
        "sglang": lambda: sglang_cache_aware(False),
        "sglang-rust": lambda: sglang_cache_aware(True),
    }
    if name in simple:
        return simple[name]()
    variants = {"cacheroute": "full", "affinity": "affinity", "replication": "replication",
                "cacheroute-sessions": "full", "cacheroute-loop": "full",
                "cacheroute-tail": "full", "cacheroute-hashed": "full",
                "cacheroute-gateway": "full", "cacheroute-no-guard": "full",
                "cacheroute-rehome": "full", "cacheroute-rehome-learned": "full",
                "cacheroute-gateway-warm": "full", "cacheroute-rehome-learned-warm": "full"}
    if name not in variants and name != "cacheroute-known":
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
    q_cap, slots = calibrate(w, cfg.model, cfg.warmup_fraction)
    as_gateway = name in _AS_GATEWAY
    shipped = _on_shipped_cadence(name, cfg)
    settings = CacheRouteSettings(
        q_cap=cfg.q_cap or q_cap,
        warm_slots_per_destination=cfg.warm_slots_per_destination or slots,
        variant=variants.get(name, "full"),
        rates="known" if name == "cacheroute-known" else cfg.cacheroute_rates,
        replan="repack-window" if shipped else cfg.replan,
        rate_window_s=SHIPPED_WINDOW_S if shipped else cfg.rate_window_s,
        session_affinity=as_gateway or name == "cacheroute-sessions",
        control_loop=as_gateway or name == "cacheroute-loop",
        publish_delay_s=cfg.publish_delay_s,
        history_slack=cfg.history_slack,
        tail_slack=cfg.tail_slack,
        balance=cfg.balance if as_gateway else "p2c",
        # The cold tail consistent-hashed (the gateway's default); the plan placing keys
        # where that tail sends them only for `cacheroute-hashed` (the planner's
        # `--hashed-tail`, off by default: `cacheroute-gateway` is the defaults as shipped).
        cold_tail="hash" if as_gateway or name in ("cacheroute-tail", "cacheroute-hashed")
        else "p2c",
        hashed_tail=name == "cacheroute-hashed",  # off in the planner by default
        idle_rehome_s=_idle_rehome_s(name, cfg, w),
        # From there, the window the router measures (`--idle-rehome-learn`, the default).
        learn_idle_rehome=name.removesuffix("-warm") in ("cacheroute-gateway",
                                                         "cacheroute-rehome-learned"),
        warm_placement=name in _WARM or _shipped(cfg.warm_placement, as_gateway,
                                                 PlannerSettings.warm_placement, False),
        imbalance_tolerance=_shipped(cfg.imbalance_tolerance, as_gateway,
                                     PlannerSettings.imbalance_tolerance,
                                     PAPER_IMBALANCE_TOLERANCE),
        queue_aware=_shipped(cfg.queue_aware, as_gateway, DEFAULT_QUEUE_AWARE, False),
        rehome_with_peers=cfg.rehome_with_peers,
        # `cacheroute-no-guard`: the paper's CacheRoute, planning whatever affinity can win.
        affinity_gain_min=None if name == "cacheroute-no-guard" else DEFAULT_AFFINITY_GAIN_MIN,
    )
    return cacheroute(settings)


def _shipped(chosen: _T | None, as_gateway: bool, shipped: _T, paper: _T) -> _T:
    """A setting of the planner or gateway as a policy runs it: the one chosen, otherwise
    as shipped for the policies run as the gateway and the paper's for the others."""
    if chosen is not None:
        return chosen
    return shipped if as_gateway else paper


def _idle_rehome_s(name: str, cfg: ReplayConfig, w: Workload) -> float | None:
    """The idle re-homing window policy `name` starts from (None: off)."""
    name = name.removesuffix("-warm")
    if name == "cacheroute-gateway":  # as shipped: the gateway's default
        window = DEFAULT_IDLE_REHOME_S if cfg.idle_rehome_s is None else cfg.idle_rehome_s
    elif name.startswith("cacheroute-rehome"):
        window = cfg.idle_rehome_s or eviction_window_s(w, cfg.model, cfg.warmup_fraction,
                                                        cfg.n_destinations)
    else:
        return None
    return window or None


POLICY_NAMES = (
    "flat",
    "sticky",
    "chwbl",
    "chwbl-1.5",
    "dualmap",
    "preble",
    "sglang",
    "sglang-rust",
    "cacheroute",
    "cacheroute-known",
    "cacheroute-sessions",
    "cacheroute-loop",
    "cacheroute-tail",
    "cacheroute-hashed",
    "cacheroute-gateway",
    "cacheroute-no-guard",
    "cacheroute-rehome",
    "cacheroute-rehome-learned",
    "cacheroute-gateway-warm",
    "cacheroute-rehome-learned-warm",
    "affinity",
    "replication",
)
ABLATION_POLICIES = tuple(p for p in POLICY_NAMES if p not in USER_POLICIES)


def make_workload(cfg: ReplayConfig, load: float, seed: int) -> Workload:
    if cfg.trace is not None:
        return scale_trace(cfg.trace, load)
    spec = ScenarioSpec(load, cfg.n_requests, seed, cfg.arrivals, cfg.n_keys)
    if cfg.scenario == "whales":
        return whales(spec, **whale_options(cfg))
    return SCENARIOS[cfg.scenario](spec)


def whale_options(cfg: ReplayConfig) -> dict[str, Any]:
    """The keyword arguments of `workload.whales` that `cfg` overrides."""
    options = {"n_whales": cfg.n_whales, "whale_share": cfg.whale_share}
    return {k: v for k, v in options.items() if v is not None}


def scale_trace(trace: Workload, load: float) -> Workload:
    """The recorded trace replayed at `load` req/s (time axis stretched; load 0 = as recorded)."""
    native = trace.offered_qps
    if load <= 0 or native <= 0:
        return trace
    t = (trace.t - trace.t[0]) * (native / load)
    return replace(trace, t=t, interval_rates=None)


def run_point(cfg: ReplayConfig, load: float, seed: int) -> list[RunMetrics]:
    """Every policy of `cfg` on one workload draw."""
    w = make_workload(cfg, load, seed)
    cluster = ClusterSpec(cfg.n_destinations, cfg.model, cfg.n_routers, cfg.warmup_fraction)
    out = []
    for name in cfg.policies:
        result = simulate(w, policy_factory(name, cfg, w), cluster_for(name, cfg, cluster),
                          seed=seed)
        metrics = run_metrics(result, load, seed)
        out.append(replace(metrics, policy=_display(name, metrics.policy)))
    return out


def cluster_for(name: str, cfg: ReplayConfig, cluster: ClusterSpec) -> ClusterSpec:
    """The cluster policy `name` runs on: a policy run as the gateway replans on the shipped
    planner's interval (unless `paper_cadence`); the rest on the scenario's."""
    if _on_shipped_cadence(name, cfg):
        return replace(cluster, control_interval_s=SHIPPED_INTERVAL_S)
    return cluster


def _on_shipped_cadence(name: str, cfg: ReplayConfig) -> bool:
    """Policy `name` replans as the shipped planner does (`SHIPPED_INTERVAL_S`, on the rates
    of the last `SHIPPED_WINDOW_S`): the policies run as the gateway, unless told otherwise."""
    return name in _AS_GATEWAY and not cfg.paper_cadence and cfg.replan != "once"


def _display(name: str, policy_label: str) -> str:
    return "CacheRoute (known rates)" if name == "cacheroute-known" else policy_label


_ACTIVE: ReplayConfig | None = None


def _point(task: tuple[float, int]) -> list[RunMetrics]:
    assert _ACTIVE is not None
    return run_point(_ACTIVE, *task)


def run_experiment(cfg: ReplayConfig, *, progress: bool = True) -> list[RunMetrics]:
    """All (load, seed) points of `cfg`; results in task order."""
    global _ACTIVE
    tasks = [(float(load), int(seed)) for load in cfg.loads for seed in cfg.seeds]
    label = cfg.trace.name if cfg.trace is not None else cfg.scenario
    bar = ProgressBar(len(tasks), label, enabled=progress)
    _ACTIVE = cfg
    results: list[RunMetrics] = []
    try:
        if cfg.workers > 1 and len(tasks) > 1:
            with mp.get_context("fork").Pool(min(cfg.workers, len(tasks))) as pool:
                for part in pool.imap(_point, tasks):
                    results.extend(part)
                    bar.step(part)
        else:
            for task in tasks:
                part = _point(task)
                results.extend(part)
                bar.step(part)
    finally:
        _ACTIVE = None
        bar.close()
    return results


class ProgressBar:
    """A one-line text progress bar on stderr."""

    def __init__(self, total: int, label: str, *, enabled: bool = True, width: int = 30) -> None:
        self.total, self.label, self.enabled, self.width = total, label, enabled, width
        self.done = 0
        self.started = time.monotonic()

    def step(self, part: Sequence[RunMetrics]) -> None:
        self.done += 1
        if not self.enabled:
            return
        filled = int(self.width * self.done / max(1, self.total))
        last = f"load={part[0].load_qps:g} seed={part[0].seed}" if part else ""
        elapsed = time.monotonic() - self.started
        bar = "#" * filled + "." * (self.width - filled)
        # The redraw's carriage return is ours: past the CLI's control-character filter
        # (planner_svc.cli.terminal), whose stream keeps the original as `raw`.
        err = getattr(sys.stderr, "raw", sys.stderr)
        err.write(f"\r{self.label} [{bar}] {self.done}/{self.total} {last} {elapsed:.0f}s ")
        err.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def loads_grid(lo: float, hi: float, steps: int) -> tuple[float, ...]:
    """`steps` loads from lo to hi inclusive, rounded to integers."""
    return tuple(float(round(x)) for x in np.linspace(lo, hi, steps))
