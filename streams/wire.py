"""Fast columnar decoding of `EventBatch` messages (pure: numpy + protobuf).

The upb parser is fast, but reading a nested body costs a Python wrapper object
per event, which dominated the stream's profile. Here upb parses only the event
level, through a private *view* of the same wire format whose bodies are opaque
bytes (`_RawEvent`: fields 10 and 11 as bytes); the bodies of a whole chunk are
then joined and parsed in lockstep with numpy (one pass per field position,
across all events at once).

The view decodes exactly the contract's wire format. Anything unusual - a body
that is not well-formed, field numbers above 15 in a body, a request and a
cache hit in one event, invalid UTF-8 - makes `fast_columns` return None and the
caller falls back to `streams.decoding` (the reference), so odd input is never
decoded differently, only more slowly.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from cacheroute.v1 import events_pb2
from streams.decoding import KIND_CACHE_HIT, KIND_REQUEST, EventColumns


def _view_classes() -> tuple[Any, Any]:
    f = descriptor_pb2.FileDescriptorProto(name="cacheroute_streams_wire_view.proto",
                                           package="cacheroute.streams.view", syntax="proto3")
    ev = f.message_type.add(name="RawEvent")
    t = descriptor_pb2.FieldDescriptorProto
    for name, number, kind in (("producer_id", 1, t.TYPE_STRING), ("sequence", 2, t.TYPE_UINT64),
                               ("timestamp_ms", 3, t.TYPE_INT64)):
        ev.field.add(name=name, number=number, type=kind, label=t.LABEL_OPTIONAL)
    # bodies keep presence (proto3 `optional`), so an empty body is still a body
    for i, (name, number) in enumerate((("request", 10), ("cache_hit", 11))):
        ev.oneof_decl.add(name=f"_{name}")
        ev.field.add(name=name, number=number, type=t.TYPE_BYTES, label=t.LABEL_OPTIONAL,
                     oneof_index=i, proto3_optional=True)
    batch = f.message_type.add(name="RawBatch")
    batch.field.add(name="events", number=1, type=t.TYPE_MESSAGE, label=t.LABEL_REPEATED,
                    type_name=".cacheroute.streams.view.RawEvent")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    raw_event = message_factory.GetMessageClass(pool.FindMessageTypeByName(
        "cacheroute.streams.view.RawEvent"))
    raw_batch = message_factory.GetMessageClass(pool.FindMessageTypeByName(
        "cacheroute.streams.view.RawBatch"))
    return raw_batch, raw_event


_RawBatch, _RawEvent = _view_classes()
_get = {n: attrgetter(n) for n in ("producer_id", "sequence", "timestamp_ms", "request",
                                   "cache_hit")}


class _Malformed(Exception):
    """The lockstep parser met something it leaves to the reference decoder."""


def fast_columns(messages: list[tuple[int, bytes]]) -> EventColumns | None:
    """Columns of all events of the (offset, value) messages, or None to fall back."""
    events: list = []
    offsets: list[int] = []
    for offset, raw in messages:
        try:
            evs = _RawBatch.FromString(raw).events
        except (DecodeError, ValueError):
            return None
        if not len(evs):
            return None
        events.extend(evs)
        offsets.extend([offset] * len(evs))
    try:
        return _columns(events, offsets)
    except _Malformed:
        return None


def _columns(events: list, offsets: list[int]) -> EventColumns:
    n = len(events)
    req = list(map(_get["request"], events))
    hit = list(map(_get["cache_hit"], events))
    req_len = np.fromiter(map(len, req), dtype=np.int64, count=n)
    hit_len = np.fromiter(map(len, hit), dtype=np.int64, count=n)
    if np.any((req_len > 0) & (hit_len > 0)):
        raise _Malformed
    kind = np.where(req_len > 0, KIND_REQUEST, np.where(hit_len > 0, KIND_CACHE_HIT, 0))
    for i in np.flatnonzero(kind == 0).tolist():  # rare: an empty body is still a body
        if events[i].HasField("request") and events[i].HasField("cache_hit"):
            raise _Malformed
        kind[i] = (KIND_REQUEST if events[i].HasField("request")
                   else KIND_CACHE_HIT if events[i].HasField("cache_hit") else 0)
    joined = b"".join(map(bytes.__add__, req, hit))
    ends = np.cumsum(req_len + hit_len)
    body = _parse_bodies(joined, ends - req_len - hit_len, ends, kind == KIND_CACHE_HIT)
    return EventColumns(
        kind=kind.astype(np.int8),
        producer=list(map(_get["producer_id"], events)),
        sequence=np.fromiter(map(_get["sequence"], events), dtype=np.uint64, count=n),
        timestamp_ms=np.fromiter(map(_get["timestamp_ms"], events), dtype=np.int64, count=n),
        key=body["key"],
        destination=body["destination"],
        prompt_tokens=body[3],
        cached_tokens=np.where(kind == KIND_CACHE_HIT, body[4], 0),
        prefix_tokens=np.where(kind == KIND_REQUEST, body[4], 0),
        depth=body["depth"],
        ttft_ms=np.where(kind == KIND_CACHE_HIT, body[7], 0.0),
        e2e_ms=np.where(kind == KIND_CACHE_HIT, body[8], 0.0),
        offset=np.array(offsets, dtype=np.int64),
        events=events,  # view messages serialize to the same Event bytes
    )


def _varint(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values and byte lengths of the varints starting at `pos` (vectorized)."""
    value = np.zeros(pos.size, dtype=np.uint64)
    length = np.zeros(pos.size, dtype=np.int64)
    done = np.zeros(pos.size, dtype=bool)
    last = buf.size - 1
    for k in range(10):
        b = buf[np.minimum(pos + k, last)].astype(np.uint64)
        value |= np.where(done, np.uint64(0), (b & np.uint64(0x7F)) << np.uint64(7 * k))
        now = ~done & (b < 0x80)
        length[now] = k + 1
        done |= now
        if done.all():
            return value, length
    raise _Malformed


def _floats(buf: np.ndarray, pos: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(buf[pos[:, None] + np.arange(4)]).view("<f4").ravel().astype(
        np.float64)


def _parse_bodies(joined: bytes, starts: np.ndarray, ends: np.ndarray,
                  is_hit: np.ndarray) -> dict:
    """Body fields of every event: 1 key, 2 destination (strings), 3 prompt, 4 prefix or
    cached, 5 inflight (request), 6 queue depth (cache hit, varint), 7 ttft, 8 e2e."""
    n = starts.size
    buf = np.frombuffer(joined, dtype=np.uint8)
    cols: dict = {f: np.zeros(n, dtype=np.int64) for f in (3, 4, 5, 6)}
    cols[7] = np.zeros(n)
    cols[8] = np.zeros(n)
    has = {5: np.zeros(n, dtype=bool), 6: np.zeros(n, dtype=bool)}
    spans = {f: (np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)) for f in (1, 2)}
    pos = starts.copy()
    for _ in range(64):
        idx = np.flatnonzero(pos < ends)
        if not idx.size:
            break
        _step(buf, pos, ends, idx, cols, has, spans)
    else:
        raise _Malformed
    if np.any(pos != ends):
        raise _Malformed
    depth = np.where(is_hit, np.where(has[6], cols[6], -1), np.where(has[5], cols[5], -1))
    cols["depth"] = depth
    text = joined.decode("latin-1")  # bytes 1:1 to characters: slices are cut in C
    cols["key"], cols["destination"] = _strings(text, spans[1]), _strings(text, spans[2])
    return cols


def _step(buf: np.ndarray, pos: np.ndarray, ends: np.ndarray, idx: np.ndarray, cols: dict,
          has: dict, spans: dict) -> None:
    """Read one field of every body in `idx` and advance its position."""
    p = pos[idx]
    tag = buf[p].astype(np.int64)
    if np.any(tag & 0x80) or np.any(tag < 8):
        raise _Malformed  # field numbers above 15 (or 0): leave it to upb
    field, wire = tag >> 3, tag & 7
    p = p + 1
    new = np.empty_like(p)
    v = wire == 0
    if v.any():
        val, ln = _varint(buf, p[v])
        new[v] = p[v] + ln
        for f in (3, 4, 5, 6):
            sel = field[v] == f
            # uint32 fields keep the low 32 bits, as protobuf does
            cols[f][idx[v][sel]] = (val[sel] & np.uint64(0xFFFFFFFF)).astype(np.int64)
            if f in has:
                has[f][idx[v][sel]] = True
    s = wire == 2
    if s.any():
        ln, lnlen = _varint(buf, p[s])
        data = p[s] + lnlen
        new[s] = data + ln.astype(np.int64)
        for f in (1, 2):
            sel = field[s] == f
            spans[f][0][idx[s][sel]] = data[sel]
            spans[f][1][idx[s][sel]] = data[sel] + ln[sel].astype(np.int64)
    f32 = wire == 5
    if f32.any():
        new[f32] = p[f32] + 4
        ok = new[f32] <= ends[idx[f32]]
        if not ok.all():
            raise _Malformed
        vals = _floats(buf, p[f32])
        for f in (7, 8):
            sel = field[f32] == f
            cols[f][idx[f32][sel]] = vals[sel]
    f64 = wire == 1
    new[f64] = p[f64] + 8
    if np.any(~(v | s | f32 | f64)):
        raise _Malformed  # groups / invalid wire types
    if np.any(new > ends[idx]):
        raise _Malformed
    pos[idx] = new


def _strings(text: str, span: tuple[np.ndarray, np.ndarray]) -> list[str]:
    """Slices of the Latin-1 view of the bodies as UTF-8 strings: only the (rare)
    non-ASCII slices are decoded again."""
    out = list(map(text.__getitem__, map(slice, span[0].tolist(), span[1].tolist())))
    if not all(map(str.isascii, out)):
        try:
            for i in np.flatnonzero(~np.fromiter(map(str.isascii, out), dtype=bool,
                                                 count=len(out))).tolist():
                out[i] = out[i].encode("latin-1").decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Malformed from exc
    return out


def reference_event(view_event: object) -> events_pb2.Event:
    """The contract's Event for a view event (tests and dead letters)."""
    return events_pb2.Event.FromString(view_event.SerializeToString())  # type: ignore[attr-defined]
