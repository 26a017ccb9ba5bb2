"""A string column stored as its distinct values plus one code per row (pure).

A batch of 16k events names a few producers, tens of destinations and some
thousands of routing keys. Holding those columns as `names` + `codes` lets the
pipeline validate, look up and count each distinct string once instead of once
per event; only the (rare) per-event text needs `column[i]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Categorical:
    """Row i holds `names[codes[i]]`. `names` may hold values no row uses (after
    `take`); codes are int64."""

    names: list[str]
    codes: np.ndarray

    @classmethod
    def of(cls, values: Sequence[str]) -> Categorical:
        """From per-row values; names in order of first appearance."""
        position: dict[str, int] = {}
        # setdefault's default is evaluated before the insert: a new name gets
        # the next position, a known one keeps its own.
        codes = np.fromiter((position.setdefault(v, len(position)) for v in values),
                            dtype=np.int64, count=len(values))
        return cls(list(position), codes)

    def __len__(self) -> int:
        return int(self.codes.size)

    def __getitem__(self, row: int) -> str:
        return self.names[int(self.codes[row])]

    def tolist(self) -> list[str]:
        names = self.names
        return [names[c] for c in self.codes.tolist()]

    def take(self, rows: np.ndarray) -> Categorical:
        return Categorical(self.names, self.codes[rows])

    def per_row(self, per_name: np.ndarray) -> np.ndarray:
        """Spread a value computed once per name to every row."""
        return per_name[self.codes]

    def name_lengths(self) -> np.ndarray:
        """Length in characters of each name (int64)."""
        return np.fromiter(map(len, self.names), dtype=np.int64, count=len(self.names))

    def used(self) -> tuple[list[str], np.ndarray]:
        """(the names some row uses, in order of first use; each row's position in
        that list). What a lookup keyed by name needs: one probe per distinct name."""
        if not self.codes.size:
            return [], np.zeros(0, dtype=np.int64)
        present, first, inverse = np.unique(self.codes, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        names = self.names
        return [names[c] for c in present[order].tolist()], rank[inverse.ravel()]
