"""Drop events already counted, by (producer_id, sequence), in bounded memory (pure).

Contract with producers (the emitter keeps it): within one source partition the
sequences of one producer strictly increase. Partitions are processed apart, so
one high-water mark per producer per partition identifies every repeat - a
producer's retried batch, or a message the broker delivered twice - without
remembering individual sequences. At most `max_producers` producers are
remembered per partition; the one seen least recently is forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from streams.categorical import Categorical


class Deduplicator:
    """High-water marks of (producer -> last accepted sequence) for one partition."""

    def __init__(self, max_producers: int = 100_000) -> None:
        self.max_producers = max_producers
        self._high: OrderedDict[str, int] = OrderedDict()
        self.duplicates = 0
        self.forgotten = 0

    def keep(self, producers: Categorical, sequences: np.ndarray) -> np.ndarray:
        """Boolean mask of the events that are new; records them as seen."""
        n = len(producers)
        codes = producers.codes
        if n and bool(np.all(codes == codes[0])):
            mask = self._keep_one(producers[0], sequences)
        else:
            mask = self._keep_mixed(producers.tolist(), sequences.tolist())
        self.duplicates += int(n - np.count_nonzero(mask))
        self._bound()
        return mask

    def _keep_one(self, producer: str, sequences: np.ndarray) -> np.ndarray:
        high = self._high.get(producer, 0)
        # Fast path: the usual batch from one producer, in order, all new.
        if sequences.size and int(sequences[0]) > high and (
            sequences.size == 1 or bool(np.all(sequences[1:] > sequences[:-1]))
        ):
            self._set(producer, int(sequences[-1]))
            return np.ones(sequences.size, dtype=bool)
        return self._keep_mixed([producer] * sequences.size, sequences.tolist())

    def _keep_mixed(self, producers: list[str], sequences: list[int]) -> np.ndarray:
        mask = np.zeros(len(producers), dtype=bool)
        high = self._high
        for i, (p, s) in enumerate(zip(producers, sequences, strict=True)):
            if s > high.get(p, 0):
                mask[i] = True
                self._set(p, s)
        return mask

    def _set(self, producer: str, sequence: int) -> None:
        self._high[producer] = sequence
        self._high.move_to_end(producer)

    def _bound(self) -> None:
        while len(self._high) > self.max_producers:
            self._high.popitem(last=False)
            self.forgotten += 1

    def __len__(self) -> int:
        return len(self._high)
