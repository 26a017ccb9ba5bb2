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

import heapq
from dataclasses import dataclass, field

import numpy as np

from planner_svc.simulator.chains import ChainBuilder
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
    engines = [Replica(cluster.model) for _ in range(cluster.n_destinations)]
    # Shared by the routers of this run: what the planner knows (true rates, built plans).
    n_warm = int(len(workload) * cluster.warmup_fraction)
    extra: dict[str, object] = {
        "known_rates": workload.interval_rates,
        "plans": {},
        "warmup_keys": workload.key[:n_warm],
        "conversations": workload.conv,  # the session a gateway would key affinity on
        "warmup_s": float(workload.t[n_warm]) if 0 < n_warm < len(workload) else 0.0,
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
    n = len(w)
    ts, keys = w.t.tolist(), w.key.tolist()
    prompts, prefixes, outputs = w.prompt.tolist(), w.prefix.tolist(), w.output.tolist()
    n_routers = len(routers)
    router_of = np.random.default_rng(seed + 99).integers(0, n_routers, n).tolist()
    dest, cached, finish, first = [0] * n, [0] * n, [0.0] * n, [0.0] * n
    pending: list[tuple[float, int]] = []
    controls = _control_times(w, cluster)
    next_control = controls.pop(0) if controls else float("inf")
    window_start_i, window_start_t = 0, 0.0
    pop, push = heapq.heappop, heapq.heappush
    single = routers[0] if n_routers == 1 else None
    admits = [e.admit for e in engines]
    chain_of = ChainBuilder(w, cluster.model.block_tokens).chain
    # Policies that match on content (policies.ContentPolicy) get each request's chain.
    by_content = [getattr(r, "route_chain", None) for r in routers]
    for i in range(n):
        now = ts[i]
        while pending and pending[0][0] <= now:
            f, j = pop(pending)
            (single or routers[router_of[j]]).finished(j, dest[j], f)
        if now >= next_control:
            window = w.key[window_start_i:i]
            for r in routers:
                r.control(next_control, window, next_control - window_start_t)
            window_start_i, window_start_t = i, next_control
            next_control = controls.pop(0) if controls else float("inf")
        k = keys[i]
        chain, answer, limit = chain_of(i)
        which = 0 if single else router_of[i]
        r, on_content = routers[which], by_content[which]
        d = (on_content(i, k, chain, prompts[i], outputs[i], now, limit) if on_content
             else r.route(i, k, prompts[i], prefixes[i], outputs[i], now))
        served = admits[d](chain, prompts[i], outputs[i], now, answer, limit)
        dest[i], cached[i], finish[i], first[i] = d, served[0], served[3], served[2]
        push(pending, (served[3], i))
    return (
        np.asarray(dest, np.int32),
        np.asarray(cached, np.int64),
        np.asarray(finish),
        np.asarray(first),
    )
