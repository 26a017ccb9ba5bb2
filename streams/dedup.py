"""Drop events already counted, by (producer_id, sequence), in bounded memory (pure).

Contract with producers (the emitter keeps it): within one source partition the
sequences of one producer strictly increase. Partitions are processed apart, so
one high-water mark per producer per partition identifies every repeat - a
producer's retried batch, or a message the broker delivered twice - without
remembering individual sequences. At most `max_producers` producers are
remembered per partition; the one seen least recently is forgotten first.

A sequence more than `max_jump` above a producer's high-water mark is not trusted: a
real producer's sequences grow by one per event (gaps only where it dropped events), so
such a jump is a forged or corrupt event that would otherwise make every later event of
that producer look like a repeat. It is refused (`jumps` mask) and the mark stays.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from streams.categorical import Categorical


class Deduplicator:
    """High-water marks of (producer -> last accepted sequence) for one partition."""

    def __init__(self, max_producers: int = 100_000, max_jump: int = 10_000_000) -> None:
        self.max_producers = max_producers
        self.max_jump = max_jump
        self._high: OrderedDict[str, int] = OrderedDict()
        self.duplicates = 0
        self.forgotten = 0
        self.jumps = 0
        self._jumped: list[int] = []

    def keep(self, producers: Categorical, sequences: np.ndarray) -> np.ndarray:
        """Boolean mask of the events that are new; records them as seen. Events refused
        for an implausible jump are in `last_jumps` (positions), not counted as duplicates."""
        n = len(producers)
        codes = producers.codes
        self._jumped = []
        if n and bool(np.all(codes == codes[0])):
            mask = self._keep_one(producers[0], sequences)
        else:
            mask = self._keep_mixed(producers.tolist(), sequences.tolist())
        self.duplicates += int(n - np.count_nonzero(mask)) - len(self._jumped)
        self._bound()
        return mask

    @property
    def last_jumps(self) -> list[int]:
        return self._jumped

    def _keep_one(self, producer: str, sequences: np.ndarray) -> np.ndarray:
        high = self._high.get(producer, 0)
        # Fast path: the usual batch from one producer, in order, all new, no jump.
        if sequences.size and int(sequences[0]) > high and (
            high == 0 or int(sequences[-1]) - high <= self.max_jump + sequences.size
        ) and (sequences.size == 1 or bool(np.all(sequences[1:] > sequences[:-1]))) and (
            sequences.size == 1 or int(np.max(np.diff(sequences))) <= self.max_jump
        ):
            self._set(producer, int(sequences[-1]))
            return np.ones(sequences.size, dtype=bool)
        return self._keep_mixed([producer] * sequences.size, sequences.tolist())

    def _keep_mixed(self, producers: list[str], sequences: list[int]) -> np.ndarray:
        mask = np.zeros(len(producers), dtype=bool)
        high = self._high
        jump = self.max_jump
        for i, (p, s) in enumerate(zip(producers, sequences, strict=True)):
            h = high.get(p, 0)
            if s > h:
                if h and s - h > jump:
                    self._jumped.append(i)
                    self.jumps += 1
                    continue
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
