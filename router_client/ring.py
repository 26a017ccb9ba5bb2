"""The cold tail's consistent-hash ring, shared by every router and the planner (pure).

A router with `cold_tail="hash"` sends a key the plan does not admit to its owner on this
ring (bounded-load consistent hashing, `router_client.routing`); the planner reads the same
ring to know where that traffic lands and to place a key entering the plan where the tail
already sends it (`planner_svc.planning.placement`), so admission moves no traffic and no
cache has to warm. Both sides must therefore agree on every point: the ring is built from
destination *ids* (never from a process's own slot numbering) and keys are hashed with a
digest that is the same in every process (Python's `hash` of a str is salted per process).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
from collections.abc import Iterator, Sequence

import numpy as np

_MASK64 = 0xFFFFFFFFFFFFFFFF
_GOLDEN = 0x9E3779B97F4A7C15
# Points per destination. With 64 the owners' arcs differ by about ±12 % (standard deviation;
# 0.65-1.35x of even at the extremes): the planner models the arcs as they are
# (`Ring.shares`) rather than as even, and a rebuild stays a sort of 64·R ints.
VNODES = 64
# The routers' default bound on a cold-tail destination's load, as a share above the mean
# (`cacheroute gateway --tail-slack`); the planner models the tail with the same bound.
# A key the plan does not admit keeps coming back to its owner, so its prefix is cached
# there: spilling it recomputes the whole prefix on another engine. At light load in-flight
# counts are a few requests, and a bound of 1.25x the mean spilled a key as soon as its owner
# held two: in the arena's simulator a third of the one-replica gateway's first turns then
# met a cold cache (served hit 2.6 pp under the SGLang gateway's; 0.7 pp at 2.0, 1.4 at 1.0).
# At the knee the looser bound costs nothing measurable: replay capacity is unchanged on
# paper-like, shared-system-prompt and whales, and on the wide active set, where a fifth of
# the traffic is tail, hit rises 61.6 -> 68.3 % with p99 4.09 -> 4.05 s (docs/arena.md).
DEFAULT_TAIL_SLACK = 2.0


def mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of an int."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


def stable_hash(text: str) -> int:
    """A 64-bit hash of `text`, identical in every process."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"),
                                          digest_size=8).digest(), "little")


# Routing keys repeat (the hot ones on every request; the planner hashes every admitted key
# at every build), and they are bounded in length (router_client.keys), so their hashes are
# memoised; conversation ids and other client strings are not, so no client fills the memo.
key_hash = functools.lru_cache(maxsize=1 << 16)(stable_hash)


@functools.lru_cache(maxsize=1 << 14)
def _points_of(destination_id: str) -> tuple[int, ...]:
    base = stable_hash("dest:" + destination_id)
    return tuple(mix((base + v * _GOLDEN) & _MASK64) for v in range(VNODES))


class Ring:
    """Owners (any ints the caller chooses: router slots, planner positions) on a ring of
    `VNODES` points per destination id. `ids[i]` is the id of `owners[i]`."""

    __slots__ = ("_arrays", "_owners", "_points", "size")

    def __init__(self, ids: Sequence[str], owners: Sequence[int] | None = None) -> None:
        labels = range(len(ids)) if owners is None else owners
        if len(labels) != len(ids):
            raise ValueError("one owner per destination id")
        pairs = sorted((p, o) for d, o in zip(ids, labels, strict=True) for p in _points_of(d))
        self._points = [p for p, _ in pairs]
        self._owners = [o for _, o in pairs]
        self.size = len(ids)
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None

    def walk(self, h: int) -> Iterator[int]:
        """Distinct owners clockwise from hash `h`: the owner first, then its successors."""
        owners, n = self._owners, len(self._owners)
        i = bisect.bisect_left(self._points, h)
        seen: set[int] = set()
        for k in range(n):
            o = owners[(i + k) % n]
            if o not in seen:
                seen.add(o)
                yield o
                if len(seen) == self.size:
                    return

    def owner(self, h: int) -> int:
        """The first owner clockwise from `h` (where an unloaded tail sends it)."""
        if not self._owners:
            raise ValueError("an empty ring has no owner")
        i = bisect.bisect_left(self._points, h)
        return self._owners[i % len(self._owners)]

    def shares(self) -> np.ndarray:
        """Each owner's share of the hash space (what a random key lands on), by owner label
        position 0..size-1 when the owners are 0..size-1 (the planner's rings)."""
        if not self._owners:
            raise ValueError("an empty ring has no owner")
        points = np.array(self._points, np.float64)
        arcs = np.diff(points, prepend=points[-1] - 2.0**64)  # a point owns up to itself
        out = np.zeros(max(self._owners) + 1)
        np.add.at(out, np.array(self._owners, np.int64), arcs)
        return out / out.sum()

    def owner_of(self, key: str) -> int:
        return self.owner(key_hash(key))

    def owners_of(self, keys: Sequence[str]) -> np.ndarray:
        """`owner_of` for many keys at once (int64): one vectorised search of the ring."""
        if not self._owners:
            raise ValueError("an empty ring has no owner")
        if self._arrays is None:
            self._arrays = (np.array(self._points, np.uint64), np.array(self._owners, np.int64))
        points, owners = self._arrays
        h = np.fromiter((key_hash(k) for k in keys), np.uint64, len(keys))
        return owners[np.searchsorted(points, h, side="left") % len(owners)]
