"""The planner at fleet scale: 1 M keys over 1,000 destinations, snapshot in → routers applied.

Run from the repo root:  .venv/bin/python bench/fleet.py [--quick] [--routers 8] [--keys N]

One real redis-server and one real Tansu broker are started on loopback (and stopped at the end).
N router processes (`RouterClient(RedisPlanSource(...))`, started with the `spawn` method so
none inherits the bench's memory) follow the plan. Each round:

1. snapshot in: the window's `RateSnapshot` parts, built per source partition by the stream's own
   `streams.snapshots.build_snapshots` (≤ 900 kB each; building them is the stream's hop work and
   is timed apart), are produced to a snapshots topic and read back by the planner's real
   `SnapshotConsumer` (confluent-kafka, `WindowAssembler`) until the window is complete;
2. plan: `build_plan` for the first round, then `repack` of the installed plan under rates
   drifted by a lognormal walk (σ = 0.3), as the planner does each interval;
3. publish: `PlanPublisher.prepare` (encode, sign, delta) + `commit` (one Lua script);
4. applied: until every router's `on_applied` hook fired for the new version.

`loop_s` = from the first snapshot part produced to the last router applied (target ≤ 10 s).
Peak RSS per process: `getrusage` in the bench (planner side) and in each router; VmHWM from
/proc for redis-server and the broker. Last line: one JSON object of figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from cryptography.hazmat.primitives import serialization

from planner_svc.adapters.redis_publisher import PlanPublisher
from planner_svc.adapters.snapshot_consumer import SnapshotConsumer
from planner_svc.devstack.processes import Broker, RedisServer, start_broker, start_redis
from planner_svc.planning import PlanningConfig, build_plan, repack
from planner_svc.simulator.rates import lognormal_walk, paper_like_keys, paper_like_rates
from router_client import signing
from router_client.plan import RoutingPlan, Version
from streams.assembly import CompleteWindow, DestinationStats
from streams.partitioning import partition_for_key
from streams.snapshots import SnapshotContext, build_snapshots
from streams.windows import WindowResult

# The planning bench's fleet-scale configuration: load just under the knee per destination.
LOAD_PER_DESTINATION = 176.0 / 30
Q_CAP = 6.0
WINDOW_S = 10.0
MEAN_PREFIX_TOKENS = 1500.0


# --- router processes (spawned: they import this module fresh) -----------------------------


def router_main(url: str, pem: bytes, rid: str, out: Any, stop: Any) -> None:
    """One edge router: follow the plan, report every apply, then its peak RSS."""
    from router_client.client import RouterClient
    from router_client.redis_source import RedisPlanSource

    key = serialization.load_pem_public_key(pem)

    def applied(table: Any, kind: str) -> None:
        out.put(("applied", rid, table.version.seq, kind, time.time(), len(table),
                 client.last_apply_cpu_ms))

    client = RouterClient(
        RedisPlanSource(url), router_id=rid, public_keys=[key], on_applied=applied
    )
    client.start()
    out.put(("ready", rid))
    stop.wait()
    client.stop()
    out.put(("rss", rid, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


class Routers:
    """N router processes and the queue they report on."""

    def __init__(self, url: str, pem: bytes, n: int) -> None:
        ctx = mp.get_context("spawn")
        self.out = ctx.Queue()
        self.stop = ctx.Event()
        self.ids = [f"edge-{i:02d}" for i in range(n)]
        self.procs = [
            ctx.Process(target=router_main, args=(url, pem, rid, self.out, self.stop), daemon=True)
            for rid in self.ids
        ]
        for p in self.procs:
            p.start()
        self.rss_mb: dict[str, float] = {}
        self.wait_for("ready", None, 60.0)

    def wait_for(self, kind: str, seq: int | None, timeout_s: float) -> dict[str, tuple]:
        """Until every router sent a `kind` message (for plan `seq`); rid -> message."""
        got: dict[str, tuple] = {}
        deadline = time.monotonic() + timeout_s
        while len(got) < len(self.ids):
            msg = self.out.get(timeout=max(0.1, deadline - time.monotonic()))
            if msg[0] == kind and (seq is None or msg[2] == seq):
                got[msg[1]] = msg
            elif msg[0] == "rss":
                self.rss_mb[msg[1]] = msg[2]
        return got

    def close(self) -> None:
        self.stop.set()
        try:
            for rid, msg in self.wait_for("rss", None, 30.0).items():
                self.rss_mb[rid] = msg[2]
        finally:
            for p in self.procs:
                p.join(5)
                if p.is_alive():
                    p.kill()


# --- the stream's side: one window's snapshot parts ------------------------------------------


def window_parts(
    keys: list[str], rates: np.ndarray, partition_of: np.ndarray, partitions: int, end_ms: int
) -> list[bytes]:
    """Serialized `RateSnapshot` parts of every source partition, as the workers publish them."""
    out: list[bytes] = []
    for p in range(partitions):
        rows = np.flatnonzero(partition_of == p)
        window = partition_window([keys[i] for i in rows.tolist()], rates[rows], end_ms)
        ctx = SnapshotContext(source_partition=p, partition_count=partitions,
                              worker_id=f"worker-{p % 4}", recovering=False,
                              published_at_ms=int(time.time() * 1000))
        out += [s.SerializeToString() for s in build_snapshots(window, ctx)]
    return out


def partition_window(keys: list[str], rates: np.ndarray, end_ms: int) -> WindowResult:
    """A plausible window of one partition for the given per-key rates."""
    requests = np.rint(rates * WINDOW_S).astype(np.uint64)
    prompt = rates * WINDOW_S * (MEAN_PREFIX_TOKENS + 200)
    return WindowResult(
        window_start_ms=end_ms - int(WINDOW_S * 1000), window_end_ms=end_ms, keys=keys,
        rate_per_s=rates, ewma_rate_per_s=rates, prompt_tokens=prompt,
        cached_tokens=prompt * 0.8, reuse_fraction=np.full(len(keys), 0.9),
        interarrival_cv=np.full(len(keys), np.nan),
        reusable_prefix_tokens=np.full(len(keys), MEAN_PREFIX_TOKENS), requests=requests,
        destinations=[DestinationStats("engine-000", float(rates.sum()), float(prompt.sum()),
                                       float(prompt.sum()) * 0.8, float("nan"), float("nan"))],
        active_keys=len(keys),
    )


# --- the loop --------------------------------------------------------------------------------


@dataclasses.dataclass
class Round:
    kind: str  # "build" or "repack"
    stream_encode_s: float = 0.0
    parts: int = 0
    snapshot_mb: float = 0.0
    snapshot_in_s: float = 0.0
    plan_s: float = 0.0
    table_keys: int = 0
    prepare_s: float = 0.0
    commit_s: float = 0.0
    applied_s: float = 0.0  # commit start -> last router applied
    apply_cpu_ms_max: float = 0.0  # one router's CPU for fetch, verify, decode, swap
    applied_as: str = ""
    loop_s: float = 0.0


class Loop:
    """Snapshot topic → SnapshotConsumer → plan → PlanPublisher → routers."""

    def __init__(self, broker: Broker, redis: RedisServer, routers: int) -> None:
        self.topic = f"fleet-snap-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for f in admin.create_topics([NewTopic(self.topic, 1, 1)]).values():
            f.result(15)
        self.producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5,
                                  "message.max.bytes": 8 * 1024 * 1024})
        self.windows: list[tuple[float, CompleteWindow]] = []
        self._got = threading.Condition()
        self.consumer = SnapshotConsumer(broker.bootstrap, self.topic, self._on_window)
        self.consumer.start(from_beginning=True)
        key = signing.generate_private_key()
        self.publisher = PlanPublisher(redis.url, key)
        pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
        self.routers = Routers(redis.url, pem, routers)
        self.installed: RoutingPlan | None = None

    def _on_window(self, window: CompleteWindow) -> None:
        with self._got:
            self.windows.append((time.time(), window))
            self._got.notify_all()

    def snapshot_in(self, parts: list[bytes], end_ms: int) -> CompleteWindow:
        for i, raw in enumerate(parts):
            self.producer.produce(self.topic, raw, key=f"{end_ms}:{i}".encode())
            self.producer.poll(0)
        self.producer.flush(60)
        with self._got:
            ok = self._got.wait_for(lambda: any(w.window_end_ms == end_ms
                                                for _, w in self.windows), 120)
        assert ok, "the planner's consumer never completed the window"
        return next(w for _, w in self.windows if w.window_end_ms == end_ms)

    def plan(self, window: CompleteWindow, config: PlanningConfig, seq: int) -> RoutingPlan:
        if self.installed is None:
            plan = build_plan(window.keys, window.rate_per_s, config)
        else:
            plan = repack(self.installed, window.keys, window.rate_per_s, config)
        return dataclasses.replace(plan, version=Version(1, seq), created_at_ms=int(time.time()
                                   * 1000), rates_window_end_ms=window.window_end_ms)

    def run_round(self, rnd: Round, parts: list[bytes], end_ms: int, config: PlanningConfig,
                  seq: int) -> None:
        t0 = time.time()
        window = self.snapshot_in(parts, end_ms)
        t1 = time.time()
        plan = self.plan(window, config, seq)
        t2 = time.time()
        prepared = self.publisher.prepare(plan, self.installed)
        t3 = time.time()
        self.publisher.commit(prepared)
        t4 = time.time()
        applied = self.routers.wait_for("applied", seq, 120)
        last = max(m[4] for m in applied.values())
        kinds = sorted({m[3] for m in applied.values()})
        assert all(m[5] == len(plan.table) for m in applied.values()), "a router's table differs"
        self.installed = plan
        rnd.snapshot_in_s, rnd.plan_s, rnd.prepare_s = t1 - t0, t2 - t1, t3 - t2
        rnd.commit_s, rnd.applied_s, rnd.loop_s = t4 - t3, last - t3, last - t0
        rnd.table_keys, rnd.applied_as = len(plan.table), "/".join(kinds)
        rnd.apply_cpu_ms_max = max(m[6] for m in applied.values())

    def close(self) -> None:
        self.routers.close()
        self.producer.flush(10)
        del self.producer  # librdkafka closes its connections before the broker stops
        self.consumer.stop()
        self.publisher.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--destinations", type=int, default=1_000)
    ap.add_argument("--warm-slots-per-destination", type=int, default=100)
    ap.add_argument("--routers", type=int, default=8)
    ap.add_argument("--partitions", type=int, default=8, help="source partitions of the stream")
    ap.add_argument("--rounds", type=int, default=3, help="1 build + (rounds-1) repacks")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="2 rounds, 4 routers")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.routers = 2, 4
    run(args)


def run(args: argparse.Namespace) -> None:
    t = time.perf_counter()
    keys = paper_like_keys(args.keys)
    rates = paper_like_rates(args.keys, LOAD_PER_DESTINATION * args.destinations, seed=args.seed)
    partition_of = np.fromiter((partition_for_key(k, args.partitions) for k in keys), np.int64,
                               len(keys))
    config = PlanningConfig.uniform(args.destinations, Q_CAP, args.warm_slots_per_destination)
    setup_s = time.perf_counter() - t
    workdir = Path(tempfile.mkdtemp(prefix="cacheroute-fleet-"))
    broker = start_broker(workdir)
    redis = start_redis(workdir)
    rng = np.random.default_rng(args.seed + 1)
    rounds: list[Round] = []
    try:
        loop = Loop(broker, redis, args.routers)
        try:
            end_ms = 0
            for i in range(args.rounds):
                if i:
                    walked = lognormal_walk(rates, 0.3, rng)
                    rates = walked * (rates.sum() / walked.sum())
                end_ms = window_end_ms(end_ms)
                rounds.append(one_round(loop, i, end_ms, keys, rates, partition_of, args,
                                        config))
        finally:
            loop.close()
        servers = {"redis": redis.process.peak_rss_mb(), "broker": broker.process.peak_rss_mb()}
    finally:
        redis.process.stop()
        broker.process.stop()
    report(args, rounds, loop.routers.rss_mb, servers, setup_s)


def one_round(loop: Loop, i: int, end_ms: int, keys: list[str], rates: np.ndarray,
              partition_of: np.ndarray, args: argparse.Namespace, config: PlanningConfig
              ) -> Round:
    rnd = Round("build" if i == 0 else "repack")
    t = time.perf_counter()
    parts = window_parts(keys, rates, partition_of, args.partitions, end_ms)
    rnd.stream_encode_s = time.perf_counter() - t
    rnd.parts, rnd.snapshot_mb = len(parts), sum(map(len, parts)) / 1e6
    loop.run_round(rnd, parts, end_ms, config, seq=i + 1)
    return rnd


def window_end_ms(previous_ms: int) -> int:
    """The next round's window end: the clock's last whole second, as a worker closes a window
    once its clock passed the end (the planner refuses a window ending more than
    `SnapshotLimits.max_ahead_ms` ahead of its clock or over an hour behind it), and at least
    a second past the previous round's so that every round's window is a new one."""
    return max(int(time.time()) * 1000, previous_ms + 1000)


def report(args: argparse.Namespace, rounds: list[Round], router_rss: dict[str, float],
           servers: dict[str, float], setup_s: float) -> None:
    print(f"fleet: {args.keys:,} keys, {args.destinations:,} destinations "
          f"(W = {args.warm_slots_per_destination}), {args.partitions} source partitions, "
          f"{args.routers} router processes; workload generated in {setup_s:.1f} s (untimed)")
    cols = ("round", "parts", "MB", "stream s", "snap in s", "plan s", "keys",
            "prepare s", "commit s", "applied s", "apply CPU", "loop s", "applied as")
    print(" ".join(f"{c:>10}" for c in cols) + "   (seconds; apply CPU: max over routers)")
    for r in rounds:
        vals = (r.kind, r.parts, f"{r.snapshot_mb:.1f}", f"{r.stream_encode_s:.2f}",
                f"{r.snapshot_in_s:.2f}", f"{r.plan_s:.2f}", r.table_keys, f"{r.prepare_s:.2f}",
                f"{r.commit_s:.3f}", f"{r.applied_s:.2f}", f"{r.apply_cpu_ms_max / 1e3:.2f}",
                f"{r.loop_s:.2f}", r.applied_as)
        print(" ".join(f"{v:>10}" for v in vals))
    planner_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    per_process = {"planner": planner_mb, **router_rss, **servers}
    print("peak RSS (MB): " + ", ".join(f"{k} {v:.0f}" for k, v in per_process.items()))
    worst = max(r.loop_s for r in rounds)
    print(f"snapshot -> plan -> all routers applied: worst {worst:.2f} s (target <= 10 s): "
          f"{'met' if worst <= 10 else 'MISSED'}")
    figures: dict[str, Any] = {
        "keys": args.keys, "destinations": args.destinations, "routers": args.routers,
        "partitions": args.partitions, "loop_max_s": round(worst, 2), "target_met": worst <= 10,
        "rounds": [{k: (round(v, 3) if isinstance(v, float) else v)
                    for k, v in dataclasses.asdict(r).items()} for r in rounds],
        "peak_rss_mb_per_process": {k: round(v, 1) for k, v in per_process.items()},
        "peak_rss_mb": round(max(per_process.values()), 1),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
