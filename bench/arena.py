"""The arena: CacheRoute against the real SGLang model gateway and vllm-router, live.

One run starts R emulated engines (planner_svc.devstack.engines: the content-level replica
model in real time behind real HTTP), CacheRoute's whole stack (broker, Redis, stream
worker, planner, and its gateway), then, for every scenario and seed, each router in
turn with 1 and 4 replicas behind a round-robin client, in front of the same engines
(reset to cold between runs), driven by identical traffic (planner_svc.devstack.traffic:
the openai async SDK, closed-loop conversations). Per run: served token-weighted hit
rate, TTFT p50/p99, end-to-end p99, errors, per-engine load imbalance (max/mean
requests), router CPU. Then the SLO capacity sweep: the highest offered load at which
TTFT p99 stays within the SLO, for CacheRoute and the best peer.

    .venv/bin/python bench/arena.py [--quick] [--seeds 3] [--scenarios paper-like,whale]
    .venv/bin/python bench/arena.py --grid [--quick]   # the scenario grid's live sample

Writes docs/results/arena/arena.md, arena.csv and PNG plots; last line one JSON object.
A missing peer is reported, never faked. Peers run with their documented defaults
(cache_aware) and with the settings a user would pick for sessions (vllm-router's
consistent_hash on x-session-id, round_robin as the cache-blind reference); `--peer-sweep`
tunes their cache_aware thresholds on a small grid first, and a best setting other than the
defaults joins the comparison as "<peer> tuned" (also read from an earlier sweep's file).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import csv
import dataclasses
import json
import math
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cacheroute.v1 import planner_pb2  # noqa: E402
from planner_svc.cli.demo import delivered_plan_report  # noqa: E402
from planner_svc.cli.ops_client import PlannerConnection  # noqa: E402
from planner_svc.devstack.engines import EngineFleet, start_engines  # noqa: E402
from planner_svc.devstack.llama import LlamaFleet, LlamaOptions, start_llama_fleet  # noqa: E402
from planner_svc.devstack.processes import stop_all  # noqa: E402
from planner_svc.devstack.routers import RouterSpec, peer_versions, start_routers  # noqa: E402
from planner_svc.devstack.stack import LocalStack, StackOptions, start_stack  # noqa: E402
from planner_svc.devstack.traffic import Driver, Record  # noqa: E402
from planner_svc.simulator.sessions import (  # noqa: E402
    SCENARIOS,
    GridCell,
    Scenario,
    grid_sample,
    grid_scenario,
    population,
    sessions,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grid_report  # noqa: E402

OUT = ROOT / "docs" / "results" / "arena"
Fleet = EngineFleet | LlamaFleet
ROUTERS = [
    RouterSpec("cacheroute", "cacheroute"),
    # the SGLang model gateway as its current package (`smg`, own virtualenv; its replicas
    # in a mesh), and as `sglang-router` 0.3.2, the package the arena measured before
    RouterSpec("smg cache_aware", "smg", "cache_aware"),
    RouterSpec("sglang cache_aware", "sglang", "cache_aware"),
    RouterSpec("sglang round_robin", "sglang", "round_robin"),
    RouterSpec("vllm cache_aware", "vllm", "cache_aware"),
    RouterSpec("vllm consistent_hash", "vllm", "consistent_hash"),
    # Only when named in --routers: the gateway with idle re-homing off (its default before
    # 2026-12-05), for an A/B of that default on the same engines and traffic.
    RouterSpec("cacheroute no-rehome", "cacheroute", extra=("--idle-rehome-s", "0")),
    # Only when named: the gateway without the planned-key spill (its rule before
    # 2026-12-05: a planned key over its bound re-homes), for an A/B of the spill.
    RouterSpec("cacheroute no-spill", "cacheroute", extra=("--spill-planned", "off")),
    # Only when named: the gateway weighing queues against recomputes (--queue-aware), its
    # default since 2026-12-06 (so the same as "cacheroute" now; kept for the commands that
    # measured it opt-in), and the gateway without it, for an A/B of that default.
    RouterSpec("cacheroute queue-aware", "cacheroute", extra=("--queue-aware", "on")),
    RouterSpec("cacheroute no-queue-aware", "cacheroute", extra=("--queue-aware", "off")),
    # Only when named: the SGLang gateway's power of two choices, the real router the
    # simulator's Flat-LB is checked against (bench/sim_vs_arena.py); no user picks it over
    # cache_aware for LLM traffic, so the comparison does not rank it.
    RouterSpec("sglang power_of_two", "sglang", "power_of_two"),
]
OPT_IN = ("cacheroute no-rehome", "cacheroute no-spill", "cacheroute queue-aware",
          "cacheroute no-queue-aware", "sglang power_of_two")
# The cache_aware policies' tuning flags (the same names in both peers; their defaults:
# cache threshold 0.3, balance when max load - min load > 64 and max > 1.5 x min). With four
# engines and tens of requests in flight, 64 never triggers: the grid lowers it, as a user
# tuning for TTFT would, and moves the match threshold either way.
PEER_GRID: list[tuple[str, tuple[str, ...]]] = [
    ("defaults", ()),
    ("balance 16 / 1.2", ("--balance-abs-threshold", "16", "--balance-rel-threshold", "1.2")),
    ("balance 4 / 1.1", ("--balance-abs-threshold", "4", "--balance-rel-threshold", "1.1")),
    ("cache 0.5, balance 16 / 1.2", ("--cache-threshold", "0.5", "--balance-abs-threshold",
                                     "16", "--balance-rel-threshold", "1.2")),
    ("cache 0.1, balance 16 / 1.2", ("--cache-threshold", "0.1", "--balance-abs-threshold",
                                     "16", "--balance-rel-threshold", "1.2")),
]
# The SGLang model gateway (smg 1.13) adds its own knobs that bear on cache affinity in
# front of HTTP engines: a warm-up slice that sends one cache miss in four (and one hit in
# eight) to a "thin" worker for 60 s after it joins, and overload protection that leaves a
# worker with 8 queued requests out of routing; swept off beside the shared grid.
SMG_GRID: list[tuple[str, tuple[str, ...]]] = [
    ("warm-up slice off", ("--worker-warmup-secs", "0", "--worker-warmup-divert-every", "0")),
    ("overload protection off", ("--disable-worker-overload-protection",)),
]
PEER_SETTINGS = OUT / "peer-sweep" / "peer-settings.json"  # where the documented sweep writes


# --quick (≤ 3 minutes on 2 cores): CacheRoute, both peers' cache_aware (the best peers in
# every full run) and round robin, the cache-blind reference; vLLM's consistent_hash (a
# session header hashed) runs in the full comparison only.
QUICK_ROUTERS = ("cacheroute", "smg cache_aware", "sglang cache_aware", "vllm cache_aware",
                 "sglang round_robin")
# ... of which these also run with 4 replicas (the JSON's *_4r figures need no more)
QUICK_REPLICATED = ("cacheroute", "sglang cache_aware")


# Where the arena issue sets a capacity target: ≥ 1.3x the best peer on paper-like and
# whale, within 5 % of it on low reuse.
CAPACITY_SCENARIOS = ("paper-like", "whale", "low-reuse")


# --grid: per cell, CacheRoute and the peers at one gateway, and CacheRoute and the SGLang
# model gateway (replicas in a mesh, sharing their trees: the peer's own answer to many
# gateways) at four and eight. CacheRoute's runs first, one after another (each next
# stack starts during the run before it).
# (`sglang-router` 0.3.2, the same gateway's earlier package, matched smg's hit to the tenth
# of a point on the quick cell and stays in the full comparison, not in the grid's 45 min.)
GRID_RUNS: tuple[tuple[str, int], ...] = (
    ("cacheroute", 1), ("cacheroute", 4), ("cacheroute", 8),
    ("smg cache_aware", 1), ("smg cache_aware", 4), ("smg cache_aware", 8),
    ("vllm cache_aware", 1))
# --grid --quick: one cell, every run of it (the machinery checked end to end)
GRID_QUICK_CELLS = 1


def replicated(spec: RouterSpec) -> bool:
    """Stateful routers (a plan, or a tree learned per replica): run with 1 and 4 replicas."""
    return spec.kind == "cacheroute" or spec.policy == "cache_aware"


@dataclass(frozen=True)
class Setup:
    engine_kind: str  # "emulator" or "llama" (real llama-server processes)
    engines: int
    time_scale: float
    kv_tokens: int
    warmup_s: float
    measure_s: float
    rate_scale: float
    slo_ttft_s: float
    # Where to keep CacheRoute's logs (planner, stream worker, gateways, decisions) of a run
    # whose TTFT p99 passed 3x the SLO: a collapsed point is explained from them ("" = not).
    logs_dir: str = ""
    client: str = "round-robin"  # --client: how requests reach several router replicas


class CacheRouteStack:
    """CacheRoute's control plane for the runs. Fresh (the default): every CacheRoute run
    starts a new stack, so it begins, like each peer's new process and the engines reset to
    cold, with nothing learned; a plan learned in an earlier run of the same tenants would
    be a head start no peer gets. A fresh stack is stopped as its run ends (in the
    background), so no peer runs beside an idle control plane (~7 % of a core: broker,
    stream worker, planner). Warm: one stack for all runs (faster, biased)."""

    def __init__(self, options: StackOptions, fresh: bool, settle_s: float) -> None:
        self.options, self.fresh, self.settle_s = options, fresh, settle_s
        self.runs = 0
        self.current: LocalStack | None = None
        self._stopping: list[threading.Thread] = []
        # Set by the caller when the run after this one is CacheRoute's too: its fresh stack
        # then starts in the background as this run begins (its start-up CPU, ~2 s of it,
        # lands in CacheRoute's own warm-up; it idles at ~7 % of a core meanwhile).
        self.next_is_cacheroute = False
        self._standby: concurrent.futures.Future[LocalStack] | None = None
        self._starter = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="stack-start")

    def _start(self) -> LocalStack:
        workdir = Path(self.options.workdir) / f"run-{self.runs}"  # nothing carried over
        self.runs += 1
        stack = start_stack(dataclasses.replace(self.options, workdir=str(workdir)))
        time.sleep(self.settle_s)  # start_stack waited for the stream and the planner
        return stack

    def for_run(self) -> LocalStack:
        if self.current is None:
            standby, self._standby = self._standby, None
            self.current = standby.result() if standby is not None else self._start()
        if self.fresh and self.next_is_cacheroute and self._standby is None:
            self._standby = self._starter.submit(self._start)
        return self.current

    def run_ended(self) -> None:
        """A CacheRoute run is over: a fresh stack stops (its processes exit while the next
        run starts), a warm one stays for the next run."""
        if self.fresh and self.current is not None:
            stopping = threading.Thread(target=self.current.stop, name="stack-stop")
            stopping.start()
            self._stopping.append(stopping)
            self.current = None

    def stop(self) -> None:
        if self._standby is not None:  # (the run it was for did not happen)
            with contextlib.suppress(Exception):
                self._standby.result().stop()
            self._standby = None
        if self.current is not None:
            self.current.stop()
            self.current = None
        for stopping in self._stopping:
            stopping.join()
        self._starter.shutdown()


def p99_interval(samples: list[tuple[int, float]], resamples: int = 1000,
                 level: float = 0.9) -> tuple[float, float]:
    """A `level` bootstrap interval of the 99th percentile of (conversation, value) samples,
    resampling whole conversations (a conversation's turns share a destination and a cache,
    so they are not independent). A capacity point's p99 rests on its few slowest requests:
    this says roughly how far another run's could land (a bootstrap of a tail quantile runs
    narrow when a handful of conversations make the tail: a guide, not a guarantee)."""
    if len(samples) < 2:
        return math.nan, math.nan
    order = sorted(range(len(samples)), key=lambda i: samples[i][0])
    values = np.array([samples[i][1] for i in order])
    sids = np.array([samples[i][0] for i in order])
    starts = np.flatnonzero(np.r_[True, sids[1:] != sids[:-1]])
    lengths = np.diff(np.r_[starts, len(values)])
    rng = np.random.default_rng(0)
    p99s = []
    for drawn in rng.integers(0, len(starts), size=(resamples, len(starts))):
        n = lengths[drawn]
        # every sample of every drawn conversation: its start plus 0..length-1
        offsets = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
        p99s.append(float(np.percentile(values[np.repeat(starts[drawn], n) + offsets], 99)))
    tail = (1.0 - level) / 2
    return float(np.quantile(p99s, tail)), float(np.quantile(p99s, 1.0 - tail))


def summarise(records: list[Record], warmup_s: float, loads: list[float]) -> dict[str, Any]:
    """`loads`: what each engine served in the measured part (requests for the emulator,
    prompt tokens for llama-server, which counts no requests)."""
    measured = [r for r in records if r.sent_s >= warmup_s]
    ok = [r for r in measured if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    ttft = np.array([r.ttft_s for r in ok]) if ok else np.array([math.nan])
    e2e = np.array([r.e2e_s for r in ok]) if ok else np.array([math.nan])
    per_engine = np.array(loads, dtype=float)
    lo, hi = p99_interval([(r.sid, r.ttft_s) for r in ok])
    # Where the misses are: a first turn can meet only shared content (system prompt,
    # documents), a later turn also its own conversation's history.
    later = [r for r in ok if r.turn > 0]
    later_prompt = sum(r.prompt_tokens for r in later)
    first_prompt = prompt - later_prompt
    later_cached = sum(r.cached_tokens for r in later)
    return {
        "requests": len(measured),
        "errors": len(measured) - len(ok),
        "hit": cached / prompt if prompt else 0.0,
        "ttft_p50_s": float(np.percentile(ttft, 50)),
        "ttft_p99_s": float(np.percentile(ttft, 99)),
        "ttft_p99_lo_s": lo,
        "ttft_p99_hi_s": hi,
        "e2e_p99_s": float(np.percentile(e2e, 99)),
        "imbalance": float(per_engine.max() / per_engine.mean()) if per_engine.sum() else 0.0,
        "first_turn_hit": (cached - later_cached) / first_prompt if first_prompt else 0.0,
        "later_turn_hit": later_cached / later_prompt if later_prompt else 0.0,
        "later_turn_token_share": later_prompt / prompt if prompt else 0.0,
    }


def engine_side(timings: list[dict[str, Any]], since: float) -> dict[str, float]:
    """The emulated engines' side of the measured requests (those that arrived at `since`,
    time.monotonic, or later): the TTFT p50/p99 the engine model gave them, which depends on
    where the router sent them and nothing else, and the p99 of how late their first token
    went out (the engines' event loop behind its deadlines: CPU taken by whatever else runs
    on these cores). A client's TTFT above the engine's is the router, the network and
    that lateness."""
    rows = np.array([row for e in timings
                     for row in zip(e["arrived_s"], e["ttft_s"], e["late_s"], strict=True)],
                    dtype=float).reshape(-1, 3)
    measured = rows[rows[:, 0] >= since]
    ttft, late = measured[:, 1], measured[:, 2]
    if not ttft.size:
        return {}
    return {"engine_ttft_p50_s": float(np.percentile(ttft, 50)),
            "engine_ttft_p99_s": float(np.percentile(ttft, 99)),
            "engine_late_p99_s": float(np.percentile(late, 99))}


@dataclass(frozen=True)
class Membership:
    """Gateways joining and leaving during a run: the first `base` replicas take the
    traffic from the start, every replica from `join_s` on, and the first `base` leave at
    `leave_s` (out of the client's rotation; their processes stopped `grace_s` later, once
    their requests have answered). All replicas start with the run, so a joining one has
    had the plan (CacheRoute) or the mesh (smg) but none of the traffic."""

    base: int
    join_s: float
    leave_s: float
    grace_s: float = 2.0

    def active(self, t: float, n: int) -> range:
        if t < self.join_s:
            return range(self.base)
        return range(n) if t < self.leave_s else range(self.base, n)


class _Rotation:
    """The driver's round robin over the replicas a `Membership` has in at each moment."""

    def __init__(self, membership: Membership, n: int, driver: Driver) -> None:
        self.membership, self.n, self.driver, self.i = membership, n, driver, 0

    def __iter__(self) -> _Rotation:
        return self

    def __next__(self) -> int:
        active = self.membership.active(time.monotonic() - self.driver.started_at, self.n)
        self.i += 1
        return active[self.i % len(active)]


def run_one(spec: RouterSpec, replicas: int, scenario: Scenario, seed: int, setup: Setup,
            fleet: Fleet, stacks: CacheRouteStack, work: Path, rate_scale: float,
            label: str, fail_at_s: float | None = None,
            membership: Membership | None = None) -> dict[str, Any]:
    """One router (with `replicas` replicas) on one scenario. `fail_at_s`: the first engine
    goes down (stops listening, connections cut) at that time and stays down to the end.
    `membership`: replicas join and leave the client's rotation during the run."""
    stack = stacks.for_run() if spec.kind == "cacheroute" else None
    for engine in fleet.urls:
        fleet.reset(engine)
    cacheroute = ({"redis-url": stack.redis_url, "public-key": str(stack.public_key_path),
                   "bootstrap": stack.bootstrap, "max-plan-age-s": "3600"}
                  if stack is not None else {})
    routers = start_routers(spec, replicas, fleet.urls, work, cacheroute=cacheroute)
    started_ms = int(time.time() * 1000)
    try:
        sc = scenario.scaled(sessions_per_s=scenario.sessions_per_s * rate_scale)
        pop = population(sc, seed)
        total = setup.warmup_s + setup.measure_s
        plan = sessions(pop, total)
        headers = None
        if spec.policy == "consistent_hash":  # how its users key sessions (a header)
            def headers(s: Any) -> dict[str, str]:
                return {"x-session-id": f"{seed}-{s.sid}"}
        cpu0 = routers.cpu_seconds()
        # CacheRoute's control plane (broker, Redis, stream worker, planner) runs on the
        # cores the engines and the driver use: its CPU is counted apart.
        control = stack.processes() if stack is not None else []
        control0 = sum(p.cpu_seconds() for p in control)
        driver = Driver(routers.urls, pop, headers=headers,
                        session_affine=setup.client == "session")
        leaving = None
        if membership is not None:  # (the driver's rotation is its one choice of replica)
            driver._next = _Rotation(membership, replicas, driver)  # type: ignore[assignment]
            leaving = threading.Timer(membership.leave_s + membership.grace_s, stop_all,
                                      [routers.processes[:membership.base]])
        done = [0.0]

        def progress(frac: float) -> None:
            if frac - done[0] >= 0.25 or frac >= 1.0:
                done[0] = frac
                print(f"\r  {label}: {frac:4.0%}", end="", file=sys.stderr, flush=True)

        warm: dict[str, list[Any]] = {}
        victim = next(iter(fleet.urls))
        if leaving is not None:
            leaving.start()
        try:
            records = asyncio.run(_drive_after(driver, plan, total, setup.warmup_s, fleet,
                                               warm, progress, fail_at_s, victim))
        finally:
            if leaving is not None:
                leaving.join()
            if fail_at_s is not None:
                fleet.control(victim, "fault", {"mode": "up"})  # type: ignore[union-attr]
        after = [fleet.load(e) for e in fleet.urls]
        print(file=sys.stderr)
        if "CACHEROUTE_ARENA_RECORDS" in os.environ:  # a diagnostic: every request, as a CSV
            keep_records(records, Path(os.environ["CACHEROUTE_ARENA_RECORDS"])
                         / f"{_slug(f'{scenario.name} s{seed} {label}')}.csv")
        loads = [a - b for a, b in zip(after, warm["loads"], strict=True)]
        row = summarise(records, setup.warmup_s, loads)
        if isinstance(fleet, EngineFleet):
            row.update(engine_side([fleet.timings(e) for e in fleet.urls],
                                   driver.started_at + setup.warmup_s))
        if fail_at_s is not None:  # what the clients saw once the engine was gone: every
            # request that ended after it (those in flight on the victim included)
            ended_after = [r for r in records if r.sent_s + r.e2e_s >= fail_at_s]
            down = summarise(ended_after, -math.inf, loads[1:])
            row.update(scenario=f"{scenario.name} + engine down", failed_at_s=fail_at_s,
                       errors_after_failure=down["errors"], hit_after_failure=down["hit"],
                       ttft_p99_after_failure_s=down["ttft_p99_s"])
        if stack is not None:  # did its plan deliver?
            delivered = delivered_plan_report(stack, since_ms=started_ms) or {}
            row.update(plan_version=delivered.get("version", ""),
                       plan_predicted_hit=delivered.get("predicted_hit_rate"),
                       plan_measured_hit=delivered.get("hit_rate"),
                       plan_windows=delivered.get("windows", 0),
                       **decisions_since(stack, started_ms))
        # (NaN, nothing measured answered, is the worst collapse of all: kept too)
        if (stack is not None and setup.logs_dir
                and not row["ttft_p99_s"] <= 3 * setup.slo_ttft_s):
            row["logs"] = keep_logs(stack, work, Path(setup.logs_dir)
                                    / _slug(f"{scenario.name} s{seed} {label}"))
        row.setdefault("scenario", scenario.name)
        row.update(router=spec.name, replicas=replicas, seed=seed,
                   rate_scale=rate_scale, time_scale=setup.time_scale,
                   warmup_s=setup.warmup_s, measure_s=setup.measure_s,
                   kv_tokens=setup.kv_tokens, engine_kind=setup.engine_kind, client=setup.client,
                   cpu_s=routers.cpu_seconds() - cpu0,
                   control_cpu_s=sum(p.cpu_seconds() for p in control) - control0,
                   router_rss_mb=routers.peak_rss_mb())
        return row
    finally:
        routers.stop()
        if stack is not None:
            stacks.run_ended()


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label).strip("-")


def keep_logs(stack: LocalStack, work: Path, dest: Path) -> str:
    """Copy a CacheRoute run's logs (its stack's processes and its gateways) to `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    for log_file in [*stack.workdir.glob("*.log"), *work.glob("cacheroute-*.log")]:
        shutil.copy2(log_file, dest / log_file.name)
    print(f"  kept the run's logs in {dest}", file=sys.stderr)
    return str(dest)


def keep_records(records: list[Record], path: Path) -> None:
    """Every request of a run (`Record`'s fields, one row each), for looking into a point."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = [f.name for f in dataclasses.fields(Record)]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(fields)
        w.writerows([getattr(r, k) for k in fields] for r in records)


def decisions_since(stack: LocalStack, since_ms: int) -> dict[str, Any]:
    """How CacheRoute's planner acted during a run: installs, and the newest reason."""
    conn = PlannerConnection(stack.grpc_target, stack.options.operator_token)
    try:
        listed = conn.call("ListDecisions", planner_pb2.ListDecisionsRequest(limit=200))
    finally:
        conn.close()
    ours = [d for d in listed.decisions if d.at_ms >= since_ms]
    installs = [d for d in ours if d.action == "install"]
    if "CACHEROUTE_ARENA_DECISIONS" in os.environ:  # a diagnostic: every reason, in order
        for d in sorted(ours, key=lambda d: d.id):
            print(f"    {(d.at_ms - since_ms) / 1000:6.1f} s  {d.action:8s} {d.reason}",
                  file=sys.stderr)
    return {"plan_installs": len(installs),
            "last_decision": max(ours, key=lambda d: d.id).reason if ours else ""}


async def _drive_after(driver: Driver, plan: list[Any], total: float, warmup_s: float,
                       fleet: Fleet, warm: dict[str, list[Any]], progress: Any,
                       fail_at_s: float | None = None, victim: str = "") -> list[Record]:
    """Run the traffic; snapshot the engines' counters when the warm-up ends (and take the
    victim engine down at `fail_at_s`)."""
    async def mark() -> None:
        await asyncio.sleep(warmup_s)
        warm["loads"] = await asyncio.to_thread(lambda: [fleet.load(e) for e in fleet.urls])

    async def fail() -> None:
        if fail_at_s is not None:
            await asyncio.sleep(fail_at_s)
            await asyncio.to_thread(fleet.control, victim, "fault",  # type: ignore[union-attr]
                                    {"mode": "down"})

    marker, failure = asyncio.create_task(mark()), asyncio.create_task(fail())
    records = await driver.run(plan, total, progress)
    await marker
    await failure
    return records


def cap_label(router: str, replicas: int) -> str:
    return router if replicas == 1 else f"{router} ({replicas} replicas)"


def peer_sweep(peers: list[RouterSpec], scenario: Scenario, setup: Setup, fleet: Fleet,
               stacks: CacheRouteStack, work: Path, rate_scale: float,
               out: Path) -> tuple[list[RouterSpec], list[dict[str, Any]]]:
    """Each tunable peer (a cache_aware policy) over `PEER_GRID`, one replica, seed 1, at
    `rate_scale` x the scenario's load (loaded enough for the settings to matter). The best
    setting of each (`choose_setting`) is written to `out`/peer-settings.json and returned
    as a router of its own ("<peer> tuned") for the comparison, beside the peer at its
    defaults, unless the defaults are the best."""
    rows: list[dict[str, Any]] = []
    for peer in peers:
        for label, extra in PEER_GRID + (SMG_GRID if peer.kind == "smg" else []):
            spec = dataclasses.replace(peer, extra=(*peer.extra, *extra))
            row = run_one(spec, 1, scenario, 1, setup, fleet, stacks, work, rate_scale,
                          f"peer sweep {peer.name}: {label}")
            row.update(router=peer.name, setting=label, flags=list(extra))
            rows.append(row)
    meta = {"scenario": scenario.name, "rate_scale": rate_scale,
            "time_scale": setup.time_scale, "engine_kind": setup.engine_kind,
            "peer_versions": peer_versions(),
            "command": " ".join([".venv/bin/python bench/arena.py", *sys.argv[1:]])}
    return tuned_from(write_peer_settings(rows, meta, out), peers), rows


def choose_setting(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One peer's best row of its sweep: its defaults unless a setting's TTFT p99 (the SLO's
    measure) lies below the defaults' 90 % interval (a p99 rests on a few slow requests, so
    a smaller one inside the interval is noise, not a better setting); of several, the
    lowest p99, hit breaking ties. Rows with errors or nothing measured never win."""
    ok = [r for r in rows if not r["errors"] and r["ttft_p99_s"] == r["ttft_p99_s"]]
    defaults = next((r for r in ok if not r["flags"]), None)
    bar = defaults["ttft_p99_lo_s"] if defaults is not None else math.inf
    better = [r for r in ok if r["flags"] and r["ttft_p99_s"] < bar]
    if better:
        return min(better, key=lambda r: (r["ttft_p99_s"], -r["hit"]))
    return defaults


def write_peer_settings(rows: list[dict[str, Any]], meta: dict[str, Any],
                        out: Path) -> dict[str, dict[str, Any]]:
    """peer-settings.json (what `tuned_peers` reads) and peer-settings.md from a sweep's rows;
    the best setting per peer."""
    best: dict[str, dict[str, Any]] = {}
    for peer in dict.fromkeys(r["router"] for r in rows):
        chosen = choose_setting([r for r in rows if r["router"] == peer])
        if chosen is not None:
            best[peer] = {"setting": chosen["setting"], "flags": list(chosen["flags"])}
    keys = ("router", "setting", "flags", "hit", "ttft_p50_s", "ttft_p99_s", "ttft_p99_lo_s",
            "ttft_p99_hi_s", "e2e_p99_s", "imbalance", "errors")
    out.mkdir(parents=True, exist_ok=True)
    (out / "peer-settings.json").write_text(json.dumps(
        {**meta, "best": best, "rows": [{k: r.get(k) for k in keys} for r in rows]}, indent=1))
    lines = [f"# Peer settings sweep ({meta['scenario']}, x{meta['rate_scale']:g} load, time "
             f"scale {meta['time_scale']:g}, 1 replica, seed 1)", "",
             f"Command: `{meta['command']}`; peers {json.dumps(meta['peer_versions'])}. Best = "
             "the defaults unless a setting's TTFT p99 lies below the defaults' 90 % interval "
             "(then the lowest such p99; rows with errors never win); a best other than the "
             "defaults runs in the comparison as `<peer> tuned`.", "",
             "| peer | setting | flags | hit | TTFT p50 s | TTFT p99 s (90 % interval) | "
             "imbalance | errors | best |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mark = "**best**" if best.get(r["router"], {}).get("setting") == r["setting"] else ""
        lines.append(f"| {r['router']} | {r['setting']} | `{' '.join(r['flags']) or '-'}` | "
                     f"{r['hit']:.1%} | {r['ttft_p50_s']:.3f} | {r['ttft_p99_s']:.3f} "
                     f"({r['ttft_p99_lo_s']:.3f}-{r['ttft_p99_hi_s']:.3f}) | "
                     f"{r['imbalance']:.2f} | {r['errors']} | {mark} |")
    (out / "peer-settings.md").write_text("\n".join(lines) + "\n")
    return best


def tuned_peers(path: Path, peers: list[RouterSpec]) -> list[RouterSpec]:
    """The tuned peers of an earlier sweep (`peer_sweep`'s file), for the peers present."""
    try:
        best = json.loads(path.read_text())["best"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return tuned_from(best, peers) if isinstance(best, dict) else []


def tuned_from(best: dict[str, Any], peers: list[RouterSpec]) -> list[RouterSpec]:
    """"<peer> tuned" for each peer whose best setting (a sweep's `best`) is not its
    defaults; a malformed entry adds none."""
    out = []
    for peer in peers:
        entry = best.get(peer.name)
        flags = entry.get("flags") if isinstance(entry, dict) else None
        if isinstance(flags, list) and flags and all(isinstance(f, str) for f in flags):
            out.append(dataclasses.replace(peer, name=f"{peer.name} tuned",
                                           extra=(*peer.extra, *flags)))
    return out


def capacity(spec: RouterSpec, scenario: Scenario, seed: int, setup: Setup, fleet: Fleet,
             stacks: CacheRouteStack, work: Path, scales: list[float],
             replicas: int = 1) -> tuple[float, list[dict]]:
    """The offered load (sessions/s) at which TTFT p99 reaches the SLO, by a sweep: linear
    between the last point that met it and the first that did not (the sweep's steps are
    coarser than the differences between routers); the last point if none failed."""
    best, rows = 0.0, []
    for scale in scales:
        row = run_one(spec, replicas, scenario, seed, setup, fleet, stacks, work, scale,
                      f"capacity {cap_label(spec.name, replicas)} x{scale:g}")
        row.update(label=cap_label(spec.name, replicas),
                   sessions_per_s=scenario.sessions_per_s * scale)
        rows.append(row)
        if row["ttft_p99_s"] <= setup.slo_ttft_s and row["errors"] == 0:
            best = scale
            continue
        if best and not row["errors"]:
            prev = rows[-2]["ttft_p99_s"]
            frac = (setup.slo_ttft_s - prev) / max(row["ttft_p99_s"] - prev, 1e-9)
            best += min(max(frac, 0.0), 1.0) * (scale - best)
        break
    return scenario.sessions_per_s * best, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one scenario, short runs (slow tier)")
    ap.add_argument("--seeds", type=int, default=1,
                    help="seeds 1..N of the comparison runs (0: none, the capacity sweep only)")
    ap.add_argument("--scenarios", default="paper-like,shared-system-prompt,whale,low-reuse")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--engine-kind", choices=("emulator", "llama"), default="emulator",
                    help="emulated engines, or real llama.cpp llama-server processes on a "
                    "tiny random model (built on first use; see planner_svc/devstack/llama.py)")
    ap.add_argument("--time-scale", type=float, default=None,
                    help="engine model durations x this (1 = a 70B-class replica; "
                    "default 1, with --grid 2: its knee cells offer up to ~80 requests/s "
                    "at 1, more than the driver sends on two cores)")
    ap.add_argument("--kv-tokens", type=int, default=60_000, help="KV cache per engine")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="offered load x this")
    ap.add_argument("--warmup-s", type=float, default=0.0, help="0: 15 (x the time scale above 1)")
    ap.add_argument("--measure-s", type=float, default=0.0, help="0: 10 (quick) or 12")
    ap.add_argument("--slo-ttft-s", type=float, default=2.0)
    ap.add_argument("--q-cap", type=float, default=0.0,
                    help="CacheRoute's q_cap (0: the engines' knee, 12 req/s / time scale); "
                    "set it wrong to see `plan report` show the gap")
    ap.add_argument("--rate-noise-z", type=float, default=0.0,
                    help="CacheRoute's rate_noise_z (hold per-key rates within this many "
                    "Poisson standard errors of the installed plan's; 0 = off)")
    ap.add_argument("--routers", default="",
                    help="comma-separated names (default: all; '<peer> tuned' for a tuned one)")
    ap.add_argument("--capacity-scales", default="1,1.5,2,3,4",
                    help="load multiples of the capacity sweep ('' skips it)")
    ap.add_argument("--capacity-seeds", default="1",
                    help="seeds of the capacity sweep, e.g. 1,2,3 (each router swept once per "
                    "seed; the capacity reported is the median)")
    ap.add_argument("--capacity-replicas", default="1",
                    help="router replica counts of the capacity sweep, e.g. 1,4 (each against "
                    "the best peer at that count)")
    ap.add_argument("--capacity-scenarios", default=",".join(CAPACITY_SCENARIOS),
                    help="which of --scenarios the capacity sweep runs on (by default those "
                    "the arena issue sets a capacity target for)")
    ap.add_argument("--capacity-peers", default="",
                    help="peers the capacity sweep runs beside CacheRoute (comma list; '': "
                    "the best peer by hit rate at that replica count, or the first named); "
                    "on low reuse the cache-blind peer can be the one to beat")
    ap.add_argument("--settle-s", type=float, default=1.0,
                    help="idle time after CacheRoute's stack is up (its stream worker owns "
                    "every partition, its planner answers), before its run")
    ap.add_argument("--warm-cacheroute", action="store_true",
                    help="one CacheRoute stack for every run (faster; later runs start with "
                    "the plan learned in earlier ones, a head start no peer gets)")
    ap.add_argument("--client", choices=("round-robin", "session"), default="round-robin",
                    help="how the traffic reaches several router replicas: in turn, or every "
                    "turn of a conversation to the same replica (a session-affine balancer)")
    ap.add_argument("--failure-scenario", default="paper-like",
                    help="after the comparison, run every router (1 replica) on this scenario "
                    "once more with an engine going down a third into the measurement "
                    "('' skips it; emulated engines only)")
    ap.add_argument("--peer-sweep", default="", metavar="SCENARIO",
                    help="first tune the peers' cache_aware policies on this scenario (a small "
                    "grid of their balance and match thresholds, one replica, seed 1), write "
                    "peer-settings.json and run the best as '<peer> tuned' beside the defaults; "
                    "a grid cell's name (grid-...) sweeps on that cell; with --routers, only "
                    "the peers named")
    ap.add_argument("--peer-sweep-scale", type=float, default=3.0,
                    help="offered load x this for the peer sweep (loaded: settings matter)")
    ap.add_argument("--peer-settings", default=str(PEER_SETTINGS),
                    help="without --peer-sweep: the tuned peers of an earlier sweep, run beside "
                    "the defaults ('' or a missing file: defaults only)")
    ap.add_argument("--grid", action="store_true",
                    help="the scenario grid's fixed sample of cells (sessions.grid_sample) "
                    "instead of --scenarios: CacheRoute and the peers at 1 gateway, "
                    "CacheRoute and smg (a mesh) at 4 and 8; heat maps, a table, a CSV "
                    "(with --quick: its first cell only)")
    ap.add_argument("--grid-cells", type=int, default=0,
                    help="with --grid: how many cells of the sample (0: all)")
    ap.add_argument("--join-leave", action="store_true",
                    help="with --grid: then, on its first cell, CacheRoute and smg with 8 "
                    "gateways of which 4 take traffic, 8 from a third of the measurement "
                    "on, the other 4 from two thirds on (the first 4 stopped)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    if args.peer_sweep and args.peer_sweep not in SCENARIOS:
        try:
            grid_scenario(args.peer_sweep)
        except KeyError:
            ap.error(f"--peer-sweep: unknown scenario {args.peer_sweep!r}")
    if args.time_scale is None:
        args.time_scale = 2.0 if args.grid else 1.0
    # checked before any run: a typo found after an hour of runs would lose them all
    capacity_scenarios = list(dict.fromkeys(
        x.strip() for x in args.capacity_scenarios.split(",") if x.strip()))
    unknown = [x for x in capacity_scenarios if x not in SCENARIOS]
    if unknown:
        ap.error(f"--capacity-scenarios: unknown scenario(s) {', '.join(unknown)} "
                 f"(known: {', '.join(SCENARIOS)})")
    skipped = [x for x in capacity_scenarios if x not in args.scenarios.split(",")]
    if skipped and args.capacity_scales and not args.quick:
        print(f"note: no capacity sweep on {', '.join(skipped)}: not in --scenarios",
              file=sys.stderr)
    quick = args.quick
    llama = args.engine_kind == "llama"
    # Slowed engines (time scale > 1) take proportionally less load, so a stream window of
    # the same length would hold proportionally fewer requests: CacheRoute's windows, control
    # interval and the warm-up that covers its learning stretch by the same factor, as q_cap
    # shrinks by it. (Every router gets the same warm-up; peers learn from each request.)
    slow = 1.0 if args.engine_kind == "llama" else max(1.0, args.time_scale)
    if args.grid:  # its loads are per cell: a 6-s window holds >= 100 requests at light
        slow = 1.0
    setup = Setup(engine_kind=args.engine_kind, engines=args.engines,
                  # llama-server runs at its own speed: no time scale
                  time_scale=1.0 if llama else args.time_scale, kv_tokens=args.kv_tokens,
                  # the warm-up covers CacheRoute's learning: its first plan lands ~10 s
                  # in (a whole stream window of traffic after the first one ends, then
                  # the planner's next timer step), and 5 s of caches warming under it
                  # (longer on slowed engines)
                  warmup_s=args.warmup_s or 15.0 * slow,
                  measure_s=args.measure_s or (10.0 if quick or args.grid else 12.0),
                  rate_scale=args.rate_scale, slo_ttft_s=args.slo_ttft_s,
                  logs_dir=str(Path(args.out) / "logs"), client=args.client)
    def scaled(name: str) -> Scenario:  # the offered load on engines slowed by the time scale
        base = SCENARIOS[name] if name in SCENARIOS else grid_scenario(name, setup.engines)
        return base.offered(args.rate_scale, setup.time_scale)

    names = ["paper-like"] if quick else args.scenarios.split(",")
    scenarios = [scaled(n) for n in names]
    wanted = set(args.routers.split(",")) if args.routers else None
    routers = [r for r in ROUTERS if r.installed]  # `wanted` picks, after the tuned join
    missing = [r.name for r in ROUTERS if not r.installed]
    work = Path(tempfile.mkdtemp(prefix="arena-"))
    t_start = time.monotonic()
    fleet: Fleet
    if llama:  # real time: the model's own speed, KV per the host-RAM cache (~527 B/token)
        (work / "llama").mkdir()
        fleet = start_llama_fleet(work / "llama", setup.engines, LlamaOptions(
            cache_ram_mib=max(1, setup.kv_tokens * 527 >> 20)))
    else:
        fleet = start_engines(work, setup.engines, extra=[
            "--time-scale", str(setup.time_scale), "--kv-tokens", str(setup.kv_tokens),
            "--faults", "--model", "arena-model"])
    stacks = CacheRouteStack(StackOptions(
        destinations=setup.engines, destination_specs=fleet.destinations(), window_s=6.0 * slow,
        # q_cap: an engine's knee (~12 req/s for the emulated engine at time scale 1, where
        # the capacity sweep's TTFT bends); slower engines take proportionally less
        hop_s=2.0 * slow, interval_s=4.0 * slow, q_cap=args.q_cap or 12.0 / setup.time_scale,
        warm_slots_per_destination=12, rate_noise_z=args.rate_noise_z,
        workdir=str(work / "stack")), fresh=not args.warm_cacheroute, settle_s=args.settle_s)
    rows: list[dict[str, Any]] = []
    cap_rows: list[dict[str, Any]] = []
    tunable = [r for r in routers if r.kind != "cacheroute" and r.policy == "cache_aware"
               and (wanted is None or r.name in wanted)]
    if args.grid:
        # a peer's best setting from a sweep named by --peer-settings (the default file was
        # swept on shared-system-prompt, not on the grid: only an explicit one is read)
        explicit = args.peer_settings and Path(args.peer_settings) != PEER_SETTINGS
        tuned = tuned_peers(Path(args.peer_settings), tunable) if explicit else []
        try:
            return grid_main(args, setup, fleet, stacks, work, routers, tuned, missing,
                             t_start)
        finally:
            stacks.stop()
            fleet.stop()
            shutil.rmtree(work, ignore_errors=True)
    try:
        if args.peer_sweep:
            tuned, _ = peer_sweep(tunable, scaled(args.peer_sweep), setup, fleet, stacks, work,
                                  args.peer_sweep_scale, Path(args.out))
        else:
            tuned = tuned_peers(Path(args.peer_settings), tunable) if args.peer_settings else []
        routers = [r for r in [*routers, *tuned]
                   if (r.name not in OPT_IN if wanted is None else r.name in wanted)]
        left_out = unswept([r.name for r in routers],
                           [p for p in args.capacity_peers.split(",") if p])
        if left_out and args.capacity_scales and not quick:
            # an A/B of a CacheRoute variant swept only CacheRoute before this said so
            print(f"warning: the capacity sweep leaves out {', '.join(left_out)} "
                  "(name them in --capacity-peers to sweep them)", file=sys.stderr)
        runs = [(scenario, seed, spec, replicas)
                for scenario in scenarios for seed in range(1, args.seeds + 1)
                for spec in routers if not quick or spec.name in QUICK_ROUTERS
                for replicas in ((1, 4) if replicated(spec) else (1,))
                if not (quick and replicas == 4 and spec.name not in QUICK_REPLICATED)]
        for i, (scenario, seed, spec, replicas) in enumerate(runs):
            # CacheRoute's runs follow each other: the next one's stack starts during this
            # one's warm-up (in its own run, not a peer's)
            stacks.next_is_cacheroute = i + 1 < len(runs) and runs[i + 1][2].kind == "cacheroute"
            label = f"{scenario.name} s{seed} {spec.name} x{replicas}"
            rows.append(run_one(spec, replicas, scenario, seed, setup, fleet, stacks, work,
                                1.0, label))
        stacks.next_is_cacheroute = False
        failing = [s for s in scenarios if s.name == args.failure_scenario]
        if failing and not quick and not llama:
            fail_at = setup.warmup_s + setup.measure_s / 3
            for spec in routers:
                rows.append(run_one(spec, 1, failing[0], 1, setup, fleet, stacks, work, 1.0,
                                    f"{failing[0].name} {spec.name}: engine down",
                                    fail_at_s=fail_at))
        per_seed: dict[str, list[float]] = {}
        scales = [float(x) for x in args.capacity_scales.split(",") if x]
        cap_seeds = sorted({int(x) for x in args.capacity_seeds.split(",") if x})
        replicas_for_capacity = [int(x) for x in args.capacity_replicas.split(",") if x]
        named = [p for p in args.capacity_peers.split(",") if p]
        if not quick and scales:
            for name in capacity_scenarios:
                found = [s for s in scenarios if s.name == name]
                if not found:
                    continue
                for n in replicas_for_capacity:
                    # without comparison runs to rank them, the first peer named
                    peers = named or [_best_peer(rows, name, n) or next(
                        (r.name for r in routers if r.kind != "cacheroute"), "")]
                    for seed in cap_seeds:
                        # (the first router is CacheRoute, unless only peers were named:
                        # then a peer swept once, not again as its own "best peer")
                        swept = {r.name: r for r in [routers[0], *[
                            r for r in routers if r.name in peers]]}
                        for spec in swept.values():
                            value, sweep = capacity(spec, found[0], seed, setup, fleet, stacks,
                                                    work, scales, n)
                            per_seed.setdefault(f"{name}/{cap_label(spec.name, n)}",
                                                []).append(value)
                            cap_rows += sweep
        cap = {k: v[_middle_seed(v, _seed_sweeps(k, cap_rows)[1])]
               for k, v in per_seed.items()}
    finally:
        stacks.stop()
        fleet.stop()
    elapsed = time.monotonic() - t_start
    summary = report(rows, cap, setup, Path(args.out), missing, elapsed, quick, cap_rows,
                     per_seed)
    print(json.dumps(summary))
    if "CACHEROUTE_ARENA_KEEP" not in os.environ:  # a diagnostic: keep every log
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"kept {work}", file=sys.stderr)
    return 0


def grid_cells_for(args: argparse.Namespace) -> list[GridCell]:
    """The cells a --grid run measures: the fixed sample, or its first few."""
    cells = grid_sample()
    n = GRID_QUICK_CELLS if args.quick else args.grid_cells or len(cells)
    return cells[:n]


def grid_main(args: argparse.Namespace, setup: Setup, fleet: Fleet, stacks: CacheRouteStack,
              work: Path, routers: list[RouterSpec], tuned: list[RouterSpec],
              missing: list[str], t_start: float) -> int:
    """--grid: every cell of the sample, every run of GRID_RUNS on it (one seed), then the
    grid's table, CSVs and heat maps under --out and the last-line JSON. A peer with a
    tuned setting (`tuned`, from a sweep) runs at it instead of its defaults."""
    by_name = {r.name: r for r in routers}
    by_name.update({r.name.removesuffix(" tuned"): r for r in tuned})
    runs = [(cell, by_name[name], n) for cell in grid_cells_for(args)
            for name, n in GRID_RUNS if name in by_name]
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    for i, (cell, spec, n) in enumerate(runs):
        stacks.next_is_cacheroute = i + 1 < len(runs) and runs[i + 1][1].kind == "cacheroute"
        scenario = cell.scenario(setup.engines).offered(args.rate_scale, setup.time_scale)
        label = f"[{i + 1}/{len(runs)}] {cell.name} {spec.name} x{n}"
        try:  # one run that cannot start does not lose the others' (it is reported)
            rows.append(run_one(spec, n, scenario, 1, setup, fleet, stacks, work, 1.0, label))
        except Exception as exc:
            print(f"\n  {label} failed: {exc}", file=sys.stderr)
            failed.append(f"{label}: {type(exc).__name__}")
    stacks.next_is_cacheroute = False
    out = Path(args.out)
    summary = grid_outputs(rows, setup, out, missing, time.monotonic() - t_start)
    moving: list[dict[str, Any]] = []
    if args.join_leave and runs:  # on the first cell: 4 gateways, 8 from 1/3, 4 from 2/3
        cell = runs[0][0]
        scenario = cell.scenario(setup.engines).offered(args.rate_scale, setup.time_scale)
        third = setup.measure_s / 3
        membership = Membership(4, setup.warmup_s + third, setup.warmup_s + 2 * third)
        for name in ("cacheroute", "smg cache_aware"):
            if name not in by_name:
                continue
            label = f"{cell.name} {by_name[name].name}: 4 gateways, 8, then 4 others"
            try:
                row = run_one(by_name[name], 8, scenario, 1, setup, fleet, stacks, work, 1.0,
                              label, membership=membership)
            except Exception as exc:
                print(f"\n  {label} failed: {exc}", file=sys.stderr)
                failed.append(f"{label}: {type(exc).__name__}")
                continue
            moving.append({**row, "scenario": f"{cell.name} + join/leave"})
        summary = grid_outputs(rows, setup, out, missing, time.monotonic() - t_start, moving)
    summary["failed_runs"] = failed
    print(json.dumps(summary))
    return 0


def grid_outputs(rows: list[dict[str, Any]], setup: Setup, out: Path, missing: list[str],
                 elapsed_s: float, moving: list[dict[str, Any]] | None = None
                 ) -> dict[str, Any]:
    """grid-live.md, grid-live.csv (every run), grid-live-deltas.csv (CacheRoute against the
    best peer per cell and gateway count) and grid-live-heatmap.png under `out`; returns
    the summary JSON."""
    out.mkdir(parents=True, exist_ok=True)
    deltas = grid_report.cell_deltas(rows)
    grid_report.write_rows_csv(rows, out / "grid-live.csv")
    grid_report.write_deltas_csv(deltas, out / "grid-live-deltas.csv")
    grid_report.plot_live(deltas, out / "grid-live-heatmap.png", "live grid")
    summary = grid_report.grid_summary(deltas)
    lines = ["# The scenario grid, live", "",
             "Command: `" + " ".join([".venv/bin/python bench/arena.py", *sys.argv[1:]])
             + f"`; {setup.engines} emulated engines (time scale {setup.time_scale:g}, "
             f"{setup.kv_tokens:,} KV tokens each), warm-up {setup.warmup_s:.0f} s then "
             f"{setup.measure_s:.0f} s measured per run, seed 1; peers "
             f"{json.dumps(peer_versions())}; whole run {elapsed_s / 60:.1f} min.", ""]
    if missing:
        lines += [f"Not installed, not measured: {', '.join(missing)}.", ""]
    lines += ["CacheRoute against the best peer (by served hit rate) of each cell and gateway "
              "count, worst one-gateway cell first:", "", *grid_report.delta_lines(deltas),
              "", "Every run:", "",
              "| cell | router | gateways | hit | first / later turns | TTFT p50 s | "
              "TTFT p99 s | imbalance | errors | requests |", "|---" * 10 + "|"]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['router']} | {r['replicas']} | {r['hit']:.1%} | "
                     f"{r['first_turn_hit']:.1%} / {r['later_turn_hit']:.1%} | "
                     f"{r['ttft_p50_s']:.3f} | {r['ttft_p99_s']:.3f} | {r['imbalance']:.2f} | "
                     f"{r['errors']} | {r['requests']} |")
    moved = join_leave_figures(rows, moving or [])
    if moving:
        lines += ["", "Gateways joining and leaving mid-measurement (8 processes from the start; "
                  "the client sends to 4 of them, to all 8 from a third of the measurement on, "
                  "to the other 4 from two thirds on, when the first 4 are stopped), against "
                  "the same cell's steady runs:", "",
                  "| router | hit, joining and leaving | steady 4 | steady 8 | TTFT p99 s | "
                  "errors |", "|---|---|---|---|---|---|"]
        for r in moving:
            steady = {n: next((x["hit"] for x in rows if x["router"] == r["router"]
                               and x["replicas"] == n
                               and r["scenario"].startswith(x["scenario"] + " ")), math.nan)
                      for n in (4, 8)}
            lines.append(f"| {r['router']} | {r['hit']:.1%} | {steady[4]:.1%} | "
                         f"{steady[8]:.1%} | {r['ttft_p99_s']:.3f} | {r['errors']} |")
        grid_report.write_rows_csv(moving, out / "grid-live-join-leave.csv")
    (out / "grid-live.md").write_text("\n".join(lines) + "\n")
    grid_report.print_table(deltas)
    summary = {k: None if isinstance(v, float) and math.isnan(v) else v
               for k, v in summary.items()}
    return {**summary, **moved, "peer_versions": peer_versions(),
            "elapsed_min": round(elapsed_s / 60, 2),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def join_leave_figures(rows: list[dict[str, Any]], moving: list[dict[str, Any]]
                       ) -> dict[str, Any]:
    """CacheRoute's hit through the join/leave run against its steady 8-gateway run of the
    same cell (pp), and the same for the peer; {} without such a run."""
    out: dict[str, Any] = {}
    for r in moving:
        steady = [x for x in rows if x["router"] == r["router"] and x["replicas"] == 8
                  and r["scenario"] == x["scenario"] + " + join/leave"]
        key = "cacheroute" if r["router"] == "cacheroute" else "peer"
        out[f"join_leave_hit_{key}"] = round(r["hit"], 4)
        out[f"join_leave_vs_steady_8r_{key}_pp"] = (
            round((r["hit"] - steady[0]["hit"]) * 100, 2) if steady else None)
    return out


def _ratio_4r(cap: dict[str, float], scenario: str, best4: str) -> dict[str, float | None]:
    """The 4-replica capacity ratio, when the sweep ran at 4 replicas."""
    ours = cap.get(f"{scenario}/{cap_label('cacheroute', 4)}")
    peer = cap.get(f"{scenario}/{cap_label(best4, 4)}") if best4 else None
    if ours is None or not peer:
        return {}
    return {"capacity_ratio_vs_best_peer_4r": round(ours / peer, 3)}


def _mean(rows: list[dict], key: str, **match: Any) -> float:
    vals = [r[key] for r in rows if all(r[k] == v for k, v in match.items())]
    return float(np.mean(vals)) if vals else math.nan


def unswept(router_names: list[str], named_peers: list[str]) -> list[str]:
    """Routers of the run that the capacity sweep will leave out: it sweeps the first router
    (CacheRoute) and the peers named in `--capacity-peers` (or the best peer, chosen after
    the comparison runs, which is never a CacheRoute variant)."""
    rest = router_names[1:]
    if named_peers:
        return [n for n in rest if n not in named_peers]
    return [n for n in rest if n.startswith("cacheroute")]


def _best_peer(rows: list[dict], scenario: str, replicas: int) -> str:
    peers = {r["router"] for r in rows if not r["router"].startswith("cacheroute")
             and r["scenario"] == scenario and r["replicas"] == replicas}
    if not peers:
        return ""
    return max(peers, key=lambda p: _mean(rows, "hit", router=p, scenario=scenario,
                                          replicas=replicas))


def _csv_row(r: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """One CSV row (floats to 4 places; a column the row lacks stays empty)."""
    return {k: (round(r[k], 4) if isinstance(r.get(k), float) else r.get(k, "")) for k in keys}


def report(rows: list[dict], cap: dict[str, float], setup: Setup, out: Path,
           missing: list[str], elapsed_s: float, quick: bool,
           cap_rows: list[dict] | None = None,
           per_seed: dict[str, list[float]] | None = None) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    keys = ["scenario", "seed", "router", "replicas", "rate_scale", "requests", "errors", "hit",
            "ttft_p50_s", "ttft_p99_s", "ttft_p99_lo_s", "ttft_p99_hi_s", "e2e_p99_s",
            "imbalance", "cpu_s", "control_cpu_s", "router_rss_mb",
            # the emulated engines' side: their model's TTFT, and how late they wrote it
            "engine_ttft_p50_s", "engine_ttft_p99_s", "engine_late_p99_s",
            "first_turn_hit", "later_turn_hit", "later_turn_token_share",
            # the setup, so bench/sim_vs_arena.py can replay each row as it ran
            "time_scale", "warmup_s", "measure_s", "kv_tokens", "engine_kind"]
    suffix = ("-llama" if setup.engine_kind == "llama" else "") + ("-quick" if quick else "")
    with open(out / f"arena{suffix}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        for r in rows:
            w.writerow(_csv_row(r, keys))
    if cap_rows:
        plot_capacity(cap_rows, out, suffix, setup.slo_ttft_s)
        with open(out / f"arena-capacity{suffix}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, keys)
            w.writeheader()
            for r in cap_rows:
                w.writerow(_csv_row(r, keys))
    lines = [f"# Arena results{' (quick)' if quick else ''}", "",
             "Command: `" + " ".join([".venv/bin/python bench/arena.py", *sys.argv[1:]]) + "`; "
             + (f"{setup.engines} llama.cpp llama-server processes (tiny random model, one "
                f"thread each, 2 slots, a host-RAM prompt cache of ~{setup.kv_tokens:,} tokens; "
                "imbalance by prompt tokens served), "
                if setup.engine_kind == "llama" else
                f"{setup.engines} emulated engines (time scale {setup.time_scale}, "
                f"{setup.kv_tokens:,} KV tokens each), ")
             + f"warm-up {setup.warmup_s:.0f} s then "
             f"{setup.measure_s:.0f} s measured per run; peers {json.dumps(peer_versions())}; "
             f"whole run {elapsed_s / 60:.1f} min.", ""]
    if missing:
        lines += [f"Not installed, not measured: {', '.join(missing)}.", ""]
    header = ("| scenario | router | replicas | hit | hit: first / later turns | TTFT p50 s | "
              "TTFT p99 s | e2e p99 s | imbalance | errors | router CPU s | control plane CPU s |")
    lines += [header, "|" + "---|" * 12]
    groups = sorted({(r["scenario"], r["router"], r["replicas"]) for r in rows},
                    key=lambda g: (g[0], g[2], -_mean(rows, "hit", scenario=g[0], router=g[1],
                                                       replicas=g[2])))
    for sc, router, rep in groups:
        m = {k: _mean(rows, k, scenario=sc, router=router, replicas=rep)
             for k in ("hit", "ttft_p50_s", "ttft_p99_s", "e2e_p99_s", "imbalance", "errors",
                       "cpu_s", "control_cpu_s", "first_turn_hit", "later_turn_hit")}
        lines.append(f"| {sc} | {router} | {rep} | {m['hit']:.1%} | "
                     f"{m['first_turn_hit']:.1%} / {m['later_turn_hit']:.1%} | "
                     f"{m['ttft_p50_s']:.3f} | "
                     f"{m['ttft_p99_s']:.3f} | {m['e2e_p99_s']:.3f} | {m['imbalance']:.2f} | "
                     f"{m['errors']:.0f} | {m['cpu_s']:.1f} | {m['control_cpu_s']:.1f} |")
    failed = [r for r in rows if "failed_at_s" in r]
    if failed:
        lines += ["", f"An engine down mid-run ({failed[0]['scenario']}: the first engine stops "
                  f"listening at {failed[0]['failed_at_s']:.0f} s, open connections cut, and "
                  "stays down; 1 router replica; requests that ended after the failure, those "
                  "in flight on it included):", "",
                  "| router | requests | errors | hit | TTFT p99 s |", "|---|---|---|---|---|"]
        for r in sorted(failed, key=lambda r: (r["errors_after_failure"], -r["hit_after_failure"])):
            lines.append(f"| {r['router']} | {r['requests']} | {r['errors_after_failure']} | "
                         f"{r['hit_after_failure']:.1%} | {r['ttft_p99_after_failure_s']:.3f} |")
    planned = [r for r in rows if r["router"] == "cacheroute" and r.get("plan_version")]
    if planned:
        lines += ["", "Did CacheRoute's plan deliver (`cacheroute plan report`: the newest plan of "
                  "the run measured past its rewarm dip, predicted at install vs served):", ""]
        for r in planned:
            pred, got = r["plan_predicted_hit"], r["plan_measured_hit"]
            lines.append(f"- {r['scenario']} s{r['seed']} x{r['replicas']}: plan "
                         f"{r['plan_version']}, predicted "
                         f"{'-' if pred is None else f'{pred:.1%}'}, served "
                         f"{'-' if got is None else f'{got:.1%}'} over "
                         f"{r['plan_windows']} windows")
    if cap:
        lines += ["", f"SLO capacity (sessions/s with TTFT p99 ≤ {setup.slo_ttft_s} s, the "
                  "middle seed's where the sweep ran on several, each seed's in brackets "
                  "(a sweep that missed at its first point ranks below it); the sweep's points "
                  "are in arena-capacity.csv, with the requests each served):", ""]
        for k, v in cap.items():
            seeds, sweeps = _seed_sweeps(k, cap_rows)
            values = (per_seed or {}).get(k, [v])
            parts = [_capacity_text(value, sweep, setup.slo_ttft_s)
                     for value, sweep in zip(values, sweeps, strict=False)]
            if len(parts) <= 1:
                lines.append(f"- {k}: {parts[0] if parts else f'{v:.2f}'}")
                continue
            middle = parts[_middle_seed(values, sweeps)]
            lines.append(f"- {k}: {middle} [" + "; ".join(
                f"s{seed}: {t}" for seed, t in zip(seeds, parts, strict=False)) + "]")
        for r in cap_rows or []:
            lines.append(f"  - {r['scenario']} s{r['seed']} {r['label']} x{r['rate_scale']:g}: "
                         f"{r['requests']} requests measured, TTFT p99 {r['ttft_p99_s']:.3f} s "
                         f"(90 % interval {r['ttft_p99_lo_s']:.2f}-{r['ttft_p99_hi_s']:.2f}), "
                         f"hit {r['hit']:.1%}"
                         + (f"; engine TTFT p99 {r['engine_ttft_p99_s']:.3f} s, first tokens "
                            f"late by up to {r['engine_late_p99_s'] * 1000:.0f} ms (p99)"
                            if "engine_ttft_p99_s" in r else "")
                         + (f"; its logs kept in {r['logs']}" if r.get("logs") else ""))
    (out / f"arena{suffix}.md").write_text("\n".join(lines) + "\n")
    _plot(rows, out, suffix)
    paper = "paper-like"
    best1, best4 = _best_peer(rows, paper, 1), _best_peer(rows, paper, 4)
    if not best1:  # a capacity-only run: the peer it swept
        best1 = next((k.split("/", 1)[1] for k in cap
                      if k.startswith(paper + "/") and k != f"{paper}/cacheroute"
                      and "replicas" not in k), "")
    ours_cap, ours_sign = _middle_bound(f"{paper}/cacheroute", cap, cap_rows, per_seed,
                                        setup.slo_ttft_s)
    peer_cap, peer_sign = _middle_bound(f"{paper}/{best1}", cap, cap_rows, per_seed,
                                        setup.slo_ttft_s)
    # A bound on either side bounds the ratio one way; bounds pulling both ways leave it
    # undetermined (two sweeps that never missed say nothing about which router is ahead).
    signs = {x for x in (ours_sign, -peer_sign) if x}
    ratio_kind = ("exact" if not signs else "undetermined" if len(signs) > 1
                  else "at_least" if signs == {1} else "at_most")
    summary = {
        "cacheroute_hit_1r": round(_mean(rows, "hit", router="cacheroute", scenario=paper,
                                         replicas=1), 4),
        "cacheroute_hit_4r": round(_mean(rows, "hit", router="cacheroute", scenario=paper,
                                         replicas=4), 4),
        "best_peer_1r": best1,
        "best_peer_hit_1r": round(_mean(rows, "hit", router=best1, scenario=paper,
                                        replicas=1), 4) if best1 else None,
        "best_peer_4r": best4,
        "best_peer_hit_4r": round(_mean(rows, "hit", router=best4, scenario=paper,
                                        replicas=4), 4) if best4 else None,
        "capacity_ratio_vs_best_peer": round(ours_cap / peer_cap, 3)
        if peer_cap and not math.isnan(peer_cap) and ratio_kind != "undetermined" else None,
        "capacity_ratio_kind": ratio_kind,
        **_ratio_4r(cap, paper, best4),
        "peer_versions": peer_versions(),
        "errors_after_failure": {r["router"]: r["errors_after_failure"] for r in failed},
        "elapsed_min": round(elapsed_s / 60, 2),
    }
    # a figure not measured (no comparison runs) is null: NaN is not JSON
    summary = {k: None if isinstance(v, float) and math.isnan(v) else v
               for k, v in summary.items()}
    if setup.engine_kind == "llama":  # the real-engine fleet's figures, named apart
        summary = {f"llama_{k}": v for k, v in summary.items()}
    summary["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return summary


def _middle_seed(values: list[float], sweeps: list[list[dict[str, Any]]]) -> int:
    """Which seed's capacity is the median (the lower middle of an even count). A sweep
    whose first point already missed has capacity 0 and ranks just below that point's
    load: an upper bound, ordered among the others, never averaged with them."""
    def rank(i: int) -> float:
        if values[i] or not sweeps[i]:
            return values[i]
        return float(sweeps[i][0]["sessions_per_s"]) * 0.999
    order = sorted(range(len(values)), key=rank)
    return order[(len(order) - 1) // 2]


def _bound_sign(value: float, sweep: list[dict], slo_s: float) -> tuple[float, int]:
    """(capacity, +1 if it is a lower bound (no point missed), -1 if an upper bound (the
    first point missed: the bound is that point's load), 0 if measured between points)."""
    if not value and sweep:
        return float(sweep[0]["sessions_per_s"]), -1
    if sweep and all(r["ttft_p99_s"] <= slo_s and not r["errors"] for r in sweep):
        return value, 1
    return value, 0


def _middle_bound(key: str, cap: dict[str, float], cap_rows: list[dict] | None,
                  per_seed: dict[str, list[float]] | None,
                  slo_s: float) -> tuple[float, int]:
    """The middle seed's capacity of `key` ("scenario/label") and its `_bound_sign`."""
    if key not in cap:
        return math.nan, 0
    values = (per_seed or {}).get(key, [cap[key]])
    sweeps = _seed_sweeps(key, cap_rows)[1]
    if len(values) != len(sweeps) or not sweeps:
        return cap[key], 0
    i = _middle_seed(values, sweeps)
    return _bound_sign(values[i], sweeps[i], slo_s)


def _seed_sweeps(key: str, cap_rows: list[dict] | None) -> tuple[list[int], list[list[dict]]]:
    """The seeds `key` ("scenario/label") was swept on, in order, and each seed's points."""
    sc, label = key.split("/", 1)
    rows = [r for r in cap_rows or [] if r["scenario"] == sc and r["label"] == label]
    seeds = sorted({r["seed"] for r in rows})
    return seeds, [[r for r in rows if r["seed"] == seed] for seed in seeds]


def _capacity_text(value: float, sweep: list[dict], slo_s: float) -> str:
    """One sweep's capacity, saying when it is only a bound."""
    bound, sign = _bound_sign(value, sweep, slo_s)
    if sign < 0:
        return (f"< {bound:.2f} (the sweep's first point, x{sweep[0]['rate_scale']:g}, "
                "already missed the SLO)")
    if sign > 0:
        return f"≥ {value:.2f} (no point of the sweep missed the SLO: a lower bound)"
    return f"{value:.2f}"


def _pyplot() -> Any:
    """matplotlib's pyplot on the file backend, or None (and a hint) if not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots (pip install '.[plots]')", file=sys.stderr)
        return None
    return plt


def _scenario_panels(rows: list[dict]) -> tuple[Any, Any, list[tuple[Any, str]]] | None:
    """(pyplot, figure, [(axes, scenario)]): one panel per scenario; None without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return None
    scenarios = sorted({r["scenario"] for r in rows})
    fig, axes = plt.subplots(1, len(scenarios), figsize=(5 * len(scenarios), 4), squeeze=False)
    return plt, fig, list(zip(axes[0], scenarios, strict=True))


def _plot(rows: list[dict], out: Path, suffix: str) -> None:
    panels = _scenario_panels(rows) if rows else None
    if panels is None:
        return
    plt, fig, pairs = panels
    for ax, sc in pairs:
        groups = sorted({(r["router"], r["replicas"]) for r in rows if r["scenario"] == sc})
        labels = [f"{g[0]} x{g[1]}" for g in groups]
        hits = [_mean(rows, "hit", scenario=sc, router=g[0], replicas=g[1]) for g in groups]
        colors = ["tab:green" if g[0] == "cacheroute" else "tab:gray" for g in groups]
        ax.barh(labels, hits, color=colors)
        ax.set_xlim(0, 1)
        ax.set_title(f"{sc}: served hit rate")
    fig.tight_layout()
    fig.savefig(out / f"arena-hit{suffix}.png", dpi=110)
    plt.close(fig)


def plot_capacity(cap_rows: list[dict], out: Path, suffix: str, slo_s: float) -> None:
    """TTFT p99 against offered load per router and scenario, the SLO as a line."""
    panels = _scenario_panels(cap_rows)
    if panels is None:
        return
    plt, fig, pairs = panels
    for ax, sc in pairs:
        seeds = sorted({r["seed"] for r in cap_rows if r["scenario"] == sc})
        for label in sorted({r["label"] for r in cap_rows if r["scenario"] == sc}):
            for seed in seeds:
                pts = sorted((float(r["rate_scale"]), float(r["ttft_p99_s"])) for r in cap_rows
                             if r["scenario"] == sc and r["label"] == label
                             and r["seed"] == seed)
                if not pts:
                    continue
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                        label=label + (f" s{seed}" if len(seeds) > 1 else ""),
                        color="tab:green" if label == "cacheroute" else None,
                        linestyle=":" if "replicas" in label else "-", alpha=0.8)
        ax.axhline(slo_s, color="tab:red", linestyle="--", label=f"SLO {slo_s:g} s")
        ax.set_xlabel("offered load (x the scenario's rate)")
        ax.set_ylabel("TTFT p99 (s)")
        ax.set_title(f"{sc}: SLO capacity sweep")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"arena-capacity{suffix}.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
