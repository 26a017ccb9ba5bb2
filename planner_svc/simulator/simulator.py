"""The discrete-event cluster simulator: a workload through N routers onto R engines.

Virtual time only. Requests are processed in arrival order; before each arrival the
completions that happened by then are delivered to the router that sent them (so in-flight
counts are exact and live, the same load source for every policy), then the request's
router picks a destination and that destination's `Engine` admits it. Because the engine
computes completion times at admission, the only event queue is a heap of completions.

With `n_routers > 1` an outer balancer spreads requests uniformly at random over the
routers; each router is its own policy instance that sees only its own traffic (its own
in-flight counts, its own learned prefixes), which is how replicated gateways behave.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits

from planner_svc.simulator import eventloop
from planner_svc.simulator.policies import Policy, PolicyContext, PolicyFactory
from planner_svc.simulator.replica import Replica, ReplicaModel
from planner_svc.simulator.workload import Workload


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    n_destinations: int = 30
    model: ReplicaModel = field(default_factory=ReplicaModel)
    n_routers: int = 1
    warmup_fraction: float = 0.3  # requests before this share of the stream are not measured
    control_interval_s: float = 0.0  # 0: the workload's interval


@dataclass
class RunResult:
    """Per-request outcomes of one run; `measured` masks the post-warm-up requests."""

    policy: str
    workload: Workload
    cluster: ClusterSpec
    dest: np.ndarray
    cached: np.ndarray
    finish: np.ndarray
    first_token: np.ndarray
    measured: np.ndarray
    info: dict[str, object] = field(default_factory=dict)

    @property
    def latency(self) -> np.ndarray:
        return self.finish - self.workload.t

    @property
    def ttft(self) -> np.ndarray:
        return self.first_token - self.workload.t


def simulate(
    workload: Workload, factory: PolicyFactory, cluster: ClusterSpec, *, seed: int
) -> RunResult:
    """Run `workload` through `cluster` with one `factory` policy per router."""
    with _one_core():
        return _simulate(workload, factory, cluster, seed)


@contextmanager
def _one_core() -> Iterator[None]:
    """One core per run: the planner's numpy dot products would otherwise wake BLAS worker
    threads that spin between calls (~15 % of a run's CPU), and replays already run one
    process per core. The per-request objects hold no reference cycles, so the cyclic
    collector, which their allocations trigger every few thousand requests, has nothing to
    find: it is paused for the run."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            yield
    finally:
        if collecting:
            gc.enable()


def _simulate(workload: Workload, factory: PolicyFactory, cluster: ClusterSpec,
              seed: int) -> RunResult:
    engines = [Replica(cluster.model) for _ in range(cluster.n_destinations)]
    # Shared by the routers of this run: what the planner knows (true rates, built plans).
    n_warm = int(len(workload) * cluster.warmup_fraction)
    extra: dict[str, object] = {
        "known_rates": workload.interval_rates,
        "plans": {},
        "warmup_keys": workload.key[:n_warm],
        # and what the stream reports of them (the guard judges them before the first plan)
        "warmup_t": workload.t[:n_warm],
        "warmup_prefix": workload.prefix[:n_warm],
        "warmup_prompt": workload.prompt[:n_warm],
        "conversations": workload.conv,  # the session a gateway would key affinity on
        # per key, the system prompt its routing key covers (what a gateway reports as the
        # key's prefix); None for length-only traces
        "system_tokens": workload.system,
        "warmup_s": float(workload.t[n_warm]) if 0 < n_warm < len(workload) else 0.0,
        # what the stream sums over every router's events, per control window (eventloop.run's
        # windows are consecutive slices of these)
        "window_columns": (workload.key, workload.prefix, workload.prompt),
    }
    routers = [
        factory(
            PolicyContext(
                cluster.n_destinations,
                workload.keys,
                cluster.model,
                seed=seed * 1_000 + r,
                router=r,
                n_routers=cluster.n_routers,
                extra=extra,
            )
        )
        for r in range(cluster.n_routers)
    ]
    out = _loop(workload, routers, engines, cluster, seed)
    measured = np.zeros(len(workload), bool)
    measured[n_warm:] = True
    return RunResult(routers[0].name, workload, cluster, *out, measured=measured)


def _control_times(workload: Workload, cluster: ClusterSpec) -> list[float]:
    interval = cluster.control_interval_s or workload.interval_s
    if interval <= 0 or not len(workload):
        return []
    return (np.arange(1, int(workload.t[-1] // interval) + 1) * interval).tolist()


def _loop(
    w: Workload, routers: list[Policy], engines: list[Replica], cluster: ClusterSpec, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    router_of = np.random.default_rng(seed + 99).integers(0, len(routers), len(w)).tolist()
    dest, cached, finish, first = eventloop.run(
        w, routers, engines, cluster.model.block_tokens, _control_times(w, cluster), router_of)
    return (
        np.asarray(dest, np.int32),
        np.asarray(cached, np.int64),
        np.asarray(finish),
        np.asarray(first),
    )
