"""A consistent-hash ring (Karger et al.) with virtual nodes and a stable hash.

Hashes are the first 8 bytes of md5 (reproducible across processes, unlike Python's
salted `hash()`), so Sticky, CHWBL and DualMap-like runs are identical for a seed.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Sequence

import numpy as np


def stable_hash(text: str, salt: str = "") -> int:
    """64-bit md5-based hash of `salt + text`."""
    return int.from_bytes(hashlib.md5((salt + text).encode()).digest()[:8], "big")


class HashRing:
    """`vnodes` points per destination on a 64-bit circle; a key maps to its clockwise successor."""

    def __init__(self, n_destinations: int, *, vnodes: int = 160, salt: str = "") -> None:
        points = sorted(
            (stable_hash(f"dest-{r}:{i}", salt), r)
            for r in range(n_destinations)
            for i in range(vnodes)
        )
        self.hashes = [h for h, _ in points]
        self.owners = [r for _, r in points]
        self.salt = salt

    def __len__(self) -> int:
        return len(self.hashes)

    def start_index(self, key: str) -> int:
        """Position on the ring of the key's successor vnode."""
        return bisect_left(self.hashes, stable_hash(key, self.salt)) % len(self.hashes)

    def lookup(self, key: str) -> int:
        return self.owners[self.start_index(key)]

    def start_indices(self, keys: Sequence[str]) -> np.ndarray:
        """Successor positions for many keys (computed once per workload)."""
        return np.fromiter((self.start_index(k) for k in keys), np.int64, count=len(keys))

    def next_distinct(self, position: int, avoid: int) -> int:
        """The first owner clockwise from `position` that is not `avoid`."""
        n = len(self.owners)
        for j in range(n):
            r = self.owners[(position + j) % n]
            if r != avoid:
                return r
        return avoid
