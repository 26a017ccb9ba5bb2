"""Many pools on one planner: real gRPC, real redis-server, a real pools file.

Each pool plans its own keys onto its own destinations and installs into its own Redis
namespace; calls name their pool; a pool that cannot start or fails its steps leaves the
others planning; the pools file is re-read at run time (pools added, edited, removed).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis

from cacheroute.v1 import planner_pb2, planner_pb2_grpc
from planner_svc.server import PlannerService, build_service
from planner_svc.simulator.rates import paper_like_rates
from router_client.layout import Layout
from router_client.plan import parse_destinations
from tests.service.harness import planner_settings
from tests.service.windows import make_window

pytestmark = pytest.mark.integration

POOLS = """
[pools.chat]
models = ["llama"]
destinations = ["c0", "c1", "c2"]
q_cap = 30

[pools.code]
models = ["qwen", "qwen@sql"]
destinations = ["q0", "q1", "q2", "q3"]
warm_slots_per_destination = 4
"""
CHAT_KEYS = [f"llama/h:tenant-{i}" for i in range(120)]
CODE_KEYS = [f"qwen/h:repo-{i}" for i in range(80)] + [f"qwen@sql/h:db-{i}" for i in range(20)]
STRAY_KEYS = [f"mistral/h:x-{i}" for i in range(10)]  # no pool claims mistral


def feed(svc: PlannerService, *, seed: int = 1) -> None:
    """Two windows of every pool's keys (and a model no pool claims), a window apart."""
    keys = CHAT_KEYS + CODE_KEYS + STRAY_KEYS
    rates = paper_like_rates(len(keys), 200.0, seed=seed)
    end = int(time.time() * 1000)
    for window_end in (end - 10_000, end):
        svc.pools.on_window(make_window(keys, rates, window_end_ms=window_end,
                                        destinations=["c0", "c1", "c2", "q0", "q1", "q2",
                                                      "q3"]))


def tick_all(svc: PlannerService) -> None:
    for unit in svc.pools.units():
        unit.planner.tick()


@pytest.fixture()
def pools_file(tmp_path: Path) -> Path:
    path = tmp_path / "pools.toml"
    path.write_text(POOLS)
    return path


@pytest.fixture()
def service(redis_server, tmp_path: Path, pools_file: Path) -> Iterator[PlannerService]:
    svc = build_service(planner_settings(redis_server.url, tmp_path, destinations=(),
                                         pools_file=str(pools_file)), consume=False)
    svc.server.start()
    yield svc
    svc.stop(0)


def stub_for(svc: PlannerService) -> planner_pb2_grpc.PlannerStub:
    return planner_pb2_grpc.PlannerStub(grpc.insecure_channel(f"127.0.0.1:{svc.port}"))


def test_each_pool_plans_its_own_keys_onto_its_own_destinations_in_its_namespace(
        service, redis_server):
    feed(service)
    tick_all(service)
    r = redis.Redis.from_url(redis_server.url)
    for pool, dests, keys in (("chat", ["c0", "c1", "c2"], CHAT_KEYS),
                              ("code", ["q0", "q1", "q2", "q3"], CODE_KEYS)):
        planner = service.pools.get(pool).planner
        plan = planner.current().plan
        assert plan.destination_ids == dests
        admitted = set(plan.table.keys)
        assert admitted and admitted <= set(keys)  # only its own keys
        assert r.get(Layout(f"cacheroute:{pool}").current) is not None
    assert r.get(Layout("cacheroute").current) is None  # no default pool here
    assert service.pools.get("chat").planner.tunables.q_cap == 30.0
    assert service.pools.get("code").planner.tunables.warm_slots_per_destination == 4
    assert service.pools.unclaimed_keys == 2 * len(STRAY_KEYS)


def test_calls_name_their_pool_and_a_wrong_name_says_which_exist(service):
    feed(service)
    tick_all(service)
    stub = stub_for(service)
    chat = stub.GetStatus(planner_pb2.GetStatusRequest(pool="chat"))
    code = stub.GetStatus(planner_pb2.GetStatusRequest(pool="code"))
    assert [d.id for d in chat.config.destinations] == ["c0", "c1", "c2"]
    assert [d.id for d in code.config.destinations] == ["q0", "q1", "q2", "q3"]
    current = stub.GetCurrentVersion(planner_pb2.GetCurrentVersionRequest(pool="code"))
    assert current.version.seq == 1
    with pytest.raises(grpc.RpcError) as missing:
        stub.GetStatus(planner_pb2.GetStatusRequest(pool="nope"))
    assert missing.value.code() is grpc.StatusCode.NOT_FOUND
    assert "running: chat, code" in missing.value.details()
    with pytest.raises(grpc.RpcError) as unnamed:
        stub.GetStatus(planner_pb2.GetStatusRequest())
    assert unnamed.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    listed = stub.ListPools(planner_pb2.ListPoolsRequest())
    assert [(p.name, p.running, p.namespace, p.installed.seq) for p in listed.pools] == [
        ("chat", True, "cacheroute:chat", 1), ("code", True, "cacheroute:code", 1)]
    assert listed.unclaimed_keys == 2 * len(STRAY_KEYS)
    # A change to one pool touches no other.
    stub.UpdateConfig(planner_pb2.UpdateConfigRequest(pool="chat", q_cap=55.0))
    assert service.pools.get("chat").planner.tunables.q_cap == 55.0
    assert service.pools.get("code").planner.tunables.q_cap == 20.0


def test_a_pool_that_cannot_start_or_fails_its_steps_leaves_the_others_planning(
        service, redis_server, pools_file):
    r = redis.Redis.from_url(redis_server.url)
    # A hostile or buggy writer left junk of the wrong type where a new pool's pointer goes.
    r.hset(Layout("cacheroute:bad").current, "x", "y")
    pools_file.write_text(POOLS + '\n[pools.bad]\nmodels = ["mistral"]\ndestinations = ["b0"]\n'
                          '\n[pools.default]\nmodels = ["*"]\ndestinations = ["d0", "d1"]\n')
    service.pools_file.reload_if_changed(service.pools)
    listed = {p.name: p for p in stub_for(service).ListPools(planner_pb2.ListPoolsRequest()).pools}
    assert not listed["bad"].running and "WRONGTYPE" in listed["bad"].error
    assert listed["chat"].running and listed["code"].running and listed["default"].running
    feed(service)
    tick_all(service)
    # The failed pool's keys (model mistral) are set aside, not planned by the '*' pool.
    assert service.pools.stranded_keys == 2 * len(STRAY_KEYS)
    assert service.pools.get("default").planner.traffic.keys == []
    # A running pool's step failing (its versions index clobbered) is counted on it alone.
    r.delete(Layout("cacheroute:code").versions)
    r.hset(Layout("cacheroute:code").versions, "x", "y")
    feed(service, seed=2)
    service.pools.each("control step",
                       lambda u: u.planner.replan(fresh=True, force=True, dry_run=False))
    code, chat = service.pools.get("code"), service.pools.get("chat")
    assert code.failures >= 1 and "WRONGTYPE" in code.last_error
    assert chat.failures == 0 and chat.planner.current().plan.version.seq == 2


def test_engine_signals_reach_a_destination_added_at_run_time(service):
    from cacheroute.v1 import signals_pb2

    chat = service.pools.get("chat").planner
    chat.update_config(tunables={}, add=parse_destinations("c9=http://10.0.0.9:8000"),
                       drain=[], remove=[])
    report = signals_pb2.EngineSignals(destination="c9",
                                       observed_at_ms=int(time.time() * 1000))
    service.pools.on_engine_signals(report)
    assert "c9" in chat.engine_signals
    assert "c9" not in service.pools.get("code").planner.engine_signals


def test_the_pools_file_adds_edits_and_removes_pools_at_run_time(service, pools_file):
    feed(service)
    tick_all(service)
    pools_file.write_text(POOLS.replace("q_cap = 30", "q_cap = 45").replace(
        '"c0", "c1", "c2"', '"c0", "c1", "c2", "c3"')
        + '\n[pools.default]\nmodels = ["*"]\ndestinations = ["d0", "d1"]\n')
    service.pools_file.reload_if_changed(service.pools)
    assert sorted(service.pools.names()) == ["chat", "code", "default"]
    chat = service.pools.get("chat").planner
    assert chat.tunables.q_cap == 45.0
    assert [d.id for d in chat.destinations] == ["c0", "c1", "c2", "c3"]
    feed(service, seed=3)
    service.pools.get("default").planner.tick()
    stray = service.pools.get("default").planner.current().plan
    assert set(stray.table.keys) <= set(STRAY_KEYS) and stray.table.keys
    # An edit that does not parse changes nothing; the error is shown.
    pools_file.write_text("[pools.chat\n")
    service.pools_file.reload_if_changed(service.pools)
    assert sorted(service.pools.names()) == ["chat", "code", "default"]
    listed = stub_for(service).ListPools(planner_pb2.ListPoolsRequest())
    assert "not TOML" in listed.pools_file_error
    # Removing a pool stops its planner; a destination left out is drained first; a setting
    # taken out of a pool's entry goes back to the process's; a weight change is applied.
    pools_file.write_text(POOLS.replace('"c0", "c1", "c2"', '"c0*3", "c1"').replace(
        "q_cap = 30\n", ""))
    service.pools_file.reload_if_changed(service.pools)
    assert sorted(service.pools.names()) == ["chat", "code"]
    chat = service.pools.get("chat").planner
    drained = {d.id: d.draining for d in chat.destinations}
    assert drained == {"c0": False, "c1": False, "c2": True, "c3": True}
    assert {d.id: d.capacity_weight for d in chat.destinations}["c0"] == 3.0
    assert chat.tunables.q_cap == 20.0  # the process's (planner_settings)
    # An operator's drain of a listed destination stands while removals are pending.
    chat.update_config(tunables={}, add=[], drain=["c1"], remove=[])
    service.pools_file.reload_if_changed(service.pools)
    service.pools_file._applied_at = float("-inf")  # the next periodic re-apply, now
    service.pools_file.reload_if_changed(service.pools)
    assert {d.id: d.draining for d in chat.destinations}["c1"] is True


def test_replicated_planners_lead_and_follow_every_pool_together(redis_server, tmp_path,
                                                                  pools_file):
    from planner_svc.errors import NotLeader

    def replica(name: str) -> PlannerService:  # replicas share the signing key
        return build_service(planner_settings(
            redis_server.url, tmp_path / name, destinations=(), pools_file=str(pools_file),
            leader_lease_s=2.0, leader_id=name,
            signing_key_path=str(tmp_path / "planner-signing-key.pem")), consume=False)

    a, b = replica("a"), replica("b")
    try:
        assert a._elect() and not b._elect()
        for svc in (a, b):
            feed(svc)
        tick_all(a)
        assert {u.spec.name: u.planner.role for u in a.pools.units()} == {
            "chat": "leader", "code": "leader"}
        for unit in b.pools.units():  # the standby installs nothing, in any pool
            assert unit.planner.role == "standby"
            with pytest.raises(NotLeader):
                unit.planner.replan(fresh=True, force=True, dry_run=False)
        b._elect()  # follows: adopts each pool's plan from its namespace
        assert all(u.planner.current().plan.version.seq == 1 for u in b.pools.units())
        a.leadership.release(a.publisher)  # the leader leaves
        a.leadership = None
        assert b._elect()
        for unit in b.pools.units():
            assert unit.planner.role == "leader"
            unit.planner.replan(fresh=True, force=True, dry_run=False)
            assert unit.planner.current().plan.version.epoch == 2  # above every old version
        # A pool added while leading leads at once.
        pools_file.write_text(POOLS + '\n[pools.more]\nmodels = ["phi"]\n'
                                      'destinations = ["m0"]\n')
        b.pools_file.reload_if_changed(b.pools)
        assert b.pools.get("more").planner.role == "leader"
    finally:
        a.stop(0)
        b.stop(0)


def test_the_cli_lists_pools_and_every_command_takes_pool(service):
    import contextlib
    import io
    import json

    from planner_svc.cli.main import main

    feed(service)
    tick_all(service)

    def cli(*argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([*argv, "--planner", f"127.0.0.1:{service.port}"])
        return rc, out.getvalue(), err.getvalue()

    rc, out, _ = cli("pools")
    assert rc == 0 and "chat" in out and "cacheroute:code" in out and "planned" in out
    rc, out, _ = cli("pools", "--json")
    listed = json.loads(out)
    assert [p["name"] for p in listed["pools"]] == ["chat", "code"]
    assert listed["pools"][1]["destinations"] == ["q0", "q1", "q2", "q3"]
    rc, out, _ = cli("config", "set", "--pool", "code", "q_cap=33")
    assert rc == 0
    assert service.pools.get("code").planner.tunables.q_cap == 33.0
    assert service.pools.get("chat").planner.tunables.q_cap == 30.0
    rc, out, _ = cli("status", "--pool", "chat", "--json")
    assert rc == 0 and json.loads(out)["config"]["q_cap"] == 30.0
    rc, _, err = cli("status", "--pool", "nope")
    assert rc == 1 and "no pool 'nope'" in err
    rc, _, err = cli("status")  # two pools, no default: name one
    assert rc == 2 and "name one (chat, code)" in err
