"""The key list on the wire: `KeyTable.keys` (plan.proto) and `KeyColumns.keys`
(snapshot.proto) hold a column of routing keys as one bytes field, each key UTF-8 and
followed by NUL (`["a", "bc"]` -> `b"a\\0bc\\0"`). One codec for both (the planner reads
what the stream writes, routers what the planner writes); keys never contain NUL, every
producer's validation rejects them. The only hand-written module beside the generated
code: it is part of the wire format, like the .proto files."""

from __future__ import annotations

from collections.abc import Sequence

# The longest routing key anywhere (UTF-8 bytes): the stream dead-letters longer ones, plans
# and RPCs refuse them. One bound, so a key the stream counts can always be planned.
MAX_KEY_BYTES = 512


def encode_keys(keys: Sequence[str]) -> bytes:
    if not keys:
        return b""
    return ("\0".join(keys) + "\0").encode("utf-8")


def decode_keys(blob: bytes) -> list[str]:
    """The keys of `blob`; ValueError if it is not NUL-terminated UTF-8."""
    if not blob:
        return []
    if not blob.endswith(b"\0"):
        raise ValueError("key blob is not NUL-terminated")
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"key blob is not UTF-8: {exc}") from exc
    return text.split("\0")[:-1]
