"""Live scale-out: 16 edge-router processes against one router, same traffic, same local stack.

Run from the repo root:  .venv/bin/python bench/routers_live.py [--quick] [--routers 16]

The local stack (broker, Redis, a stream worker, the planner) runs as `cacheroute demo` runs
it. The demo's request stream (`planner_svc.devstack.fleet.Workload`: paper-like skewed key rates,
drifting) is served twice, at the same instants, by two identical fleets of engines (the
engine model of `planner_svc.simulator.replica`):
- *single*: every request is routed by one `RouterClient` in its own process;
- *scaled out*: an outer balancer spreads the requests round-robin over N `RouterClient`
  processes; each router counts only the requests it sent (its own in-flight view), as
  independent gateways do.
Every router follows the same plan in Redis (the planner learns from the single fleet's
events). Figures count only the reporting periods in which every router had a plan applied.
Target: the scaled-out hit rate within 2 pp of the single router's.

Last line: one JSON object of figures.
"""

from __future__ import annotations

import argparse
import heapq
import json
import multiprocessing as mp
import os
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner_svc.devstack.fleet import FleetOptions, Tally, Workload, admit_stream, make_engines
from planner_svc.devstack.stack import LocalStack, StackOptions, start_stack
from planner_svc.simulator.replica import Replica
from router_client import RouterCore
from streams.emitter import EventEmitter

# --- router processes ------------------------------------------------------------------------


def router_main(conn: Connection, redis_url: str, key_path: str, rid: str,
                destination_ids: list[str]) -> None:
    """One edge router process: answers batches of (finished destinations, keys to route).

    For each batch: `finished` for every completed request it had routed, then for each key
    `route` followed at once by `started` (so the next key of the batch sees it in flight).
    """
    from router_client import RouterClient, signing
    from router_client.redis_source import RedisPlanSource

    keys = [signing.load_public_key(key_path)]
    client = RouterClient(RedisPlanSource(redis_url), router_id=rid, public_keys=keys,
                          destination_ids=destination_ids).start()
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg[0] == "batch":
            conn.send(_route_batch(client, msg[1], msg[2]))
        elif msg[0] == "status":
            conn.send((str(client.version), client.mode, client.table is not None))
        else:
            client.stop()
            conn.send(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
            return


def _route_batch(client: Any, finished: list[str], keys: list[str]) -> list[str]:
    for d in finished:
        client.finished(d)
    out = []
    for k in keys:
        d = client.route(k)
        client.started(d)
        out.append(d)
    return out


class RouterPool:
    """N router processes behind an outer round-robin balancer."""

    def __init__(self, name: str, n: int, stack: LocalStack) -> None:
        ctx = mp.get_context("spawn")
        self.name = name
        self.conns: list[Connection] = []
        self.procs = []
        for i in range(n):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=router_main, daemon=True, args=(
                theirs, stack.redis_url, str(stack.public_key_path), f"{name}-{i:02d}",
                stack.options.destination_ids))
            p.start()
            self.conns.append(mine)
            self.procs.append(p)
        self._next = 0
        self.rss_mb: list[float] = []

    @property
    def size(self) -> int:
        return len(self.conns)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        for c in self.conns:
            if not c.poll(timeout_s) or c.recv() != "ready":
                raise RuntimeError(f"{self.name}: a router process did not start")

    def pick(self) -> int:
        """The outer balancer: round-robin over the routers."""
        i = self._next
        self._next = (i + 1) % len(self.conns)
        return i

    def route(self, batches: dict[int, tuple[list[str], list[str]]]) -> dict[int, list[str]]:
        """Send each router its batch, then collect the answers (routers work in parallel)."""
        for i, (finished, keys) in batches.items():
            self.conns[i].send(("batch", finished, keys))
        return {i: self.conns[i].recv() for i in batches}

    def statuses(self) -> list[tuple[str, str, bool]]:
        for c in self.conns:
            c.send(("status",))
        return [c.recv() for c in self.conns]

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(("stop",))
                self.rss_mb.append(c.recv() if c.poll(10) else 0.0)
            except (OSError, EOFError):
                pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()


class FlatPool:
    """The baseline: one in-process router with no plan (power of two choices, Flat-LB)."""

    name = "flat-lb"
    size = 1

    def __init__(self, destination_ids: list[str], seed: int) -> None:
        self.core = RouterCore(destination_ids, seed=seed)

    def pick(self) -> int:
        return 0

    def route(self, batches: dict[int, tuple[list[str], list[str]]]) -> dict[int, list[str]]:
        core = self.core
        out: dict[int, list[str]] = {}
        for i, (finished, keys) in batches.items():
            for d in finished:
                core.finished(core.slot_of(d))
            out[i] = []
            for k in keys:
                d = core.route(k)
                core.started(core.slot_of(d))
                out[i].append(d)
        return out


# --- one fleet of engines behind a pool ------------------------------------------------------


@dataclass
class PooledFleet:
    """R engines; requests routed by `pool`, each request's completion told to its router."""

    pool: RouterPool | FlatPool
    engines: dict[str, Replica]
    emitter: EventEmitter | None = None
    tally: Tally = field(default_factory=Tally)
    _pending: list[tuple[float, int, int, str, str, int, int, float]] = field(
        default_factory=list)
    _finished: dict[int, list[str]] = field(default_factory=dict)
    _n: int = 0

    def serve(self, arrivals: Sequence[tuple[str, int, int]], output: int, now: float) -> None:
        """Route and admit one tick's arrivals `(key, prefix, prompt)`, in order."""
        batches: dict[int, tuple[list[str], list[str]]] = {}
        order = []
        for key, _, _ in arrivals:
            i = self.pool.pick()
            batches.setdefault(i, (self._finished.pop(i, []), []))[1].append(key)
            order.append(i)
        for i, done in self._finished.items():  # completions of routers with no new request
            batches[i] = (done, [])
        self._finished = {}
        answers = {i: iter(ds) for i, ds in self.pool.route(batches).items()}
        for (key, prefix, prompt), i in zip(arrivals, order, strict=True):
            self._admit(i, key, next(answers[i]), prefix, prompt, output, now)

    def _admit(self, router: int, key: str, dest: str, prefix: int, prompt: int, output: int,
               now: float) -> None:
        cached, finish = admit_stream(self.engines[dest], key, prompt, prefix, output, now)
        self._n += 1
        heapq.heappush(self._pending, (finish, self._n, router, key, dest, prompt, cached, now))
        if self.emitter is not None:
            self.emitter.emit_request(key, dest, prompt_tokens=prompt,
                                      reusable_prefix_tokens=prefix, router_id=self.pool.name)
        self.tally.count(dest, prompt, cached)

    def complete(self, now: float, output: int) -> None:
        """Retire finished requests; their routers hear of it with their next batch."""
        while self._pending and self._pending[0][0] <= now:
            finish, _, router, key, dest, prompt, cached, start = heapq.heappop(self._pending)
            self._finished.setdefault(router, []).append(dest)
            if self.emitter is not None:
                self.emitter.emit_cache_hit(key, dest, prompt_tokens=prompt, cached_tokens=cached,
                                            output_tokens=output, e2e_ms=(finish - start) * 1e3)

    def take_tally(self) -> Tally:
        t, self.tally = self.tally, Tally(per_destination=dict.fromkeys(self.engines, 0))
        return t


# --- the run ----------------------------------------------------------------------------------


@dataclass
class FleetFigures:
    """One fleet over the periods in which every router had a plan applied throughout."""

    name: str
    routers: int
    hit: float = 0.0
    imbalance: float = 0.0  # max/mean requests per destination over all those periods
    period_imbalance: float = 0.0  # the same per 5-s period, averaged
    requests: int = 0


@dataclass
class LiveResult:
    single: FleetFigures
    scaled: FleetFigures
    flat: FleetFigures
    planned_periods: int
    versions_seen: list[str]
    first_plan_at_s: float | None
    split_reports: int = 0  # reports at which the routers were not all on one plan version
    router_peak_rss_mb: float = 0.0

    @property
    def hit_gap_pp(self) -> float:
        """Single-router minus scaled-out served hit rate, in percentage points."""
        return (self.single.hit - self.scaled.hit) * 100


def run_live(stack: LocalStack, options: FleetOptions, routers: int, duration_s: float,
             report_every_s: float = 5.0, verbose: bool = True) -> LiveResult:
    """Serve the demo traffic through 1 router, through `routers` routers and by Flat-LB."""
    ids = stack.options.destination_ids
    single = RouterPool("single", 1, stack)
    scaled = RouterPool("edge", routers, stack)
    emitter = EventEmitter(stack.bootstrap, stack.options.events_topic, producer_id="live-fleet")
    try:
        single.wait_ready()
        scaled.wait_ready()
        fleets = [PooledFleet(single, make_engines(ids, options), emitter),
                  PooledFleet(scaled, make_engines(ids, options)),
                  PooledFleet(FlatPool(ids, options.seed + 1), make_engines(ids, options))]
        result = _drive(Workload(options), fleets, duration_s, report_every_s, verbose)
    finally:
        emitter.close()
        single.close()
        scaled.close()
    result.router_peak_rss_mb = max(single.rss_mb + scaled.rss_mb, default=0.0)
    return result


class _Periods:
    """Adds up the periods that had every router planned from start to end."""

    def __init__(self, fleets: list[PooledFleet], verbose: bool) -> None:
        self.pools = [f.pool for f in fleets if isinstance(f.pool, RouterPool)]
        self.totals = [Tally() for _ in fleets]
        self.imbalances: list[list[float]] = [[] for _ in fleets]
        self.versions: list[str] = []
        self.first_plan: float | None = None
        self.periods = 0
        self.split_reports = 0
        self._was_planned = False
        self.verbose = verbose
        if verbose:
            names = [f"{f.pool.name} x{f.pool.size}" for f in fleets]
            print(f"{'t':>5} {'plan(s)':>9} " + " ".join(f"{n + ' hit':>14} {'imb':>5}"
                                                          for n in names), flush=True)

    def report(self, elapsed: float, period: list[Tally]) -> None:
        status = [st for pool in self.pools for st in pool.statuses()]
        planned = all(mode == "planned" and has for _, mode, has in status)
        seen = sorted({v for v, _, _ in status})
        self.split_reports += len(seen) > 1
        if planned and self.first_plan is None:
            self.first_plan = elapsed
        if planned and self._was_planned:
            self.periods += 1
            self.versions += [v for v in seen if v not in self.versions]
            for total, imb, t in zip(self.totals, self.imbalances, period, strict=True):
                total.add(t)
                imb.append(t.imbalance())
        self._was_planned = planned
        if self.verbose:
            cols = " ".join(f"{t.hit_rate:14.1%} {t.imbalance():5.2f}" for t in period)
            print(f"{elapsed:5.0f} {','.join(seen) if planned else 'none':>9} {cols}", flush=True)

    def figures(self, fleets: list[PooledFleet]) -> list[FleetFigures]:
        return [FleetFigures(f.pool.name, f.pool.size, t.hit_rate, t.imbalance(),
                             sum(imb) / len(imb) if imb else 0.0, t.requests)
                for f, t, imb in zip(fleets, self.totals, self.imbalances, strict=True)]


def _drive(workload: Workload, fleets: list[PooledFleet], duration_s: float,
           report_every_s: float, verbose: bool) -> LiveResult:
    """Every fleet gets the same arrivals at the same instants for `duration_s` of wall time."""
    o = workload.options
    periods = _Periods(fleets, verbose)
    start = last = time.monotonic()
    next_report = report_every_s
    while (now := time.monotonic()) - start < duration_s:
        elapsed = now - start
        workload.drift_if_due(elapsed)
        arrivals = [(workload.keys[i], int(workload.prefix[i]),
                     int(workload.prefix[i]) + o.new_tokens) for i in workload.arrivals(now - last)]
        last = now
        for f in fleets:
            f.serve(arrivals, o.output_tokens, now)
            f.complete(now, o.output_tokens)
        if elapsed >= next_report:
            next_report += report_every_s
            periods.report(elapsed, [f.take_tally() for f in fleets])
        time.sleep(0.01)
    single, scaled, flat = periods.figures(fleets)
    return LiveResult(single, scaled, flat, periods.periods, periods.versions, periods.first_plan,
                      periods.split_reports)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--routers", type=int, default=16)
    ap.add_argument("--duration", type=float, default=150.0, help="seconds of traffic")
    ap.add_argument("--rate", type=float, default=300.0, help="requests/s offered")
    ap.add_argument("--keys", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="70 s of traffic")
    args = ap.parse_args()
    if args.quick:
        args.duration = 70.0
    stack = start_stack(StackOptions())
    try:
        options = FleetOptions(keys=args.keys, total_rate=args.rate, seed=args.seed)
        res = run_live(stack, options, args.routers, args.duration)
    finally:
        stack.stop()
    print_result(res)


def print_result(res: LiveResult) -> None:
    print()
    print(f"periods with every router planned throughout: {res.planned_periods} (first plan at "
          f"t = {res.first_plan_at_s or 0:.0f} s), plan versions {', '.join(res.versions_seen)}; "
          f"reports with the routers on different versions: {res.split_reports}")
    print(f"{'fleet':>12} {'routers':>8} {'requests':>9} {'served hit':>11} {'imbalance':>10} "
          f"{'per-5s imb':>11}")
    for f in (res.single, res.scaled, res.flat):
        print(f"{f.name:>12} {f.routers:8d} {f.requests:9d} {f.hit:11.2%} {f.imbalance:10.3f} "
              f"{f.period_imbalance:11.3f}")
    ok = res.planned_periods > 0 and abs(res.hit_gap_pp) <= 2.0
    verdict = "met" if ok else "MISSED"
    print(f"hit-rate gap {res.hit_gap_pp:+.2f} pp (target within 2 pp): {verdict}")
    driver_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    figures = {**asdict(res), "hit_gap_pp": round(res.hit_gap_pp, 2), "target_met": ok,
               "driver_peak_rss_mb": driver_mb,
               "peak_rss_mb": max(driver_mb, round(res.router_peak_rss_mb, 1)),
               "load_avg_1m": round(os.getloadavg()[0], 2)}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
