"""The simulator checked against the arena: each one-replica arena run replayed in virtual
time with the same conversations and engine model (`session_sim.arena_run`), served hit
rate and TTFT p99 compared within the arena issue's tolerances (3 pp, 20 %).

Pure but for `load_arena_csvs`: rows are the arena CSV's rows as dicts, the request path's
cost is bench/gateway.py's summary as loaded; printing and writing are the shells'
(`cacheroute replay --arena-csv`, bench/sim_vs_arena.py). Arena routers and their simulated
counterparts:
- `cacheroute`: CacheRoute as the gateway and planner run it (`gateway_like`: sessions kept
  with their history, the hashed cold tail, idle keys re-homed, the production control loop
  and placement, queue-aware routing);
- `sglang cache_aware`: our SGLang-like baseline (reactive.SGLangCacheAware, its CLI
  defaults, matching on the prompts' content) next to the real SGLang gateway;
- `sglang round_robin`: round robin, the cache-blind reference;
- `sglang power_of_two`: uniform random routing, what it measured as in front of these
  engines (bench/probe_sglang_p2c.py); `power_of_two="polled"` for its source's rule
  (reactive.SGLangPowerOfTwo), `"flat"` for Flat-LB.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner_svc.settings import PlannerSettings
from planner_svc.simulator.cacheroute_policy import gateway_like
from planner_svc.simulator.policies import PolicyFactory, flat_lb, round_robin, uniform_random
from planner_svc.simulator.reactive import sglang_cache_aware, sglang_power_of_two
from planner_svc.simulator.session_sim import arena_run
from planner_svc.simulator.sessions import SCENARIOS
from router_client.ring import DEFAULT_TAIL_SLACK
from router_client.routing import DEFAULT_IDLE_REHOME_S, DEFAULT_QUEUE_AWARE

HIT_TOLERANCE_PP = 3.0
P99_TOLERANCE = 0.20
ROUTERS = ("cacheroute", "sglang cache_aware", "sglang round_robin", "sglang power_of_two")
POWER_OF_TWO_MODELS = ("random", "polled", "flat")
# The columns a replay reads from an arena row; the optional ones predate some CSVs
# (RunDefaults stands in for them).
_NUMBERS = ("rate_scale", "hit", "ttft_p99_s", "seed", "time_scale", "warmup_s", "measure_s",
            "kv_tokens")
_OPTIONAL = ("seed", "time_scale", "warmup_s", "measure_s", "kv_tokens")


@dataclass(frozen=True)
class GatewaySettings:
    """The gateway's and planner's settings the arena rows ran with (the CSVs do not record
    them; they changed over time: before 2026-12-04 the cold tail's bound was 0.25, before
    2026-12-05 the balance was p2c and idle re-homing off, before 2026-12-06 warm placement
    off, tolerance 0.03 and queue-aware routing off). Defaults: as shipped."""

    tail_slack: float = DEFAULT_TAIL_SLACK
    balance: str = "first-token"
    idle_rehome_s: float | None = DEFAULT_IDLE_REHOME_S  # None: off
    warm_placement: bool = PlannerSettings.warm_placement
    imbalance_tolerance: float = PlannerSettings.imbalance_tolerance
    queue_aware: bool = DEFAULT_QUEUE_AWARE
    # The simulated planner plans on the stream window's rates (as the planner does); False:
    # on the cumulative mean rates (before 2026-12-05).
    rate_window: bool = True
    power_of_two: str = "random"


@dataclass(frozen=True)
class RunDefaults:
    """What an arena CSV row that predates a column ran with (the arena's defaults then)."""

    time_scale: float = 0.5
    warmup_s: float = 18.0
    measure_s: float = 12.0
    kv_tokens: int = 60_000
    engines: int = 4


def policies(time_scale: float, gw: GatewaySettings = GatewaySettings()
             ) -> dict[str, PolicyFactory]:
    """Arena router name -> its simulated counterpart (q_cap and W as the arena sets them)."""
    return {
        # the arena's planner: rates of a 6-s stream window (longer on slowed engines, as
        # bench/arena.py sets it), replanned every 4 s (session_sim.arena_run)
        "cacheroute": gateway_like(12.0 / time_scale, 12, tail_slack=gw.tail_slack,
                                   balance=gw.balance, idle_rehome_s=gw.idle_rehome_s,
                                   warm_placement=gw.warm_placement,
                                   imbalance_tolerance=gw.imbalance_tolerance,
                                   queue_aware=gw.queue_aware,
                                   rate_window_s=(6.0 * max(1.0, time_scale)
                                                  if gw.rate_window else None)),
        "sglang cache_aware": sglang_cache_aware(),
        "sglang round_robin": round_robin,
        "sglang power_of_two": {"random": uniform_random, "polled": sglang_power_of_two(),
                                "flat": flat_lb}[gw.power_of_two],
    }


def load_arena_csvs(paths: Iterable[Path]) -> list[dict[str, str]]:
    """Every row of bench/arena.py's CSVs, in order (the shells' one read of them;
    `arena_rows` keeps a later file's run over an earlier one's)."""
    rows: list[dict[str, str]] = []
    for path in paths:
        with path.open(newline="") as f:
            rows.extend(csv.DictReader(f))
    return rows


def arena_rows(rows: Iterable[Mapping[str, str]]) -> list[dict[str, str]]:
    """The one-replica rows of emulated engines, known scenarios and routers the simulator
    models, in a stable order; a later row replaces an earlier one of the same (scenario,
    router, seed, load)."""
    kept: dict[tuple[str, ...], dict[str, str]] = {}
    for n, row in enumerate(rows, 1):
        if row.get("replicas") != "1" or row.get("scenario") not in SCENARIOS:
            continue
        if row.get("engine_kind", "emulator") != "emulator" or row.get("router") not in ROUTERS:
            continue
        for name in _NUMBERS:
            value = row.get(name) or ("1" if name in _OPTIONAL else "")
            try:
                ok = math.isfinite(float(value)) and float(value) >= 0
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"arena row {n} ({row['scenario']}, {row['router']}): "
                                 f"{name} {value!r} is not a number >= 0")
        kept[(row["scenario"], row["router"], row.get("seed") or "1", row["rate_scale"])] = (
            dict(row))
    return sorted(kept.values(), key=lambda r: (r["scenario"], r["router"],
                                                float(r["rate_scale"]), r.get("seed") or "1"))


def transport_s(measured: Mapping[str, Any]) -> dict[str, float]:
    """Arena router name -> seconds the request path adds to its first token (the emulated
    engine's first streamed event plus what the router in front adds), from bench/gateway.py's
    JSON summary. The engine model is compute only; the SGLang gateway holds a streamed
    response's first event back by ~40 ms, a quarter of the TTFT p99 at time scale 0.5."""
    engine = float(measured["engine_first_event_ms"]["p50"])
    added = {name: float(v["p50"]) for name, v in measured["first_event_added_ms"].items()}
    out: dict[str, float] = {}
    for name in ROUTERS:
        # a policy bench/gateway.py did not run costs what its gateway's others cost: the
        # streamed path does not depend on the policy
        same = [v for n, v in added.items() if n.split()[0] == name.split()[0]]
        if name in added or same:
            out[name] = (engine + added.get(name, statistics.median(same) if same else 0.0)) / 1000
    return out


@dataclass(frozen=True)
class RowCheck:
    """One arena row against its replay."""

    scenario: str
    router: str
    load: float
    seed: int
    arena_hit: float
    sim_hit: float
    arena_p99_s: float
    sim_p99_s: float
    sim_hit_range: tuple[float, float]
    sim_p99_range_s: tuple[float, float]

    @property
    def hit_diff_pp(self) -> float:
        return (self.sim_hit - self.arena_hit) * 100

    @property
    def p99_ratio(self) -> float:
        return self.sim_p99_s / self.arena_p99_s if self.arena_p99_s > 0 else math.nan

    @property
    def hit_ok(self) -> bool:
        return abs(self.hit_diff_pp) <= HIT_TOLERANCE_PP

    @property
    def p99_ok(self) -> bool:
        return abs(self.p99_ratio - 1) <= P99_TOLERANCE

    def as_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "router": self.router, "load": self.load,
                "seed": self.seed, "hit_diff_pp": round(self.hit_diff_pp, 2),
                "p99_ratio": round(self.p99_ratio, 3), "hit_ok": self.hit_ok,
                "p99_ok": self.p99_ok,
                # is the arena's draw one the simulator also makes?
                "arena_p99_in_sim_range": (self.sim_p99_range_s[0] <= self.arena_p99_s
                                           <= self.sim_p99_range_s[1]),
                "arena_hit_in_sim_range": (self.sim_hit_range[0] <= self.arena_hit
                                           <= self.sim_hit_range[1])}


def path_from_row(row: Mapping[str, str]) -> float | None:
    """The request path's cost in this run, from its own row: the client's TTFT p50 over
    the engines' own TTFT p50 (the engines report each request's, bench/arena.py), the
    router, the loopback and event-loop lateness together; None where the row lacks them."""
    try:
        return max(0.0, float(row["ttft_p50_s"]) - float(row["engine_ttft_p50_s"]))
    except (KeyError, TypeError, ValueError):
        return None


def check_row(row: Mapping[str, str], gw: GatewaySettings = GatewaySettings(),
              defaults: RunDefaults = RunDefaults(), *, policy_seeds: int = 1,
              transport: Mapping[str, float] | None = None,
              path_from_rows: bool = False) -> RowCheck:
    """Arena row `row` replayed under `policy_seeds` draws of the router's own randomness
    (P2C's pairs, tie-breaks; the conversations are the row's): the mean hit rate and the
    median TTFT p99 over the draws, and each one's range. A router that draws at random is
    a random process: one arena run is one draw of it, and so is one simulated run. The
    request path's cost is added to each simulated TTFT: `transport` (bench/gateway.py's,
    per router) or, with `path_from_rows`, the row's own (`path_from_row`; `transport` where
    the row lacks it)."""
    if policy_seeds < 1:
        raise ValueError("policy_seeds must be >= 1")
    ts = float(row.get("time_scale") or defaults.time_scale)
    warmup = float(row.get("warmup_s") or defaults.warmup_s)
    factory = policies(ts, gw)[row["router"]]
    own = path_from_row(row) if path_from_rows else None
    added = own if own is not None else (transport or {}).get(row["router"], 0.0)
    hits, p99s = [], []
    for draw in range(1, policy_seeds + 1):
        r = arena_run(row["scenario"], int(row.get("seed") or 1), factory,
                      rate_scale=float(row["rate_scale"]), time_scale=ts, warmup_s=warmup,
                      measure_s=float(row.get("measure_s") or defaults.measure_s),
                      kv_tokens=int(float(row.get("kv_tokens") or defaults.kv_tokens)),
                      engines=defaults.engines, policy_seed=draw)
        hits.append(r.hit_rate(warmup))
        p99s.append(r.ttft_p99(warmup) + added)
    return RowCheck(scenario=row["scenario"], router=row["router"],
                    load=float(row["rate_scale"]), seed=int(row.get("seed") or 1),
                    arena_hit=float(row["hit"]), sim_hit=statistics.fmean(hits),
                    arena_p99_s=float(row["ttft_p99_s"]), sim_p99_s=statistics.median(p99s),
                    sim_hit_range=(min(hits), max(hits)), sim_p99_range_s=(min(p99s), max(p99s)))


def summary(checks: list[RowCheck]) -> dict[str, dict[str, Any]]:
    """Per router: rows, how many are within each tolerance, the worst hit difference and the
    median p99 ratio."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(c.router for c in checks):
        mine = [c for c in checks if c.router == name]
        out[name] = {
            "rows": len(mine),
            "worst_abs_hit_diff_pp": round(max(abs(c.hit_diff_pp) for c in mine), 2),
            "median_p99_ratio": round(statistics.median(c.p99_ratio for c in mine), 3),
            "hit_within_3pp": sum(c.hit_ok for c in mine),
            "p99_within_20pct": sum(c.p99_ok for c in mine),
            "arena_p99_in_sim_range": sum(c.as_json()["arena_p99_in_sim_range"] for c in mine),
        }
    return out


def table_lines(checks: list[RowCheck], *, ranges: bool = False) -> list[str]:
    """A readable table, one line per row, then one line per router."""
    lines = [f"{'scenario':<21} {'router':<20} {'load':>5} {'seed':>4} {'arena hit':>9} "
             f"{'sim hit':>8} {'diff pp':>8} {'arena p99':>9} {'sim p99':>8} {'p99 ratio':>9}"
             f"  within{'  sim p99 range over draws' if ranges else ''}"]
    for c in checks:
        lines.append(f"{c.scenario:<21} {c.router:<20} {c.load:>5g} {c.seed:>4} "
                     f"{c.arena_hit:>9.1%} {c.sim_hit:>8.1%} {c.hit_diff_pp:>+8.1f} "
                     f"{c.arena_p99_s:>9.3f} {c.sim_p99_s:>8.3f} {c.p99_ratio:>9.2f}  "
                     f"{'hit' if c.hit_ok else '---'} {'p99' if c.p99_ok else '---'}"
                     + (f"  {c.sim_p99_range_s[0]:.3f}-{c.sim_p99_range_s[1]:.3f}" if ranges
                        else ""))
    for name, s in summary(checks).items():
        lines.append(f"{name}: {s['rows']} rows; hit within 3 pp on {s['hit_within_3pp']}, "
                     f"p99 within 20 % on {s['p99_within_20pct']}; worst hit diff "
                     f"{s['worst_abs_hit_diff_pp']:.1f} pp, median p99 ratio "
                     f"{s['median_p99_ratio']:.2f}"
                     + (f"; the arena's p99 inside the simulated draws' range on "
                        f"{s['arena_p99_in_sim_range']}" if ranges else ""))
    return lines
