"""Item 9, a stateful model test: hypothesis drives a real Redis, a publisher and
three router clients through publish valid / invalid, rollback, kill and restart
Redis (no persistence: the planner republishes), drop notifications, restart
routers (from their on-disk plan). Invariants after every step: each router's
history is valid (strictly increasing, only valid published versions, digests
match) and routing answers; after a settle step every router is on the newest
valid version within 3 s."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from planner_svc.adapters.redis_publisher import PlanPublisher
from planner_svc.devstack.processes import RedisServer, restart_redis, start_redis
from router_client import RouterClient, signing
from router_client.layout import Layout
from router_client.plan import RoutingPlan, Version
from router_client.redis_source import RedisPlanSource
from router_client.testing import perturb, synthetic_plan
from tests.faults import signals
from tests.faults.bad_plans import EXPECTED_REASON, bad_blobs, install_raw
from tests.faults.history import RouterHistory, check_history

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
ROUTERS = 3
SERVER: RedisServer | None = None
STEPS: Counter[str] = Counter()  # rules run, to show the model really moved
_ERRORS = (redis.RedisError, OSError)


class PlanModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        assert SERVER is not None
        self.server = SERVER
        redis.Redis.from_url(SERVER.url).flushall()
        self.key = signing.generate_private_key()
        self.pub = PlanPublisher(SERVER.url, self.key, socket_timeout=1.0, retain=20)
        self.seq = 1
        self.base = synthetic_plan(120, 5)
        self.valid: list[RoutingPlan] = [self.base]
        self.published: dict[Version, bytes] = {}
        self._commit(self.base)
        self.up = True
        self.dir = Path(tempfile.mkdtemp(prefix="model-"))
        self.histories = [RouterHistory(f"m{i}") for i in range(ROUTERS)]
        self.retired: list[RouterHistory] = []
        self.clients = [self._router(i) for i in range(ROUTERS)]

    def _router(self, i: int) -> RouterClient:
        h = self.histories[i]
        return RouterClient(
            RedisPlanSource(self.server.url), router_id=h.router_id,
            public_keys=[self.key.public_key()], recheck_s=0.3, on_applied=h.on_applied,
            cache_path=self.dir / f"{h.router_id}.bin", max_plan_bytes=1 << 20,
        ).start(initial_wait_s=3 if getattr(self, "up", True) else 0)  # fmt: skip

    def _commit(self, plan: RoutingPlan, previous: RoutingPlan | None = None) -> bool:
        prepared = self.pub.prepare(plan, previous)
        self.published[plan.version] = prepared.digest  # valid even if the reply is lost
        try:
            self.pub.commit(prepared)
            return True
        except _ERRORS:
            return False

    def _next(self) -> Version:
        self.seq += 1
        return Version(1, self.seq)

    @precondition(lambda self: self.up)
    @rule(share=st.floats(0.0, 0.5), seed=st.integers(0, 1000))
    def publish_valid(self, share: float, seed: int) -> None:
        STEPS["publish_valid"] += 1
        plan = perturb(self.valid[-1], share, version=self._next(), seed=seed)
        if self._commit(plan, self.valid[-1]):
            self.valid.append(plan)

    @precondition(lambda self: self.up)
    @rule(kind=st.sampled_from(sorted(EXPECTED_REASON)))
    def publish_invalid(self, kind: str) -> None:
        STEPS["publish_invalid"] += 1
        blob = bad_blobs(self.valid[-1], self.key, oversize_bytes=1 << 20)[kind]
        with contextlib.suppress(*_ERRORS):
            install_raw(redis.Redis.from_url(self.server.url), Layout(), self._next(), blob)

    @precondition(lambda self: self.up and len(self.valid) > 1)
    @rule(back=st.integers(1, 5))
    def rollback(self, back: int) -> None:
        STEPS["rollback"] += 1
        target = self.valid[-min(back + 1, len(self.valid))]
        plan = RoutingPlan(target.config, target.destinations, target.table, target.stats,
                           self._next())  # fmt: skip
        if self._commit(plan, self.valid[-1]):
            self.valid.append(plan)

    @precondition(lambda self: self.up)
    @rule()
    def kill_redis(self) -> None:
        STEPS["kill_redis"] += 1
        signals.kill(self.server.process.pid)
        self.up = False

    @precondition(lambda self: not self.up)
    @rule()
    def restart_redis(self) -> None:
        STEPS["restart_redis"] += 1
        restart_redis(self.server)  # comes back empty
        self.up = True
        self._commit(self.valid[-1])  # the planner republishes its installed plan

    @precondition(lambda self: self.up)
    @rule()
    def drop_notifications(self) -> None:
        STEPS["drop_notifications"] += 1
        redis.Redis.from_url(self.server.url).execute_command("CLIENT", "KILL", "TYPE", "pubsub")

    @rule(i=st.integers(0, ROUTERS - 1))
    def restart_router(self, i: int) -> None:
        STEPS["restart_router"] += 1
        # A new process: its history starts again (a crash may lose an apply that
        # was not yet on disk; the restarted router then applies it again).
        self.clients[i].stop()
        self.retired.append(self.histories[i])
        self.histories[i] = RouterHistory(f"m{i}.{len(self.retired)}")
        self.clients[i] = self._router(i)

    @precondition(lambda self: self.up)
    @rule()
    def settle(self) -> None:
        STEPS["settle"] += 1
        plan = perturb(self.valid[-1], 0.05, version=self._next())
        assert self._commit(plan, self.valid[-1])
        self.valid.append(plan)
        for c in self.clients:
            assert c.wait_for_version(plan.version, 3.0), (c.router_id, c.version, plan.version)

    @invariant()
    def histories_hold(self) -> None:
        for h in self.histories + self.retired:
            assert check_history(h, published=self.published, final=None) == []
        for c in self.clients:
            if c.table is not None:
                assert c.route("k00000001") in c.table.destination_ids

    def teardown(self) -> None:
        for c in self.clients:
            c.stop()
        self.pub.close()
        if not self.up:
            restart_redis(self.server)


def run_model(tmp_path: Path, examples: int, steps: int) -> None:
    global SERVER
    SERVER = start_redis(tmp_path)
    STEPS.clear()
    try:
        PlanModel.TestCase.settings = settings(
            max_examples=examples, stateful_step_count=steps, deadline=None,
            suppress_health_check=list(HealthCheck),
            # Deterministic: with random draws (and hypothesis disabling rules per example),
            # six short examples could leave out `settle` or `kill_redis` altogether (seen in
            # a CI run: settle 0 of 75 steps), and then the run checks nothing it is for.
            derandomize=True, database=None,
        )  # fmt: skip
        PlanModel.TestCase().runTest()
        print(f"model steps: {dict(STEPS)}")
        assert sum(STEPS.values()) >= examples * steps // 2
        assert STEPS["settle"] > 0 and STEPS["kill_redis"] > 0
    finally:
        SERVER.process.stop()
        SERVER = None


def run_model_in_child(tmp_path: Path, examples: int, steps: int, timeout_s: float) -> None:
    """`run_model` in a child Python process. The model SIGKILLs and restarts Redis under
    three router clients' threads; twice in CI (2026-12-03, -04) the pytest-xdist worker
    running it died mid-test without a Python traceback, and xdist then hung waiting for
    the replacement worker. In a child, such a death fails this test with its signal and
    output instead of taking the worker down; one death by a signal is retried once (and
    reported), a model failure (exit 1) never is."""
    code = (f"import sys; from pathlib import Path; from tests.reliability.test_model import "
            f"run_model; run_model(Path(sys.argv[1]), {examples}, {steps})")
    deaths: list[int] = []
    for attempt in range(2):
        work = tmp_path / f"attempt{attempt}"
        work.mkdir()
        done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code, str(work)],
                              cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        output = (done.stdout + done.stderr)[-4000:]
        if done.returncode == 0:
            if deaths:
                warnings.warn(f"plan model: the first attempt died by signal {deaths[0]}; "
                              "the retry passed", stacklevel=1)
            print(output)
            return
        if done.returncode > 0:
            pytest.fail(f"plan model failed (exit {done.returncode}):\n{output}")
        deaths.append(-done.returncode)
        print(f"plan model: died by signal {-done.returncode}:\n{output}")
    pytest.fail(f"plan model died by signal twice ({deaths})")


def test_plan_model(tmp_path):
    run_model_in_child(tmp_path, examples=6, steps=12, timeout_s=240)


@pytest.mark.slow
def test_plan_model_long(tmp_path):
    run_model_in_child(tmp_path, examples=40, steps=30, timeout_s=1200)
