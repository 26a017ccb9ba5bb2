"""The fast decoder (streams.wire) agrees with the reference (streams.decoding)
on every batch it accepts, and declines what it cannot decode exactly."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheroute.v1 import events_pb2
from streams.decoding import columns_of, decode_batch
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
    assert (a.producer, a.key, a.destination) == (b.producer, b.key, b.destination)
    assert [e.SerializeToString() for e in a.events] == [e.SerializeToString() for e in b.events]


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
    future = b"\x0a\x01p\x10\x01\x18\x01" + b"\x62\x01x"  # field 12: a newer body type
    empty = events_pb2.Event(producer_id="p", sequence=2, timestamp_ms=1,
                             request=events_pb2.RequestEvent()).SerializeToString()
    raw = b"\x0a" + bytes([len(future)]) + future + b"\x0a" + bytes([len(empty)]) + empty
    fast = fast_columns([(3, raw)])
    assert fast is not None
    assert_same(fast, reference([(3, raw)]))
    assert fast.kind.tolist() == [0, 1]
