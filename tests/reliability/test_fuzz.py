"""Item 10, fuzzing every decoder (events, plans, deltas, notifications, pointers)
and the gRPC request validators: only the declared rejection errors, no crash,
no input taking over 1 s (hypothesis' per-example deadline)."""

from __future__ import annotations

from datetime import timedelta

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cacheroute.v1 import events_pb2, plan_pb2, planner_pb2, planner_pb2_grpc
from router_client import signing
from router_client.delta import apply_delta, decode_delta, make_delta
from router_client.errors import PlanRejected
from router_client.layout import Pointer
from router_client.plan import Version, decode_plan, encode_plan
from router_client.redis_source import _hint, _pointer
from router_client.routing import RoutingTable
from router_client.testing import perturb, synthetic_plan
from streams.config import StreamConfig
from streams.decoding import columns_of, decode_batch
from streams.validation import REASONS, validate

FUZZ = settings(
    max_examples=300,
    deadline=timedelta(seconds=1),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
KEY = signing.generate_private_key()
PLAN = synthetic_plan(60, 5)
PAYLOAD = encode_plan(PLAN)
NEXT = perturb(PLAN, 0.2, version=Version(1, 2))
TABLE = RoutingTable.from_plan(PLAN, b"\x01" * 32)
DELTA = make_delta(PLAN, NEXT, b"\x01" * 32, b"\x02" * 32).SerializeToString()


def mutated(base: bytes) -> st.SearchStrategy[bytes]:
    """`base` with a few bytes overwritten, inserted or cut off."""

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        data = bytearray(base)
        for _ in range(draw(st.integers(1, 8))):
            if not data:
                break
            i = draw(st.integers(0, len(data) - 1))
            op = draw(st.sampled_from(["set", "insert", "cut"]))
            if op == "set":
                data[i] = draw(st.integers(0, 255))
            elif op == "insert":
                data[i:i] = draw(st.binary(max_size=16))
            else:
                del data[i:]
        return bytes(data)

    return build()


def blobs_of(base: bytes) -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=4096), mutated(base))


# --- plans and deltas -------------------------------------------------------------------


@FUZZ
@given(raw=blobs_of(signing.sign_blob(PAYLOAD, signing.PLAN, KEY)))
def test_verify_blob_only_rejects(raw):
    try:
        kind, _payload, digest = signing.verify_blob(raw, [KEY.public_key()])
    except PlanRejected:
        return
    assert kind in (signing.PLAN, signing.DELTA) and len(digest) == 32


@FUZZ
@given(payload=blobs_of(PAYLOAD))
def test_plan_decoders_only_reject(payload):
    # A signed payload reaches the decoders only from the planner's key, but the
    # decoders must not trust that: same outcome either way, never a crash.
    outcomes = []
    for decode in (decode_plan, RoutingTable.from_payload):
        try:
            decode(payload)
            outcomes.append("ok")
        except PlanRejected as exc:
            outcomes.append("rejected")
            assert exc.reason
    assert outcomes[0] == outcomes[1]


@FUZZ
@given(payload=blobs_of(DELTA))
def test_delta_decode_and_apply_only_reject(payload):
    try:
        table = apply_delta(TABLE, decode_delta(payload))
    except PlanRejected as exc:
        assert exc.reason
        return
    assert table.version > TABLE.version


# --- notifications and pointers --------------------------------------------------------

NOTE = plan_pb2.PlanNotification(
    version=plan_pb2.PlanVersion(epoch=1, seq=7), digest=b"\x03" * 32
).SerializeToString()


@FUZZ
@given(data=blobs_of(NOTE), kind=st.sampled_from(["message", "subscribe", "pong"]))
def test_notifications_are_hints_or_nothing(data, kind):
    hint = _hint({"type": kind, "data": data})
    assert hint is None or isinstance(hint, Version)


@FUZZ
@given(
    raw=st.one_of(
        st.binary(max_size=200), mutated(Pointer(Version(1, 2), b"\x04" * 32).encode().encode())
    )
)
def test_pointers_decode_or_read_as_none(raw):
    p = _pointer(raw)
    assert p is None or isinstance(p, Pointer)


# --- events ----------------------------------------------------------------------------

texts = st.text(max_size=80)
u32 = st.integers(0, 2**32 - 1)


@st.composite
def event_batches(draw: st.DrawFn) -> bytes:
    batch = events_pb2.EventBatch()
    for _ in range(draw(st.integers(0, 20))):
        ev = batch.events.add(
            producer_id=draw(texts),
            sequence=draw(st.integers(0, 2**64 - 1)),
            timestamp_ms=draw(st.integers(-(2**63), 2**63 - 1)),
        )
        body = ev.request if draw(st.booleans()) else ev.cache_hit
        body.routing_key, body.destination = draw(texts), draw(texts)
        body.prompt_tokens = draw(u32)
        if body is ev.cache_hit:
            body.cached_tokens = draw(u32)
            body.ttft_ms = draw(st.floats(allow_nan=True, allow_infinity=True))
            body.e2e_ms = draw(st.floats(allow_nan=True, allow_infinity=True))
        else:
            body.reusable_prefix_tokens = draw(u32)
    return batch.SerializeToString()


@FUZZ
@given(raw=st.one_of(st.binary(max_size=2048), event_batches(), event_batches().flatmap(mutated)))
def test_event_decoding_and_validation_never_crash(raw):
    events = decode_batch(raw)
    if events is None:
        return  # dead-lettered as undecodable
    cols = columns_of(events, [0] * len(events))
    reasons = validate(cols, 1_700_000_000_000, StreamConfig())
    assert len(reasons) == len(events)
    assert np.all((reasons >= 0) & (reasons < len(REASONS)))


# --- gRPC request validators ---------------------------------------------------------

DECLARED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE,
}
versions = st.builds(
    plan_pb2.PlanVersion, epoch=st.integers(0, 2**64 - 1), seq=st.integers(0, 2**64 - 1)
)
floats = st.floats(allow_nan=True, allow_infinity=True)
destinations = st.builds(
    plan_pb2.Destination, id=texts, address=texts, capacity_weight=floats, draining=st.booleans()
)


@st.composite
def config_requests(draw: st.DrawFn) -> planner_pb2.UpdateConfigRequest:
    req = planner_pb2.UpdateConfigRequest(
        add_destinations=draw(st.lists(destinations, max_size=3)),
        drain_destinations=draw(st.lists(texts, max_size=3)),
        remove_destinations=draw(st.lists(texts, max_size=3)),
        request_id=draw(texts),
    )
    for name in (
        "q_cap",
        "interval_s",
        "hysteresis",
        "min_dwell_s",
        "imbalance_tolerance",
        "max_plan_age_s",
    ):
        if draw(st.booleans()) and name in req.DESCRIPTOR.fields_by_name:
            setattr(req, name, draw(floats))
    if draw(st.booleans()):
        req.warm_slots_per_destination = draw(st.integers(0, 2**32 - 1))
    return req


CALLS = st.one_of(
    st.tuples(st.just("UpdateConfig"), config_requests()),
    st.tuples(
        st.just("Rollback"),
        st.builds(
            planner_pb2.RollbackRequest, version=versions, release=st.booleans(), request_id=texts
        ),
    ),
    st.tuples(
        st.just("SetMode"),
        st.builds(
            planner_pb2.SetModeRequest, mode=st.integers(-5, 5), reason=st.text(max_size=1100)
        ),
    ),
    st.tuples(st.just("GetPlan"), st.builds(planner_pb2.GetPlanRequest, version=versions)),
    st.tuples(
        st.just("DiffPlans"), st.builds(planner_pb2.DiffPlansRequest, a=versions, b=versions)
    ),
    st.tuples(
        st.just("ListPlanVersions"),
        st.builds(planner_pb2.ListPlanVersionsRequest, limit=st.integers(0, 2**32 - 1)),
    ),
    st.tuples(
        st.just("ListDecisions"),
        st.builds(planner_pb2.ListDecisionsRequest, limit=st.integers(0, 2**32 - 1)),
    ),
    st.tuples(
        st.just("Replan"),
        st.builds(
            planner_pb2.ReplanRequest, fresh=st.booleans(), dry_run=st.just(True), request_id=texts
        ),
    ),
)


@pytest.fixture(scope="module")
def planner_stub(tmp_path_factory):
    from planner_svc.devstack.processes import start_redis
    from tests.reliability.harness import feed, planner_service

    workdir = tmp_path_factory.mktemp("fuzz")
    server = start_redis(workdir)
    svc = planner_service(server.url, workdir / "planner", interval_s=3600.0)
    feed(svc)
    svc.planner.tick()
    channel = grpc.insecure_channel(f"127.0.0.1:{svc.port}")
    yield planner_pb2_grpc.PlannerStub(channel)
    channel.close()
    svc.stop(0)
    server.process.stop()


@pytest.mark.integration
@settings(
    max_examples=250,
    deadline=timedelta(seconds=1),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(call=CALLS)
def test_grpc_validators_answer_only_declared_codes(planner_stub, call):
    method, request = call
    try:
        response = getattr(planner_stub, method)(request, timeout=5)
        if method == "GetPlan":
            list(response)
    except grpc.RpcError as exc:
        assert exc.code() in DECLARED, (method, request, exc.code(), exc.details())
