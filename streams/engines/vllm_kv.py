"""vLLM's KV-cache events, decoded (pure; msgspec reads the msgpack).

A vLLM engine started with `--kv-events-config '{"enable_kv_cache_events": true,
"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'`
publishes, per scheduler step, a `KVEventBatch` as a ZMQ multipart message
`[topic, sequence (8 bytes, big-endian), payload]`; the payload is msgspec's msgpack of

    EventBatch(ts: float, events: list, data_parallel_rank: int | None = None)
    BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
                lora_name, extra_keys=None, group_idx=None, ...)
    BlockRemoved(block_hashes, medium, group_idx=None)
    AllBlocksCleared()

(`vllm/distributed/kv_events.py`). Two layouts have shipped: vLLM 0.9 - 0.10 encoded the
batch *and* the events as arrays (`["BlockStored", hashes, parent, ...]`, msgspec's
`array_like=True, tag=True`); later releases (0.28 as read for this module) keep the batch
an array and encode events as maps tagged by `"type"`, and some builds encode the batch as a
map too. This module accepts all of them. Block hashes are ints (older releases) or bytes
(sha256-based hashing); both become bytes here, so one resident set holds either.

Anything else (not msgpack, wrong shapes, unknown tags) is `KvDecodeError` with the
reason: the bridge counts it and skips the message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

MAX_PAYLOAD_BYTES = 16 << 20  # one scheduler step's events; anything larger is refused
MAX_BLOCKS_PER_EVENT = 1 << 20

_decoder = msgspec.msgpack.Decoder()


class KvDecodeError(ValueError):
    """A payload that is not a KV event batch; the message says why."""


@dataclass(frozen=True, slots=True)
class Stored:
    hashes: tuple[bytes, ...]
    parent: bytes | None
    block_size: int
    lora: str | None = None
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class Removed:
    hashes: tuple[bytes, ...]
    medium: str | None = None


@dataclass(slots=True)
class KvBatch:
    ts: float
    rank: int | None
    stored: list[Stored] = field(default_factory=list)
    removed: list[Removed] = field(default_factory=list)
    cleared: bool = False  # an AllBlocksCleared came (before the events after it)


def block_key(h: Any) -> bytes:
    """A block hash as bytes: int hashes as 8-byte (or longer) two's complement."""
    if isinstance(h, bytes):
        return h
    if isinstance(h, int) and not isinstance(h, bool):
        length = max(8, (h.bit_length() + 8) // 8)
        return h.to_bytes(length, "big", signed=True)
    raise KvDecodeError(f"a block hash is {type(h).__name__}, not int or bytes")


def decode_batch(payload: bytes) -> KvBatch:
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise KvDecodeError(f"payload of {len(payload)} bytes is over {MAX_PAYLOAD_BYTES}")
    try:
        raw = _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise KvDecodeError(f"not msgpack: {exc}") from None
    if isinstance(raw, list):
        if len(raw) < 2:
            raise KvDecodeError("a batch array needs [ts, events, ...]")
        ts, events, rank = raw[0], raw[1], raw[2] if len(raw) > 2 else None
    elif isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    else:
        raise KvDecodeError(f"a batch is an array or a map, not {type(raw).__name__}")
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise KvDecodeError("the batch has no timestamp")
    if not isinstance(events, list):
        raise KvDecodeError("the batch has no event list")
    if rank is not None and not isinstance(rank, int):
        raise KvDecodeError("data_parallel_rank is not an int")
    batch = KvBatch(float(ts), rank)
    for event in events:
        _add(batch, event)
    return batch


def _add(batch: KvBatch, event: Any) -> None:
    if isinstance(event, list) and event and isinstance(event[0], str):
        tag, fields = event[0], _positional(event[0], event[1:])
    elif isinstance(event, dict) and isinstance(event.get("type"), str):
        tag, fields = event["type"], event
    else:
        raise KvDecodeError("an event is neither a tagged array nor a tagged map")
    if tag == "BlockStored":
        hashes = _hashes(fields.get("block_hashes"))
        parent = fields.get("parent_block_hash")
        size = fields.get("block_size")
        if not isinstance(size, int) or size <= 0:
            raise KvDecodeError("BlockStored without a positive block_size")
        lora = fields.get("lora_name")
        if lora is None and fields.get("lora_id") is not None:
            lora = str(fields["lora_id"])
        batch.stored.append(Stored(hashes, None if parent is None else block_key(parent),
                                   size, lora if isinstance(lora, str) else None,
                                   _medium(fields)))
    elif tag == "BlockRemoved":
        batch.removed.append(Removed(_hashes(fields.get("block_hashes")), _medium(fields)))
    elif tag == "AllBlocksCleared":
        # Everything before in this batch is void; keep what comes after.
        batch.stored.clear()
        batch.removed.clear()
        batch.cleared = True
    else:
        raise KvDecodeError(f"unknown event type {tag[:40]!r}")


_POSITIONS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name", "extra_keys", "group_idx"),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}


def _positional(tag: str, values: list[Any]) -> dict[str, Any]:
    names = _POSITIONS.get(tag)
    if names is None:
        raise KvDecodeError(f"unknown event type {tag[:40]!r}")
    return dict(zip(names, values, strict=False))


def _hashes(value: Any) -> tuple[bytes, ...]:
    if not isinstance(value, list):
        raise KvDecodeError("block_hashes is not a list")
    if len(value) > MAX_BLOCKS_PER_EVENT:
        raise KvDecodeError(f"{len(value)} block hashes in one event")
    return tuple(block_key(h) for h in value)


def _medium(fields: dict[str, Any]) -> str | None:
    medium = fields.get("medium")
    return medium if isinstance(medium, str) else None
