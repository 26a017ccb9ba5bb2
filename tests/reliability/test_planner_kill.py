"""Item 7, the planner SIGKILLed at each step of publication (failpoints
publish.before_redis / after_redis / after_history). Redis always points at a
complete, valid plan; no version number ever maps to two different plans (in
Redis or in the durable history); a restart republishes what Redis lost.

CI tier: 3 kills per step; slow tier: 10 per step.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from planner_svc.adapters.kafka_history import KafkaHistory
from planner_svc.devstack.processes import restart_redis
from router_client import signing
from router_client.layout import Layout, Pointer
from router_client.plan import Version, decode_plan
from tests.waiting import eventually

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
STEPS = ("publish.before_redis", "publish.after_redis", "publish.after_history")


class Planners:
    """Runs tests.faults.planner_proc against one Redis, one data dir, one history topic."""

    def __init__(self, redis_url: str, bootstrap: str, data_dir: Path) -> None:
        self.args = [
            "--redis-url", redis_url, "--data-dir", str(data_dir),
            "--bootstrap", bootstrap, "--state-topic", f"state-{uuid.uuid4().hex[:8]}",
        ]  # fmt: skip
        self.seed = 0

    def _cmd(self, *mode: str) -> list[str]:
        return [sys.executable, "-m", "tests.faults.planner_proc", *self.args, *mode]

    def _env(self, failpoints: str) -> dict[str, str]:
        return {**os.environ, "CACHEROUTE_FAILPOINTS": failpoints, "PYTHONPATH": str(ROOT)}

    def publish(self, failpoints: str = "") -> int:
        self.seed += 1
        cmd = self._cmd("publish", "--seed", str(self.seed))
        done = subprocess.run(cmd, cwd=ROOT, env=self._env(failpoints), capture_output=True,
                              timeout=120)  # fmt: skip
        if done.returncode not in (0, -9):
            raise AssertionError(done.stderr.decode()[-2000:])
        return done.returncode

    def serve(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self._cmd("serve"), cwd=ROOT, env=self._env(""),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


def check_redis(r: Any, public_key, seen: dict[Version, bytes]) -> Version:  # type: ignore[no-untyped-def]
    """The pointer names a complete, valid plan whose version never had other bytes."""
    lay = Layout()
    pointer = Pointer.decode(r.get(lay.current))
    blob = r.get(lay.plan(pointer.version))
    assert blob is not None, f"pointer {pointer.version} names a missing plan"
    _kind, payload, digest = signing.verify_blob(blob, [public_key])
    assert digest == pointer.digest
    assert decode_plan(payload).version == pointer.version
    for v in r.zrange(lay.versions, 0, -1):
        from router_client.layout import parse_member

        version = parse_member(v)
        stored = bytes.fromhex(r.get(lay.digest(version)).decode())
        assert seen.setdefault(version, stored) == stored, f"{version} maps to two plans"
    return pointer.version


def kill_at_every_step(planners: Planners, r: redis.Redis, tmp_path: Path, per_step: int):  # type: ignore[no-untyped-def]
    """Publish once, then SIGKILL the planner `per_step` times at each failpoint;
    returns (public key, version -> digest seen, the last version)."""
    assert planners.publish() == 0
    key = signing.load_private_key(tmp_path / "planner" / "planner-signing-key.pem").public_key()
    seen: dict[Version, bytes] = {}
    version = check_redis(r, key, seen)
    for step in STEPS:
        for _ in range(per_step):
            assert planners.publish(f"{step}=kill") == -9  # SIGKILLed at the failpoint
            after = check_redis(r, key, seen)
            expected_seq = version.seq if step == "publish.before_redis" else version.seq + 1
            assert after == Version(version.epoch, expected_seq), (step, version, after)
            version = after
    return key, seen, version


def run_kills(redis_server, broker, tmp_path: Path, per_step: int) -> None:  # type: ignore[no-untyped-def]
    planners = Planners(redis_server.url, broker.bootstrap, tmp_path / "planner")
    r = redis.Redis.from_url(redis_server.url)
    key, seen, version = kill_at_every_step(planners, r, tmp_path, per_step)
    history = KafkaHistory(broker.bootstrap, planners.args[-1]).load()
    for v, blob in history.plans.items():  # the durable record agrees with Redis
        _k, _p, digest = signing.verify_blob(blob, [key])
        assert seen.get(v, digest) == digest, f"{v}: history and Redis hold different plans"
    restart_redis(redis_server)  # no persistence: Redis comes back empty
    assert r.get(Layout().current) is None
    proc = planners.serve()
    try:
        assert eventually(lambda: r.get(Layout().current) is not None, 30)
        republished = check_redis(r, key, seen)  # complete, valid, same bytes as before
        assert republished == version  # the newest plan, read back from the history
    finally:
        proc.terminate()
        proc.wait(10)


def test_planner_killed_at_each_publication_step(redis_server, broker, tmp_path):
    run_kills(redis_server, broker, tmp_path, per_step=3)


@pytest.mark.slow
def test_planner_killed_10_times_at_each_publication_step(redis_server, broker, tmp_path):
    run_kills(redis_server, broker, tmp_path, per_step=10)


def test_history_load_sees_the_last_install(broker):
    history = KafkaHistory(broker.bootstrap, f"state-{uuid.uuid4().hex[:8]}")
    for seq in (1, 2):
        history.record_install(Version(1, seq), b"blob-%d" % seq)
    assert history.load().current == Version(1, 2)


def test_restart_on_an_empty_redis_republishes_the_newest_plan(redis_server, broker, tmp_path):
    planners = Planners(redis_server.url, broker.bootstrap, tmp_path / "planner")
    r = redis.Redis.from_url(redis_server.url)
    key, seen, version = kill_at_every_step(planners, r, tmp_path, per_step=1)
    restart_redis(redis_server)
    proc = planners.serve()
    try:
        assert eventually(lambda: r.get(Layout().current) is not None, 30)
        assert check_redis(r, key, seen) == version
    finally:
        proc.terminate()
        proc.wait(10)
    assert planners.publish() == 0  # the next install must not reuse a version number
    check_redis(r, key, seen)
