"""The fast decoder (streams.wire) agrees with the reference (streams.decoding)
on every batch it accepts, and declines what it cannot decode exactly."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.v1 import events_pb2
from streams.decoding import KIND_ERROR, columns_of, decode_batch
from streams.wire import fast_columns

u32 = st.integers(0, 2**32 - 1)
text = st.text(max_size=12)
floats = st.floats(allow_nan=False, width=32)


@st.composite
def events(draw):
    e = events_pb2.Event(producer_id=draw(text), sequence=draw(st.integers(0, 2**64 - 1)),
                         timestamp_ms=draw(st.integers(-(2**63), 2**63 - 1)))
    body = draw(st.sampled_from(["request", "cache_hit", "none"]))
    if body == "request":
        r = e.request
        r.SetInParent()
        r.routing_key, r.destination, r.router_id = draw(text), draw(text), draw(text)
        r.prompt_tokens, r.reusable_prefix_tokens = draw(u32), draw(u32)
        if draw(st.booleans()):
            r.inflight = draw(u32)
    elif body == "cache_hit":
        c = e.cache_hit
        c.SetInParent()
        c.routing_key, c.destination = draw(text), draw(text)
        c.prompt_tokens, c.cached_tokens, c.output_tokens = draw(u32), draw(u32), draw(u32)
        c.ttft_ms, c.e2e_ms = draw(floats), draw(floats)
        if draw(st.booleans()):
            c.queue_depth = draw(u32)
    return e


def reference(messages):
    evs, offs = [], []
    for off, raw in messages:
        batch = decode_batch(raw)
        assert batch is not None
        evs.extend(batch)
        offs.extend([off] * len(batch))
    return columns_of(evs, offs)


def assert_same(a, b):
    for name in ("kind", "sequence", "timestamp_ms", "prompt_tokens", "cached_tokens",
                 "prefix_tokens", "depth", "offset"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    for name in ("ttft_ms", "e2e_ms"):
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True), name
    for name in ("producer", "key", "destination"):
        assert getattr(a, name).tolist() == getattr(b, name).tolist(), name
    assert [a.event_bytes(i) for i in range(len(a))] == [b.event_bytes(i) for i in range(len(b))]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(events(), min_size=1, max_size=12), min_size=1, max_size=4))
def test_fast_decoder_matches_the_reference(batches):
    messages = [(i, events_pb2.EventBatch(events=b).SerializeToString())
                for i, b in enumerate(batches)]
    fast = fast_columns(messages)
    assert fast is not None
    assert_same(fast, reference(messages))


def test_declines_garbage_and_unknown_body_fields_above_15():
    assert fast_columns([(0, b"\xff\xfe garbage")]) is None
    # a body with field 20 (two-byte tag): the reference decoder handles it
    body = b"\x0a\x01k" + b"\xa0\x01\x05"
    event = b"\x0a\x01p\x10\x01\x18\x01" + b"\x52" + bytes([len(body)]) + body
    raw = b"\x0a" + bytes([len(event)]) + event
    assert fast_columns([(0, raw)]) is None
    assert decode_batch(raw) is not None


def test_unknown_body_type_and_empty_body():
    future = b"\x0a\x01p\x10\x01\x18\x01" + b"\x6a\x01x"  # field 13: a newer body type
    empty = events_pb2.Event(producer_id="p", sequence=2, timestamp_ms=1,
                             request=events_pb2.RequestEvent()).SerializeToString()
    raw = b"\x0a" + bytes([len(future)]) + future + b"\x0a" + bytes([len(empty)]) + empty
    fast = fast_columns([(3, raw)])
    assert fast is not None
    assert_same(fast, reference([(3, raw)]))
    assert fast.kind.tolist() == [0, 1]


def test_error_events_decode_like_the_reference_and_carry_no_tokens():
    err = events_pb2.Event(producer_id="p", sequence=3, timestamp_ms=5, error=events_pb2.ErrorEvent(
        routing_key="k", destination="d1", status_code=503, kind="http_5xx", router_id="gw"))
    req = events_pb2.Event(producer_id="p", sequence=4, timestamp_ms=6,
                           request=events_pb2.RequestEvent(routing_key="k", destination="d1",
                                                           prompt_tokens=7))
    raw = _batch(err, req)
    fast = fast_columns([(9, raw)])
    assert fast is not None
    assert_same(fast, reference([(9, raw)]))
    assert fast.kind.tolist() == [KIND_ERROR, 1]
    assert fast.prompt_tokens.tolist() == [0, 7]
    assert fast.destination[0] == "d1" and fast.key[0] == "k"


def _batch(*events):
    return events_pb2.EventBatch(events=list(events)).SerializeToString()


def _request(producer, seq, key, dest):
    e = events_pb2.Event(producer_id=producer, sequence=seq, timestamp_ms=1)
    e.request.routing_key, e.request.destination = key, dest
    return e


def test_long_and_non_ascii_strings_match_the_reference():
    long_key = "k" * 300 + "é"  # beyond the fingerprint width: built per row
    raw = _batch(_request("p", 1, long_key, "d"), _request("p", 2, "ключ", "d"),
                 _request("p", 3, long_key, "dé"))
    fast = fast_columns([(0, raw)])
    assert fast is not None
    assert_same(fast, reference([(0, raw)]))
    assert fast.key.tolist() == [long_key, "ключ", long_key]


def test_fingerprint_collisions_cost_speed_not_correctness(monkeypatch):
    import streams.wire as wire

    # every string gets the same fingerprint: the byte check must notice
    monkeypatch.setattr(wire.keyhash, "fingerprints", lambda words, lengths: np.zeros(
        lengths.size, dtype=np.uint64))
    raw = _batch(*(_request(f"p{i % 2}", i + 1, f"key-{i % 5}", f"d{i % 3}") for i in range(12)))
    fast = fast_columns([(0, raw)])
    assert fast is not None
    assert_same(fast, reference([(0, raw)]))
    assert fast.key.tolist() == [f"key-{i % 5}" for i in range(12)]


def test_distinct_strings_are_built_once_in_order_of_first_appearance():
    raw = _batch(*(_request("p", i + 1, f"key-{(7 - i) % 4}", "d") for i in range(10)))
    fast = fast_columns([(0, raw)])
    assert fast is not None
    assert fast.key.names == ["key-3", "key-2", "key-1", "key-0"]
    assert fast.destination.names == ["d"]
    assert fast.producer.names == ["p"]


def test_invalid_utf8_falls_back_to_the_reference():
    body = b"\x0a\x02\xc3\x28"  # routing_key with an invalid UTF-8 sequence
    event = b"\x0a\x01p\x10\x01\x18\x01" + b"\x52" + bytes([len(body)]) + body
    raw = b"\x0a" + bytes([len(event)]) + event
    assert fast_columns([(0, raw)]) is None


def test_a_body_given_twice_falls_back_to_the_reference():
    body = b"\x0a\x01k\x12\x01d"
    event = b"\x0a\x01p\x10\x01\x18\x01" + (b"\x52" + bytes([len(body)]) + body) * 2
    raw = b"\x0a" + bytes([len(event)]) + event
    assert fast_columns([(0, raw)]) is None
    assert decode_batch(raw) is not None  # protobuf merges the two: the reference's job
