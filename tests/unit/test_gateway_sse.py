"""The gateway's SSE splitter (router_client.gateway.sse): events come out whole whatever
the chunking, and an event that never ends is refused instead of held for ever."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router_client.gateway import sse

event_text = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b""))
endings = st.sampled_from([b"\n\n", b"\r\n\r\n", b"\n\r\n", b"\r\n\n"])


@given(st.lists(st.tuples(event_text, endings), max_size=12), st.binary(max_size=30),
       st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=40))
def test_events_come_out_whole_in_order_whatever_the_chunking(
        events: list[tuple[bytes, bytes]], tail: bytes, cuts: list[int]) -> None:
    tail = tail.replace(b"\n", b"").replace(b"\r", b"")
    whole = [b"data: " + text + end for text, end in events]
    stream = b"".join(whole) + tail
    splitter, got, at, i = sse.SseSplitter(), [], 0, 0
    while at < len(stream):
        step = cuts[i % len(cuts)]
        got.extend(splitter.feed(stream[at:at + step]))
        at, i = at + step, i + 1
    assert got == whole
    assert splitter.pending == tail


def test_an_event_that_never_ends_is_refused_past_the_cap() -> None:
    splitter = sse.SseSplitter(max_event_bytes=1000)
    assert splitter.feed(b"data: a\n\ndata: ") == [b"data: a\n\n"]
    with pytest.raises(sse.EventTooLarge):
        for _ in range(200):
            splitter.feed(b"b" * 10)
    assert len(splitter.pending) > 1000  # what was held, for a caller that passes it on


def test_a_long_event_under_the_cap_is_kept_in_parts_and_comes_out_whole() -> None:
    splitter = sse.SseSplitter(max_event_bytes=1 << 20)
    for _ in range(1000):
        assert splitter.feed(b"x" * 500) == []
    assert splitter.feed(b"\r\n\r\nda") == [b"x" * 500_000 + b"\r\n\r\n"]
    assert splitter.pending == b"da"
