"""Chaos: every fault the hardening issue names, plus SIGKILLs of every component, at random
while routers route; every restart is the stack's own Supervisor's (as under `cacheroute up`).

The stack (broker, Redis, a stream worker, the planner) runs as processes; synthetic traffic
goes through Kafka; six routers follow the plans in this process (three through a proxy that
can blackhole them) and route without pause; an operator replan every 2 s keeps
publications flowing. Every `--fault-every-s` one fault, at random (every kind once per
cycle):

    kills     broker (Apache Kafka comes back with its storage; Tansu's is memory: topics,
              history and offsets are lost), Redis (no persistence), the stream worker,
              the planner: SIGKILL, nothing else
    network   the routers' path to Redis blackholed for 10 s
    hostile   a forged snapshot (far-future window, five made-up keys at 5,000 req/s) and
              a plausible one (issue 55 item 6: every partition's part, on the grid, 26 s
              ahead and at the next end, unsigned and signed by a rogue key); one event
              per partition stamped 290 s ahead; one per partition with the real
              producer's id and sequence 2^64-1, and one 9,000,000 ahead of its sequence
              (item 7); 3 MB of random bytes on the events topic;
              a junk or too-high current pointer; 20 watch streams at once; junk router
              status and version-index members; oversized request ids and absurd values

At the end: every router on the planner's newest version; versions each router observed
only increased (and only published digests); the newest complete window's per-key counts
equal a recount of the events topic over the same range minus the dead-lettered events;
every component alive, restarted by the Supervisor only; every hostile write refused.

Then the attack run (bench/attacks.py, on servers of its own: issue 55's attacks by one
credential at a time against the ACL'd Redis, the planner's gRPC, the gateway and the
endpoint picker, while honest clients use the gateway); its figures join the JSON.

    .venv/bin/python bench/chaos.py                  # 3 minutes, then ~75 s of attacks
    .venv/bin/python bench/chaos.py --minutes 20 --no-attacks

Last line: one JSON object of figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc
import redis
from attacks import print_table as print_attack_table
from attacks import run_attacks
from confluent_kafka import Producer
from soak import FAULTS as SOAK_FAULTS
from soak import Soak

from cacheroute.v1 import events_pb2, plan_pb2, planner_pb2, planner_pb2_grpc
from planner_svc.adapters.events_export import read_topic
from planner_svc.devstack.stack import Supervisor, wait_for_planner
from router_client import signing
from router_client.errors import PlanRejected
from router_client.layout import Layout, Pointer, parse_member
from router_client.plan import decode_keys, version_from_pb
from streams.assembly import CompleteWindow
from streams.emitter import PARTITION_SHIFT
from tests.faults import signals
from tests.faults.hostile import (
    FORGED_PREFIX,
    JUNK_POINTERS,
    accept_large_messages,
    forged_request,
    forged_snapshot,
    oversized_garbage,
    plausible_forged_part,
    rogue_signed,
)
from tests.integration.test_stream_support import SnapshotLog, dead_letters

KILL_TARGET = {"broker_kill": "broker", "redis_kill": "redis", "worker_kill": "worker-0",
               "planner_kill": "planner"}
KILLS = tuple(KILL_TARGET)
HOSTILE = ("forged_snapshot", "future_events", "sequence_jump", "oversized_message",
           "junk_pointer", "watch_flood", "junk_fleet_keys", "oversized_values")
FAULTS = (*KILLS, "blackhole", *HOSTILE)
# The dead-letter reason each hostile write must produce (every real event still counts).
DEAD_LETTER_OF = {"future_events": ("timestamp_future",), "sequence_jump": ("sequence_jump",),
                  "oversized_message": ("undecodable",)}
assert "blackhole" in SOAK_FAULTS


class Chaos(Soak):
    corrupt_in_flight = False  # the Supervisor restarts the real Redis; corruption is the soak's

    def __init__(self, workdir: Path, seed: int, window_s: float = 20.0) -> None:
        super().__init__(workdir, seed)
        self.options = replace(self.options, window_s=window_s, hop_s=2.0)
        self.failures: list[str] = []
        self.restart_wait_s: list[float] = []
        self.dead_letters_expected: set[str] = set()

    def start(self) -> None:
        super().start()
        self.supervisor = Supervisor(self.stack, max_backoff_s=4.0)
        self._supervising = threading.Event()
        self._supervisor_thread = threading.Thread(target=self._supervise, daemon=True)
        self._supervisor_thread.start()

    def _supervise(self) -> None:
        while not self._supervising.wait(0.3):
            for name in self.supervisor.check():
                print(f"    supervisor restarted {name}", flush=True)

    def stop(self) -> None:
        self._supervising.set()
        self._supervisor_thread.join(10)
        super().stop()

    def next_chaos_fault(self, remaining_s: float) -> str:
        """At random, every kind once per cycle; a broker kill (its storage is lost) never
        so late that the final window could still cover it."""
        if not self._cycle:
            self._cycle = self.rng.sample(FAULTS, len(FAULTS))
            if "broker_kill" in self._cycle:  # early in the cycle: short runs see it
                self._cycle.remove("broker_kill")
                self._cycle.insert(len(self._cycle) - self.rng.randrange(3) - 1, "broker_kill")
        kind = self._cycle.pop()
        if kind == "broker_kill" and remaining_s < self.options.window_s + 40:
            if not self._cycle:  # a fresh cycle without it, so the next pick is another kind
                self._cycle = [k for k in self.rng.sample(FAULTS, len(FAULTS)) if k != kind]
            self._cycle.insert(0, kind)  # later, if there is time
            kind = self._cycle.pop()
        return kind

    # --- faults ---------------------------------------------------------------------------

    def _stub(self) -> planner_pb2_grpc.PlannerStub:
        return planner_pb2_grpc.PlannerStub(self.channel)

    def _fail(self, what: str) -> None:
        print(f"    FAILED: {what}", flush=True)
        self.failures.append(what)

    def inject(self, kind: str) -> None:
        self.faults[kind] += 1
        s = self.stack
        if kind == "broker_kill":
            self.dead_letters_expected.clear()  # the topic is lost with the broker's storage
        self.dead_letters_expected.update(DEAD_LETTER_OF.get(kind, ()))
        if kind in KILLS:
            name = KILL_TARGET[kind]  # the supervisor's own name for the component
            proc = dict(self.supervisor.components())[name]
            before = self.supervisor.restarted[name]
            signals.kill(proc.pid)
            t0 = time.monotonic()
            while self.supervisor.restarted[name] == before:
                if time.monotonic() - t0 > 60:
                    self._fail(f"{name} not restarted by the supervisor within 60 s")
                    return
                time.sleep(0.1)
            self.restart_wait_s.append(time.monotonic() - t0)
            if kind == "planner_kill":
                wait_for_planner(s, 60)
        elif kind == "blackhole":
            super().inject(kind)
            self.faults[kind] -= 1  # counted once
        else:
            getattr(self, f"_{kind}")()

    def _producer(self) -> Producer:  # a third-party client: no idempotence, no help
        return Producer({"bootstrap.servers": self.stack.bootstrap, "log_level": 0,
                         "message.max.bytes": 8 << 20})

    def _send(self, topic: str, values: list[tuple[int | None, bytes]]) -> None:
        p = self._producer()
        errors: list[str] = []
        for partition, value in values:
            kw: dict[str, Any] = {} if partition is None else {"partition": partition}
            p.produce(topic, value=value, on_delivery=_note_error(errors), **kw)
        if p.flush(15) or errors:
            self._fail(f"could not write the hostile messages to {topic}: {errors[:1]}")

    def _forged_snapshot(self) -> None:
        now = int(time.time() * 1000) // 2000 * 2000
        parts = self.options.event_partitions
        # and issue 55 item 6's plausible forgery: every partition's part, on the grid,
        # ending 26 s ahead and at the next real end, unsigned and signed by a rogue key
        window_ms = round(self.options.window_s * 1000)
        plausible = [plausible_forged_part(end, p, parts, window_ms)
                     for end in (now + 26_000, now + 2_000) for p in range(parts)]
        self._send(self.options.snapshots_topic, [
            (None, forged_snapshot(2**62, parts)), (None, forged_snapshot(now, 1)),
            *[(None, v) for v in plausible], *[(None, rogue_signed(v)) for v in plausible]])

    def _future_events(self) -> None:
        ahead = int(time.time() * 1000) + 290_000
        self._send(self.options.events_topic, [
            (p, forged_request("evil-clock", 1 + p, ahead)) for p in
            range(self.options.event_partitions)])

    def _sequence_jump(self) -> None:
        now = int(time.time() * 1000)
        real = self.traffic.emitter.producer_id
        # and issue 55 item 7: +9,000,000 on the real producer's current sequence in each
        # partition (under the dead-letter bound: counted, and it must not shadow the real
        # producer's next events; the end's recount would miss them)
        sent = dict(self.traffic.emitter._sequences)  # partition -> its last sequence
        parts = range(self.options.event_partitions)
        self._send(self.options.events_topic, [
            *[(p, forged_request(real, 2**64 - 1, now, key="hot-0")) for p in parts],
            *[(p, forged_request(real, sent.get(p, p << PARTITION_SHIFT) + 9_000_000, now,
                                 key="hot-0")) for p in parts]])

    def _oversized_message(self) -> None:
        accept_large_messages(self.stack.bootstrap, self.options.events_topic)
        self._send(self.options.events_topic, [(0, oversized_garbage(3 << 20))])

    def _junk_pointer(self) -> None:
        r: Any = redis.Redis.from_url(self.redis.url, socket_timeout=2)
        with contextlib.suppress(redis.RedisError):
            r.set(Layout().current, self.rng.choice(JUNK_POINTERS))
        t0 = time.monotonic()  # the planner repairs it (without an install being needed)
        while time.monotonic() - t0 < 30:
            with contextlib.suppress(redis.RedisError, OSError):
                if self.newest_valid() is not None:
                    return
            time.sleep(0.2)
        self._fail("a junk current pointer was not repaired within 30 s")

    def _watch_flood(self) -> None:
        channels = [grpc.insecure_channel(self.stack.grpc_target) for _ in range(20)]
        calls = [planner_pb2_grpc.PlannerStub(ch).WatchPlans(planner_pb2.WatchPlansRequest(),
                                                             timeout=3) for ch in channels]

        def drain(call: Any) -> None:
            with contextlib.suppress(grpc.RpcError):
                for _ in call:
                    pass

        with ThreadPoolExecutor(20) as pool:
            for c in calls:
                pool.submit(drain, c)
            time.sleep(0.5)
            try:
                self._stub().GetStatus(planner_pb2.GetStatusRequest(), timeout=3)
            except grpc.RpcError as exc:
                self._fail(f"GetStatus under 20 watch streams: {exc.code()}")
        for ch in channels:
            ch.close()

    def _junk_fleet_keys(self) -> None:
        r: Any = redis.Redis.from_url(self.redis.url, socket_timeout=2)
        lay = Layout()
        with contextlib.suppress(redis.RedisError):
            r.zadd(lay.routers, {"junk-router": time.time() * 1000})
            r.set(lay.router_status("junk-router"), b"\xff\xfe not a status")
            r.zadd(lay.versions, {"not-a-version": 0})
        for call in (lambda: self._stub().ListRouters(planner_pb2.ListRoutersRequest(),
                                                      timeout=5),
                     lambda: self._stub().ListPlanVersions(
                         planner_pb2.ListPlanVersionsRequest(), timeout=5)):
            try:
                call()
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:  # Redis restarting: documented
                    self._fail(f"a fleet view failed on junk keys: {exc.code()}")

    def _oversized_values(self) -> None:
        refused = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED)
        for what, call in (
            ("a 4 MB request id", lambda: self._stub().Replan(
                planner_pb2.ReplanRequest(dry_run=True, request_id="x" * 4_000_000), timeout=10)),
            ("q_cap 1e-300", lambda: self._stub().UpdateConfig(
                planner_pb2.UpdateConfigRequest(q_cap=1e-300), timeout=5)),
        ):
            try:
                call()
                self._fail(f"{what} was accepted")
            except grpc.RpcError as exc:
                if exc.code() not in refused:
                    self._fail(f"{what}: {exc.code()} (want INVALID_ARGUMENT)")

    # --- the end ---------------------------------------------------------------------------

    def planner_version(self) -> Any:
        st = self._stub().GetStatus(planner_pb2.GetStatusRequest(), timeout=5)
        return version_from_pb(st.installed) if st.HasField("installed") else None

    def forged_keys_in_plans(self) -> list[str]:
        """Forged keys in any retained plan (full plans; deltas build on them)."""
        r: Any = redis.Redis.from_url(self.redis.url, socket_timeout=2)
        lay = Layout()
        found = []
        for member in r.zrange(lay.versions, 0, -1):
            try:
                v = parse_member(member)
            except ValueError:
                continue  # the junk member this run wrote
            blob = r.get(lay.plan(v))
            try:
                kind, payload, _ = signing.verify_blob(blob or b"", [self.key])
            except PlanRejected:
                continue
            if kind != plan_pb2.SignedBlob.PLAN:
                continue
            plan = plan_pb2.RoutingPlan.FromString(payload)
            found += [f"{v}: {k}" for k in decode_keys(plan.table.keys) if
                      k.startswith(FORGED_PREFIX)]
        return found

    def count_check(self, traffic_stopped_ms: int) -> dict[str, Any]:
        """The newest complete window that ends after the traffic stopped, against a
        recount of the events topic over its range minus what was dead-lettered."""
        s = self.stack
        log = SnapshotLog(s.bootstrap, self.options.snapshots_topic)
        want_end = traffic_stopped_ms + 2 * round(self.options.hop_s * 1000)

        def settled(w: CompleteWindow) -> bool:
            return w.window_end_ms >= want_end and not w.recovering

        window = log.wait_for(settled, timeout_s=60)
        log.close()
        if window is None:
            return {"count_window": None, "count_mismatched_keys": -1}
        # at least one letter per expected reason (a reason's count depends on the run)
        letters = dead_letters(s.bootstrap, self.options.deadletter_topic,
                               len(self.dead_letters_expected))
        dead: set[tuple[str, int]] = set()
        for letter in letters:
            with contextlib.suppress(Exception):
                e = events_pb2.Event.FromString(letter.raw)
                if e.producer_id:
                    dead.add((e.producer_id, e.sequence))
        truth: Counter[str] = Counter()
        seen: set[tuple[str, int]] = set()
        for value in read_topic(s.bootstrap, self.options.events_topic, deadline_s=60.0):
            try:
                batch = events_pb2.EventBatch.FromString(value)
            except Exception:
                continue  # the random bytes: dead-lettered as undecodable
            for e in batch.events:
                ident = (e.producer_id, e.sequence)
                if e.WhichOneof("body") != "request" or ident in seen or ident in dead:
                    continue
                seen.add(ident)
                if window.window_start_ms <= e.timestamp_ms < window.window_end_ms:
                    truth[e.request.routing_key] += 1
        counted = Counter({k: int(n) for k, n in zip(window.keys, window.requests, strict=True)
                           if n})
        diff = {k: (counted[k], truth[k]) for k in set(counted) | set(truth)
                if counted[k] != truth[k]}
        return {
            "count_window_s": (window.window_end_ms - window.window_start_ms) / 1000,
            "count_requests": sum(counted.values()),
            "count_recount": sum(truth.values()),
            "count_mismatched_keys": len(diff),
            "count_mismatch_examples": dict(list(diff.items())[:5]),
            "dead_letters_by_reason": dict(Counter(x.reason for x in letters)),
            "dead_letter_reasons_missing": sorted(
                self.dead_letters_expected - {x.reason for x in letters}),
        }

    def run(self, minutes: float, fault_every_s: float) -> dict[str, Any]:  # type: ignore[override]
        start = time.monotonic()
        end = start + minutes * 60
        next_fault = start + 8.0
        self.sample()
        baseline = self.samples[-1]
        def going() -> bool:
            # A slow machine fits fewer faults in the time: run on (at most a minute longer)
            # until every kind has been injected once.
            now = time.monotonic()
            unseen = any(not self.faults[k] for k in FAULTS)
            return now < end - 10 or (unseen and now < end + 60)

        while going():
            time.sleep(max(0.0, min(1.0, next_fault - time.monotonic())))
            if time.monotonic() < next_fault:
                continue
            kind = self.next_chaos_fault(max(end, time.monotonic() + 10) - time.monotonic())
            print(f"[{time.monotonic() - start:6.1f} s] {kind}", flush=True)
            self.inject(kind)
            self.converge(kind)
            next_fault = max(next_fault + fault_every_s, time.monotonic() + 1.0)
        time.sleep(3.0)
        self.converge("end")
        self.traffic.stop.set()
        self.traffic.join(30)
        stopped_ms = int(time.time() * 1000)
        self.sample()
        fig = self.figures(minutes, baseline)
        fig.update(self.end_figures(stopped_ms))
        return fig

    def end_figures(self, traffic_stopped_ms: int) -> dict[str, Any]:
        # The planner keeps publishing after the last convergence check (its control loop
        # runs on): give a version it published just now the routers' normal propagation time
        # (converge_max_s is ~0.5 s) before comparing, so the figure is "on the newest
        # version", not "published in the same millisecond".
        planner = self.planner_version()
        settle_until = time.monotonic() + 2.0
        while (time.monotonic() < settle_until
               and any(c.version != planner for c in self.clients)):
            time.sleep(0.05)
            planner = self.planner_version()
        pointer = Pointer.decode(redis.Redis.from_url(self.redis.url).get(Layout().current)
                                 or b"")
        routers = [c.version for c in self.clients]
        alive = {name: proc.alive() for name, proc in self.supervisor.components()}
        forged = self.forged_keys_in_plans()
        counts = self.count_check(traffic_stopped_ms)
        return {
            "faults_by_kind": dict(self.faults),
            "restarts_by_supervisor": dict(self.supervisor.restarted),
            "restart_wait_max_s": round(max(self.restart_wait_s, default=0.0), 2),
            "all_alive": all(alive.values()),
            "planner_version": str(planner),
            "pointer_version": str(pointer.version),
            "routers_on_planner_version": sum(v == planner for v in routers),
            "routers": len(routers),
            "forged_keys_in_plans": len(forged),
            "hostile_failures": len(self.failures),
            "hostile_failure_examples": self.failures[:5],
            **counts,
        }


def _note_error(errors: list[str]) -> Callable[[Any, Any], None]:
    """A delivery callback that keeps the reason of each failed produce."""
    def note(error: Any, _message: Any) -> None:
        if error is not None:
            errors.append(str(error))
    return note


def run_chaos(minutes: float = 3.0, fault_every_s: float = 12.0, seed: int = 1) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        chaos = Chaos(Path(tmp), seed)
        chaos.start()
        try:
            return chaos.run(minutes, fault_every_s)
        finally:
            chaos.stop()


def with_attacks(fig: dict[str, Any], attacks: dict[str, Any]) -> dict[str, Any]:
    """The chaos figures and the attack run's (bench/attacks.py) in one object; an attack
    run's name that a chaos figure has too gets "attack_run_" in front."""
    out = dict(fig)
    for k, v in attacks.items():
        if k != "peak_rss_mb":
            out[f"attack_run_{k}" if k in fig else k] = v
    out["peak_rss_mb"] = max(fig.get("peak_rss_mb", 0.0), attacks["peak_rss_mb"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--fault-every-s", type=float, default=12.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--attacks", action=argparse.BooleanOptionalAction, default=True,
                    help="then the attack run (bench/attacks.py) on a rig of its own")
    a = ap.parse_args()
    fig = run_chaos(a.minutes, a.fault_every_s, a.seed)
    print(f"\n{'figure':<30}{'value':>40}")
    for k, v in fig.items():
        if not k.endswith("examples"):
            print(f"{k:<30}{v!s:>40}")
    for k in ("violation_examples", "hostile_failure_examples", "count_mismatch_examples"):
        if fig.get(k):
            print(f"{k}: {fig[k]}")
    if a.attacks:
        attacks = run_attacks()
        print_attack_table(attacks)
        fig = with_attacks(fig, attacks)
    print(json.dumps(fig, default=str))


if __name__ == "__main__":
    main()
