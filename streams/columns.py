"""Key columns on the wire: routing keys as one NUL-terminated UTF-8 blob
(`cacheroute.keyblob`, the codec plans use too).

Columnar keys decode 128k entries in milliseconds, where a repeated string
field would allocate one protobuf object per key.
"""

from __future__ import annotations

from cacheroute import keyblob
from cacheroute.keyblob import encode_keys
from streams.errors import SnapshotError

__all__ = ["decode_keys", "encode_keys"]


def decode_keys(blob: bytes) -> list[str]:
    """A snapshot's keys; SnapshotError if the blob is malformed (not NUL-terminated UTF-8)."""
    try:
        return keyblob.decode_keys(blob)
    except ValueError as exc:
        raise SnapshotError(str(exc)) from exc
