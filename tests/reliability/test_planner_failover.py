"""Two planner replicas electing a leader over a Redis lease (orchestration.leadership),
as the ha-planner Kubernetes overlay runs them: real planner processes, real Redis, real
history topic, routers following the plan.

- The leader is SIGKILLed while an operator installs plans at ~10/s: the standby takes over
  within 5 s, versions stay strictly increasing (the new leader's in a higher epoch), and
  no router applies a version twice, out of order or with bytes nobody published.
- A leader paused past its lease (SIGSTOP) comes back to find the standby in charge: its
  next install is refused by the store's fence, and it steps down instead of writing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import redis

from cacheroute.v1 import planner_pb2, planner_pb2_grpc
from router_client import signing
from router_client.layout import Layout, parse_member
from router_client.plan import Version
from tests.faults.history import check_history
from tests.reliability.harness import router
from tests.waiting import eventually

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
LEASE_S = 2.0


@dataclass
class Replica:
    name: str
    proc: subprocess.Popen[str]
    port: int
    stub: planner_pb2_grpc.PlannerStub

    def status(self) -> planner_pb2.PlannerStatus:
        return self.stub.GetStatus(planner_pb2.GetStatusRequest(), timeout=5)

    def says(self, field: str) -> str:
        """One status field, "" while the replica cannot answer (starting, loaded)."""
        try:
            return str(getattr(self.status(), field))
        except grpc.RpcError:
            return ""


def start_replica(name: str, redis_url: str, bootstrap: str, data_dir: Path,
                  state_topic: str) -> Replica:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.faults.planner_proc", "--redis-url", redis_url,
         "--data-dir", str(data_dir), "--bootstrap", bootstrap, "--state-topic", state_topic,
         "--leader-lease-s", str(LEASE_S), "--leader-id", name, "--interval-s", "3600",
         "serve"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("PORT "), f"{name} did not start: {line!r}"
    port = int(line.split()[1])
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    return Replica(name, proc, port, planner_pb2_grpc.PlannerStub(channel))


@dataclass
class Operator:
    """Forces an install every `period_s` on whichever replica leads; records outcomes."""

    replicas: list[Replica]
    period_s: float = 0.1
    installs: list[tuple[float, str, Version]] = field(default_factory=list)
    refusals: list[tuple[str, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Operator:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            for r in self.replicas:
                if r.proc.poll() is not None:
                    continue
                try:
                    answer = r.stub.Replan(planner_pb2.ReplanRequest(force=True), timeout=2)
                except grpc.RpcError as exc:
                    self.refusals.append((r.name, exc.code().name))
                    continue
                if answer.installed:
                    v = answer.candidate.version
                    self.installs.append((time.monotonic(), r.name, Version(v.epoch, v.seq)))
                    break


class Published:
    """Every version Redis held at some point, with its digest (polled: Redis keeps 50)."""

    def __init__(self, url: str) -> None:
        self.r = redis.Redis.from_url(url)
        self.seen: dict[Version, bytes] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self._sweep()

    def _sweep(self) -> None:
        lay = Layout()
        for member in self.r.zrange(lay.versions, 0, -1):
            v = parse_member(member)
            if v not in self.seen:
                raw = self.r.get(lay.digest(v))
                if raw:
                    self.seen[v] = bytes.fromhex(raw.decode())

    def __enter__(self) -> Published:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sweep()  # what was installed since the last sweep


@pytest.fixture()
def replicas(redis_server, broker, tmp_path) -> Iterator[list[Replica]]:  # type: ignore[no-untyped-def]
    topic = f"state-{uuid.uuid4().hex[:8]}"
    data = tmp_path / "planner"
    out = [start_replica("planner-a", redis_server.url, broker.bootstrap, data, topic)]
    # the first replica is the leader (it started alone); it also wrote the signing key
    assert eventually(lambda: out[0].says("role") == "leader", 30)
    out.append(start_replica("planner-b", redis_server.url, broker.bootstrap, data, topic))
    assert eventually(lambda: out[1].says("leader_id") == "planner-a", 30)
    yield out
    for r in out:
        if r.proc.poll() is None:
            os.kill(r.proc.pid, signal.SIGCONT)
            r.proc.terminate()
        r.proc.wait(15)


def public_key(tmp_path: Path):  # type: ignore[no-untyped-def]
    return signing.load_public_key(tmp_path / "planner" / "planner-signing-key.pub.pem")


def test_the_standby_takes_over_within_5_s_of_the_leader_being_killed(
        replicas, redis_server, tmp_path):  # type: ignore[no-untyped-def]
    a, b = replicas
    assert b.status().leader_id == "planner-a"
    with pytest.raises(grpc.RpcError) as refused:  # a standby takes no changes
        b.stub.Replan(planner_pb2.ReplanRequest(force=True), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "planner-a" in refused.value.details()
    key = public_key(tmp_path)
    routers = [router(redis_server.url, key, f"r{i}") for i in range(3)]
    try:
        with Published(redis_server.url) as published, Operator([a, b]) as op:
            assert eventually(lambda: len(op.installs) >= 20, 20)
            killed_at = time.monotonic()
            a.proc.send_signal(signal.SIGKILL)
            assert eventually(lambda: any(n == "planner-b" for _, n, _ in op.installs), 15)
            assert eventually(lambda: sum(n == "planner-b" for _, n, _ in op.installs) >= 20, 20)
        took_over_s = next(t for t, n, _ in op.installs if n == "planner-b") - killed_at
        print(f"failover: first install by the standby {took_over_s:.2f} s after SIGKILL "
              f"(lease {LEASE_S} s); {len(op.installs)} installs")
        assert took_over_s <= 5.0
        versions = [v for _, _, v in op.installs]
        assert versions == sorted(versions) and len(set(versions)) == len(versions)
        before = [v for _, n, v in op.installs if n == "planner-a"]
        after = [v for _, n, v in op.installs if n == "planner-b"]
        assert after[0].epoch > before[-1].epoch  # a new term, above everything before
        assert b.status().role == "leader"
        final = versions[-1]
        for client, history in routers:
            assert client.wait_for_version(final, 10) and history.wait_for(final)
        for _client, history in routers:
            assert check_history(history, published=published.seen, final=final) == []
    finally:
        for client, _ in routers:
            client.stop()


def test_a_leader_paused_past_its_lease_is_fenced_off(replicas):  # type: ignore[no-untyped-def]
    a, b = replicas
    installed = a.stub.Replan(planner_pb2.ReplanRequest(force=True), timeout=10)
    assert installed.installed
    os.kill(a.proc.pid, signal.SIGSTOP)  # a stalls (GC pause, frozen VM) with its lease
    try:
        assert eventually(lambda: b.says("role") == "leader", 15)
        taken = b.stub.Replan(planner_pb2.ReplanRequest(force=True), timeout=10)
        assert taken.installed and taken.candidate.version.epoch > \
            installed.candidate.version.epoch
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    # a wakes up still believing it leads: whatever it tries, the store refuses it, and
    # within a renewal period it knows it is the standby
    try:
        answer = a.stub.Replan(planner_pb2.ReplanRequest(force=True), timeout=10)
        assert not answer.installed
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()
    assert eventually(lambda: a.says("role") == "standby", 10)
    assert a.status().leader_id == "planner-b"
    current = b.stub.GetCurrentVersion(planner_pb2.GetCurrentVersionRequest(), timeout=5)
    assert (current.version.epoch, current.version.seq) == (
        taken.candidate.version.epoch, taken.candidate.version.seq)
