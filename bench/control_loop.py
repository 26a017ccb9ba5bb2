"""Control-loop benchmark: staleness vs rewarm over six drifting control intervals.

Run from the repo root:  .venv/bin/python bench/control_loop.py [--quick] [--seeds N]

Workload: the paper's 128,824 keys (`planner_svc.simulator.rates`: lognormal, Gini ≈ 0.756, no key
above 0.3 %), 176 QPS over R = 30 destinations with q_cap = 6 (each destination's fair share sits
just under its knee, as in bench/planning.py), W = 128 warm slots each. Each key has a fixed
reusable prefix (lognormal, mean ≈ 1,500 tokens). Rates follow a lognormal random walk with
σ = 0.3 per control interval, applied in `--substeps` equal steps (σ/√m each), so the traffic keeps
drifting *inside* an interval while a plan is installed.

Three policies, all starting from the same warm `build_plan` on the initial rates:
- never: keep the initial plan;
- fresh: `build_plan` from scratch at the start of every interval, always installed;
- loop: every interval, `repack` proposes a candidate and `ControlLoop.step` decides.

How the simulated run measures cost (one unit: recomputed prefill tokens; "hit-weighted traffic"):
- staleness, per sub-step of length dt: dt × max(0, U(fresh plan for the sub-step's rates) −
  U(installed plan)), U = Σ_admitted λ_b P_b Δh − overload loss (requests above a destination's
  knee lose Δh), Δh = 0.3 (93 % vs 64 % served hit in the paper). The fresh reference plan is
  `build_plan` on the sub-step's rates.
- rewarm, per install: the dip of every key whose destination set changes, with the formula's
  τ_b = k_b/λ_b + engine warm-up (5 s) and Δh: Σ f_b λ_b P_b Δh τ_b, f_b the new share of its set
  (1 for a key entering admission). Charged in full at the install. The dip also unfolds in time
  (full deficit during the warm-up, then decaying as exp(−(λ_b/k_b)·t)), which is what the
  loop's telemetry sees.
- telemetry for the loop (measured mode): one window per interval, averaged over its sub-steps:
  served token-weighted hit rate h_cold + (warm gain − current dip deficit) / prompt tokens,
  h_cold = 0.6, warm gain = Σ_admitted λ P Δh (no overload term: overload shows in the reported
  per-destination loads, the plan's expected loads). The loop learns its rewarm factor from
  those dips (it starts at the conservative 2×) and decides on measured staleness once it has
  a settled baseline.
The loop sees rates only at interval starts, exactly like the service. A fourth row runs the loop
without telemetry (modelled staleness only, default rewarm factor).
Last line: one JSON object of figures.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner_svc.control import (
    Action,
    ControlLoop,
    DecisionSettings,
    LoopSettings,
    Telemetry,
    Traffic,
    WarmAdvantage,
)
from planner_svc.control.penalties import rewarm_formula, useful_work_rate
from planner_svc.control.traffic import (
    aligned_rates,
    aligned_tokens,
    expected_loads,
    new_member_share,
)
from planner_svc.planning import PlanningConfig, build_plan, repack
from planner_svc.simulator.rates import lognormal_walk, paper_like_keys, paper_like_rates
from router_client.plan import RoutingPlan

PAPER_KEYS = 128_824
TOTAL_QPS = 176.0
DESTINATIONS = 30
Q_CAP = 6.0
WARM_SLOTS = 128
SIGMA = 0.3
INTERVALS = 6
DELTA_H = 0.3
H_COLD = 0.6
WARMUP_S = 5.0
TRUE_WARM = WarmAdvantage(global_value=DELTA_H)


@dataclass
class World:
    """The drifting truth every policy is measured against."""

    keys: list[str]
    tokens: np.ndarray
    rates: list[list[np.ndarray]]  # [interval][substep]
    fresh_useful: list[list[float]]  # U(build_plan(rates)) per sub-step
    config: PlanningConfig
    interval_s: float
    substeps: int

    @property
    def dt(self) -> float:
        return self.interval_s / self.substeps

    def traffic(self, rates: np.ndarray, at_s: float = 0.0) -> Traffic:
        return Traffic(self.keys, rates, self.tokens, at_s)

    def useful(self, plan: RoutingPlan, rates: np.ndarray) -> float:
        return useful_work_rate(plan, self.traffic(rates), TRUE_WARM)

    def warm_gain(self, plan: RoutingPlan, rates: np.ndarray) -> float:
        return useful_work_rate(plan, self.traffic(rates), TRUE_WARM, overload_weight=0.0)

    def build(self, rates: np.ndarray) -> RoutingPlan:
        return build_plan(self.keys, rates, self.config, prefix_tokens=self.tokens)


def make_world(n_keys: int, seed: int, interval_s: float, substeps: int) -> World:
    rng = np.random.default_rng(seed)
    keys = paper_like_keys(n_keys)
    tokens = np.exp(rng.normal(np.log(1500.0) - 0.125, 0.5, n_keys))
    r = paper_like_rates(n_keys, TOTAL_QPS, seed=seed)
    config = PlanningConfig.uniform(DESTINATIONS, Q_CAP, WARM_SLOTS)
    rates: list[list[np.ndarray]] = []
    for _ in range(INTERVALS):
        row = []
        for _ in range(substeps):
            row.append(r)
            r = lognormal_walk(r, SIGMA / np.sqrt(substeps), rng)
        rates.append(row)
    world = World(keys, tokens, rates, [], config, interval_s, substeps)
    world.fresh_useful = [[world.useful(world.build(x), x) for x in row] for row in rates]
    return world


@dataclass
class Dip:
    """One install's rewarm deficit as it unfolds: per moved key f·λ·P·Δh, λ/k, from t0."""

    t0: float
    full: np.ndarray
    decay: np.ndarray

    def integral(self, a_s: float, b_s: float) -> float:
        """∫ deficit rate over [a, b] (absolute times)."""
        a, b = max(0.0, a_s - self.t0), max(0.0, b_s - self.t0)
        flat = self.full * max(0.0, min(b, WARMUP_S) - min(a, WARMUP_S))
        lo, hi = max(a, WARMUP_S) - WARMUP_S, max(b, WARMUP_S) - WARMUP_S
        mu = np.maximum(self.decay, 1e-12)
        tail = self.full / mu * (np.exp(-mu * lo) - np.exp(-mu * hi))
        return float(flat.sum() + tail.sum())


def make_dip(world: World, old: RoutingPlan, new: RoutingPlan, rates: np.ndarray, t0: float) -> Dip:
    tr = world.traffic(rates)
    share = new_member_share(old, new)
    lam = aligned_rates(new, tr)
    k = new.table.replicas().astype(np.float64)
    full = share * lam * aligned_tokens(new, tr) * DELTA_H
    return Dip(t0, full[share > 0], (lam / k)[share > 0])


@dataclass
class Outcome:
    name: str
    staleness: float = 0.0
    rewarm: float = 0.0
    installs: int = 0
    log: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return self.staleness + self.rewarm


class Runner:
    """Steps one policy through the world, charging staleness and rewarm as documented."""

    def __init__(self, world: World, name: str) -> None:
        self.world, self.out = world, Outcome(name)
        self.installed = world.build(world.rates[0][0])
        self.dips: list[Dip] = []
        self.window: list[tuple[float, float, float]] = []  # (hit work, tokens, req/s)
        self.loads: list[np.ndarray] = []

    def install(self, plan: RoutingPlan, rates: np.ndarray, t: float) -> None:
        tr = self.world.traffic(rates)
        self.out.rewarm += rewarm_formula(self.installed, plan, tr, TRUE_WARM, WARMUP_S)
        self.dips.append(make_dip(self.world, self.installed, plan, rates, t))
        self.installed, self.out.installs = plan, self.out.installs + 1

    def serve_interval(self, i: int) -> None:
        w, self.window, self.loads = self.world, [], []
        for j, rates in enumerate(w.rates[i]):
            t = i * w.interval_s + j * w.dt
            u = w.useful(self.installed, rates)
            self.out.staleness += w.dt * max(0.0, w.fresh_useful[i][j] - u)
            deficit = sum(d.integral(t, t + w.dt) for d in self.dips) / w.dt
            tokens = float(np.dot(rates, w.tokens))
            gain = w.warm_gain(self.installed, rates)
            self.window.append((H_COLD * tokens + gain - deficit, tokens, float(rates.sum())))
            self.loads.append(expected_loads(self.installed, w.traffic(rates)))

    def telemetry(self, end_s: float) -> Telemetry:
        hit_work = sum(x[0] for x in self.window)
        tokens = sum(x[1] for x in self.window)
        requests = sum(x[2] for x in self.window) * self.world.dt
        return Telemetry(
            window_end_s=end_s,
            hit_rate=hit_work / tokens,
            prompt_tokens_per_s=tokens / len(self.window),
            requests=int(requests),
            destination_loads_per_s=dict(
                zip(self.installed.destination_ids, np.mean(self.loads, axis=0), strict=True)
            ),
            planned_hit_rate=H_COLD + DELTA_H,
            fallback_hit_rate=H_COLD,
            active_keys=len(self.world.keys),
        )


def run_never(world: World) -> Outcome:
    runner = Runner(world, "never replan")
    for i in range(INTERVALS):
        runner.serve_interval(i)
    return runner.out


def run_fresh(world: World) -> Outcome:
    runner = Runner(world, "fresh build_plan every interval")
    for i in range(INTERVALS):
        if i > 0:
            rates = world.rates[i][0]
            runner.install(world.build(rates), rates, i * world.interval_s)
        runner.serve_interval(i)
    return runner.out


def loop_settings(world: World) -> LoopSettings:
    age = world.interval_s + 1.0
    return LoopSettings(
        decision=DecisionSettings(hysteresis=0.1, min_dwell_s=0.0),
        warmup_s=WARMUP_S,
        max_rates_age_s=age,
        max_telemetry_age_s=age,
    )


def run_loop(world: World, *, measured: bool) -> Outcome:
    name = "control loop" + ("" if measured else " (modelled only)")
    runner, loop = Runner(world, name), ControlLoop(loop_settings(world))
    runner.window = _warm_window(world, runner.installed)
    runner.loads = [expected_loads(runner.installed, world.traffic(world.rates[0][0]))]
    for i in range(INTERVALS):
        t, rates = i * world.interval_s, world.rates[i][0]
        candidate = repack(
            runner.installed, world.keys, rates, world.config, prefix_tokens=world.tokens
        )
        telemetry = runner.telemetry(t) if measured else None
        decision = loop.step(
            t,
            installed=runner.installed,
            traffic=world.traffic(rates, t),
            candidate=candidate,
            telemetry=telemetry,
        )
        runner.out.log.append(f"t={t:6.0f} s  {decision.action:7}  {decision.reason}")
        if decision.action is Action.INSTALL:
            runner.install(candidate, rates, t)
            loop.record_install(t)
        runner.serve_interval(i)
    runner.out.log.append(
        f"learned rewarm factor {loop.rewarm.value:.2f} ({loop.rewarm.observations} dips measured)"
    )
    return runner.out


def _warm_window(world: World, plan: RoutingPlan) -> list[tuple[float, float, float]]:
    """The window before t = 0: the initial plan, warm, under the initial rates."""
    rates = world.rates[0][0]
    tokens = float(np.dot(rates, world.tokens))
    return [(H_COLD * tokens + world.warm_gain(plan, rates), tokens, float(rates.sum()))]


def run_seed(n_keys: int, seed: int, interval_s: float, substeps: int) -> list[Outcome]:
    world = make_world(n_keys, seed, interval_s, substeps)
    return [
        run_never(world),
        run_fresh(world),
        run_loop(world, measured=True),
        run_loop(world, measured=False),
    ]


def print_table(per_seed: list[list[Outcome]], total_tokens: float) -> None:
    names = [o.name for o in per_seed[0]]
    print(
        f"{'policy':34} {'installs':>8} {'staleness Mtok':>14} {'rewarm Mtok':>12} "
        f"{'total Mtok':>11} {'% of prompt':>11}"
    )
    for k, name in enumerate(names):
        rows = [s[k] for s in per_seed]
        st = np.mean([r.staleness for r in rows]) / 1e6
        rw = np.mean([r.rewarm for r in rows]) / 1e6
        inst = np.mean([r.installs for r in rows])
        share = (st + rw) * 1e6 / total_tokens
        print(f"{name:34} {inst:8.1f} {st:14.3f} {rw:12.3f} {st + rw:11.3f} {share:11.3%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 keys, one seed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--interval-s", type=float, default=300.0)
    parser.add_argument("--substeps", type=int, default=10)
    parser.add_argument("--verbose", action="store_true", help="print the loop's decisions")
    args = parser.parse_args()
    n_keys, seeds = (20_000, 1) if args.quick else (PAPER_KEYS, args.seeds)
    started = time.perf_counter()
    per_seed = [run_seed(n_keys, s, args.interval_s, args.substeps) for s in range(1, seeds + 1)]
    elapsed = time.perf_counter() - started
    mean_tokens = TOTAL_QPS * 1500.0 * INTERVALS * args.interval_s
    print(
        f"{n_keys} keys, R={DESTINATIONS}, {TOTAL_QPS:.0f} QPS, q_cap={Q_CAP}, W={WARM_SLOTS}, "
        f"{INTERVALS} intervals × {args.interval_s:.0f} s (σ={SIGMA}), {seeds} seed(s), "
        "costs in recomputed prefill tokens (mean over seeds)"
    )
    print_table(per_seed, mean_tokens)
    for s, outcomes in enumerate(per_seed, 1):
        never, fresh, loop, modelled = (o.total for o in outcomes)
        print(
            f"seed {s}: never {never / 1e6:.3f}  fresh {fresh / 1e6:.3f}  "
            f"loop {loop / 1e6:.3f}  loop(modelled) {modelled / 1e6:.3f} Mtok"
        )
        if args.verbose or s == 1:
            print("\n".join("    " + line for line in outcomes[2].log))
    means = {
        k: float(np.mean([s[i].total for s in per_seed]))
        for i, k in enumerate(("never", "fresh", "loop", "loop_modelled"))
    }
    wins = sum(s[2].total < min(s[0].total, s[1].total) for s in per_seed)
    print(
        json.dumps(
            {
                "keys": n_keys,
                "seeds": seeds,
                "interval_s": args.interval_s,
                "never_total_tokens": round(means["never"]),
                "fresh_total_tokens": round(means["fresh"]),
                "loop_total_tokens": round(means["loop"]),
                "loop_modelled_total_tokens": round(means["loop_modelled"]),
                "loop_installs_mean": float(np.mean([s[2].installs for s in per_seed])),
                "fresh_installs": INTERVALS - 1,
                "loop_beats_both_seeds": wins,
                "loop_beats_both": bool(means["loop"] < min(means["never"], means["fresh"])),
                "elapsed_s": round(elapsed, 2),
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
