"""Event validation: each kind of bad event gets its named reason (streams.validation)."""

from __future__ import annotations

import numpy as np
import pytest

from cacheroute.v1 import events_pb2
from streams.config import StreamConfig
from streams.decoding import columns_of, decode_batch
from streams.validation import CODE, REASONS, validate

NOW = 1_800_000_000_000
CFG = StreamConfig(max_key_bytes=64, max_tokens=1_000_000, max_future_ms=60_000,
                   max_past_ms=3_600_000)


def event(**kw) -> events_pb2.Event:
    base = dict(producer_id="p", sequence=1, timestamp_ms=NOW)
    base.update(kw)
    return events_pb2.Event(**base)


def request(**kw) -> events_pb2.RequestEvent:
    base = dict(routing_key="k", destination="d", prompt_tokens=10)
    base.update(kw)
    return events_pb2.RequestEvent(**base)


def hit(**kw) -> events_pb2.CacheHitEvent:
    base = dict(routing_key="k", destination="d", prompt_tokens=10, cached_tokens=5)
    base.update(kw)
    return events_pb2.CacheHitEvent(**base)


CASES = [
    ("ok", event(request=request())),
    ("ok", event(cache_hit=hit(e2e_ms=12.5, queue_depth=0))),
    ("ok", event(request=request(prompt_tokens=0))),  # unknown prompt size is fine
    ("unknown_type", event()),
    ("missing_field", event(producer_id="", request=request())),
    ("missing_field", event(sequence=0, request=request())),
    ("missing_field", event(timestamp_ms=0, request=request())),
    ("missing_field", event(request=request(routing_key=""))),
    ("missing_field", event(request=request(destination=""))),
    ("missing_field", event(cache_hit=hit(prompt_tokens=0, cached_tokens=0))),
    ("invalid_key", event(request=request(routing_key="x" * 65))),
    ("invalid_key", event(request=request(routing_key="é" * 33))),  # 66 bytes, 33 chars
    ("invalid_key", event(request=request(routing_key="a\0b"))),
    ("invalid_key", event(request=request(destination="d" * 100))),
    ("absurd_tokens", event(request=request(prompt_tokens=2**32 - 5))),  # -5 wrapped
    ("absurd_tokens", event(request=request(reusable_prefix_tokens=5_000_000))),
    ("absurd_tokens", event(cache_hit=hit(prompt_tokens=2_000_000, cached_tokens=1))),
    ("cached_exceeds_prompt", event(cache_hit=hit(prompt_tokens=10, cached_tokens=11))),
    ("invalid_latency", event(cache_hit=hit(e2e_ms=-1.0))),
    ("invalid_latency", event(cache_hit=hit(ttft_ms=float("nan")))),
    ("timestamp_future", event(timestamp_ms=NOW + 60_001, request=request())),
    ("timestamp_past", event(timestamp_ms=NOW - 3_600_001, request=request())),
]


@pytest.mark.parametrize(("reason", "ev"), CASES, ids=[f"{i}-{c[0]}" for i, c in enumerate(CASES)])
def test_each_bad_event_gets_its_reason(reason, ev):
    cols = columns_of([ev], [0])
    assert REASONS[int(validate(cols, NOW, CFG)[0])] == reason


def test_reasons_in_one_batch_do_not_leak_into_neighbours():
    events = [ev for _, ev in CASES]
    batch = events_pb2.EventBatch(events=events).SerializeToString()
    decoded = decode_batch(batch)
    assert decoded is not None
    got = validate(columns_of(decoded, [7] * len(decoded)), NOW, CFG)
    assert [REASONS[c] for c in got.tolist()] == [r for r, _ in CASES]


def test_precedence_reports_the_most_basic_problem_first():
    ev = event(producer_id="", cache_hit=hit(prompt_tokens=10, cached_tokens=20, e2e_ms=-1.0))
    assert int(validate(columns_of([ev], [0]), NOW, CFG)[0]) == CODE["missing_field"]


def test_garbage_bytes_are_undecodable_not_an_empty_batch():
    assert decode_batch(b"\xff\xff\xff\xff not protobuf") is None
    assert decode_batch(b"\x08\x01") is None  # parses as an unknown field only
    assert decode_batch(b"") == []


def test_empty_columns_validate_to_nothing():
    assert validate(columns_of([], []), NOW, CFG).size == 0
    assert np.all(validate(columns_of([event(request=request())], [0]), NOW, CFG) == 0)
