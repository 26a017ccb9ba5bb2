"""What a replay reports: per-run figures, SLO capacity from a load sweep, mean ± sd over seeds.

- served hit rate: token-weighted, Σ cached tokens / Σ prompt tokens of the measured requests;
- imbalance: max / mean of the requests each destination served in the measured window;
- p50 / p99 of end-to-end latency (arrival to last token) and p99 of time to first token;
- SLO capacity: the highest offered load of the sweep whose p99 meets the SLO, scanning up
  from the lowest load and stopping at the first failure. Censored at either end: if the
  lowest load already fails the capacity is "< lowest" (reported as 0), and if every load
  passes it is "≥ highest" (reported as the highest load); both are marked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner_svc.simulator.simulator import RunResult

SLOS_S = (2.0, 3.5, 5.0)


@dataclass(frozen=True, slots=True)
class RunMetrics:
    policy: str
    load_qps: float
    seed: int
    hit_rate: float
    imbalance: float
    p50_s: float
    p99_s: float
    ttft_p99_s: float
    requests: int

    def as_dict(self) -> dict[str, float | int | str]:
        return {f: getattr(self, f) for f in self.__slots__}


def run_metrics(result: RunResult, load_qps: float, seed: int) -> RunMetrics:
    w, m = result.workload, result.measured
    latency = result.latency[m]
    counts = np.bincount(result.dest[m], minlength=result.cluster.n_destinations)
    return RunMetrics(
        policy=result.policy,
        load_qps=load_qps,
        seed=seed,
        hit_rate=float(result.cached[m].sum() / max(1, int(w.prompt[m].sum()))),
        imbalance=float(counts.max() / counts.mean()) if counts.sum() else 1.0,
        p50_s=float(np.percentile(latency, 50)),
        p99_s=float(np.percentile(latency, 99)),
        ttft_p99_s=float(np.percentile(result.ttft[m], 99)),
        requests=int(m.sum()),
    )


@dataclass(frozen=True, slots=True)
class Capacity:
    """SLO capacity of one sweep; `censored` is "", "<" (below the sweep) or ">=" (above it)."""

    qps: float
    censored: str

    def label(self) -> str:
        return f"{self.censored}{self.qps:g}"


def slo_capacity(loads: Sequence[float], p99s: Sequence[float], slo_s: float) -> Capacity:
    """Highest load passing the SLO before the first failing one (see module doc)."""
    order = np.argsort(np.asarray(loads, np.float64))
    ls = [float(loads[i]) for i in order]
    ps = [float(p99s[i]) for i in order]
    if not ls:
        return Capacity(0.0, "<")
    best = None
    for load, p99 in zip(ls, ps, strict=True):
        if p99 > slo_s:
            break
        best = load
    if best is None:
        return Capacity(0.0, "<")
    return Capacity(best, ">=" if best == ls[-1] else "")


@dataclass(frozen=True, slots=True)
class MeanSd:
    mean: float
    sd: float
    censored: str = ""

    def label(self, digits: int = 1, scale: float = 1.0) -> str:
        text = f"{self.mean * scale:.{digits}f} ± {self.sd * scale:.{digits}f}"
        return f"{self.censored}{text}" if self.censored else text


def mean_sd(values: Sequence[float], censored: Sequence[str] = ()) -> MeanSd:
    """Mean and sample sd; marked censored if any seed was (the mark of the first such)."""
    v = np.asarray(values, np.float64)
    sd = float(v.std(ddof=1)) if len(v) > 1 else 0.0
    mark = next((c for c in censored if c), "")
    return MeanSd(float(v.mean()) if len(v) else float("nan"), sd, mark)
