"""Security set-up: Redis ACL users on a real redis-server, no pickle, every size bounded."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import grpc
import pytest
import redis

from cacheroute.v1 import events_pb2, plan_pb2
from planner_svc.adapters.redis_publisher import IN_SYNC, PlanPublisher, PublishError
from planner_svc.devstack.processes import start_redis
from planner_svc.settings import PlannerSettings
from router_client import RouterClient, signing
from router_client.errors import PlanRejected
from router_client.layout import Layout
from router_client.plan import MAX_KEY_BYTES, MAX_PLAN_BYTES, Version
from router_client.redis_source import RedisPlanSource
from router_client.testing import perturb, synthetic_plan
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("router_client", "planner_svc", "streams", "examples", "deploy")
TEMPLATE = ROOT / "deploy" / "redis" / "users.acl.template"
RENDER = ROOT / "deploy" / "redis" / "render-acl.sh"



def render_acl(path: Path, planner_pw: str, routers: dict[str, str]) -> Path:
    """The shipped template rendered exactly as docs/security.md does it: by
    deploy/redis/render-acl.sh, one router line per router id."""
    lines = [f"planner {planner_pw}"] + [f"router {rid} {pw}" for rid, pw in routers.items()]
    out = subprocess.run(["sh", str(RENDER)], input="\n".join(lines) + "\n", text=True,
                         capture_output=True, check=True).stdout
    path.write_text(out)
    return path


@pytest.mark.integration
def test_acl_users_planner_writes_routers_read_default_is_off(tmp_path):
    acl = render_acl(tmp_path / "users.acl", "planner-pw", {"edge-1": "e1", "edge-2": "e2"})
    server = start_redis(tmp_path, extra_args=["--aclfile", str(acl)])
    url = f"redis://127.0.0.1:{server.port}/0"
    key = signing.generate_private_key()
    lay = Layout()
    client = None
    try:
        with pytest.raises(redis.AuthenticationError):  # the default user is off
            redis.Redis.from_url(url).get(lay.current)
        pub = PlanPublisher(url, key, username="cacheroute-planner", password="planner-pw")
        plan = synthetic_plan(100, 4)
        pub.install(plan, None)
        source = RedisPlanSource(url, username="cacheroute-router-edge-1", password="e1")
        client = RouterClient(source, router_id="edge-1", public_keys=[key.public_key()])
        client.start(initial_wait_s=5)
        assert client.version == Version(1, 1)
        nxt = perturb(plan, 0.1, version=Version(1, 2))
        # staged first, as the planner publishes: the install script renames the blobs
        pub.commit(pub.stage(pub.prepare(nxt, plan)))
        assert client.wait_for_version(Version(1, 2), 5)  # the delta chain: read-only Lua
        assert client.follower.applied_delta == 1
        assert eventually(lambda: [s.state for s in pub.fleet_view()] == [IN_SYNC], 5)
        assert client.unavailable_rounds == 0  # no NOPERM anywhere on the router's path
        router = redis.Redis.from_url(url, username="cacheroute-router-edge-1", password="e1")
        denied = [
            lambda: router.set(lay.current, b"x"),
            lambda: router.set(lay.plan(Version(1, 9)), b"x"),
            lambda: router.delete(lay.plan(Version(1, 2))),
            lambda: router.set(lay.router_status("edge-2"), b"forged"),
            lambda: router.publish(lay.channel, b"x"),
            lambda: router.eval("return redis.call('SET', KEYS[1], 'x')", 1, lay.current),
            lambda: router.keys("*"),
            lambda: router.flushall(),
            lambda: router.config_get("*"),
            lambda: router.get("other:key"),
        ]
        for attempt in denied:
            with pytest.raises(redis.exceptions.NoPermissionError):
                attempt()
        # No scripting at all: a script is a way to hang Redis for every other client.
        for attempt in (lambda: router.script_load("return 1"),
                        lambda: router.evalsha("0" * 40, 1, lay.versions),
                        lambda: router.eval("return 1", 0)):
            with pytest.raises(redis.exceptions.NoPermissionError):
                attempt()
        router_pub = PlanPublisher(url, key, username="cacheroute-router-edge-1", password="e1")
        with pytest.raises(PublishError, match="no permissions"):
            router_pub.install(perturb(nxt, 0.1, version=Version(1, 3)), nxt)
        assert pub.current().version == Version(1, 2)
        planner = redis.Redis.from_url(url, username="cacheroute-planner", password="planner-pw")
        for attempt in (lambda: planner.flushall(), lambda: planner.config_set("save", "")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                attempt()
    finally:
        if client is not None:
            client.stop()
        server.process.stop()


# --- no pickle ----------------------------------------------------------------------

FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "marshal"}
FORBIDDEN_CALLS = {"loads", "load", "Unpickler"}


def _python_files() -> list[Path]:
    files = [p for d in SHIPPED for p in (ROOT / d).rglob("*.py")]
    return [p for p in files if "_pb2" not in p.name]


def test_no_pickle_anywhere_in_the_shipped_packages():
    offenders = []
    for path in _python_files():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                # Faust / Kafka serializers are named by string: "pickle" must not be one.
                names = ["pickle"] if node.value.strip().lower() == "pickle" else []
            offenders += [
                f"{path.relative_to(ROOT)}:{node.lineno}" for n in names if n in FORBIDDEN_MODULES
            ]
    assert len(_python_files()) > 50
    assert offenders == []


def test_the_stream_app_serializes_with_protobuf_not_pickle():
    text = (ROOT / "streams" / "app.py").read_text()
    assert "pickle" not in text
    assert "value_serializer" in text or "serializer" in text


# --- size bounds ---------------------------------------------------------------------


def test_plan_size_bound_is_enforced_before_parsing():
    key = signing.generate_private_key()
    with pytest.raises(PlanRejected) as exc:
        signing.verify_blob(b"\x00" * 1025, [key.public_key()], max_bytes=1024)
    assert exc.value.reason == "oversize"
    with pytest.raises(PlanRejected) as exc:
        signing.verify_blob(b"\x00" * (MAX_PLAN_BYTES + 1), [key.public_key()])
    assert exc.value.reason == "oversize"
    from streams.config import StreamConfig

    assert StreamConfig().max_key_bytes == MAX_KEY_BYTES  # one bound: counted keys can be planned


def test_notifications_are_bounded_and_junk_is_only_a_missed_hint():
    from router_client.redis_source import _hint

    note = plan_pb2.PlanNotification(
        version=plan_pb2.PlanVersion(epoch=2**64 - 1, seq=2**64 - 1), digest=b"\xff" * 32
    ).SerializeToString()
    assert len(note) <= 64  # the largest notification a planner sends
    assert _hint({"type": "message", "data": note}) == Version(2**64 - 1, 2**64 - 1)
    assert _hint({"type": "message", "data": b"\xff" * 1_000_000}) is None


def test_event_sizes_are_bounded_by_validation():
    from streams.config import StreamConfig
    from streams.decoding import columns_of, decode_batch
    from streams.validation import CODE, validate

    config = StreamConfig()
    ev = events_pb2.Event(producer_id="p", sequence=1, timestamp_ms=1_000)
    ev.request.routing_key = "k" * (config.max_key_bytes + 1)
    ev.request.destination = "d0"
    ev.request.prompt_tokens = 10
    raw = events_pb2.EventBatch(events=[ev]).SerializeToString()
    events = decode_batch(raw)
    assert events is not None
    reasons = validate(columns_of(events, [0]), 1_000, config)
    assert reasons.tolist() == [CODE["invalid_key"]]
    assert config.max_tracked_keys > 0 and config.max_destinations > 0


@pytest.mark.integration
def test_grpc_messages_over_the_limit_are_refused(redis_server, tmp_path):
    from cacheroute.v1 import planner_pb2, planner_pb2_grpc
    from planner_svc.server import build_service

    settings = PlannerSettings(
        redis_url=redis_server.url,
        grpc_port=0,
        data_dir=str(tmp_path),
        destinations=("d0", "d1"),
        max_request_bytes=64 * 1024,
    )
    svc = build_service(settings, consume=False)
    svc.server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{svc.port}") as ch:
            stub = planner_pb2_grpc.PlannerStub(ch)
            big = planner_pb2.SetModeRequest(reason="x" * (65 * 1024))
            with pytest.raises(grpc.RpcError) as exc:
                stub.SetMode(big, timeout=5)
            assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            small = planner_pb2.SetModeRequest(reason="x" * 1001)
            with pytest.raises(grpc.RpcError) as exc:
                stub.SetMode(small, timeout=5)
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        svc.stop(0)


@pytest.mark.integration
def test_a_router_acl_from_before_zcount_still_reports_its_status(tmp_path):
    """An ACL file rendered before the peer count (no `+zcount`): the status is written and
    the count is unknown (None), so idle re-homing stays as it was (paused on Redis)."""
    from cacheroute.v1 import plan_pb2 as pb

    acl = render_acl(tmp_path / "users.acl", "planner-pw", {"edge-1": "e1"})
    acl.write_text(acl.read_text().replace(" +zcount", ""))
    server = start_redis(tmp_path, extra_args=["--aclfile", str(acl)])
    url = f"redis://127.0.0.1:{server.port}/0"
    source = RedisPlanSource(url, username="cacheroute-router-edge-1", password="e1")
    try:
        assert source.report(pb.RouterStatus(router_id="edge-1", reported_at_ms=1)) is None
        admin = redis.Redis.from_url(url, username="cacheroute-planner", password="planner-pw")
        assert admin.get(Layout().router_status("edge-1")) is not None
    finally:
        source.close()
        server.process.stop()
