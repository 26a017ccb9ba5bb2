"""One gateway, two model pools, one planner: every part real.

The planner runs a pools file (chat: model llama on e0, e1; code: model qwen on e2, e3)
against redis-server; the gateway is the `cacheroute gateway --pools-file` process reading
each pool's plan from its own namespace; the engines are the emulator; the client is the
openai SDK. Each request goes to its model's pool and, when its key is planned, to the
key's planned set; a model no pool claims gets a 404.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx2 as httpx  # the HTTP client the openai SDK itself uses
import numpy as np
import openai
import pytest

from cacheroute.v1 import planner_pb2, planner_pb2_grpc
from planner_svc.devstack.engines import EngineFleet, start_engines
from planner_svc.devstack.processes import RedisServer
from planner_svc.server import PlannerService, build_service
from tests.gateway_harness import gateway_process
from tests.service.harness import planner_settings
from tests.service.windows import make_window
from tests.waiting import eventually

pytestmark = pytest.mark.integration
POOL_OF_MODEL = {"llama": "chat", "qwen": "code"}
TENANTS = [f"t{i}" for i in range(12)]


@pytest.fixture()
def fleet(tmp_path: Path) -> Iterator[EngineFleet]:
    f = start_engines(tmp_path, 4, extra=["--time-scale", "0.02"])
    yield f
    f.stop()


@pytest.fixture()
def pools_file(tmp_path: Path, fleet: EngineFleet) -> Path:
    ids = list(fleet.urls)
    dest = [f'"{i}={fleet.urls[i]}"' for i in ids]
    path = tmp_path / "pools.toml"
    path.write_text(f"""
[pools.chat]
models = ["llama"]
destinations = [{dest[0]}, {dest[1]}]

[pools.code]
models = ["qwen"]
destinations = [{dest[2]}, {dest[3]}]
""")
    return path


@pytest.fixture()
def planner(redis_server: RedisServer, pools_file: Path, fleet: EngineFleet,
            tmp_path: Path) -> Iterator[PlannerService]:
    svc = build_service(planner_settings(redis_server.url, tmp_path / "planner",
                                         destinations=(), pools_file=str(pools_file),
                                         q_cap=30.0, warm_slots_per_destination=16),
                        consume=False)
    svc.start()
    keys = [f"{model}/h:{t}" for model in POOL_OF_MODEL for t in TENANTS]
    rates = np.linspace(20.0, 1.0, len(keys))
    now = int(time.time() * 1000)
    for end in (now - 10_000, now):
        svc.pools.on_window(make_window(keys, rates, window_end_ms=end,
                                        destinations=list(fleet.urls)))
    for unit in svc.pools.units():
        unit.planner.tick()
        assert unit.planner.installed is not None
    yield svc
    svc.stop()


@contextlib.contextmanager
def gateway(planner: PlannerService, redis_url: str, pools_file: Path, *extra: str,
            rid: str = "gw-pools") -> Iterator[str]:
    """`cacheroute gateway --pools-file ...` as a process; its URL once it follows its pools."""
    with gateway_process(
            "--pools-file", str(pools_file), "--redis-url", redis_url, "--public-key",
            str(Path(planner.settings.data_dir) / "planner-signing-key.pub.pem"),
            "--probe-path", "", "--router-id", rid, *extra) as url:

        def following() -> bool:
            body = httpx.get(url + "/readyz").json()
            pools = body.get("pools", {"chat": body})
            return all(p.get("plan_version") == "1.1" for p in pools.values())

        assert eventually(following, 10.0), httpx.get(url + "/readyz").text
        yield url


@pytest.fixture()
def gateway_url(planner: PlannerService, redis_server: RedisServer,
                pools_file: Path) -> Iterator[str]:
    with gateway(planner, redis_server.url, pools_file) as url:
        yield url


def ask(url: str, model: str, tenant: str, i: int = 0) -> str:
    c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0,
                      default_headers={"x-routing-key": tenant})
    raw = c.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": f"question {i}"}], max_tokens=2)
    return str(raw.headers["x-cacheroute-destination"])


def test_each_request_goes_to_its_models_pool_and_its_planned_set(
        planner: PlannerService, gateway_url: str, fleet: EngineFleet) -> None:
    ids = list(fleet.urls)
    own = {"chat": set(ids[:2]), "code": set(ids[2:])}
    checked = 0
    for model, pool in POOL_OF_MODEL.items():
        plan = planner.pools.get(pool).planner.installed.plan  # type: ignore[union-attr]
        table, dests = plan.table, [d.id for d in plan.destinations]
        for tenant in TENANTS:
            served = {ask(gateway_url, model, tenant, j) for j in range(3)}
            assert served <= own[pool], (model, tenant, served)
            key = f"{model}/h:{tenant}"
            if key in table.keys:
                planned = {dests[m] for m in table.set_of(table.keys.index(key))}
                assert served <= planned, (key, served, planned)
                checked += 1
    assert checked >= len(TENANTS)  # most keys are planned at these rates
    with pytest.raises(openai.NotFoundError, match="no pool claims it"):
        ask(gateway_url, "mistral", "t0")
    # The gateway reports into each pool's namespace; the planner lists it per pool.
    stub = planner_pb2_grpc.PlannerStub(grpc.insecure_channel(f"127.0.0.1:{planner.port}"))
    for pool in ("chat", "code"):
        def reported(pool: str = pool) -> bool:
            routers = stub.ListRouters(planner_pb2.ListRoutersRequest(pool=pool)).routers
            return [r.status.router_id for r in routers] == ["gw-pools"]
        assert eventually(reported, 10.0)
    metrics = httpx.get(gateway_url + "/metrics").text
    assert 'pool="chat"' in metrics and 'pool="code"' in metrics


def test_a_gateway_for_some_pools_sends_the_others_nowhere_else(
        planner: PlannerService, redis_server: RedisServer, pools_file: Path,
        fleet: EngineFleet) -> None:
    with gateway(planner, redis_server.url, pools_file, "--pools", "chat",
                 rid="gw-chat") as url:
        assert ask(url, "llama", "t1") in set(list(fleet.urls)[:2])
        # qwen is the code pool's: never sent to chat's engines, and the client is told why.
        with pytest.raises(openai.NotFoundError, match="served by other gateways"):
            ask(url, "qwen", "t1")


def test_the_gateway_follows_the_pools_file_at_run_time(
        planner: PlannerService, redis_server: RedisServer, pools_file: Path) -> None:
    with gateway(planner, redis_server.url, pools_file) as url:
        original = pools_file.read_text()
        ask(url, "qwen", "t1")  # served by the code pool
        pools_file.write_text(original.split("[pools.code]")[0])  # code removed

        def qwen_refused() -> bool:
            try:
                ask(url, "qwen", "t1")
            except openai.NotFoundError:
                return True
            return False

        assert eventually(qwen_refused, 10.0)
        assert ask(url, "llama", "t1")  # chat carries on throughout
        pools_file.write_text(original)  # and back: served again, by its plan in Redis
        assert eventually(lambda: not qwen_refused(), 10.0)

        def code_planned() -> bool:
            pools = httpx.get(url + "/readyz").json()["pools"]
            return set(pools) == {"chat", "code"} and pools["code"]["plan_version"] == "1.1"

        assert eventually(code_planned, 10.0)
