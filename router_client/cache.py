"""The last good plan on disk, so a router that starts while Redis is down serves at once.

The file holds the signed blobs exactly as they came from the source: the last
full plan and the deltas applied on top of it. They are verified again when
loaded, so a tampered or truncated file is refused like a bad plan.
Writes go to a temporary file that is renamed over the old one (atomic).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path

MAGIC = b"CRPLAN1\n"
# After this many deltas the client fetches the full plan again to restart the chain.
MAX_CHAIN = 32


def save_chain(path: str | Path, blobs: Sequence[bytes]) -> None:
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(MAGIC)
        for blob in blobs:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)


def load_chain(path: str | Path) -> list[bytes]:
    """The saved blobs, or [] if the file is missing or not ours."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return []
    if not data.startswith(MAGIC):
        return []
    out, pos = [], len(MAGIC)
    while pos + 8 <= len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8
        if pos + n > len(data):
            return []  # truncated: refuse all of it
        out.append(data[pos : pos + n])
        pos += n
    return out


def chain_mtime_ms(path: str | Path) -> int:
    try:
        return int(Path(path).stat().st_mtime * 1000)
    except OSError:
        return 0
