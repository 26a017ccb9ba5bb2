"""The gateway following the real planner through real Redis: drain and engine failure.

The planner is the production service in-process (gRPC on port 0, the Redis publisher,
its timer thread), fed rate windows directly; the gateway reads plans with the
production Redis source, verified with the planner's key; the engines are the emulator.
"""

from __future__ import annotations

import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import redis

from planner_svc.devstack.engines import EngineFleet, start_engines
from planner_svc.devstack.processes import RedisServer
from planner_svc.server import PlannerService, build_service
from router_client import signing
from router_client.gateway import GatewaySettings
from router_client.health import HealthPolicy
from router_client.layout import Layout
from router_client.plan import parse_destinations
from router_client.redis_source import AsyncRedisPlanSource
from tests.gateway_harness import GatewayThread, fault, gateway_process
from tests.service.harness import planner_settings
from tests.service.windows import make_window
from tests.timing import bound
from tests.waiting import eventually

pytestmark = pytest.mark.integration
KEYS = [f"k{i}" for i in range(40)]


@pytest.fixture()
def fleet(tmp_path: Path) -> Iterator[EngineFleet]:
    f = start_engines(tmp_path, 4, extra=["--time-scale", "0.02", "--faults"])
    yield f
    f.stop()


@pytest.fixture()
def planner(redis_server: RedisServer, fleet: EngineFleet,
            tmp_path: Path) -> Iterator[PlannerService]:
    settings = planner_settings(redis_server.url, tmp_path / "planner",
                                destinations=tuple(fleet.destinations().split(",")),
                                interval_s=3600.0, q_cap=30.0, warm_slots_per_destination=16)
    svc = build_service(settings, consume=False)
    svc.start()
    rates = np.linspace(60.0, 1.0, len(KEYS))  # the hottest keys need 2 replicas (q_cap 30)
    now = int(time.time() * 1000)
    ids = list(fleet.urls)
    for end in (now - 10_000, now):
        svc.planner.on_window(make_window([f"m/h:{k}" for k in KEYS], rates,
                                          window_end_ms=end, destinations=ids))
    svc.planner.tick()
    assert svc.planner.installed is not None
    yield svc
    svc.stop()


@pytest.fixture()
def gw(planner: PlannerService, redis_server: RedisServer,
       fleet: EngineFleet, tmp_path: Path) -> Iterator[GatewayThread]:
    g = _gateway(planner, redis_server, fleet, "gw-planned", share=False,
                 health=HealthPolicy(consecutive_failures=2, base_ejection_s=60.0))
    yield g
    g.stop()


def ask(g: GatewayThread, key: str, i: int = 0) -> str:
    c = openai.OpenAI(base_url=g.url + "/v1", api_key="k", max_retries=0,
                      default_headers={"x-routing-key": key})
    raw = c.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": f"question {i}"}], max_tokens=2)
    return str(raw.headers["x-cacheroute-destination"])


def test_plan_affinity_drain_through_the_planner_takes_effect_within_a_second(
        planner: PlannerService, gw: GatewayThread) -> None:
    table = planner.planner.installed.plan.table  # type: ignore[union-attr]
    ids = [d.id for d in planner.planner.installed.plan.destinations]  # type: ignore[union-attr]
    for key in KEYS[:5]:  # admitted keys go to their planned set
        members = {ids[m] for m in table.set_of(table.keys.index(f"m/h:{key}"))}
        assert {ask(gw, key, i) for i in range(6)} <= members
    drained = ids[0]
    before = planner.planner.installed.plan.version  # type: ignore[union-attr]
    t0 = time.monotonic()
    planner.planner.update_config(tunables={}, add=[], drain=[drained], remove=[])
    assert eventually(lambda: gw.client.version > before, 10.0)  # type: ignore[union-attr]
    bound(time.monotonic() - t0, 1.0, "drain applied by the gateway after, s")
    seen = Counter(ask(gw, key, i) for i, key in enumerate(KEYS * 2))
    assert seen[drained] == 0 and sum(seen.values()) == 2 * len(KEYS)


def test_an_engine_killed_inside_an_interval_is_routed_around_then_drained(
        planner: PlannerService, gw: GatewayThread, fleet: EngineFleet) -> None:
    plan = planner.planner.installed.plan  # type: ignore[union-attr]
    ids = [d.id for d in plan.destinations]
    victim = ids[1]
    on_victim = [k for k in KEYS
                 if ids.index(victim) in plan.table.set_of(plan.table.keys.index(f"m/h:{k}"))]
    assert on_victim
    fault(fleet, victim, "down")
    # At once: every request is answered, by the rest of the key's set or by P2C.
    answers = [ask(gw, key, i) for i, key in enumerate(on_victim * 3)]
    assert victim not in answers
    assert not gw.client.core.is_usable(victim)  # type: ignore[union-attr]
    # The router reports it; the planner drains it within its timer period, although the
    # control interval (an hour here) has not passed.
    assert eventually(lambda: victim in planner.planner.reported_down, 5.0)
    assert eventually(lambda: any(d.id == victim and d.draining for d in
                                  planner.planner.installed.plan.destinations), 5.0)  # type: ignore[union-attr]
    new = planner.planner.installed.plan  # type: ignore[union-attr]
    assert all(ids.index(victim) not in new.table.set_of(i) for i in range(len(new.table.keys)))
    decision = planner.planner.decisions[-1]
    assert "reported down" in decision.reason
    assert eventually(lambda: gw.client.version >= new.version, 3.0)  # type: ignore[union-attr]


def _gateway(planner: PlannerService, redis_server: RedisServer, fleet: EngineFleet,
             name: str, share: bool, health: HealthPolicy | None = None) -> GatewayThread:
    """A gateway following the planner's plan through Redis, once it holds that plan."""
    keys = signing.pin([signing.load_public_key(
        Path(planner.settings.data_dir) / "planner-signing-key.pub.pem")])
    g = GatewayThread(parse_destinations(fleet.destinations()),
                      source=AsyncRedisPlanSource(redis_server.url), public_keys=keys,
                      health=health, settings=GatewaySettings(port=0, router_id=name),
                      share_history_url=redis_server.url if share else "").start()
    version = planner.planner.installed.plan.version  # type: ignore[union-attr]
    assert eventually(lambda: g.client is not None and g.client.version >= version, 5.0)
    return g


def _turn(g: GatewayThread, conversation: str) -> str:
    c = openai.OpenAI(base_url=g.url + "/v1", api_key="k", max_retries=0,
                      default_headers={"x-routing-key": KEYS[0], "x-session-id": conversation})
    raw = c.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "next"}], max_tokens=2)
    return str(raw.headers["x-cacheroute-destination"])


@pytest.mark.parametrize("share", [True, False])
def test_a_turn_at_another_gateway_goes_where_the_conversation_went_when_they_share(
        planner: PlannerService, redis_server: RedisServer, fleet: EngineFleet,
        share: bool) -> None:
    """Gateway A has one member of the hot key's set ejected, so it places every
    conversation on the other; gateway B sees both healthy and would spread them over both
    by rendezvous hashing. Sharing over Redis sends B's turns where A put each conversation."""
    plan = planner.planner.installed.plan  # type: ignore[union-attr]
    ids = [d.id for d in plan.destinations]
    members = [ids[m] for m in plan.table.set_of(plan.table.keys.index(f"m/h:{KEYS[0]}"))]
    assert len(members) >= 2
    a = _gateway(planner, redis_server, fleet, "gw-a", share)
    b = _gateway(planner, redis_server, fleet, "gw-b", share)
    try:
        assert a.client is not None and b.client is not None
        core_a = a.client.core
        a.loop.call_soon_threadsafe(core_a.mark_down, members[0])
        assert eventually(lambda: not core_a.is_usable(members[0]), 2.0)
        if share:  # garbage on the channel is counted and skipped; the loop carries on
            hostile = redis.Redis.from_url(redis_server.url)
            hostile.publish(Layout().history_channel, b"\x00garbage")
            hostile.publish(Layout().history_channel, b'{"v":1,"router":"x","moves":[["c","zz"]]}')
            hostile.close()
            assert eventually(lambda: b.client.metrics()["history_messages_rejected"] == 1, 3.0)  # type: ignore[union-attr]
        conversations = [f"conv-{i}" for i in range(20)]
        first = {c: _turn(a, c) for c in conversations}
        assert members[0] not in first.values()
        if share:
            assert eventually(lambda: b.client.core.history_learned >= 20, 3.0)  # type: ignore[union-attr]
        second = {c: _turn(b, c) for c in conversations}
        kept = sum(first[c] == second[c] for c in conversations)
        if share:
            assert kept == 20
            m = b.client.metrics()
            assert m["history_moves_learned"] >= 20 and m["history_messages_rejected"] == 1
            assert a.client.metrics()["history_moves_sent"] >= 20
        else:  # rendezvous over both members sends about half elsewhere
            assert kept < 20
    finally:
        a.stop()
        b.stop()


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{"))


def test_gateway_processes_share_conversations_through_the_plan_redis(
        redis_server: RedisServer, fleet: EngineFleet, tmp_path: Path) -> None:
    """The command's wiring: two `cacheroute gateway` processes on one Redis (given the
    same router id by their deployment, as replicas often are) hear each other's
    conversation placements, with no planner running yet."""
    pub = tmp_path / "planner.pub.pem"
    signing.save_public_key(signing.generate_private_key().public_key(), pub)
    common = ("--destinations", fleet.destinations(), "--probe-path", "", "--redis-url",
              redis_server.url, "--public-key", str(pub), "--router-id", "gateway")
    with gateway_process(*common) as a, gateway_process(*common) as b:
        # Both subscribed first (a placement published before that is only a lost hint).
        r = redis.Redis.from_url(redis_server.url)
        channel = Layout().history_channel
        assert eventually(lambda: r.pubsub_numsub(channel)[0][1] >= 2, 5.0)
        r.close()
        for i in range(10):
            c = openai.OpenAI(base_url=a + "/v1", api_key="k", max_retries=0,
                              default_headers={"x-session-id": f"s{i}"})
            c.chat.completions.create(model="m", max_tokens=2, messages=[
                {"role": "system", "content": "app"}, {"role": "user", "content": "hi"}])
        assert eventually(
            lambda: _metric(b, "cacheroute_router_history_moves_learned_total") >= 10, 5.0)
        assert _metric(a, "cacheroute_router_history_moves_sent_total") >= 10
