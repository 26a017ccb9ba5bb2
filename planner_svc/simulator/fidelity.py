"""The fidelity gate (pure): before `replay` or `diagnose` answer for a recorded trace, the
engine model must reproduce what the trace says happened.

A trace recorded at the gateways (`--trace kafka://…`, or a file with `destination`,
`cached_tokens` and `e2e_ms` columns) says where each request went and what it met there.
The gate replays the trace with every request sent where it actually went, through the
engine model the replay would use, and compares the served hit rate (prompt tokens from
cache over prompt tokens) and the end-to-end p99 with the measured ones. Only when both
are within `HIT_TOLERANCE` and `P99_TOLERANCE` does the model say anything about other
policies on this traffic; otherwise the commands refuse, with the figures, and the usual
fixes are the engine model's cache size (`--cache-tokens`) and speed (`--engine`, or a
model fitted with `ReplicaModel.fit`). A trace without outcomes cannot be checked: the
answer is then the model's alone, and the commands say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner_svc.simulator.policies import FlatP2C, PolicyContext
from planner_svc.simulator.replica import ReplicaModel
from planner_svc.simulator.simulator import ClusterSpec, simulate
from planner_svc.simulator.workload import Workload

HIT_TOLERANCE = 0.05  # served hit rate, absolute (5 percentage points)
P99_TOLERANCE = 0.30  # end-to-end p99, relative
MIN_RECORDED_SHARE = 0.9  # requests whose destination the trace records


@dataclass(frozen=True)
class Fidelity:
    checked: bool  # False: the trace records too little to check the model against
    passed: bool
    requests: int = 0  # requests compared (after the warm-up)
    measured_hit: float = math.nan
    simulated_hit: float = math.nan
    measured_p99_s: float = math.nan
    simulated_p99_s: float = math.nan
    why: str = ""  # what failed, or why nothing could be checked

    def lines(self) -> list[str]:
        if not self.checked:
            return [f"fidelity gate not run: {self.why}; the verdict is the model's alone"]
        head = "fidelity gate passed" if self.passed else "fidelity gate FAILED"
        return [
            f"{head}: the trace replayed as it was routed, {self.requests} requests compared",
            f"  served hit rate: measured {self.measured_hit:.1%}, model "
            f"{self.simulated_hit:.1%} (tolerance ±{HIT_TOLERANCE * 100:.0f} pp)",
            f"  end-to-end p99: measured {self.measured_p99_s:.3f} s, model "
            f"{self.simulated_p99_s:.3f} s (tolerance ±{P99_TOLERANCE:.0%})",
            *([f"  {self.why}"] if self.why else []),
        ]


class RecordedRoutes(FlatP2C):
    """Each request to the destination it was recorded at (Flat-LB's P2C for the few
    without one)."""

    name = "as recorded"

    def __init__(self, ctx: PolicyContext, recorded: np.ndarray) -> None:
        super().__init__(ctx)
        self._recorded = recorded.tolist()

    def route(self, i: int, key: int, prompt: int, prefix: int, output: int, now: float) -> int:
        d = self._recorded[i]
        if d < 0:
            return super().route(i, key, prompt, prefix, output, now)
        self.inflight[d] += 1
        return int(d)


def check_fidelity(w: Workload, model: ReplicaModel, *, warmup_fraction: float = 0.3,
                   seed: int = 1) -> Fidelity:
    """Replay `w` as it was routed through `model`; compare with what was measured."""
    if w.recorded_dest is None or not w.recorded_destinations:
        return Fidelity(False, False, why="the trace records no destinations")
    recorded = w.recorded_dest
    share = float((recorded >= 0).mean())
    if share < MIN_RECORDED_SHARE:
        return Fidelity(False, False, why=f"only {share:.0%} of requests record their "
                        f"destination (at least {MIN_RECORDED_SHARE:.0%} needed)")
    cluster = ClusterSpec(n_destinations=len(w.recorded_destinations), model=model,
                          warmup_fraction=warmup_fraction)
    run = simulate(w, lambda ctx: RecordedRoutes(ctx, recorded), cluster, seed=seed)
    cached = w.measured_cached if w.measured_cached is not None else np.full(len(w), -1)
    e2e = w.measured_e2e_s if w.measured_e2e_s is not None else np.full(len(w), math.nan)
    hit_mask = run.measured & (cached >= 0)
    p99_mask = run.measured & np.isfinite(e2e)
    if not hit_mask.any() or not p99_mask.any():
        return Fidelity(False, False, why="the trace records no served cache or latency "
                        "figures after its warm-up")
    prompt = w.prompt.astype(np.float64)
    measured_hit = float(cached[hit_mask].sum() / max(1.0, prompt[hit_mask].sum()))
    simulated_hit = float(run.cached[hit_mask].sum() / max(1.0, prompt[hit_mask].sum()))
    measured_p99 = float(np.percentile(e2e[p99_mask], 99))
    simulated_p99 = float(np.percentile(run.latency[p99_mask], 99))
    misses = []
    if abs(simulated_hit - measured_hit) > HIT_TOLERANCE:
        misses.append(f"the model's hit rate is {(simulated_hit - measured_hit) * 100:+.1f} pp "
                      "off (its cache size or content is not the engines')")
    if measured_p99 > 0 and abs(simulated_p99 / measured_p99 - 1) > P99_TOLERANCE:
        misses.append(f"the model's p99 is {simulated_p99 / measured_p99 - 1:+.0%} off (its "
                      "speed is not the engines')")
    return Fidelity(True, not misses, int(hit_mask.sum()), measured_hit, simulated_hit,
                    measured_p99, simulated_p99, "; ".join(misses))
