"""Fast columnar decoding of `EventBatch` messages (pure: numpy + protobuf).

upb parses fast, but every field read through a Python message object costs an
object, and at a few hundred thousand events per second those reads were most
of the stream's profile. Here upb does only the framing: a private *view* of the
same wire format declares `EventBatch.events` as `repeated bytes`, so one C call
per message yields the serialized events. They are joined into one buffer, and
the fields of all events - then of all bodies, which lie inside the same buffer
- are read in lockstep with numpy: one pass per field position, across every
event at once. Strings become `Categorical` columns: each distinct string is
built once, found by a fingerprint of its bytes and checked byte for byte.

The lockstep parser reads exactly the contract's wire format. Anything unusual -
a field number above 15, a body that is not well-formed, a request and a cache
hit in one event, a body given twice, invalid UTF-8 - makes `fast_columns`
return None and the caller falls back to `streams.decoding` (the reference), so
odd input is never decoded differently, only more slowly. Fields the parser does
not know (a newer body type, `router_id`) are skipped, as upb skips them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from cacheroute import keyhash
from streams.categorical import Categorical
from streams.decoding import KIND_CACHE_HIT, KIND_ERROR, KIND_REQUEST, EventColumns


def _view_batch_class() -> Any:
    f = descriptor_pb2.FileDescriptorProto(name="cacheroute_streams_wire_view.proto",
                                           package="cacheroute.streams.view", syntax="proto3")
    batch = f.message_type.add(name="RawBatch")
    t = descriptor_pb2.FieldDescriptorProto
    batch.field.add(name="events", number=1, type=t.TYPE_BYTES, label=t.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("cacheroute.streams.view.RawBatch"))


_RawBatch = _view_batch_class()

# Field numbers (events.proto). Event: producer_id 1, sequence 2, timestamp_ms 3,
# request 10, cache_hit 11, error 12 (whose body shares routing_key 1 and destination 2;
# its status_code 3 is not a token count, and its strings 9 and 10 are skipped).
# Bodies: routing_key 1, destination 2, prompt_tokens 3,
# reusable_prefix_tokens / cached_tokens 4, inflight / output_tokens 5,
# (router_id) / queue_depth 6, ttft_ms 7, e2e_ms 8.
_EVENT = ((2, 3), (1, 10, 11, 12), ())
_BODY = ((3, 4, 5, 6), (1, 2), (7, 8))
_MAX_FIELDS = 64  # more fields in one event or body: leave it to upb
_FINGERPRINT_MAX_BYTES = 256  # longer strings are built per row


class _Malformed(Exception):
    """The lockstep parser met something it leaves to the reference decoder."""


def fast_columns(messages: list[tuple[int, bytes]]) -> EventColumns | None:
    """Columns of all events of the (offset, value) messages, or None to fall back."""
    chunks: list[bytes] = []
    counts: list[int] = []
    for _, raw in messages:
        try:
            events = _RawBatch.FromString(raw).events
        except (DecodeError, ValueError):
            return None
        if not len(events):
            return None  # garbage that parsed as unknown fields, not an empty batch
        chunks.extend(events)
        counts.append(len(events))
    lengths = np.fromiter(map(len, chunks), dtype=np.int64, count=len(chunks))
    ends = np.cumsum(lengths)
    offsets = np.repeat(np.fromiter((o for o, _ in messages), dtype=np.int64,
                                    count=len(messages)), counts)
    try:
        return _columns(b"".join(chunks), ends - lengths, ends, offsets)
    except _Malformed:
        return None


def _columns(joined: bytes, starts: np.ndarray, ends: np.ndarray,
             offsets: np.ndarray) -> EventColumns:
    buf = np.frombuffer(joined, dtype=np.uint8)
    ev = _parse(buf, starts, ends, *_EVENT)
    req, hit, err = ev.seen[10], ev.seen[11], ev.seen[12]
    # protobuf merges a body given twice, and keeps the last of a oneof: rare, upb's job
    if np.any(req > 1) or np.any(hit > 1) or np.any(err > 1) or np.any(
            (req > 0).astype(np.int8) + (hit > 0) + (err > 0) > 1):
        raise _Malformed
    kind = np.select([req > 0, hit > 0, err > 0],
                     [KIND_REQUEST, KIND_CACHE_HIT, KIND_ERROR], 0).astype(np.int8)
    is_hit = kind == KIND_CACHE_HIT
    is_err = kind == KIND_ERROR
    body_start = np.select([is_hit, is_err], [ev.start[11], ev.start[12]], ev.start[10])
    body_end = np.select([is_hit, is_err], [ev.end[11], ev.end[12]], ev.end[10])
    body = _parse(buf, body_start, body_end, *_BODY)
    # uint32 fields keep the low 32 bits of the varint, as protobuf does
    u32 = {f: (body.varint[f] & np.uint64(0xFFFFFFFF)).astype(np.int64) for f in (3, 4, 5, 6)}
    depth = np.where(is_hit, np.where(body.seen[6] > 0, u32[6], -1),
                     np.where(body.seen[5] > 0, u32[5], -1))
    text = joined.decode("latin-1")  # byte i is character i: slices are cut in C
    return EventColumns(
        kind=kind,
        producer=_categorical(buf, text, ev.start[1], ev.end[1]),
        sequence=ev.varint[2],
        timestamp_ms=ev.varint[3].view(np.int64),
        key=_categorical(buf, text, body.start[1], body.end[1]),
        destination=_categorical(buf, text, body.start[2], body.end[2]),
        prompt_tokens=np.where(is_err, 0, u32[3]),
        cached_tokens=np.where(is_hit, u32[4], 0),
        prefix_tokens=np.where(kind == KIND_REQUEST, u32[4], 0),
        depth=depth,
        ttft_ms=np.where(is_hit, body.f32[7], 0.0),
        e2e_ms=np.where(is_hit, body.f32[8], 0.0),
        offset=offsets,
        raw=joined,
        raw_start=starts,
        raw_end=ends,
    )


@dataclass
class _Fields:
    """What `_parse` read, per field number, aligned with the messages."""

    varint: dict[int, np.ndarray] = field(default_factory=dict)  # uint64
    start: dict[int, np.ndarray] = field(default_factory=dict)  # length-delimited spans
    end: dict[int, np.ndarray] = field(default_factory=dict)
    f32: dict[int, np.ndarray] = field(default_factory=dict)  # float64
    seen: dict[int, np.ndarray] = field(default_factory=dict)  # occurrences (int64)


def _parse(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, varints: tuple[int, ...],
           spans: tuple[int, ...], floats: tuple[int, ...]) -> _Fields:
    """Read the named fields of the messages buf[starts[i]:ends[i]] (last one wins,
    as in protobuf); other fields are skipped by their wire type."""
    n = starts.size
    out = _Fields()
    for f in varints:
        out.varint[f] = np.zeros(n, dtype=np.uint64)
    for f in spans:
        out.start[f] = np.zeros(n, dtype=np.int64)
        out.end[f] = np.zeros(n, dtype=np.int64)
    for f in floats:
        out.f32[f] = np.zeros(n, dtype=np.float64)
    for f in (*varints, *spans, *floats):
        out.seen[f] = np.zeros(n, dtype=np.int64)
    pos = starts.copy()
    for _ in range(_MAX_FIELDS):
        idx = np.flatnonzero(pos < ends)
        if not idx.size:
            return out
        pos[idx] = _step(buf, pos[idx], ends[idx], idx, out, varints, spans, floats)
    raise _Malformed


def _step(buf: np.ndarray, p: np.ndarray, end: np.ndarray, idx: np.ndarray, out: _Fields,
          varints: tuple[int, ...], spans: tuple[int, ...],
          floats: tuple[int, ...]) -> np.ndarray:
    """Read one field of each message in `idx` (now at `p`); returns the new positions."""
    tag = buf[p].astype(np.int64)
    if np.any(tag & 0x80) or np.any(tag < 8):
        raise _Malformed  # field numbers above 15 (or 0)
    number, wire = tag >> 3, tag & 7
    p = p + 1
    new = np.empty_like(p)
    v = wire == 0
    if v.any():
        val, ln = _varint(buf, p[v])
        new[v] = p[v] + ln
        _store(out.varint, out.seen, varints, number[v], idx[v], val)
    s = wire == 2
    if s.any():
        ln, lnlen = _varint(buf, p[s])
        if np.any(ln > np.uint64(1 << 40)):
            raise _Malformed
        data = p[s] + lnlen
        new[s] = data + ln.astype(np.int64)
        _store(out.start, out.seen, spans, number[s], idx[s], data)
        _store(out.end, {}, spans, number[s], idx[s], new[s])
    f32 = wire == 5
    if f32.any():
        new[f32] = p[f32] + 4
        if np.any(new[f32] > end[f32]):
            raise _Malformed
        _store(out.f32, out.seen, floats, number[f32], idx[f32], _floats(buf, p[f32]))
    f64 = wire == 1
    new[f64] = p[f64] + 8
    if np.any(~(v | s | f32 | f64)):
        raise _Malformed  # groups / invalid wire types
    if np.any(new > end):
        raise _Malformed
    return new


def _store(columns: dict[int, np.ndarray], seen: dict[int, np.ndarray], wanted: tuple[int, ...],
           number: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    for f in wanted:
        sel = number == f
        if sel.any():
            columns[f][rows[sel]] = values[sel]
            if f in seen:
                seen[f][rows[sel]] += 1  # each row reads one field per step: no repeats


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


def _categorical(buf: np.ndarray, text: str, start: np.ndarray, end: np.ndarray) -> Categorical:
    """The strings buf[start:end] as a Categorical column, each distinct one built once.

    Rows are grouped by a 64-bit fingerprint of their (zero-padded) bytes and
    length; every row is then compared with its group's first row, so a
    fingerprint collision only costs the slow path, never a wrong string.
    """
    n = start.size
    lengths = end - start
    width = int(lengths.max()) if n else 0
    if width == 0:
        return Categorical([""], np.zeros(n, dtype=np.int64))
    if width > _FINGERPRINT_MAX_BYTES:
        return Categorical.of(_strings(text, start, end))
    words_per_row = -(-width // 8)
    column = np.arange(words_per_row * 8)
    padded = buf[np.minimum(start[:, None] + column, buf.size - 1)]
    padded[column >= lengths[:, None]] = 0
    words = padded.view("<u8")
    _, first, inverse = np.unique(keyhash.fingerprints(words, lengths), return_index=True,
                                  return_inverse=True)
    inverse = inverse.ravel()
    representative = first[inverse]
    if not (np.array_equal(lengths, lengths[representative])
            and np.array_equal(words, words[representative])):
        return Categorical.of(_strings(text, start, end))  # a fingerprint collision
    order = np.argsort(first, kind="stable")  # names in order of first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    names = _strings(text, start[first[order]], end[first[order]])
    return Categorical(names, rank[inverse])


def _strings(text: str, start: np.ndarray, end: np.ndarray) -> list[str]:
    """Slices of the Latin-1 view of the buffer as UTF-8 strings: only the (rare)
    non-ASCII slices are decoded again."""
    out = list(map(text.__getitem__, map(slice, start.tolist(), end.tolist())))
    if not all(map(str.isascii, out)):
        try:
            for i, s in enumerate(out):
                if not s.isascii():
                    out[i] = s.encode("latin-1").decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Malformed from exc
    return out
