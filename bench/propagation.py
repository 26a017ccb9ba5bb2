"""Publish -> applied delay of a plan, full and delta, to 1 and to N subscriber processes.

A real redis-server is started on loopback (and stopped at the end). The plan
has 100,000 keys over 1,000 destinations; a delta round changes 2 % of the keys.
Each subscriber is its own process running `RouterClient(RedisPlanSource(...))`.

Method: the publisher prepares (encodes, signs, diffs) the install and stages
its blobs in Redis first, as the planner does (`PlanPublisher.stage`; the
staging time is printed too); the clock starts right before the one Lua script
call that moves the pointer and PUBLISHes, and stops in each subscriber right
after its atomic swap (`on_applied`), both read with `time.time()` on the same
machine. So a delay covers: the install script, notification, GET of the blob,
size/digest/signature checks, decoding, sanity checks, building (or editing) the
lookup, and the swap. "full" rounds are installed
without a delta (every subscriber fetches the whole plan), "delta" rounds with one.

Last line: one JSON object of figures.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner_svc.adapters.redis_publisher import PlanPublisher
from planner_svc.devstack.processes import start_redis
from router_client import signing
from router_client.client import RouterClient
from router_client.plan import RoutingPlan, Version
from router_client.redis_source import RedisPlanSource
from router_client.testing import perturb, synthetic_plan


def subscriber(url: str, pem: bytes, rid: str, out: Any, stop: Any, tune: bool) -> None:
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    key = load_pem_public_key(pem)
    keys = signing.pin([key])  # type: ignore[list-item]

    def applied(table: Any, kind: str) -> None:
        out.put((rid, table.version.seq, kind, time.time(), client.last_apply_cpu_ms))

    client: RouterClient = RouterClient(
        RedisPlanSource(url),
        router_id=rid,
        public_keys=keys,
        on_applied=applied,
        tune_malloc=tune,
    )
    client.start()
    stop.wait()
    client.stop()


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


class Run:
    def __init__(
        self, url: str, publisher: PlanPublisher, n_subs: int, pem: bytes, tune: bool
    ) -> None:
        ctx = mp.get_context("fork")
        self.out = ctx.Queue()
        self.stop = ctx.Event()
        self.n = n_subs
        self.cpu_ms: dict[str, list[float]] = {}
        self.commit_ms: list[float] = []
        self.stage_ms: list[float] = []
        self.publisher = publisher
        self.procs = [
            ctx.Process(
                target=subscriber, args=(url, pem, f"s{i}", self.out, self.stop, tune), daemon=True
            )
            for i in range(n_subs)
        ]
        for p in self.procs:
            p.start()

    def install(self, plan: RoutingPlan, previous: RoutingPlan | None) -> tuple[list[float], dict]:
        prepared = self.publisher.prepare(plan, previous)
        t = time.perf_counter()
        prepared = self.publisher.stage(prepared)  # upload, as the planner does first
        self.stage_ms.append((time.perf_counter() - t) * 1000)
        t0 = time.time()
        self.publisher.commit(prepared)
        self.commit_ms.append((time.time() - t0) * 1000)
        delays: list[float] = []
        kinds: dict[str, int] = {}
        deadline = time.monotonic() + 30
        while len(delays) < self.n and time.monotonic() < deadline:
            _rid, seq, kind, t, cpu_ms = self.out.get(timeout=30)
            if seq == plan.version.seq:
                delays.append((t - t0) * 1000)
                kinds[kind] = kinds.get(kind, 0) + 1
                self.cpu_ms.setdefault(kind, []).append(cpu_ms)
        return delays, kinds

    def close(self) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()


def measure(
    url: str,
    pub: PlanPublisher,
    pem: bytes,
    n_subs: int,
    base: RoutingPlan,
    rounds: int,
    start_seq: int,
    tune: bool,
) -> dict[str, Any]:
    run = Run(url, pub, n_subs, pem, tune)
    try:
        seq = start_seq
        plan = synthetic_plan(len(base.table), len(base.destinations), version=Version(1, seq))
        run.install(plan, None)  # warm-up: every subscriber holds a plan
        time.sleep(0.3)  # as between the rounds below
        res: dict[str, Any] = {"full": [], "delta": [], "kinds": {}}
        for _ in range(rounds):
            for kind in ("full", "delta"):
                seq += 1
                nxt = perturb(plan, 0.02, version=Version(1, seq), seed=seq)
                delays, kinds = run.install(nxt, plan if kind == "delta" else None)
                res[kind] += delays
                for k, v in kinds.items():
                    res["kinds"][f"{kind}->{k}"] = res["kinds"].get(f"{kind}->{k}", 0) + v
                plan = nxt
                time.sleep(0.3)
        res["seq"] = seq
        res["cpu_ms"] = run.cpu_ms
        res["commit_ms"] = run.commit_ms
        res["stage_ms"] = run.stage_ms
        return res
    finally:
        run.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--destinations", type=int, default=1_000)
    ap.add_argument("--subscribers", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="3 rounds")
    ap.add_argument(
        "--no-tune-malloc",
        action="store_true",
        help="subscribers keep glibc's malloc defaults (the baseline of router_client.memory)",
    )
    args = ap.parse_args()
    if args.quick:
        args.rounds = 3

    workdir = Path(tempfile.mkdtemp(prefix="cacheroute-propagation-"))
    redis = start_redis(workdir)
    try:
        key = signing.generate_private_key()
        from cryptography.hazmat.primitives import serialization

        pem = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        pub = PlanPublisher(redis.url, key)
        base = synthetic_plan(args.keys, args.destinations)
        t = time.perf_counter()
        pub.prepare(perturb(base, 0.02, version=Version(1, 2)), base)
        prepare_ms = (time.perf_counter() - t) * 1000
        tune = not args.no_tune_malloc
        one = measure(redis.url, pub, pem, 1, base, args.rounds, 1, tune)
        many = measure(
            redis.url, pub, pem, args.subscribers, base, args.rounds, one["seq"] + 1, tune
        )
    finally:
        redis.process.stop()

    commit = statistics.median(one["commit_ms"] + many["commit_ms"])
    stage = statistics.median(one["stage_ms"] + many["stage_ms"])
    print(
        f"plan: {args.keys:,} keys over {args.destinations:,} destinations; delta = 2 % of keys;"
        f" {args.rounds} rounds each; publisher prepare (encode+sign+delta) {prepare_ms:.0f} ms,"
        f" stage (upload, before the clock) p50 {stage:.1f} ms,"
        f" commit (Lua install, inside the measured delay) p50 {commit:.1f} ms"
    )
    print(
        f"{'subscribers':>11s} {'kind':>6s} {'n':>5s} {'p50 ms':>8s} {'p99 ms':>8s} "
        f"{'max ms':>8s} {'target':>8s} {'apply CPU p50 ms':>17s}"
    )
    fig: dict[str, Any] = {
        "keys": args.keys,
        "destinations": args.destinations,
        "subscribers": args.subscribers,
        "rounds": args.rounds,
        "tune_malloc": tune,
        "publisher_prepare_ms": round(prepare_ms, 1),
        "publisher_stage_p50_ms": round(stage, 1),
        "publisher_commit_p50_ms": round(commit, 1),
    }
    targets = {(1, "full"): 30, (args.subscribers, "full"): 400, (args.subscribers, "delta"): 50}
    for n, res in ((1, one), (args.subscribers, many)):
        for kind in ("full", "delta"):
            xs = res[kind]
            tgt = targets.get((n, kind))
            cpu = statistics.median(res["cpu_ms"].get(kind, [0.0]))
            print(
                f"{n:11d} {kind:>6s} {len(xs):5d} {statistics.median(xs):8.1f} "
                f"{_pct(xs, 0.99):8.1f} {max(xs):8.1f} {tgt if tgt else '-':>8} {cpu:17.1f}"
            )
            tag = "1sub" if n == 1 else f"{n}sub"
            fig[f"{kind}_{tag}_p50_ms"] = round(statistics.median(xs), 1)
            fig[f"{kind}_{tag}_p99_ms"] = round(_pct(xs, 0.99), 1)
            fig[f"{kind}_{tag}_apply_cpu_p50_ms"] = round(cpu, 1)
        print(f"{'':11s} applied as: {res['kinds']}")
    fig["load_avg_1m"] = round(__import__("os").getloadavg()[0], 2)
    fig["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(fig))


if __name__ == "__main__":
    main()
