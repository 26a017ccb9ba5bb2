"""Drop events already counted, by (producer_id, sequence), in bounded memory (pure).

Contract with producers (the emitter keeps it): within one source partition a producer
numbers its events consecutively (n, n + 1, n + 2, ...; each partition on its own), so a
run of consecutive sequences is what one producer sends there; gaps appear only where it
lost events.

For each producer the deduplicator remembers a few *runs*: ranges [first, last] of the
sequences it counted. An event inside a run is a repeat (a producer's retried batch, or a
message delivered twice). One at most `max_gap` above the end of a run extends that run;
any other opens a run of its own. A forward jump therefore never moves the mark of the run
the producer is on: an event forged under a real producer's id, however far ahead, can
shadow only the sequences it covers itself (with max_gap g, up to g of them), and the real
producer's next events extend their own run and count. (A producer restarted under the
same id would look like repeats of its old run: the emitter adds a random incarnation
suffix to its id for that reason.)

A sequence more than `max_jump` above every run of its producer is dead data (corrupt or
forged, e.g. 2^64-1): it is refused (positions in `last_jumps`) and changes nothing.
At most `max_runs` runs per producer are kept (the least recently extended is forgotten)
and at most `max_producers` producers per partition (the least recently seen first).
Forgetting can only let a very late repeat count again; it never drops a new event (the
gaps a run bridged when max_gap > 1 count as seen).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from streams.categorical import Categorical

DEFAULT_MAX_GAP = 1
DEFAULT_MAX_JUMP = 10_000_000


class _Runs:
    """One producer's runs: parallel lists of first/last sequence and last use (small)."""

    __slots__ = ("first", "last", "used")

    def __init__(self) -> None:
        self.first: list[int] = []
        self.last: list[int] = []
        self.used: list[int] = []

    def find(self, s: int) -> int:
        """The run holding s, -1 when none does."""
        for i, (lo, hi) in enumerate(zip(self.first, self.last, strict=True)):
            if lo <= s <= hi:
                return i
        return -1

    def below(self, s: int, max_gap: int) -> int:
        """The run whose end is the highest below s, if s lies within max_gap of it."""
        best = -1
        for i, hi in enumerate(self.last):
            if hi < s and s - hi <= max_gap and (best < 0 or hi > self.last[best]):
                best = i
        return best

    def extend(self, i: int, last: int, tick: int) -> None:
        self.last[i] = last
        self.used[i] = tick
        for j in range(len(self.first) - 1, -1, -1):  # runs the extension reached merge in
            if j != i and self.last[i] >= self.first[j] > self.first[i]:
                self.last[i] = max(self.last[i], self.last[j])
                for column in (self.first, self.last, self.used):
                    del column[j]
                i -= j < i

    def open(self, s: int, tick: int, max_runs: int) -> None:
        self.first.append(s)
        self.last.append(s)
        self.used.append(tick)
        if len(self.first) > max_runs:
            oldest = self.used.index(min(self.used))
            for column in (self.first, self.last, self.used):
                del column[oldest]


class Deduplicator:
    """Runs of counted sequences per producer, for one partition; see the module docstring."""

    def __init__(self, max_producers: int = 100_000, max_jump: int = DEFAULT_MAX_JUMP,
                 max_gap: int = DEFAULT_MAX_GAP, max_runs: int = 4) -> None:
        self.max_producers = max_producers
        self.max_jump = max_jump
        self.max_gap = max_gap
        self.max_runs = max_runs
        self._runs: OrderedDict[str, _Runs] = OrderedDict()
        self._tick = 0
        self.duplicates = 0
        self.forgotten = 0
        self.jumps = 0  # events refused for a jump beyond max_jump
        self.runs_opened = 0  # runs opened beside a producer's existing ones (gaps, forgeries)
        self._jumped: list[int] = []

    def keep(self, producers: Categorical, sequences: np.ndarray) -> np.ndarray:
        """Boolean mask of the events that are new; records them as seen. Events refused
        for an implausible jump are in `last_jumps` (positions), not counted as duplicates."""
        n = len(producers)
        mask = np.zeros(n, dtype=bool)
        self._jumped = []
        if n and int(producers.codes.min()) == int(producers.codes.max()):
            mask[:] = self._keep_one(producers[0], sequences, np.arange(n))
        elif n:
            # Producers are independent: one pass per producer over its rows, in order.
            order = np.argsort(producers.codes, kind="stable")
            sorted_codes = producers.codes[order]
            starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
            for lo, hi in zip(starts.tolist(), [*starts[1:].tolist(), n], strict=True):
                rows = order[lo:hi]
                name = producers.names[int(sorted_codes[lo])]
                mask[rows] = self._keep_one(name, sequences[rows], rows)
        self._jumped.sort()
        self.duplicates += int(n - np.count_nonzero(mask)) - len(self._jumped)
        self._bound()
        return mask

    @property
    def last_jumps(self) -> list[int]:
        return self._jumped

    def _keep_one(self, producer: str, sequences: np.ndarray, rows: np.ndarray) -> np.ndarray:
        runs = self._runs.get(producer)
        if runs is None:
            runs = self._runs[producer] = _Runs()
        self._runs.move_to_end(producer)
        self._tick += 1
        if self._at_once(runs, sequences):  # the usual batch: the next ones, in order
            return np.ones(sequences.size, dtype=bool)
        mask = np.zeros(sequences.size, dtype=bool)
        for i, s in enumerate(sequences.tolist()):
            mask[i] = self._one(runs, s, int(rows[i]))
        return mask

    def _at_once(self, runs: _Runs, seqs: np.ndarray) -> bool:
        """Count `seqs` in one step when they are in order, within max_gap of each other,
        overlap no run, and either continue one or open one (not beyond max_jump)."""
        if not seqs.size or int(seqs[-1]) >= 1 << 63:
            return False
        steps = np.diff(seqs.astype(np.int64))
        if steps.size and not (int(steps.min()) >= 1 and int(steps.max()) <= self.max_gap):
            return False
        lo, hi = int(seqs[0]), int(seqs[-1])
        if not runs.first:
            runs.open(lo, self._tick, self.max_runs)
            runs.extend(0, hi, self._tick)
            return True
        if any(f <= hi and e >= lo for f, e in zip(runs.first, runs.last, strict=True)):
            return False  # (overlaps a run: some of these may be repeats)
        i = runs.below(lo, self.max_gap)
        if i >= 0:
            runs.extend(i, hi, self._tick)
            return True
        if hi - max(runs.last) > self.max_jump:
            return False
        self.runs_opened += 1
        runs.open(lo, self._tick, self.max_runs)
        runs.extend(len(runs.first) - 1, hi, self._tick)
        return True

    def _one(self, runs: _Runs, s: int, row: int) -> bool:
        if runs.find(s) >= 0:
            return False
        i = runs.below(s, self.max_gap)
        if i >= 0:
            runs.extend(i, s, self._tick)
            return True
        if runs.last and s - max(runs.last) > self.max_jump:
            self._jumped.append(row)
            self.jumps += 1
            return False
        if runs.first:
            self.runs_opened += 1
        runs.open(s, self._tick, self.max_runs)
        return True

    def _bound(self) -> None:
        while len(self._runs) > self.max_producers:
            self._runs.popitem(last=False)
            self.forgotten += 1

    def __len__(self) -> int:
        return len(self._runs)
