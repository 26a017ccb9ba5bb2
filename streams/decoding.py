"""Event columns, and the reference decoder of `EventBatch` messages (pure).

`EventColumns` is what the pipeline counts: one numpy array (or `Categorical`
string column) per field. The fast path that fills it is `streams.wire`; the
decoder here reads protobuf objects through upb, handles everything upb accepts,
and is what the fast path falls back to for unusual input. Garbage bytes yield
`None` (the caller dead-letters the whole message); events of an unknown type get
kind `KIND_UNKNOWN` and are rejected by validation, while the valid events of the
same batch are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter, methodcaller
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from cacheroute.v1 import events_pb2
from streams.categorical import Categorical

KIND_UNKNOWN = 0
KIND_REQUEST = 1
KIND_CACHE_HIT = 2
KIND_ERROR = 3  # counted, never windowed into rates


@dataclass
class EventColumns:
    """Entry i of every column belongs to event i. -1 marks an absent optional.

    The serialized events are kept as one buffer and a span per event, so a
    rejected event is dead-lettered with its exact bytes without holding a
    Python object per event.
    """

    kind: np.ndarray  # int8
    producer: Categorical
    sequence: np.ndarray  # uint64
    timestamp_ms: np.ndarray  # int64
    key: Categorical
    destination: Categorical
    prompt_tokens: np.ndarray  # int64
    cached_tokens: np.ndarray  # int64
    prefix_tokens: np.ndarray  # int64
    depth: np.ndarray  # int64, -1 = not reported
    ttft_ms: np.ndarray  # float64
    e2e_ms: np.ndarray  # float64
    offset: np.ndarray  # int64, source offset of the message carrying the event
    raw: bytes  # the serialized events, back to back
    raw_start: np.ndarray  # int64: event i is raw[raw_start[i]:raw_end[i]]
    raw_end: np.ndarray

    def __len__(self) -> int:
        return int(self.kind.size)

    def event_bytes(self, i: int) -> bytes:
        """Event i as serialized (what a dead letter carries)."""
        return self.raw[int(self.raw_start[i]):int(self.raw_end[i])]


_KIND = {"request": KIND_REQUEST, "cache_hit": KIND_CACHE_HIT, "error": KIND_ERROR,
         None: KIND_UNKNOWN}


def decode_batch(raw: bytes) -> list[events_pb2.Event] | None:
    """The events of one message; None when the bytes are not an EventBatch."""
    try:
        batch = events_pb2.EventBatch.FromString(raw)
    except (DecodeError, ValueError):
        return None
    events = list(batch.events)
    if not events and raw:
        return None  # parsed only as unknown fields: garbage, not an empty batch
    return events


_BODY_FIELD = {"request": "request", "cache_hit": "cache_hit", "error": "error",
               None: "request"}
_which = methodcaller("WhichOneof", "body")
_get = {name: attrgetter(name) for name in (
    "producer_id", "sequence", "timestamp_ms", "routing_key", "destination", "prompt_tokens",
    "reusable_prefix_tokens", "cached_tokens", "ttft_ms", "e2e_ms")}


def _column(name: str, items: list, dtype: type | None = None) -> Any:
    values = list(map(_get[name], items))
    return values if dtype is None else np.array(values, dtype=dtype)


def _optional(items: list, name: str) -> np.ndarray:
    """An optional uint field as int64, -1 where unset (unset reads as 0)."""
    has = np.fromiter(map(methodcaller("HasField", name), items), dtype=bool, count=len(items))
    values = np.fromiter(map(attrgetter(name), items), dtype=np.int64, count=len(items))
    return np.where(has, values, -1)


def columns_of(events: list[events_pb2.Event], offsets: list[int]) -> EventColumns:
    """Pull the fields of `events` (from messages at `offsets`, one per event).

    C-level `map`s with attrgetters: the fastest way through upb messages
    without a Python-level loop or a tuple per event. An event without a known
    body reads as an empty request (validation rejects it as unknown_type).
    """
    n = len(events)
    which = list(map(_which, events))
    kind = np.fromiter(map(_KIND.__getitem__, which), dtype=np.int8, count=n)
    bodies = list(map(getattr, events, map(_BODY_FIELD.__getitem__, which)))
    prefix = np.zeros(n, dtype=np.int64)
    prompt = np.zeros(n, dtype=np.int64)
    cached = np.zeros(n, dtype=np.int64)
    depth = np.full(n, -1, dtype=np.int64)
    ttft = np.zeros(n, dtype=np.float64)
    e2e = np.zeros(n, dtype=np.float64)
    req = np.flatnonzero(kind == KIND_REQUEST)
    if req.size:
        reqs = list(map(bodies.__getitem__, req.tolist()))
        prefix[req] = _column("reusable_prefix_tokens", reqs)
        prompt[req] = _column("prompt_tokens", reqs)
        depth[req] = _optional(reqs, "inflight")
    hit = np.flatnonzero(kind == KIND_CACHE_HIT)
    if hit.size:
        hits = list(map(bodies.__getitem__, hit.tolist()))
        cached[hit] = _column("cached_tokens", hits)
        prompt[hit] = _column("prompt_tokens", hits)
        depth[hit] = _optional(hits, "queue_depth")
        ttft[hit] = _column("ttft_ms", hits)
        e2e[hit] = _column("e2e_ms", hits)
    serialized = [e.SerializeToString() for e in events]
    raw_len = np.fromiter(map(len, serialized), dtype=np.int64, count=n)
    raw_end = np.cumsum(raw_len)
    return EventColumns(
        kind=kind,
        producer=Categorical.of(_column("producer_id", events)),
        sequence=_column("sequence", events, np.uint64),
        timestamp_ms=_column("timestamp_ms", events, np.int64),
        key=Categorical.of(_column("routing_key", bodies)),
        destination=Categorical.of(_column("destination", bodies)),
        prompt_tokens=prompt,
        cached_tokens=cached,
        prefix_tokens=prefix,
        depth=depth,
        ttft_ms=ttft,
        e2e_ms=e2e,
        offset=np.array(offsets, dtype=np.int64),
        raw=b"".join(serialized),
        raw_start=raw_end - raw_len,
        raw_end=raw_end,
    )


def take(cols: EventColumns, idx: np.ndarray) -> EventColumns:
    """The events at positions `idx` (an int array), as new columns."""
    return EventColumns(
        kind=cols.kind[idx], producer=cols.producer.take(idx),
        sequence=cols.sequence[idx], timestamp_ms=cols.timestamp_ms[idx],
        key=cols.key.take(idx), destination=cols.destination.take(idx),
        prompt_tokens=cols.prompt_tokens[idx], cached_tokens=cols.cached_tokens[idx],
        prefix_tokens=cols.prefix_tokens[idx], depth=cols.depth[idx],
        ttft_ms=cols.ttft_ms[idx], e2e_ms=cols.e2e_ms[idx], offset=cols.offset[idx],
        raw=cols.raw, raw_start=cols.raw_start[idx], raw_end=cols.raw_end[idx],
    )
