"""Which partition of the events topic a routing key belongs to (pure).

Every producer must use this function: the stream keeps a key's whole state in
one partition and never repartitions. CRC-32 of the UTF-8 key, modulo the
partition count (stable across processes and languages; zlib's crc32).
"""

from __future__ import annotations

import zlib


def partition_for_key(routing_key: str, partitions: int) -> int:
    """The partition (0..partitions-1) of `routing_key`."""
    return zlib.crc32(routing_key.encode("utf-8")) % partitions
