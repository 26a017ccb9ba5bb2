"""The attack run: issue 55's attacks, one after another, against real servers on loopback
while honest clients use the gateway; what each attack did to them and to the planner.

The rig: a redis-server started with the shipped ACL (deploy/redis/render-acl.sh: the
planner, the gateway `gw-1`, the picker `epp-1` and the attacker's router login `edge-3`);
the planner service in this process on its own Redis user (windows fed directly, no broker),
an operator replan every second forcing an install; emulated engines; the gateway and the
endpoint picker as processes, each following the plans on its own router login; honest
clients as a process of their own (24 at once, from 127.0.0.1, keep-alive). The engines take
about 0.3 s a request (time scale 3), so what a ratio measures is the gateway's service,
not the few ms of scheduling delay a loaded machine adds to each hop.

First the honest clients' throughput alone (the baseline), then each measured attack
(items 1-3, 8, 10-13: 2 s unattacked, then 3 s under attack), then one pass of the others
(4, 5, 14-16), then the baseline again. For each measured attack: honest throughput over
the mean of the unattacked windows either side of it (the machine's other load drifts
within a run; the ratio to the first baseline is reported too), plan versions published
during it, the slowest GetStatus, health SERVING throughout, and whether the attack was
refused or bounded as its defect test (tests/reliability/) says. On two cores or more the
honest path (engines, gateway, honest clients) runs on the first core and everything else
on the rest (`pinned`). Items 6 and 7 need a broker: they are in bench/chaos.py's hostile
writes. Item 9 is `cacheroute up`'s, and 17 is the ACL this rig loads.

    .venv/bin/python bench/attacks.py                    # about 80 s
    .venv/bin/python bench/attacks.py --attack-s 6 --baseline-s 10 --only 11,12

Last line: one JSON object of figures.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import io
import json
import os
import resource
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc
import numpy as np
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cacheroute.v1 import plan_pb2, planner_pb2, planner_pb2_grpc
from planner_svc.devstack.engines import EngineFleet, start_engines
from planner_svc.devstack.processes import ManagedProcess, RedisServer, start_redis
from planner_svc.server import PlannerService, build_service
from planner_svc.settings import PlannerSettings
from planner_svc.simulator.rates import paper_like_rates
from router_client.layout import Layout
from tests.service.windows import make_window

ROUTERS = {"gw-1": "gw-pw", "epp-1": "epp-pw", "edge-3": "attacker-pw"}
ATTACKER = "edge-3"
PLANNER_PW, OPERATOR = "planner-pw", "op-token"
HONEST_KEYS = [f"tenant-{i}" for i in range(64)]
LAY = Layout()
# GetStatus and health must answer within this (a starved server never does; a loaded
# machine's answers take up to a few hundred ms, the slowest seen 2.8 s at load 11).
UNARY_DEADLINE_S = 5.0
ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
# The gateway's and picker's bounds, scaled down as the defect tests scale them.
HEADER_TIMEOUT_S, CLIENT_BODY_BYTES, BODY = 2.0, 16 * MIB, 8 * MIB
GATEWAY_FLAGS = ("--max-connections", "1000", "--max-connections-per-client", "200",
                 "--header-timeout-s", str(HEADER_TIMEOUT_S), "--max-buffered-bytes",
                 str(48 * MIB), "--max-buffered-bytes-per-client", str(CLIENT_BODY_BYTES),
                 "--max-body-bytes", str(BODY), "--probe-path", "")
PICKER_INFLIGHT, STREAM_TIMEOUT_S = 16, 2.0  # in flight per destination
PICKER_FLAGS = ("--max-inflight", str(PICKER_INFLIGHT), "--request-timeout-s", "1",
                "--stream-timeout-s", str(STREAM_TIMEOUT_S), "--probe-path", "")


def redis_url(port: int, user: str, password: str) -> str:
    return f"redis://{user}:{password}@127.0.0.1:{port}/0"


def render_acl(path: Path) -> Path:
    """The shipped template rendered as docs/security.md renders it."""
    import subprocess

    lines = [f"planner {PLANNER_PW}"] + [f"router {r} {p}" for r, p in ROUTERS.items()]
    out = subprocess.run(["sh", str(ROOT / "deploy/redis/render-acl.sh")],
                         input="\n".join(lines) + "\n", text=True, capture_output=True,
                         check=True).stdout
    path.write_text(out)
    return path


# --- the honest clients (their own process) ----------------------------------------------

def honest_main(url: str, concurrency: int) -> None:
    """Chat requests through the gateway from `concurrency` keep-alive connections; every
    0.1 s one line `monotonic_s ok errors` on stdout (CLOCK_MONOTONIC is the machine's)."""
    host, port = url.removeprefix("http://").split(":")
    counts = [0, 0]
    lock = threading.Lock()

    def one(worker: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=10,
                                          source_address=("127.0.0.1", 0))
        n = worker
        while True:
            n += concurrency
            body = json.dumps({"model": "m", "max_tokens": 4, "messages": [
                {"role": "user", "content": f"question {n}"}]})
            try:
                conn.request("POST", "/v1/chat/completions", body, {
                    "Content-Type": "application/json",
                    "x-routing-key": HONEST_KEYS[n % len(HONEST_KEYS)]})
                resp = conn.getresponse()
                resp.read()
                ok = resp.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                time.sleep(0.05)
            with lock:
                counts[0 if ok else 1] += 1

    for w in range(concurrency):
        threading.Thread(target=one, args=(w,), daemon=True).start()
    while True:
        time.sleep(0.1)
        with lock:
            print(f"{time.monotonic():.3f} {counts[0]} {counts[1]}", flush=True)


class HonestLog:
    """Reads the honest clients' progress lines from their log file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def rows(self) -> list[tuple[float, int, int]]:
        out = []
        for line in self.path.read_text(errors="replace").splitlines():
            parts = line.split()
            with contextlib.suppress(ValueError):
                if len(parts) == 3:
                    out.append((float(parts[0]), int(parts[1]), int(parts[2])))
        return out

    def between(self, t0: float, t1: float) -> tuple[float, int]:
        """(answered requests per second, errors) over [t0, t1]."""
        rows = self.rows()
        a = max((r for r in rows if r[0] <= t0), default=rows[0], key=lambda r: r[0])
        b = max((r for r in rows if r[0] <= t1), key=lambda r: r[0])
        return (b[1] - a[1]) / max(1e-9, b[0] - a[0]), b[2] - a[2]


# --- the planner's side: forced installs and probes ---------------------------------------

@dataclass
class Probe:
    """An operator replan every `replan_s` (a fresh window fed first) and GetStatus and
    health every `probe_s`, each timed; samples kept with their monotonic times."""

    svc: PlannerService
    replan_s: float = 1.0
    probe_s: float = 0.25
    versions: list[tuple[float, tuple[int, int]]] = field(default_factory=list)
    status: list[tuple[float, float, str]] = field(default_factory=list)  # t, latency, code
    health: list[tuple[float, int]] = field(default_factory=list)
    replan_errors: list[tuple[float, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Probe:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.svc.port}")
        self.stub = planner_pb2_grpc.PlannerStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)
        self.threads = [threading.Thread(target=f, daemon=True)
                        for f in (self._replans, self._probes)]
        for t in self.threads:
            t.start()
        return self

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)
        self.channel.close()

    def _replans(self) -> None:
        n = 0
        while not self.stop.wait(self.replan_s):
            n += 1
            feed(self.svc, seed=n)
            t = time.monotonic()
            try:
                r = self.stub.Replan(planner_pb2.ReplanRequest(force=True, fresh=True),
                                     metadata=[("authorization", f"Bearer {OPERATOR}")],
                                     timeout=5)
                if r.installed:
                    v = r.candidate.version
                    self.versions.append((t, (v.epoch, v.seq)))
            except grpc.RpcError as exc:
                self.replan_errors.append((t, str(exc.code())))

    def _probes(self) -> None:
        while not self.stop.wait(self.probe_s):
            t = time.monotonic()
            try:
                self.stub.GetStatus(planner_pb2.GetStatusRequest(), timeout=UNARY_DEADLINE_S)
                code = "OK"
            except grpc.RpcError as exc:
                code = str(exc.code())
            self.status.append((t, time.monotonic() - t, code))
            try:
                h = self.health_stub.Check(health_pb2.HealthCheckRequest(),
                                           timeout=UNARY_DEADLINE_S).status
            except grpc.RpcError:
                h = -1
            self.health.append((t, h))

    def during(self, t0: float, t1: float) -> dict[str, Any]:
        versions = sorted({v for t, v in self.versions if t0 <= t <= t1})
        status = [(lat, c) for t, lat, c in self.status if t0 <= t <= t1]
        health = [h for t, h in self.health if t0 <= t <= t1]
        return {
            "versions_published": len(versions),
            "replan_errors": sum(t0 <= t <= t1 for t, _ in self.replan_errors),
            "get_status_calls": len(status),
            "get_status_failed": sum(c != "OK" for _, c in status),
            "get_status_max_ms": round(1000 * max((lat for lat, _ in status), default=0.0), 1),
            "health_serving": all(h == health_pb2.HealthCheckResponse.SERVING
                                  for h in health) if health else None,
        }


def feed(svc: PlannerService, seed: int) -> None:
    """Two windows one window length apart, ending now: the honest keys and a tail, so a
    plan is well over a flow-control window (item 8's slow readers block on it)."""
    keys = HONEST_KEYS + [f"tail-{i}" for i in range(4000)]
    rates = paper_like_rates(len(keys), 400.0, seed=seed)
    end = int(time.time() * 1000)
    dests = list(svc.settings.destinations)
    for window_end in (end - 10_000, end):
        svc.planner.on_window(make_window(keys, np.asarray(rates), window_end_ms=window_end,
                                          destinations=dests))


# --- the rig --------------------------------------------------------------------------------

@dataclass
class Rig:
    workdir: Path
    redis: RedisServer
    svc: PlannerService
    engines: EngineFleet
    gateway: ManagedProcess
    gateway_url: str
    picker: ManagedProcess
    picker_target: str
    honest: ManagedProcess
    honest_log: HonestLog
    pinned: bool

    def attacker_redis(self) -> Any:
        return redis.Redis(port=self.redis.port, username=f"cacheroute-router-{ATTACKER}",
                           password=ROUTERS[ATTACKER], socket_timeout=5)

    def planner_redis(self) -> Any:
        return redis.Redis(port=self.redis.port, username="cacheroute-planner",
                           password=PLANNER_PW, socket_timeout=5)

    @functools.cached_property
    def channel(self) -> grpc.Channel:
        """The attacks' own channel to the planner (closed with the rig)."""
        return grpc.insecure_channel(f"127.0.0.1:{self.svc.port}")

    def stub(self) -> planner_pb2_grpc.PlannerStub:
        return planner_pb2_grpc.PlannerStub(self.channel)


def _announced(proc: ManagedProcess, prefix: str, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in proc.log_path.read_text(errors="replace").splitlines():
            if line.startswith(prefix):
                return line.strip().split("=", 1)[1]
        if not proc.alive():
            break
        time.sleep(0.05)
    raise RuntimeError(f"{proc.name} did not start:\n{proc.log_tail(30)}")


def _edge(workdir: Path, kind: str, rid: str, rig_redis: RedisServer, engines: EngineFleet,
          flags: tuple[str, ...], wrap: list[str]) -> ManagedProcess:
    proc = ManagedProcess(kind, [
        *wrap, sys.executable, "-m", "planner_svc.cli.main", kind, "--port", "0",
        "--router-id", rid, "--destinations", engines.destinations(),
        "--redis-url", redis_url(rig_redis.port, f"cacheroute-router-{rid}", ROUTERS[rid]),
        "--public-key", str(workdir / "planner" / "planner-signing-key.pub.pem"), *flags],
        workdir / f"{kind}.log")
    proc.start()
    return proc


@contextlib.contextmanager
def pinned() -> Iterator[list[str]]:
    """On two cores or more: this process (the planner, the attacker) and what it starts
    on all but the first core, the honest path (engines, gateway, honest clients) on the
    first, whose `taskset` prefix is yielded. An attacker's tools and the attacked edge's
    neighbours then take no CPU from the gateway that is not the gateway's own work (as on
    separate machines); the gateway's own attacks (12, 13) still cost it what they cost."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 or shutil.which("taskset") is None:
        yield []
        return
    os.sched_setaffinity(0, cores[1:])
    try:
        yield ["taskset", "-c", str(cores[0])]
    finally:
        os.sched_setaffinity(0, cores)


@contextlib.contextmanager
def rig(workdir: Path, concurrency: int = 24, time_scale: float = 3.0) -> Iterator[Rig]:
    with contextlib.ExitStack() as stack:
        wrap = stack.enter_context(pinned())
        acl = render_acl(workdir / "users.acl")
        server = start_redis(workdir, extra_args=["--aclfile", str(acl)])
        stack.callback(server.process.stop)
        engines = start_engines(workdir, 4, extra=["--time-scale", str(time_scale)], wrap=wrap)
        stack.callback(engines.stop)
        svc = build_service(PlannerSettings(
            redis_url=redis_url(server.port, "cacheroute-planner", PLANNER_PW), grpc_port=0,
            data_dir=str(workdir / "planner"), destinations=tuple(engines.urls), q_cap=20.0,
            warm_slots_per_destination=1000, interval_s=2.0,
            validated_affinity_gain_min=0.0, operator_token=OPERATOR), consume=False)
        stack.callback(svc.stop, 0)
        svc.start()
        feed(svc, seed=0)
        svc.planner.tick()
        gateway = _edge(workdir, "gateway", "gw-1", server, engines, GATEWAY_FLAGS, wrap)
        stack.callback(gateway.stop)
        picker = _edge(workdir, "epp", "epp-1", server, engines, PICKER_FLAGS, [])
        stack.callback(picker.stop)
        url = _announced(gateway, "CACHEROUTE_GATEWAY=")
        target = _announced(picker, "CACHEROUTE_EPP=")
        honest = ManagedProcess("honest", [*wrap, sys.executable, __file__, "--honest", url,
                                           "--concurrency", str(concurrency)],
                                workdir / "honest.log")
        honest.start()
        stack.callback(honest.stop)
        log = HonestLog(honest.log_path)
        deadline = time.monotonic() + 20
        while len(log.rows()) < 5 or log.rows()[-1][1] == 0:
            if time.monotonic() > deadline or not honest.alive():
                raise RuntimeError(f"honest clients got nothing:\n{honest.log_tail()}\n"
                                   f"{gateway.log_tail()}")
            time.sleep(0.1)
        made = Rig(workdir, server, svc, engines, gateway, url, picker, target, honest, log,
                   pinned=bool(wrap))
        stack.callback(lambda: made.channel.close())
        yield made


# --- the attacks ------------------------------------------------------------------------------

Verdict = dict[str, Any]  # "held": True when the attack was refused or bounded as it should
Attack = Callable[[Rig, threading.Event], Verdict]


def run_attack(r: Rig, probe: Probe, name: str, attack: Attack, attack_s: float,
               quiet_s: float = 0.0) -> dict[str, Any]:
    """`attack` for `attack_s` (after 0.5 s under way), measured; with `quiet_s`, the
    honest throughput of the `quiet_s` before it too (the run's load drifts: others share
    the cores)."""
    q0 = time.monotonic()
    time.sleep(quiet_s)
    quiet = r.honest_log.between(q0, time.monotonic())[0] if quiet_s else 0.0
    stop = threading.Event()
    result: dict[str, Verdict] = {}

    def go() -> None:
        try:
            result["v"] = attack(r, stop)
        except Exception as exc:  # an attack that cannot run is a failed check, reported
            result["v"] = {"held": False, "error": f"{type(exc).__name__}: {exc}"}

    thread = threading.Thread(target=go, name=f"attack-{name}", daemon=True)
    thread.start()
    time.sleep(0.5)  # the attack under way before the measurement starts
    t0, cpu0 = time.monotonic(), r.gateway.cpu_seconds()
    time.sleep(attack_s)
    t1, cpu1 = time.monotonic(), r.gateway.cpu_seconds()
    stop.set()
    thread.join(30)
    rate, errors = r.honest_log.between(t0, t1)
    verdict = result.get("v", {"held": False, "error": "did not finish in 30 s"})
    return {"honest_rps": round(rate, 1), "quiet_before_rps": round(quiet, 1),
            "honest_errors": errors, "gateway_cpu_share": round((cpu1 - cpu0) / (t1 - t0), 3),
            **probe.during(t0, t1), **verdict}


def denied(fn: Callable[[], Any]) -> bool:
    try:
        fn()
    except redis.exceptions.NoPermissionError:
        return True
    return False


def until(stop: threading.Event, fn: Callable[[], bool]) -> tuple[int, int]:
    """Repeat `fn` until `stop`: (attempts, attempts for which it returned True). The
    attacker shares the machine's cores with the servers: its loops pause 1 ms a turn."""
    n = ok = 0
    while not stop.is_set():
        n += 1
        ok += fn()
        time.sleep(0.001)
    return n, ok


def attack_1_scripts(r: Rig, stop: threading.Event) -> Verdict:
    """Item 1: a router login loading and running a CPU-loop script."""
    a = r.attacker_redis()
    loop = "while true do end"
    n, refused = until(stop, lambda: all(denied(f) for f in (
        lambda: a.script_load(loop), lambda: a.eval(loop, 0),
        lambda: a.evalsha("0" * 40, 1, LAY.versions))))
    try:
        r.planner_redis().script_kill()
        killable = False
    except redis.ResponseError as exc:
        killable = "NOTBUSY" in str(exc)  # the planner may SCRIPT KILL; none was running
    return {"held": refused == n > 0 and killable, "attempts": n}


def attack_2_registry(r: Rig, stop: threading.Event) -> Verdict:
    """Item 2: a type change and invalid UTF-8 in the routers index, with ListRouters."""
    a, stub = r.attacker_redis(), r.stub()
    failures: list[str] = []

    def once() -> bool:
        refused = denied(lambda: a.set(LAY.routers, b"junk")) and denied(
            lambda: a.zadd(LAY.routers, {b"\xff\xfe": 1}))
        try:
            stub.ListRouters(planner_pb2.ListRoutersRequest(), timeout=3)
        except grpc.RpcError as exc:
            failures.append(str(exc.code()))
        time.sleep(0.05)
        return refused

    n, refused = until(stop, once)
    return {"held": refused == n > 0 and not failures, "attempts": n,
            "list_routers_failed": len(failures)}


def attack_3_forged_statuses(r: Rig, stop: threading.Event) -> Verdict:
    """Item 3: age honest routers out of the index, forge other routers' statuses, and
    an impostor status on its own key naming gw-1, all calling the first engine down."""
    a, stub = r.attacker_redis(), r.stub()
    down = next(iter(r.engines.urls))
    drained: set[str] = set()

    def once() -> bool:
        now = int(time.time() * 1000)
        refused = all(denied(partial(a.zadd, LAY.routers, {rid: now - 3_600_000}))
                      for rid in ("gw-1", "epp-1"))
        for i in range(5):
            forged = plan_pb2.RouterStatus(router_id=f"edge-9{i}", reported_at_ms=now,
                                           unhealthy_destinations=[down])
            refused &= denied(partial(a.set, LAY.router_status(forged.router_id),
                                      forged.SerializeToString(), ex=15))
        impostor = plan_pb2.RouterStatus(router_id="gw-1", reported_at_ms=now,
                                         unhealthy_destinations=[down])
        a.set(LAY.router_status(ATTACKER), impostor.SerializeToString(), ex=15)
        drained.update(r.svc.planner.reported_down)
        time.sleep(0.1)
        return refused

    n, refused = until(stop, once)
    listed = {x.status.router_id for x in stub.ListRouters(planner_pb2.ListRoutersRequest(),
                                                           timeout=3).routers}
    return {"held": refused == n > 0 and not drained and {"gw-1", "epp-1"} <= listed,
            "attempts": n, "drained": sorted(drained), "listed": sorted(listed)}


def attack_8_plan_downloads(r: Rig, stop: threading.Event) -> Verdict:
    """Item 8: 24 GetPlan streams that are never read, each on its own connection."""
    from planner_svc import server as server_mod

    target = f"127.0.0.1:{r.svc.port}"
    slow = [("grpc.http2.bdp_probe", 0), ("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.insecure_channel(target, options=slow) for _ in range(24)]
    try:
        calls = [planner_pb2_grpc.PlannerStub(ch).GetPlan(planner_pb2.GetPlanRequest(),
                                                          timeout=60) for ch in channels]
        stop.wait()
        refused = sum(c.done() and c.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                      for c in calls)
        held = sum(not c.done() for c in calls)
        for c in calls:
            c.cancel()
    finally:
        for ch in channels:
            ch.close()
    return {"held": refused >= 24 - server_mod.MAX_PLAN_STREAMS
            and held <= server_mod.MAX_PLAN_STREAMS, "refused": refused, "streams_held": held}


# --- the endpoint picker ------------------------------------------------------------------

def picker_routes(r: Rig, n: int = 20) -> int:
    """Of `n` honest requests to the picker, one after another, how many were routed."""
    from tests.epp_harness import ExtProcStream, request_headers

    ch = grpc.insecure_channel(r.picker_target)
    routed = 0
    try:
        for _ in range(n):
            s = ExtProcStream(ch, timeout_s=5)
            s.send(request_headers(end=True))
            with contextlib.suppress(grpc.RpcError, StopIteration):
                routed += not s.read(1)[0].HasField("immediate_response")
            s.cancel()
    finally:
        ch.close()
    return routed


def attack_10_repeated_headers(r: Rig, stop: threading.Event) -> Verdict:
    """Item 10: request headers sent five times on each ext_proc stream, stream after
    stream (each leaked four in-flight slots before the fix)."""
    from tests.epp_harness import ExtProcStream, request_headers

    ch = grpc.insecure_channel(r.picker_target)
    streams = refused = 0
    try:
        while not stop.is_set():
            s = ExtProcStream(ch, timeout_s=5)
            s.send(*[request_headers(end=True) for _ in range(5)])
            with contextlib.suppress(grpc.RpcError, StopIteration):
                for answer in s.read(2):
                    refused += answer.immediate_response.status.code == 400
            s.cancel()
            streams += 1
            time.sleep(0.01)
    finally:
        ch.close()
    time.sleep(0.5)
    routed = picker_routes(r)
    return {"held": streams > 0 and refused == streams and routed == 20, "streams": streams,
            "refused_400": refused, "honest_routed_after": f"{routed}/20"}


def attack_11_endless_streams(r: Rig, stop: threading.Event) -> Verdict:
    """Item 11: streams that never end, more than the picker has slots (routed ones never
    answered, trickled bodies never finished), kept topped up as the picker ends them."""
    from tests.epp_harness import ExtProcStream, request_body, request_headers

    ch = grpc.insecure_channel(r.picker_target)
    health = health_pb2_grpc.HealthStub(ch)
    slots = PICKER_INFLIGHT * len(r.engines.urls)
    pending: deque[tuple[float, ExtProcStream]] = deque()
    opened = 0
    outcomes: Counter[str] = Counter()
    not_ready = False
    try:
        while not stop.is_set() or pending:
            now = time.monotonic()
            while pending and (now - pending[0][0] > STREAM_TIMEOUT_S + 0.5 or stop.is_set()):
                t, s = pending.popleft()
                time.sleep(max(0.0, t + STREAM_TIMEOUT_S + 0.5 - time.monotonic()))
                outcomes[_outcome(s)] += 1
            for i in range(0 if stop.is_set() else slots + slots // 4 - len(pending)):
                s = ExtProcStream(ch, timeout_s=30)
                s.send(request_headers(end=True) if i % 8 else request_headers())
                if not i % 8:
                    s.send(request_body(b'{"model": "m", ', end=False))
                pending.append((time.monotonic(), s))
                opened += 1
            with contextlib.suppress(grpc.RpcError):
                ready = health.Check(health_pb2.HealthCheckRequest(service="readiness"),
                                     timeout=2).status
                not_ready |= ready != health_pb2.HealthCheckResponse.SERVING
            stop.wait(0.2)
    finally:
        ch.close()
    routed = picker_routes(r)
    ended = outcomes["deadline"] + outcomes["refused"]
    return {"held": outcomes["deadline"] > slots and ended == opened and routed == 20,
            "streams": opened, "outcomes": dict(outcomes),
            "readiness_not_serving_seen": not_ready, "honest_routed_after": f"{routed}/20"}


def _outcome(s: Any) -> str:
    """How the picker ended stream `s`: "deadline" (past its request or stream deadline),
    "refused" (answered 503: no slot free), else what else happened (a stream it never
    ends runs into the client's own deadline, 30 s)."""
    refused = False
    try:
        for answer in s.call:
            refused |= answer.immediate_response.status.code == 503
    except grpc.RpcError as exc:
        late = (exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                and "picker's deadline" in (exc.details() or ""))
        return "deadline" if late else str(exc.code())
    return "refused" if refused else "ended"


# --- the gateway ------------------------------------------------------------------------------

def _connect(r: Rig, client: str) -> socket.socket:
    host, port = r.gateway_url.removeprefix("http://").split(":")
    s = socket.socket()
    s.settimeout(10)
    s.bind((client, 0))
    s.connect((host, int(port)))
    return s


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _peek(s: socket.socket, wait_s: float) -> bytes | None:
    """What the gateway sent within `wait_s` (b"" if it closed), None if nothing yet."""
    s.settimeout(wait_s)
    try:
        return s.recv(65536)
    except TimeoutError:
        return None
    except OSError:
        return b""


def attack_12_body_flood(r: Rig, stop: threading.Event) -> Verdict:
    """Item 12: from two client addresses, four bodies each of 8 MiB held one byte short of
    their end, again and again; past one client's share (16 MiB) the gateway must answer
    413 up front, and its memory stay within what it may hold plus what it has not yet
    given back (TRIM_AFTER_BYTES)."""
    from router_client.gateway.http11 import TRIM_AFTER_BYTES

    base = peak = _rss_mb(r.gateway.pid)
    rounds = refused = held = 0
    while not stop.is_set():
        rounds += 1
        socks = []
        for client in ("127.0.0.2", "127.0.0.3"):
            for _ in range(4):
                s = _connect(r, client)
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Length: %d\r\n\r\n" % BODY)
                answer = _peek(s, 0.2)
                if answer is not None:
                    refused += answer.startswith(b"HTTP/1.1 413")
                    s.close()
                    continue
                s.sendall(b"x" * (BODY - 1))
                socks.append(s)
        held += len(socks)
        time.sleep(0.3)
        peak = max(peak, _rss_mb(r.gateway.pid))
        for s in socks:
            s.close()
    bound_mb = (2 * CLIENT_BODY_BYTES + TRIM_AFTER_BYTES) / MIB + 24
    return {"held": rounds > 0 and refused == held == 4 * rounds and peak - base < bound_mb,
            "rounds": rounds, "refused_413": refused, "bodies_held": held,
            "rss_growth_max_mb": round(peak - base, 1), "rss_bound_mb": round(bound_mb),
            "rss_after_close_mb": round(_rss_mb(r.gateway.pid) - base, 1)}


def attack_13_idle_connections(r: Rig, stop: threading.Event) -> Verdict:
    """Item 13: from two client addresses, 250 connections each that never send a byte
    (the share is 200 per client), opened again as the header timeout (2 s) closes them."""
    beyond = closed = opened = rounds = 0
    while not stop.is_set():
        rounds += 1
        socks = [_connect(r, c) for c in ("127.0.0.2", "127.0.0.3") for _ in range(250)]
        started = time.monotonic()
        opened += len(socks)
        time.sleep(0.3)
        first = [_peek(s, 0.001) for s in socks]
        beyond += sum(a is not None and a.startswith(b"HTTP/1.1 503") for a in first)
        idle = [s for s, a in zip(socks, first, strict=True) if a is None]
        deadline = started + HEADER_TIMEOUT_S + 5.0  # closed at the header timeout
        closed += sum(_peek(s, max(0.01, deadline - time.monotonic())) == b"" for s in idle)
        for s in socks:
            s.close()
    return {"held": rounds > 0 and beyond == 100 * rounds and closed == 400 * rounds,
            "connections_opened": opened, "refused_503": beyond,
            "closed_at_header_timeout": closed}


# --- one pass of the others -------------------------------------------------------------------

def attack_4_impossible_version(r: Rig, stop: threading.Event) -> Verdict:
    """Item 4: the attacker's own status, as a router writes it, claiming 2^64-1."""
    from router_client.redis_source import RedisPlanSource

    src = RedisPlanSource(redis_url(r.redis.port, f"cacheroute-router-{ATTACKER}",
                                    ROUTERS[ATTACKER]))
    top = (1 << 64) - 1
    try:
        src.report(plan_pb2.RouterStatus(router_id=ATTACKER,
                                         reported_at_ms=int(time.time() * 1000),
                                         applied=plan_pb2.PlanVersion(epoch=top, seq=top)))
    finally:
        src.close()
    stop.wait()
    routers = r.stub().ListRouters(planner_pb2.ListRoutersRequest(), timeout=3).routers
    believed = [x.status.router_id for x in routers if x.status.applied.epoch == top]
    return {"held": not believed, "believed": believed}


def attack_5_unbounded_status(r: Rig, stop: threading.Event) -> Verdict:
    """Item 5: a 10 MB status without a TTL on its own key; 1,000 members into the index."""
    a, key = r.attacker_redis(), LAY.router_status(ATTACKER)
    index_refused = denied(lambda: a.zadd(LAY.routers, {f"r{i}": i for i in range(1000)}))
    a.set(key, b"x" * (10 * MIB))
    stop.wait()
    deadline = time.monotonic() + 5  # deleted on the planner's next read of the fleet
    while time.monotonic() < deadline and r.planner_redis().exists(key):
        time.sleep(0.1)
    left = bool(r.planner_redis().exists(key))
    return {"held": index_refused and not left, "status_left": left}


DOT_PATHS = ("/v1/../metrics", "/v1/../../etc/passwd", "/v1/%2e%2e/metrics", "/v1/.%2E/metrics",
             "/v1/..%2fmetrics", "/v1/%252e%252e/metrics", "/v1/..\\metrics", "/v1/./models")


def attack_14_dot_segments(r: Rig, stop: threading.Event) -> Verdict:
    """Item 14: dot segments in every spelling, each refused 400 before forwarding."""
    refused = 0
    for path in DOT_PATHS:
        with _connect(r, "127.0.0.2") as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            answer = _peek(s, 5) or b""
        refused += answer.startswith(b"HTTP/1.1 400")
    stop.wait()
    return {"held": refused == len(DOT_PATHS), "refused_400": f"{refused}/{len(DOT_PATHS)}"}


def attack_15_history_channel(r: Rig, stop: threading.Event) -> Verdict:
    """Item 15: the gateway shares conversation memory on its router login (no NOPERM in
    its log); that login may publish there and still not on the planner's channel."""
    gw = redis.Redis(port=r.redis.port, username="cacheroute-router-gw-1",
                     password=ROUTERS["gw-1"], socket_timeout=5)
    may_share = not denied(lambda: gw.publish(LAY.history_channel, b"{}"))
    notify_refused = denied(lambda: gw.publish(LAY.channel, b"x"))
    stop.wait()
    nopermit = "NOPERM" in r.gateway.log_path.read_text(errors="replace")
    return {"held": may_share and notify_refused and not nopermit,
            "gateway_log_noperm": nopermit}


HOSTILE_TEXT = "\x1b]0;owned\x07\x1b]52;c;b3duZWQ=\x07\x1b[2J\x9b31m\x00\x7f"


def attack_16_terminal_escapes(r: Rig, stop: threading.Event) -> Verdict:
    """Item 16: control sequences in the attacker's own status, shown by `cacheroute
    routers` (the CLI in this process, as an operator runs it)."""
    from planner_svc.cli.main import main as cli
    from router_client.redis_source import RedisPlanSource

    src = RedisPlanSource(redis_url(r.redis.port, f"cacheroute-router-{ATTACKER}",
                                    ROUTERS[ATTACKER]))
    try:
        src.report(plan_pb2.RouterStatus(
            router_id=ATTACKER, reported_at_ms=int(time.time() * 1000), mode="planned",
            last_rejection=HOSTILE_TEXT, last_rejected=plan_pb2.PlanVersion(epoch=1, seq=1)))
    finally:
        src.close()
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        cli(["routers", "--planner", f"127.0.0.1:{r.svc.port}", "--token", OPERATOR])
    stop.wait()
    text = out.getvalue()
    raw = [c for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F]
    return {"held": ATTACKER in text and not raw, "control_characters_printed": len(raw)}


MEASURED: dict[str, Attack] = {
    "1_lua_scripts": attack_1_scripts, "2_registry_junk": attack_2_registry,
    "3_forged_statuses": attack_3_forged_statuses, "8_unread_plan_streams":
    attack_8_plan_downloads, "10_repeated_headers": attack_10_repeated_headers,
    "11_endless_streams": attack_11_endless_streams, "12_body_flood": attack_12_body_flood,
    "13_idle_connections": attack_13_idle_connections,
}
ONE_PASS: dict[str, Attack] = {
    "4_impossible_version": attack_4_impossible_version,
    "5_unbounded_status": attack_5_unbounded_status, "14_dot_segments": attack_14_dot_segments,
    "15_history_channel": attack_15_history_channel,
    "16_terminal_escapes": attack_16_terminal_escapes,
}


# --- the run ----------------------------------------------------------------------------------

def run_attacks(attack_s: float = 3.0, baseline_s: float = 8.0, quiet_s: float = 2.0,
                only: tuple[str, ...] = ()) -> dict[str, Any]:
    """The whole attack run (its own servers, in a temporary directory): figures."""
    with tempfile.TemporaryDirectory(prefix="attacks-") as tmp, rig(Path(tmp)) as r:
        probe = Probe(r.svc).start()
        try:
            return _run(r, probe, attack_s, baseline_s, quiet_s, only)
        finally:
            probe.close()


def _baseline(r: Rig, probe: Probe, seconds: float) -> dict[str, Any]:
    t0, cpu0 = time.monotonic(), r.gateway.cpu_seconds()
    time.sleep(seconds)
    t1, cpu1 = time.monotonic(), r.gateway.cpu_seconds()
    rate, errors = r.honest_log.between(t0, t1)
    return {"honest_rps": round(rate, 1), "honest_errors": errors,
            "gateway_cpu_share": round((cpu1 - cpu0) / (t1 - t0), 3), **probe.during(t0, t1)}


def _run(r: Rig, probe: Probe, attack_s: float, baseline_s: float, quiet_s: float,
         only: tuple[str, ...]) -> dict[str, Any]:
    time.sleep(1.0)  # the probe's first installs
    base = _baseline(r, probe, baseline_s)
    rows: dict[str, dict[str, Any]] = {}
    for name, attack in {**MEASURED, **ONE_PASS}.items():
        if only and not name.startswith(only):
            continue
        is_measured = name in MEASURED
        row = run_attack(r, probe, name, attack, attack_s if is_measured else 0.5,
                         quiet_s if is_measured else 0.0)
        row["measured"] = is_measured
        row["throughput_ratio"] = round(row["honest_rps"] / base["honest_rps"], 3)
        rows[name] = row
        print(f"  {name:<24} {json.dumps(rows[name])}", flush=True)
    end = _baseline(r, probe, baseline_s / 2)
    measured = {k: v for k, v in rows.items() if v["measured"]}
    _adjacent_ratios(list(measured.values()), end["honest_rps"])
    return {
        "baseline_honest_rps": base["honest_rps"],
        "baseline_end_honest_rps": end["honest_rps"],
        "baseline_end_ratio": round(end["honest_rps"] / base["honest_rps"], 3),
        # the run's own noise: the largest unattacked window over the smallest
        "unattacked_spread": _spread([base["honest_rps"], end["honest_rps"],
                                      *(v["quiet_before_rps"] for v in measured.values())]),
        "baseline_versions_published": base["versions_published"],
        "baseline_get_status_max_ms": base["get_status_max_ms"],
        "baseline_gateway_cpu_share": base["gateway_cpu_share"],
        "attack_honest_throughput_ratio_min": min(
            (v["ratio_to_adjacent_quiet"] for v in measured.values()), default=None),
        "throughput_ratio_by_attack": {k: v["ratio_to_adjacent_quiet"]
                                       for k, v in measured.items()},
        "attack_honest_throughput_ratio_to_baseline_min": min(
            (v["throughput_ratio"] for v in measured.values()), default=None),
        "throughput_ratio_to_baseline_by_attack": {k: v["throughput_ratio"]
                                                   for k, v in measured.items()},
        "planner_published_during_every_attack": all(
            v["versions_published"] >= 1 for v in measured.values()),
        "versions_published_min": min(
            (v["versions_published"] for v in measured.values()), default=0),
        "replan_errors": sum(v["replan_errors"] for v in rows.values()),
        "unary_rpcs_answered_during_every_attack": all(
            v["get_status_failed"] == 0 and v["get_status_calls"] > 0 for v in rows.values()),
        "health_serving_during_every_attack": all(
            v["health_serving"] for v in measured.values()),
        "attacks_held": sum(v["held"] for v in rows.values()),
        "attacks": len(rows),
        "attacks_not_held": sorted(k for k, v in rows.items() if not v["held"]),
        "by_attack": rows,
        "honest_path_pinned_to_own_core": r.pinned,
        "components_alive": all(p.alive() for p in (r.gateway, r.picker, r.honest)),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


HEALTH_WORD = {True: "SERVING", False: "NO", None: "-"}


def _spread(rates: list[float]) -> float | None:
    low = min(rates, default=0.0)
    return round(max(rates) / low, 3) if low > 0 else None


def _adjacent_ratios(rows: list[dict[str, Any]], end_rps: float) -> None:
    """Each measured attack's honest throughput over the mean of the unattacked windows
    either side of it (its own quiet window, the next attack's, or the end's baseline):
    the same run's unattacked throughput at that time, as other loads on the machine drift."""
    after = [row["quiet_before_rps"] for row in rows[1:]] + [end_rps]
    for row, later in zip(rows, after, strict=True):
        row["quiet_after_rps"] = later
        quiet = (row["quiet_before_rps"] + later) / 2
        row["ratio_to_adjacent_quiet"] = round(row["honest_rps"] / quiet, 3) if quiet else None


def print_table(fig: dict[str, Any]) -> None:
    print(f"\nbaseline: {fig['baseline_honest_rps']} honest req/s "
          f"(at the end: {fig['baseline_end_honest_rps']}, ratio {fig['baseline_end_ratio']})")
    head = ("attack", "held", "ratio", "to base", "errors", "versions", "GetStatus max ms",
            "health")
    print(f"{head[0]:<24}{head[1]:>6}{head[2]:>8}{head[3]:>10}{head[4]:>8}{head[5]:>10}"
          f"{head[6]:>18}{head[7]:>9}")
    for name, v in fig["by_attack"].items():
        ratio = f"{v['ratio_to_adjacent_quiet']:.3f}" if v["measured"] else "-"
        quiet = f"{v['throughput_ratio']:.3f}" if v["measured"] else "-"
        print(f"{name:<24}{'yes' if v['held'] else 'NO':>6}{ratio:>8}{quiet:>10}"
              f"{v['honest_errors']:>8}"
              f"{v['versions_published']:>10}{v['get_status_max_ms']:>18}"
              f"{HEALTH_WORD[v['health_serving']]:>9}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attack-s", type=float, default=3.0, help="each measured attack")
    ap.add_argument("--baseline-s", type=float, default=8.0)
    ap.add_argument("--quiet-s", type=float, default=2.0,
                    help="unattacked throughput measured before each attack")
    ap.add_argument("--only", default="", help="comma-separated attack name prefixes")
    ap.add_argument("--honest", default="", help=argparse.SUPPRESS)  # the clients' process
    ap.add_argument("--concurrency", type=int, default=8, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.honest:
        honest_main(a.honest, a.concurrency)
        return
    fig = run_attacks(a.attack_s, a.baseline_s, a.quiet_s, tuple(x for x in a.only.split(",") if x))
    print_table(fig)
    print(json.dumps(fig, default=str))


if __name__ == "__main__":
    main()
