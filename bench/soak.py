"""Soak: the whole stack on loopback under one random fault a minute.

Broker, Redis, a stream worker and the planner run as processes (as `cacheroute up`
runs them); synthetic traffic goes through Kafka; six routers follow the plans in
this process (three through a fault proxy) and route without pause, recording
histories; an operator replan every 2 s keeps publications flowing. Every
`--fault-every-s` one fault, chosen at random (each kind once per five): Redis
SIGKILLed and restarted (no persistence: the planner republishes), the stream
worker SIGKILLed and restarted, the routers' path blackholed for 10 s, a
publication corrupted in flight (a byte flipped between planner and Redis), the
planner SIGKILLed and restarted.

Checked: every router history valid (strictly increasing, only published digests;
no version ever published with two digests), routing never fails, every router
back on the newest valid plan after each fault, memory growth of the router
process < 10 % after warm-up, no fd growth.

    .venv/bin/python bench/soak.py --minutes 30        # the slow tier's figure
    .venv/bin/python bench/soak.py --quick             # 2 minutes, a fault every 20 s

Last line: one JSON object of figures.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib

import grpc
import numpy as np
import redis

from cacheroute.v1 import planner_pb2, planner_pb2_grpc
from planner_svc.devstack.processes import RedisServer, restart_redis, start_broker, start_redis
from planner_svc.devstack.stack import (
    LocalStack,
    StackOptions,
    create_topics,
    start_planner,
    start_worker,
    wait_for_planner,
)
from router_client import RouterClient, signing
from router_client.errors import PlanRejected
from router_client.layout import Layout, Pointer, parse_member
from router_client.plan import Version
from router_client.redis_source import RedisPlanSource
from streams.emitter import EventEmitter
from tests.faults import signals
from tests.faults.history import RouterHistory, check_histories, percentile
from tests.faults.proxy import FaultProxy
from tests.faults.resources import open_fds, rss_mb
from tests.reliability.harness import RoutingLoad

FAULTS = ("redis_kill", "worker_kill", "blackhole", "corrupt_publish", "planner_restart")
HOT, COLD = 12, 300
KEYS = [f"hot-{i}" for i in range(HOT)] + [f"cold-{j}" for j in range(COLD)]


class Traffic(threading.Thread):
    """HOT keys at drifting rates, COLD keys rarely: real events through Kafka."""

    def __init__(self, bootstrap: str, topic: str, dests: list[str]) -> None:
        super().__init__(daemon=True)
        self.dests = dests
        self.emitter = EventEmitter(bootstrap, topic, producer_id="soak")
        self.stop = threading.Event()

    def run(self) -> None:
        dests, emitter = self.dests, self.emitter
        rng = np.random.default_rng(5)
        rates = np.full(HOT, 8.0)
        while not self.stop.is_set():
            tick = time.monotonic()
            rates = np.clip(rates * np.exp(rng.normal(0, 0.05, HOT)), 1.0, 30.0)
            for i in range(HOT):
                for _ in range(rng.poisson(rates[i] * 0.1)):
                    d = dests[rng.integers(len(dests))]
                    emitter.emit_request(f"hot-{i}", d, prompt_tokens=1200,
                                         reusable_prefix_tokens=1000)  # fmt: skip
                    emitter.emit_cache_hit(f"hot-{i}", d, prompt_tokens=1200, cached_tokens=600)
            for j in rng.choice(COLD, size=rng.poisson(COLD * 0.05 * 0.1)):
                emitter.emit_request(f"cold-{j}", dests[0], prompt_tokens=300)
            time.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))
        emitter.close(5)


class VersionLog(threading.Thread):
    """Polls Redis (directly) for every retained version and its digest; flags a
    version ever seen with two digests."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.r: Any = redis.Redis.from_url(url, socket_timeout=0.5)
        self.published: dict[Version, bytes] = {}
        self.conflicts: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            with contextlib.suppress(redis.RedisError, OSError, ValueError):
                self.poll()

    def poll(self) -> None:
        lay = Layout()
        versions = []
        for m in self.r.zrange(lay.versions, 0, -1):
            with contextlib.suppress(ValueError):  # junk a hostile writer put in the index
                versions.append(parse_member(m))
        digests = self.r.mget([lay.digest(v) for v in versions]) if versions else []
        for v, d in zip(versions, digests, strict=True):
            if d is None:
                continue
            digest = bytes.fromhex(d.decode())
            if self.published.setdefault(v, digest) != digest:
                self.conflicts.append(f"{v} published with two digests")


class Soak:
    # The planner reaches Redis through a proxy that can corrupt a publication in flight.
    corrupt_in_flight = True

    def __init__(self, workdir: Path, seed: int) -> None:
        self.workdir = workdir
        self.rng = random.Random(seed)
        self.options = StackOptions(
            destinations=6, event_partitions=2, window_s=4.0, hop_s=1.0, interval_s=5.0,
            q_cap=4.0, warm_slots_per_destination=8, workdir=str(workdir),
        )  # fmt: skip
        self.faults: Counter[str] = Counter()
        self.converge_s: list[float] = []
        self.not_converged: list[str] = []
        self.samples: list[tuple[float, float, int]] = []  # (t, rss, fds)
        self._cycle: list[str] = []

    def next_fault(self) -> str:
        """At random, but every kind once per cycle of five (so short runs see them all)."""
        if not self._cycle:
            self._cycle = self.rng.sample(FAULTS, len(FAULTS))
        return self._cycle.pop()

    # --- start and stop ------------------------------------------------------------------

    def start(self) -> None:
        s = self.stack = LocalStack(self.options, self.workdir)
        s.broker = start_broker(self.workdir)
        self.redis = start_redis(self.workdir)
        create_topics(s.bootstrap, self.options)
        s.workers = [start_worker(s, 0)]
        self.planner_proxy: FaultProxy | None = None
        s.redis = self.redis
        if self.corrupt_in_flight:
            self.planner_proxy = FaultProxy(self.redis.port).start()
            s.redis = RedisServer(self.planner_proxy.port, self.redis.process, self.redis.datadir)
        s.planner = start_planner(s)
        wait_for_planner(s)
        self.routers_proxy = FaultProxy(self.redis.port).start()
        self.traffic = Traffic(s.bootstrap, self.options.events_topic, self.options.destination_ids)
        self.traffic.start()
        self.versions = VersionLog(self.redis.url)
        self.versions.start()
        self.channel = grpc.insecure_channel(s.grpc_target)
        self._wait_first_plan()
        self._start_routers()
        self.replans = threading.Thread(target=self._replan_loop, daemon=True)
        self._stop = threading.Event()
        self.replans.start()

    def _wait_first_plan(self) -> None:
        r = redis.Redis.from_url(self.redis.url)
        deadline = time.monotonic() + 90
        while r.get(Layout().current) is None:
            if time.monotonic() > deadline:
                raise RuntimeError("no first plan within 90 s")
            time.sleep(0.5)
        self.key = signing.load_public_key(self.stack.public_key_path)

    def _start_routers(self) -> None:
        self.histories = [RouterHistory(f"soak-{i}") for i in range(6)]
        self.clients = []
        for i, h in enumerate(self.histories):
            url = self.routers_proxy.redis_url if i < 3 else self.redis.url
            c = RouterClient(
                RedisPlanSource(url), router_id=h.router_id, public_keys=[self.key],
                on_applied=h.on_applied, max_plan_age_s=30.0,
                destination_ids=self.options.destination_ids,
            )  # fmt: skip
            self.clients.append(c.start(initial_wait_s=10))
        self.load = RoutingLoad(self.clients, self.histories, keys=KEYS).__enter__()

    def _replan_loop(self) -> None:
        while not self._stop.wait(2.0):
            # planner restarting (channel replaced) or Redis down: the next one will do
            with contextlib.suppress(grpc.RpcError, ValueError):
                stub = planner_pb2_grpc.PlannerStub(self.channel)
                stub.Replan(planner_pb2.ReplanRequest(force=True), timeout=5)

    def stop(self) -> None:
        self._stop.set()
        self.replans.join(10)
        self.load.__exit__()
        for c in self.clients:
            c.stop()
        self.traffic.stop.set()
        self.traffic.join(10)
        self.versions.stop.set()
        self.versions.join(5)
        self.channel.close()
        self.routers_proxy.stop()
        if self.planner_proxy is not None:
            self.planner_proxy.stop()
        assert self.stack.broker is not None
        for p in (self.stack.planner, *self.stack.workers, self.redis.process,
                  self.stack.broker.process):  # fmt: skip
            if p is not None:
                p.stop()

    # --- faults ---------------------------------------------------------------------------

    def inject(self, kind: str) -> None:
        self.faults[kind] += 1
        s = self.stack
        if kind == "redis_kill":
            signals.kill(self.redis.process.pid)
            time.sleep(3.0)
            restart_redis(self.redis)
        elif kind == "worker_kill":
            signals.kill(s.workers[0].pid)
            time.sleep(2.0)
            s.workers[0].stop()
            s.workers[0].start()
        elif kind == "blackhole":
            self.routers_proxy.blackhole = True
            time.sleep(10.0)
            self.routers_proxy.blackhole = False
        elif kind == "corrupt_publish":
            assert self.planner_proxy is not None  # started with the stack
            self.planner_proxy.corrupt_next_upstream = 2048
            stub = planner_pb2_grpc.PlannerStub(self.channel)
            with contextlib.suppress(grpc.RpcError):
                stub.Replan(planner_pb2.ReplanRequest(force=True), timeout=5)
        elif kind == "planner_restart":
            assert s.planner is not None
            signals.kill(s.planner.pid)
            s.planner.stop()
            s.planner = start_planner(s)  # new ports; the same data dir and signing key
            wait_for_planner(s, 60)
            self.channel.close()
            self.channel = grpc.insecure_channel(s.grpc_target)

    def newest_valid(self) -> Version | None:
        """The version Redis points at if its plan verifies, else None (rejected)."""
        r: Any = redis.Redis.from_url(self.redis.url, socket_timeout=1)
        raw = r.get(Layout().current)
        if raw is None:
            return None
        p = Pointer.decode(raw)
        blob = r.get(Layout().plan(p.version))
        try:
            _k, _p, digest = signing.verify_blob(blob or b"", [self.key])
        except PlanRejected:
            return None
        return p.version if digest == p.digest else None

    def converge(self, kind: str, timeout_s: float = 30.0) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            try:
                target = self.newest_valid()
            except (redis.RedisError, OSError):
                target = None
            if target is not None and all(c.version >= target for c in self.clients):
                self.converge_s.append(time.monotonic() - t0)
                return
            time.sleep(0.1)
        self.not_converged.append(f"{kind}: {[str(c.version) for c in self.clients]}")

    def sample(self) -> None:
        conns = self.routers_proxy.open_connections()
        if self.planner_proxy is not None:
            conns += self.planner_proxy.open_connections()
        self.samples.append((time.monotonic(), rss_mb(), open_fds() - 2 * conns))

    def run(self, minutes: float, fault_every_s: float) -> dict[str, Any]:
        start = time.monotonic()
        end = start + minutes * 60
        warm = start + min(120.0, minutes * 60 * 0.2)
        next_fault = start + fault_every_s
        baseline: tuple[float, float, int] | None = None
        while time.monotonic() < end:
            time.sleep(min(5.0, max(0.0, next_fault - time.monotonic())))
            if baseline is None and time.monotonic() >= warm:
                self.sample()
                baseline = self.samples[-1]
            if time.monotonic() >= next_fault and time.monotonic() < end - 15:
                kind = self.next_fault()
                print(f"[{time.monotonic() - start:7.1f} s] fault: {kind}", flush=True)
                self.inject(kind)
                self.converge(kind)
                next_fault += fault_every_s
        time.sleep(3.0)
        self.converge("end")
        self.sample()
        return self.figures(minutes, baseline or self.samples[0])

    def figures(self, minutes: float, baseline: tuple[float, float, int]) -> dict[str, Any]:
        self.versions.poll()
        final = self.newest_valid()
        violations = check_histories(self.histories, published=self.versions.published,
                                     final=final)  # fmt: skip
        violations += self.versions.conflicts
        _t, rss_end, fds_end = self.samples[-1]
        return {
            "minutes": minutes,
            "faults": sum(self.faults.values()),
            **{f"faults_{k}": self.faults[k] for k in FAULTS},
            "violations": len(violations),
            "violation_examples": violations[:5],
            "not_converged": len(self.not_converged),
            "converge_p50_s": round(percentile(self.converge_s, 50), 3),
            "converge_max_s": round(max(self.converge_s, default=float("nan")), 3),
            "route_calls": self.load.calls,
            "route_errors": len(self.load.errors),
            "longest_route_gap_s": round(self.load.longest_gap_s, 3),
            "versions_published": len(self.versions.published),
            "versions_applied": sum(len(h.applied) for h in self.histories),
            "rejections": sum(c.follower.rejections for c in self.clients),
            "delta_fallbacks": sum(c.follower.delta_fallbacks for c in self.clients),
            "corrupted_publications": (self.planner_proxy.stats.corrupted
                                       if self.planner_proxy is not None else 0),
            "rss_warm_mb": round(baseline[1], 1),
            "rss_end_mb": round(rss_end, 1),
            "rss_growth_pct": round(100 * (rss_end - baseline[1]) / baseline[1], 2),
            "fds_warm": baseline[2],
            "fds_end": fds_end,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }


def run_soak(minutes: float, fault_every_s: float, seed: int = 1) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        soak = Soak(Path(tmp), seed)
        soak.start()
        try:
            return soak.run(minutes, fault_every_s)
        finally:
            soak.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--fault-every-s", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="2 minutes, a fault every 20 s")
    a = ap.parse_args()
    minutes, every = (2.0, 20.0) if a.quick else (a.minutes, a.fault_every_s)
    fig = run_soak(minutes, every, a.seed)
    print(f"\n{'figure':<24}{'value':>14}")
    for k, v in fig.items():
        if k != "violation_examples":
            print(f"{k:<24}{v!s:>14}")
    for v in fig["violation_examples"]:
        print("violation:", v)
    print(json.dumps(fig))


if __name__ == "__main__":
    main()
