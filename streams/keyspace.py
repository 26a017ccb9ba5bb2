"""Bounded name -> slot maps for routing keys and destinations (pure).

Per-key statistics live in numpy arrays indexed by slot. Once `capacity` slots
are taken, new names get slot -1 (the overflow bucket) until the window code
releases slots of keys that went quiet: a producer inventing millions of keys
cannot exhaust memory, and keys that already hold a slot keep it.
"""

from __future__ import annotations

from itertools import repeat

import numpy as np


class SlotMap:
    """Assigns dense slots 0..capacity-1 to names; releases them on request."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._slot: dict[str, int] = {}
        self._names: list[str | None] = []
        self._free: list[int] = []
        self._live = np.zeros(1024, dtype=bool)

    def lookup(self, names: list[str]) -> np.ndarray:
        """Slot per name (int64), assigning new slots while capacity lasts; -1 = overflow."""
        slots = np.fromiter(map(self._slot.get, names, repeat(-1, len(names))), dtype=np.int64,
                            count=len(names))
        for i in np.flatnonzero(slots == -1).tolist():
            slots[i] = self._assign(names[i])
        return slots

    def _assign(self, name: str) -> int:
        slot = self._slot.get(name)
        if slot is not None:
            return slot
        if self._free:
            slot = self._free.pop()
            self._names[slot] = name
        elif len(self._names) < self.capacity:
            slot = len(self._names)
            self._names.append(name)
        else:
            return -1
        self._slot[name] = slot
        if slot >= self._live.size:
            self._live = np.concatenate([self._live, np.zeros(self._live.size, dtype=bool)])
        self._live[slot] = True
        return slot

    def release(self, slots: np.ndarray) -> None:
        """Give slots back; their names get new slots if they come back."""
        for s in slots.tolist():
            name = self._names[s]
            if name is not None:
                del self._slot[name]
                self._names[s] = None
                self._free.append(s)
                self._live[s] = False

    def names(self, slots: np.ndarray) -> list[str]:
        """Names of live slots."""
        names = self._names
        return [names[s] or "" for s in slots.tolist()]

    @property
    def high_water(self) -> int:
        """One past the highest slot ever handed out (array sizes must cover it)."""
        return len(self._names)

    def live(self) -> np.ndarray:
        """Boolean mask over 0..high_water-1 of slots currently held by a name."""
        return self._live[: len(self._names)].copy()

    def __len__(self) -> int:
        return len(self._slot)
